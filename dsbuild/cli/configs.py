"""The config commands: ``presets``, ``show``, ``export``, ``validate``, ``explain``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..atomic import write_atomic
from ..errors import DsbuildError
from ..explain import explain, render_explanation
from ..interop import accelerate_config, for_hf, mixed_precision_of, to_yaml, zero_stage
from ..presets import presets
from ..validate import validate
from .common import (
    CONSUMERS,
    FORMATS,
    Commands,
    add_run_facts,
    add_target,
    diagnose,
    job_of,
    load_ref,
    load_with_sets,
    no_training_file,
    positive_int,
    render,
    resolved,
    resolved_job,
)
from .output import counts, error, out, plural, report

__all__ = ["add_explain", "add_export", "add_presets", "add_show", "add_validate"]


def add_presets(commands: Commands) -> None:
    p = commands.add_parser("presets", help="list the packaged presets", description="List the packaged presets.")
    p.set_defaults(handler=_presets)


def _presets(args: argparse.Namespace) -> int:
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
    p.add_argument("config", metavar="NAME|FILE", help="a preset name or a .json/.toml/.yaml file")
    p.add_argument("--format", choices=FORMATS, default="json", help="output format (default: json)")
    p.set_defaults(handler=_show)


def _show(args: argparse.Namespace) -> int:
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
            "config that points to it (--for accelerate)."
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
            'to "auto"), or "accelerate" (OUT is an Accelerate config YAML; the hf ds_config is written beside it)'
        ),
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
    output = Path(args.output)
    if args.consumer == "accelerate":
        fmt = "yaml"
        if output.suffix.lower() not in (".yaml", ".yml"):
            error(f"{output}: --for accelerate writes an Accelerate config: name it .yaml or .yml")
            return 2
    else:
        fmt = args.format or output.suffix.lower().lstrip(".")
    if fmt not in (*FORMATS, "yaml"):
        error(f"{output}: cannot tell the output format from its suffix: use --format json|toml or a .json/.toml name")
        return 2
    if args.resolve and args.consumer != "deepspeed":
        error(
            f'--resolve fills the "auto" values that --for {args.consumer} leaves for the HF Trainer: use one or the other'
        )
        return 2
    job = job_of(args.config, args.set)
    if job is not None:
        no_training_file(args)
        config = resolved_job(job, args) if args.resolve else job.config
    else:
        config = resolved(args) if args.resolve else load_with_sets(args.config, args.set)[0]
    if args.consumer != "deepspeed":
        config = for_hf(config)
    target = "hf" if args.consumer != "deepspeed" else args.target
    world_size = args.world_size or (job.launch.world_size if job is not None else 1)
    if args.check:
        found = validate(config, world_size=world_size, target=target, resolved=args.resolve)
        errors = [d for d in found if d.severity == "error"]
        if errors:
            for d in errors:
                error(f"{args.config}: {d}")
            error(f"not written: {plural(len(errors), 'error')}")
            return 1
    if args.consumer == "accelerate":
        ds_path = output.with_name("ds_config.json")
        config.to_json(ds_path)
        settings = accelerate_config(
            str(ds_path),
            num_processes=world_size,
            num_machines=job.launch.nnodes if job is not None else 1,
            zero3_init=zero_stage(config) == 3,
            mixed_precision=mixed_precision_of(config, job.training if job is not None else None),
        )
        write_atomic(output, to_yaml(settings))
        out(f"wrote {ds_path}")
        out(f"wrote {output}  (accelerate launch --config_file {output} your_script.py)")
        return 0
    written = config.to_json(output) if fmt == "json" else config.to_toml(output)
    out(f"wrote {written}")
    return 0


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
    add_target(p)
    p.set_defaults(handler=_validate)


def _validate(args: argparse.Namespace) -> int:
    unreadable = with_errors = 0
    totals = {"error": 0, "warning": 0}
    for ref in args.configs:
        try:
            found = diagnose(ref, strict=args.strict, world_size=args.world_size, target=args.target, sets=args.set)
        except DsbuildError as e:
            unreadable += 1
            report(e)
            out(f"{ref}: unreadable")
            continue
        errors = [d for d in found if d.severity == "error"]
        warnings = [d for d in found if d.severity == "warning"]
        totals["error"] += len(errors)
        totals["warning"] += len(warnings)
        with_errors += bool(errors)
        if not found:
            out(f"{ref}: ok")
            continue
        out(f"{ref}: {counts(len(errors), len(warnings))}")
        for title, group in (("errors", errors), ("warnings", warnings)):
            if group:
                out(f" {title}:")
                for d in group:
                    out(f"  {d}")
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
    p.set_defaults(handler=_explain)


def _explain(args: argparse.Namespace) -> int:
    job = job_of(args.config, args.set)
    if job is not None:
        no_training_file(args)
        config = resolved_job(job, args)
    else:
        config = resolved(args)
    out(render_explanation(explain(config)))
    return 0
