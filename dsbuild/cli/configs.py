"""The config commands: ``presets``, ``show``, ``export``, ``validate``, ``explain``, ``schema``."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DsbuildError, UnresolvedAutoError
from .args import CONSUMERS, FORMATS, Commands, add_run_facts, add_target, positive_int
from .output import counts, error, escape, escape_lines, out, plural, report, said

if TYPE_CHECKING:
    from ..validate import Diagnostic

# Each command imports what it runs on when it runs (``args``), so building the parsers stays light.

__all__ = ["add_explain", "add_export", "add_presets", "add_schema", "add_show", "add_validate"]


def add_presets(commands: Commands) -> None:
    p = commands.add_parser("presets", help="list the packaged presets", description="List the packaged presets.")
    p.set_defaults(handler=_presets)


def _presets(args: argparse.Namespace) -> int:
    from ..io.presets import presets

    found = presets()
    width = max((len(name) for name in found), default=0)
    for name, description in found.items():
        out(f"{name:<{width}}  {description}")
    return 0


def add_show(commands: Commands) -> None:
    p = commands.add_parser(
        "show",
        help="print a preset or config file as a ds_config",
        description="Print a preset or config file as a ds_config (extends merged, aliases normalized).",
    )
    p.add_argument(
        "config", metavar="NAME|FILE|JOB", help="a preset name, a .json/.toml/.yaml file, or a job file (its config)"
    )
    p.add_argument("--format", choices=FORMATS, default="json", help="output format (default: json)")
    p.set_defaults(handler=_show)


def _show(args: argparse.Namespace) -> int:
    from .common import load_ref, render

    config = load_ref(args.config)
    out(render(config, args.format), end="")
    return 0


def add_export(commands: Commands) -> None:
    p = commands.add_parser(
        "export",
        help="write a preset, config file or job's config as a JSON or TOML ds_config",
        description=(
            "Write a preset, config file or job file's config as a ds_config: as it is, resolved for raw DeepSpeed "
            "(--resolve), for the HF Trainer (--for hf: TrainingArguments(deepspeed=...)) or with an Accelerate "
            "config that points to it (--for accelerate). Says what it wrote; the files named are written over."
        ),
    )
    p.add_argument("config", metavar="NAME|FILE|JOB", help="a preset name, a .json/.toml/.yaml config, or a job file")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the file to write (atomically)")
    p.add_argument("--format", choices=FORMATS, help="output format (default: from OUT's suffix)")
    p.add_argument(
        "--for",
        dest="consumer",
        choices=CONSUMERS,
        default="deepspeed",
        help=(
            'who reads it: "deepspeed" (default, the config as it is), "hf" (every value the HF Trainer fills set '
            'to "auto"), "accelerate" (OUT is an Accelerate config YAML, and the ds_config it points to is written '
            'too: "auto" where Accelerate fills it in a plain loop, the rest resolved from the job or --training/--set), '
            'or "trl" (a job as TRL runs it: OUT is the TRL config, written with its Accelerate config and ds_config)'
        ),
    )
    p.add_argument(
        "--ds-config",
        type=Path,
        metavar="JSON",
        help="with --for accelerate: the ds_config to write (default: beside OUT, OUT's name with .ds_config.json)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="refuse to write a config with validation errors (exit 1)",
    )
    p.add_argument(
        "--resolve",
        action="store_true",
        help='fill every "auto" as the HF Trainer would (from --training/--set, --world-size, ...) for raw DeepSpeed',
    )
    add_run_facts(p)
    add_target(p)
    p.set_defaults(handler=_export)


def _export(args: argparse.Namespace) -> int:
    from .._util.atomic import write_atomic
    from ..interop import for_hf, training_arguments
    from ..validate import validate
    from .common import (
        for_accelerate_of,
        job_of,
        load_problems,
        load_with_sets,
        no_training_file,
        resolved,
        resolved_job,
    )

    output = Path(args.output)
    if args.consumer == "trl":
        from .imports import export_trl

        return export_trl(args)
    accelerate = args.consumer == "accelerate"
    usage = _export_usage(args, output)
    if usage is None:
        return 2
    fmt, ds_path = usage
    if args.check:
        # A value the reader refuses is a config that fails its checks (exit 1), as validate says; not unreadable.
        rejected = load_problems(args.config, args.set)
        if rejected:
            return _not_written(args.config, rejected)
    job = job_of(args.config, args.set)
    if job is not None:
        no_training_file(args)
    if accelerate:
        try:
            config = for_accelerate_of(args, job)
        except UnresolvedAutoError as e:
            report(e)
            error(
                'not written: --for accelerate keeps "auto" only where Accelerate fills it in a plain loop and resolves '
                "the rest: export a job file, give the training arguments (--training FILE or --set "
                "training.NAME=VALUE), or set these values in the config"
            )
            return 2
    elif job is not None:
        config = resolved_job(job, args) if args.resolve else job.config
    else:
        config = resolved(args) if args.resolve else load_with_sets(args.config, args.set)[0]
    if args.consumer == "hf":
        config = for_hf(config)
    target = "hf" if args.consumer != "deepspeed" else args.target
    world_size = args.world_size or (job.launch.world_size if job is not None else 1)
    if args.check:
        found = validate(config, world_size=world_size, target=target, resolved=args.resolve)
        errors = [d for d in found if d.severity == "error"]
        if errors:
            return _not_written(args.config, errors)
    if ds_path is not None:
        _write_for_accelerate(config, output, ds_path, job, world_size)
        return 0
    written = config.to_json(output) if fmt == "json" else config.to_toml(output)
    if args.consumer == "hf" and job is not None:
        # The job's training arguments in the HF Trainer's names: TrainingArguments(**json.load(f)) runs as the job.
        arguments = output.with_name(f"{output.stem}.training_args.json")
        deepspeed = str(written) if fmt == "json" else None
        hf = training_arguments(job.training, deepspeed=deepspeed)
        del hf["output_dir"]  # the HF run writes where its script says, never into this job's run folder
        write_atomic(arguments, json.dumps(hf, indent=1) + "\n")
        out(f"wrote {written}, {arguments}  (TrainingArguments(**json.load(open('{arguments}'))))")
        return 0
    out(f"wrote {written}")
    return 0


def _export_usage(args: argparse.Namespace, output: Path) -> tuple[str, Path | None] | None:
    """The output format and, ``--for accelerate``, where its ds_config goes; ``None`` after saying what is wrong."""
    accelerate = args.consumer == "accelerate"
    ds_path: Path | None = None
    if accelerate:
        fmt = "yaml"
        if output.suffix.lower() not in (".yaml", ".yml"):
            error(f"{output}: --for accelerate writes an Accelerate config: name it .yaml or .yml")
            return None
        ds_path = _ds_config_path(output, args.ds_config)
        if ds_path is None:
            return None
    elif args.ds_config is not None:
        error("--ds-config names the ds_config that --for accelerate writes beside its YAML: use -o for this export")
        return None
    else:
        fmt = args.format or output.suffix.lower().lstrip(".")
    if fmt not in (*FORMATS, "yaml"):
        error(f"{output}: cannot tell the output format from its suffix: use --format json|toml or a .json/.toml name")
        return None
    if args.resolve and args.consumer != "deepspeed":
        tool = "Accelerate" if accelerate else "the HF Trainer"
        error(f'--resolve fills the "auto" values that --for {args.consumer} leaves for {tool}: use one or the other')
        return None
    return fmt, ds_path


def _write_for_accelerate(config: Any, output: Path, ds_path: Path, job: Any, world_size: int) -> None:
    """``--for accelerate``: the ds_config, and the Accelerate config that names it."""
    from .._util.atomic import write_atomic
    from ..interop import accelerate_config, to_yaml, zero_stage
    from ..resolve.batch import degrees

    config.to_json(ds_path)
    settings = accelerate_config(
        str(ds_path),
        num_processes=world_size,
        num_machines=job.launch.nnodes if job is not None else 1,
        zero3_init=zero_stage(config) == 3,
        sequence_parallel=degrees(config)[0],
        attn_implementation=(job.model.attn_implementation if job is not None else None) or "sdpa",
    )
    write_atomic(output, to_yaml(settings))
    out(f"wrote {output}, {ds_path}  (accelerate launch --config_file {output} your_script.py)")


def _ds_config_path(output: Path, given: Path | None) -> Path | None:
    """Where ``--for accelerate`` writes the ds_config: ``--ds-config``, else ``OUT``'s name with ``.ds_config.json``
    beside it (``accel.yaml``: ``accel.ds_config.json``); ``None`` after saying why it cannot be."""
    path = given if given is not None else output.with_name(f"{output.stem}.ds_config.json")
    if path.suffix.lower() != ".json":  # never -o's file, then: that one is .yaml
        error(f"--ds-config {path}: Accelerate reads the ds_config as JSON: name it .json")
        return None
    return path


def _not_written(ref: str, errors: list[Diagnostic]) -> int:
    """``export --check`` refusing: each error as ``validate`` words it, then what happened; exit 1."""
    for d in errors:
        error(f"{ref}: {said(d)}")
    error(f"not written: {plural(len(errors), 'error')}")
    return 1


def add_validate(commands: Commands) -> None:
    p = commands.add_parser(
        "validate",
        help="check config files before launch",
        description=(
            "Check config files (or presets) before launch. Exit 0: no errors; 1: a config has errors; "
            "2: an input could not be read."
        ),
    )
    p.add_argument(
        "configs", nargs="+", metavar="FILE", help="config files (.json/.toml/.yaml), preset names, or job files"
    )
    p.add_argument("--world-size", type=positive_int, metavar="N", help="check the batch sizes for N processes")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a job file's value (training.max_steps=10, strategy.overrides.zero_optimization.stage=2)",
    )
    p.add_argument(
        "--strict",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="unknown keys are errors (default: warnings, as DeepSpeed ignores them)",
    )
    p.add_argument(
        "--deepspeed",
        action="store_true",
        help=(
            "also run the installed DeepSpeed's own config parser on each config (as dsbuild would hand it, at "
            "--world-size) and list what it refuses (needs dsbuild[train])"
        ),
    )
    add_target(p)
    p.set_defaults(handler=_validate)


def _validate(args: argparse.Namespace) -> int:
    from ..env.extras import require
    from .common import diagnose

    if args.deepspeed:
        if args.target == "hf":
            error(
                '--deepspeed asks DeepSpeed about the config as written, but --target hf leaves "auto" values for the '
                "HF Trainer to fill: export it with --resolve, then validate that file with --deepspeed"
            )
            return 2
        require("dsbuild validate --deepspeed", "torch", "deepspeed")
        # Parsing needs no device: DeepSpeed on its CPU accelerator imports quickly and quietly everywhere.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    unreadable = with_errors = 0
    totals = {"error": 0, "warning": 0}
    for ref in args.configs:
        try:
            found = diagnose(
                ref,
                strict=args.strict,
                world_size=args.world_size,
                target=args.target,
                sets=args.set,
                deepspeed=args.deepspeed,
            )
        except DsbuildError as e:
            unreadable += 1
            report(e)
            out(f"{escape(ref)}: unreadable")
            continue
        errors = [d for d in found if d.severity == "error"]
        warnings = [d for d in found if d.severity == "warning"]
        totals["error"] += len(errors)
        totals["warning"] += len(warnings)
        with_errors += bool(errors)
        if not found:
            out(f"{escape(ref)}: ok")
            continue
        out(f"{escape(ref)}: {counts(len(errors), len(warnings))}")
        for title, group in (("errors", errors), ("warnings", warnings)):
            if group:
                out(f" {title}:")
                for d in group:
                    out(f"  {escape(said(d))}")
    n = len(args.configs)
    parts = [f"{plural(n, 'config')} checked", counts(totals["error"], totals["warning"])]
    if unreadable:
        parts.append(f"{unreadable} unreadable")
    out(", ".join(parts))
    return 2 if unreadable else 1 if with_errors else 0


def add_explain(commands: Commands) -> None:
    p = commands.add_parser(
        "explain",
        help="the resolved config, each key with where its value came from",
        description=(
            'Resolve a config as the HF Trainer would (every "auto" filled from the training arguments, the '
            "model's hidden size, the world size and the run's steps) and print each key's value and origin."
        ),
    )
    p.add_argument("config", metavar="NAME|FILE|JOB", help="a preset name, a .json/.toml/.yaml file, or a job file")
    add_run_facts(p)
    p.add_argument(
        "--for-inference",
        action="store_true",
        help="then the config of an engine without an optimizer (a reference or reward model) made from it "
        "(Config.for_inference()): what it changed and what it removed, with why",
    )
    p.set_defaults(handler=_explain)


def _explain(args: argparse.Namespace) -> int:
    from ..resolve.explain import explain, render_explanation
    from ..resolve.inference import for_inference, removed_by_for_inference
    from .common import job_of, no_training_file, resolved, resolved_job

    job = job_of(args.config, args.set)
    if job is not None:
        no_training_file(args)
        config = resolved_job(job, args)
    else:
        config = resolved(args, hf_defaults=True)
    explanations = explain(config)
    if args.for_inference:
        explanations = explain(for_inference(config)) + removed_by_for_inference(config)
    out(escape_lines(render_explanation(explanations)))
    return 0


def add_schema(commands: Commands) -> None:
    p = commands.add_parser(
        "schema",
        help="the JSON Schema of a ds_config (or with --job, of a job file), for editors",
        description=(
            "Print the JSON Schema (draft 2020-12) of a ds_config, generated from dsbuild's typed model: editors "
            "use it to complete and check JSON and TOML config files (docs/schema.md says how to set them up). "
            "--job: the schema of a job file instead ([model], [data], [training], [strategy], [launch])."
        ),
    )
    p.add_argument("-o", "--output", metavar="OUT", help="write it to OUT (atomically) instead of printing it")
    p.add_argument("--job", action="store_true", help="the schema of a job file, not of a ds_config")
    p.set_defaults(handler=_schema)


def _schema(args: argparse.Namespace) -> int:
    from .._util.atomic import write_atomic

    if args.job:
        from ..job.schema import job_schema

        schema = job_schema()
    else:
        from ..io.schema import json_schema

        schema = json_schema()
    text = json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
    if args.output is None:
        out(text, end="")
    else:
        out(f"wrote {write_atomic(args.output, text)}")
    return 0
