"""The ``dsbuild`` command: the only module that reads argv, prints or sets an exit code.

Exit codes: 0 success; 1 a well-formed config that fails validation; 2 bad
usage or an input that cannot be used (missing file, invalid JSON, unknown
preset...). Bad input never prints a traceback: every ``DsbuildError`` becomes
one ``dsbuild: error: ...`` line per problem on stderr.

Each command is a ``_add_<name>(subparsers)`` function that registers its
parser and sets ``handler``; add new ones to ``_COMMANDS``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from . import __version__
from .config import Config
from .errors import ConfigError, DsbuildError
from .io import SUFFIXES, load, read_dict, to_config
from .presets import load_preset, preset_names, presets
from .validate import Diagnostic, validate

if TYPE_CHECKING:
    from .job import Job

__all__ = ["main"]

FORMATS = ("json", "toml")
TARGETS = ("deepspeed", "hf")
CONSUMERS = ("deepspeed", "hf", "accelerate")

Handler: TypeAlias = Callable[[argparse.Namespace], int]
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dsbuild`` command line; return the exit code."""
    parser = _parser()
    try:
        args, extra = parser.parse_known_args(argv)
        # `dsbuild validate a.json --world-size 8 b.json`: argparse stops taking files after an
        # option; take the rest as files too when the command takes several.
        if extra and isinstance(getattr(args, "configs", None), list) and not any(x.startswith("-") for x in extra):
            args.configs.extend(extra)
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:
        # argparse exits 2 on usage errors (after printing them) and 0 for --help / --version.
        return e.code if isinstance(e.code, int) else 2
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_usage(sys.stderr)
        _error("a command is required (see dsbuild --help)")
        return 2
    try:
        return handler(args)
    except DsbuildError as e:
        _report(e)
        return 2
    except BrokenPipeError:  # pragma: no cover - `dsbuild show x | head`
        # Python would complain again when flushing stdout at exit; point it at /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:
        # Writing an output file: a missing directory, no permission, a full disk.
        where = f"{e.filename}: " if e.filename else ""
        _error(f"{where}{e.strerror or e}")
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsbuild",
        description="Build, check and export DeepSpeed configs.",
    )
    parser.add_argument("--version", action="version", version=f"dsbuild {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for add in _COMMANDS:
        add(commands)
    return parser


# -- presets -------------------------------------------------------------------


def _add_presets(commands: Commands) -> None:
    p = commands.add_parser("presets", help="list the packaged presets", description="List the packaged presets.")
    p.set_defaults(handler=_presets)


def _presets(args: argparse.Namespace) -> int:
    found = presets()
    width = max((len(name) for name in found), default=0)
    for name, description in found.items():
        _out(f"{name:<{width}}  {description}")
    return 0


# -- show / export -------------------------------------------------------------


def _add_show(commands: Commands) -> None:
    p = commands.add_parser(
        "show",
        help="print a preset or config file as a ds_config",
        description="Print a preset or config file as a ds_config (extends merged, aliases normalized).",
    )
    p.add_argument("config", metavar="NAME|FILE", help="a preset name or a .json/.toml/.yaml file")
    p.add_argument("--format", choices=FORMATS, default="json", help="output format (default: json)")
    p.set_defaults(handler=_show)


def _show(args: argparse.Namespace) -> int:
    config = _load_ref(args.config)
    _out(_render(config, args.format), end="")
    return 0


def _add_export(commands: Commands) -> None:
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
        help="fill every \"auto\" as the HF Trainer would (from --training/--set, --world-size, ...) for raw DeepSpeed",
    )
    _add_run_facts(p)
    _add_target(p)
    p.set_defaults(handler=_export)


def _export(args: argparse.Namespace) -> int:
    from .job import accelerate_config, for_hf, mixed_precision_of, to_yaml, zero_stage

    out = Path(args.output)
    if args.consumer == "accelerate":
        fmt = "yaml"
        if out.suffix.lower() not in (".yaml", ".yml"):
            _error(f"{out}: --for accelerate writes an Accelerate config: name it .yaml or .yml")
            return 2
    else:
        fmt = args.format or out.suffix.lower().lstrip(".")
    if fmt not in (*FORMATS, "yaml"):
        _error(f"{out}: cannot tell the output format from its suffix: use --format json|toml or a .json/.toml name")
        return 2
    if args.resolve and args.consumer != "deepspeed":
        _error(
            f'--resolve fills the "auto" values that --for {args.consumer} leaves for the HF Trainer: use one or the other'
        )
        return 2
    job = _job_of(args.config, args.set)
    if job is not None:
        _no_training_file(args)
        config = _resolved_job(job, args) if args.resolve else job.config
    else:
        config = _resolved(args) if args.resolve else _load_with_sets(args.config, args.set)[0]
    if args.consumer != "deepspeed":
        config = for_hf(config)
    target = "hf" if args.consumer != "deepspeed" else args.target
    world_size = args.world_size or (job.launch.world_size if job is not None else 1)
    if args.check:
        found = validate(config, world_size=world_size, target=target, resolved=args.resolve)
        errors = [d for d in found if d.severity == "error"]
        if errors:
            for d in errors:
                _error(f"{args.config}: {d}")
            _error(f"not written: {_plural(len(errors), 'error')}")
            return 1
    if args.consumer == "accelerate":
        ds_path = out.with_name("ds_config.json")
        config.to_json(ds_path)
        settings = accelerate_config(
            str(ds_path),
            num_processes=world_size,
            num_machines=job.launch.nnodes if job is not None else 1,
            zero3_init=zero_stage(config) == 3,
            mixed_precision=mixed_precision_of(config, job.training if job is not None else None),
        )
        from .io import _write_atomic

        _write_atomic(out, to_yaml(settings))
        _out(f"wrote {ds_path}")
        _out(f"wrote {out}  (accelerate launch --config_file {out} your_script.py)")
        return 0
    written = config.to_json(out) if fmt == "json" else config.to_toml(out)
    _out(f"wrote {written}")
    return 0


# -- validate ------------------------------------------------------------------


def _add_validate(commands: Commands) -> None:
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
    p.add_argument("--world-size", type=_positive_int, metavar="N", help="check the batch sizes for N processes")
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
    _add_target(p)
    p.set_defaults(handler=_validate)


def _validate(args: argparse.Namespace) -> int:
    unreadable = with_errors = 0
    totals = {"error": 0, "warning": 0}
    for ref in args.configs:
        try:
            found = _diagnose(ref, strict=args.strict, world_size=args.world_size, target=args.target, sets=args.set)
        except DsbuildError as e:
            unreadable += 1
            _report(e)
            _out(f"{ref}: unreadable")
            continue
        errors = [d for d in found if d.severity == "error"]
        warnings = [d for d in found if d.severity == "warning"]
        totals["error"] += len(errors)
        totals["warning"] += len(warnings)
        with_errors += bool(errors)
        if not found:
            _out(f"{ref}: ok")
            continue
        _out(f"{ref}: {_counts(len(errors), len(warnings))}")
        for title, group in (("errors", errors), ("warnings", warnings)):
            if group:
                _out(f" {title}:")
                for d in group:
                    _out(f"  {d}")
    n = len(args.configs)
    parts = [f"{_plural(n, 'config')} checked", _counts(totals["error"], totals["warning"])]
    if unreadable:
        parts.append(f"{unreadable} unreadable")
    _out(", ".join(parts))
    return 2 if unreadable else 1 if with_errors else 0


def _diagnose(
    ref: str, *, strict: bool, world_size: int | None, target: str, sets: Sequence[str] = ()
) -> list[Diagnostic]:
    """Diagnostics of one config or job; a value ``from_dict`` rejects is an error diagnostic, not an unreadable file."""
    path = _as_path(ref)
    job_data = _job_data(path) if path is not None else None
    if path is not None and job_data is not None:
        return _diagnose_job(path, job_data, sets, world_size)
    if sets:
        raise ConfigError(f"{ref}: --set applies to job files; this is a ds_config (edit it, or use export --set)")
    if path is None:
        return validate(load_preset(ref), world_size=world_size, target=target)
    data, _ = read_dict(path)
    try:
        config = to_config(data, strict=strict, source=str(path))
    except ConfigError as e:
        return [Diagnostic(p.path, "error", p.message, p.hint) for p in e.problems]
    return validate(config, world_size=world_size, target=target)


def _diagnose_job(path: Path, data: dict[str, object], sets: Sequence[str], world_size: int | None) -> list[Diagnostic]:
    """A job's problems: what the file gets wrong (unknown keys, bad values), else its config resolved for the run."""
    from .job import Job, set_dotted

    for key, value in _job_sets(sets).items():
        set_dotted(data, key, value)
    try:
        job = Job.from_dict(data, base_dir=path.parent, source=str(path), name=path.stem)
    except ConfigError as e:
        return [Diagnostic(p.path, "error", p.message, p.hint) for p in e.problems]
    return job.validate(world_size=world_size)


# -- helpers -------------------------------------------------------------------


def _as_path(ref: str) -> Path | None:
    """``ref`` as a file path, or ``None`` when it names a preset."""
    path = Path(ref)
    # A suffix or a directory part means a file; a bare word is a preset unless only a file has that name.
    if path.suffix.lower() in SUFFIXES or os.sep in ref or "/" in ref:
        return path
    if ref in preset_names() or not path.exists():
        return None
    return path


def _load_ref(ref: str) -> Config:
    """A config file, or a preset by name."""
    path = _as_path(ref)
    return load_preset(ref) if path is None else load(path)


def _job_data(path: Path) -> dict[str, object] | None:
    """The raw table of a job file, or ``None`` when ``path`` is not one (a ds_config, or unreadable: reported later)."""
    from .job import looks_like_job, read_job_dict

    try:
        data = read_job_dict(path)
    except DsbuildError:
        return None
    return data if looks_like_job(data) else None


def _job_sets(sets: Sequence[str]) -> dict[str, object]:
    from .job import parse_set

    return dict(parse_set(text) for text in sets)


def _job_of(ref: str, sets: Sequence[str]) -> Job | None:
    """The job ``ref`` names (with ``--set`` applied), or ``None`` when it is a preset or a ds_config file."""
    from .job import load_job

    path = _as_path(ref)
    if path is None or _job_data(path) is None:
        return None
    return load_job(path, _job_sets(sets))


def _no_training_file(args: argparse.Namespace) -> None:
    if getattr(args, "training", None) is not None:
        raise ConfigError(f"{args.config}: a job has its own [training]: change it with --set training.KEY=VALUE")


def _resolved_job(job: Job, args: argparse.Namespace) -> Config:
    return job.resolve(world_size=args.world_size, hidden_size=args.hidden_size, total_steps=args.total_steps)


def _parse_set(text: str) -> tuple[list[str], object]:
    """``section.key=value`` with the value in TOML syntax (a bare word is taken as a string)."""
    import tomllib

    key, sep, raw = text.partition("=")
    if not sep or not key.strip() or any(not part for part in key.strip().split(".")):
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. training.learning_rate=2e-5")
    try:
        value: object = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.strip().split("."), value


def _load_with_sets(ref: str, sets: Sequence[str]) -> tuple[Config, dict[str, object]]:
    """The config of ``ref`` with ``--set`` overrides applied, and the ``training.*`` ones apart."""
    training: dict[str, object] = {}
    overrides: list[tuple[list[str], object]] = []
    for text in sets:
        keys, value = _parse_set(text)
        if keys[0] == "training" and len(keys) == 2:
            training[keys[1]] = value
        else:
            overrides.append((keys, value))
    if not overrides:
        return _load_ref(ref), training
    path = _as_path(ref)
    if path is None:
        data, source = load_preset(ref).to_dict(), f"preset {ref}"
    else:
        data, _ = read_dict(path)
        source = str(path)
    for keys, value in overrides:
        node = data
        for key in keys[:-1]:
            child = node.get(key)
            if not isinstance(child, dict):
                child = node[key] = {}
            node = child
        node[keys[-1]] = value
    return to_config(data, source=source, label=f"{source} with --set"), training


def _add_run_facts(p: argparse.ArgumentParser) -> None:
    """The facts ``resolve`` needs: world size, training arguments, hidden size, total steps."""
    p.add_argument(
        "--world-size", type=_positive_int, metavar="N", help="number of processes (default: a job's, else 1)"
    )
    p.add_argument(
        "--training",
        metavar="TOML",
        type=Path,
        help="training arguments: a TOML file of Training fields (not for jobs)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=(
            "override a training argument (training.learning_rate=2e-5) or a ds_config key (zero_optimization.stage=2); "
            "for a job file, any job value (strategy.overrides.zero_optimization.stage=2)"
        ),
    )
    p.add_argument("--hidden-size", type=_positive_int, metavar="H", help="the model's hidden size")
    p.add_argument("--total-steps", type=_positive_int, metavar="N", help="optimizer steps of the run")


def _resolved(args: argparse.Namespace) -> Config:
    from .training import Training

    config, overrides = _load_with_sets(args.config, args.set)
    fields: dict[str, object] = {}
    if args.training is not None:
        import tomllib

        try:
            with open(args.training, "rb") as fh:
                fields.update(tomllib.load(fh))
        except OSError as e:
            raise ConfigError(f"{args.training}: {e.strerror or e}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{args.training}: invalid TOML: {e}") from None
        table = fields.get("training")
        if isinstance(table, dict):  # a job file's [training] table
            fields = dict(table)
    fields.update(overrides)
    training = Training.from_dict(fields) if fields else None
    return config.resolve(
        world_size=args.world_size or 1, training=training, hidden_size=args.hidden_size, total_steps=args.total_steps
    )


def _render(config: Config, fmt: str) -> str:
    data = config.to_dict()
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    import tomli_w

    try:
        return tomli_w.dumps(data)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"cannot be written as TOML: {e} (use --format json)") from None


def _add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default="deepspeed",
        help='who reads the config: "deepspeed" as is (default) or "hf", the HF Trainer / Accelerate, which fill "auto"',
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _counts(errors: int, warnings: int) -> str:
    return f"{_plural(errors, 'error')}, {_plural(warnings, 'warning')}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _report(error: DsbuildError) -> None:
    """One ``dsbuild: error:`` line per problem, each naming the file."""
    if isinstance(error, ConfigError):
        where = f"{error.source}: " if error.source else ""
        for problem in error.problems:
            _error(f"{where}{problem}")
    else:
        _error(str(error))


def _out(text: str, *, end: str = "\n") -> None:
    print(text, end=end)


def _error(text: str) -> None:
    print(f"dsbuild: error: {text}", file=sys.stderr)


# -- explain -------------------------------------------------------------------


def _add_explain(commands: Commands) -> None:
    p = commands.add_parser(
        "explain",
        help="the resolved config, each key with where its value came from",
        description=(
            'Resolve a config as the HF Trainer would (every "auto" filled from the training arguments, the '
            "model's hidden size, the world size and the run's steps) and print each key's value and origin."
        ),
    )
    p.add_argument("config", metavar="NAME|FILE|JOB", help="a preset name, a .json/.toml/.yaml file, or a job file")
    _add_run_facts(p)
    p.set_defaults(handler=_explain)


def _explain(args: argparse.Namespace) -> int:
    from .resolve import explain, render_explanation

    job = _job_of(args.config, args.set)
    if job is not None:
        _no_training_file(args)
        config = _resolved_job(job, args)
    else:
        config = _resolved(args)
    _out(render_explanation(explain(config)))
    return 0


# -- plan --------------------------------------------------------------------


def _add_plan(commands: Commands) -> None:
    p = commands.add_parser(
        "plan",
        help="which ZeRO stage and offload fit your GPUs",
        description=(
            "Model-state memory per GPU and per node for every ZeRO stage and offload choice (the figures of "
            "DeepSpeed's own estimators; activations are not included), and the fastest choice that fits."
        ),
    )
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--params", metavar="N", help="parameter count, e.g. 7B, 1.5B, 350M")
    size.add_argument("--model", metavar="PATH", help="an HF model directory or its config.json (counted, not loaded)")
    p.add_argument("--largest-layer-params", metavar="N", help="parameters of the largest layer (default: from --model)")
    p.add_argument("--gpus-per-node", type=_positive_int, default=1, metavar="N")
    p.add_argument("--nodes", type=_positive_int, default=1, metavar="N")
    p.add_argument("--gpu-memory", metavar="SIZE", help="memory per GPU, e.g. 80GiB")
    p.add_argument("--cpu-memory", metavar="SIZE", help="CPU memory per node, e.g. 512GiB")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--emit", metavar="FILE", type=Path, help="write the recommended config as TOML (or JSON by suffix)")
    p.set_defaults(handler=_plan)


def _plan(args: argparse.Namespace) -> int:
    from .planner import format_plan_table, parse_count, plan, plan_to_json

    result = plan(
        params=parse_count(args.params) if args.params is not None else None,
        model=args.model,
        largest_layer_params=(
            parse_count(args.largest_layer_params, "largest_layer_params") if args.largest_layer_params else None
        ),
        gpus_per_node=args.gpus_per_node,
        nodes=args.nodes,
        gpu_memory=args.gpu_memory,
        cpu_memory=args.cpu_memory,
    )
    _out(json.dumps(plan_to_json(result), indent=2) if args.json else format_plan_table(result))
    if args.emit is not None:
        if result.recommended is None:
            _error(f"nothing to write to {args.emit}: {result.reason}")
            return 1
        written = result.recommended.to_json(args.emit) if args.emit.suffix == ".json" else result.recommended.to_toml(args.emit)
        if not args.json:
            _out(f"wrote {written}")
    return 0


# -- doctor ------------------------------------------------------------------


def _add_doctor(commands: Commands) -> None:
    p = commands.add_parser(
        "doctor",
        help="versions, accelerator, and the ops a config needs",
        description=(
            "Report the versions of Python, torch, DeepSpeed, transformers, peft and accelerate, the accelerator "
            "DeepSpeed will use, and whether the ops a config needs are built or can be compiled here. "
            "Exit 1 when something the config needs is missing."
        ),
    )
    p.add_argument("config", nargs="?", metavar="CONFIG_OR_JOB", help="a config file or preset to check against")
    p.set_defaults(handler=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import render_report, report

    config = _load_ref(args.config) if args.config is not None else None
    result = report(config)
    _out(render_report(result))
    return 0 if result.ok else 1


# -- train -------------------------------------------------------------------


def _add_train(commands: Commands) -> None:
    p = commands.add_parser(
        "train",
        help="run a job file (without one: the built-in demo job)",
        description=(
            "Train the model of a job file with DeepSpeed: in this process for one process, through torchrun for "
            "several processes or nodes. Without JOB, runs the built-in demo (a tiny Llama learning arithmetic, "
            "about a minute on a CPU). Exit 0: trained; 1: the job's config fails validation, or a rank failed; "
            "2: the job cannot be used."
        ),
    )
    p.add_argument("job", nargs="?", metavar="JOB", help="a job file (default: the built-in demo job)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='override a job value, in TOML syntax (training.max_steps=100, launch.device_mapping="0-3")',
    )
    p.add_argument("--nproc-per-node", type=_positive_int, metavar="N", help="processes per node (default: the job's)")
    p.add_argument("--nnodes", type=_positive_int, metavar="N", help="nodes (default: the job's)")
    p.add_argument("--node-rank", type=_non_negative_int, metavar="R", help="this node's rank, with --nnodes")
    p.add_argument("--master-addr", metavar="ADDR", help="the address of node 0, with --nnodes")
    p.add_argument("--master-port", type=_positive_int, metavar="PORT", help="a free port on node 0 (default 29500)")
    p.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint in output_dir")
    p.set_defaults(handler=_train)


def _train(args: argparse.Namespace) -> int:
    from .job import demo_job_path, load_job

    path = Path(args.job) if args.job is not None else demo_job_path()
    job = load_job(path, _job_sets(args.set))
    nproc = args.nproc_per_node or job.launch.nproc_per_node
    nnodes = args.nnodes or job.launch.nnodes
    node_rank = args.node_rank or 0
    if nnodes > 1 and (args.node_rank is None or args.master_addr is None):
        _error(f"{nnodes} nodes: give each node's launch --node-rank R and --master-addr of node 0 (and --master-port)")
        return 2
    if node_rank >= nnodes:
        _error(f"--node-rank {node_rank}: expected 0 to {nnodes - 1} for {nnodes} nodes")
        return 2
    if job.launch.device_mapping is not None and len(job.launch.device_mapping) != nproc * nnodes:
        _error(
            f"{path}: launch.device_mapping lists {len(job.launch.device_mapping)} devices for "
            f"{nnodes} node(s) x {nproc} process(es)"
        )
        return 2

    found = job.validate(world_size=nproc * nnodes)
    errors = [d for d in found if d.severity == "error"]
    for d in found:
        if d.severity == "warning":
            print(f"dsbuild: warning: {path}: {d}", file=sys.stderr)
    if errors:
        for d in errors:
            _error(f"{path}: {d}")
        _error(f"not started: {_plural(len(errors), 'error')}")
        return 1

    from . import train as runner

    try:
        runner.preflight(job)  # the model config, the tokenizer and the data, before any process starts
    except ConfigError as e:
        raise e if e.source else e.with_source(str(path)) from None
    env = _launch_env(job, node_rank, nnodes)
    if nproc * nnodes == 1 and args.master_port is None:
        os.environ.update(env)
        runner.run(job, resume=args.resume, log=lambda text: print(f"dsbuild: {text}", file=sys.stderr))
    else:
        code = _torchrun(args, path, job, nproc=nproc, nnodes=nnodes, node_rank=node_rank, env=env)
        if code != 0:
            return code
    if node_rank == 0:
        for line in runner.summary_lines(job):
            _out(line)
    else:
        _out(f"node {node_rank}: done; node 0 has the outputs in {job.output_dir}")
    return 0


def _launch_env(job: Job, node_rank: int, nnodes: int) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` for this node from ``launch.device_mapping`` (nothing without one)."""
    gpus_per_node = None
    if job.launch.device_mapping is None:
        return {}
    if nnodes > 1 and job.launch.gpus_per_node is None:
        import torch

        gpus_per_node = torch.cuda.device_count() or None
    devices = job.launch.local_devices(node_rank, gpus_per_node)
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices or ()))}


def _torchrun(
    args: argparse.Namespace,
    path: Path,
    job: Job,
    *,
    nproc: int,
    nnodes: int,
    node_rank: int,
    env: dict[str, str],
) -> int:
    """Start this node's processes with torchrun; on failure, show the failing rank's last stderr lines."""
    import subprocess

    log_dir = job.output_dir / "logs" / "torchrun" / f"node{node_rank}"
    log_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    if nnodes == 1 and args.master_port is None:
        cmd.append("--standalone")  # a free port of its own
    else:
        cmd += ["--nnodes", str(nnodes), "--node-rank", str(node_rank)]
        cmd += ["--master-addr", args.master_addr or "127.0.0.1", "--master-port", str(args.master_port or 29500)]
    # Every rank's output goes to a file; rank 0 of the node is also shown here.
    cmd += ["--log-dir", str(log_dir), "--tee", "3", "--local-ranks-filter", "0"]
    cmd += ["-m", "dsbuild.train", str(path), *(f"--set={text}" for text in args.set)]
    if args.resume:
        cmd.append("--resume")
    before = {p.name for p in log_dir.iterdir()}
    try:
        code = subprocess.call(cmd, env={**os.environ, **env})
    except KeyboardInterrupt:
        return 130
    if code != 0:
        _error(f"training failed: torchrun exited with {code}")
        runs = [p for p in log_dir.iterdir() if p.is_dir() and p.name not in before]
        for line in _failure_report(max(runs, key=lambda p: p.stat().st_mtime) if runs else None):
            print(line, file=sys.stderr)
    return code


def _failure_report(run_dir: Path | None, tail: int = 15) -> list[str]:
    """The failed ranks of a torchrun run (those that wrote an error file, first failure first) and their last stderr lines."""
    if run_dir is None:
        return []
    ranks = sorted((p for p in run_dir.glob("attempt_*/*") if p.is_dir()), key=lambda p: p.name)
    failed: list[tuple[str, Path, str]] = []
    for rank_dir in ranks:
        error = rank_dir / "error.json"
        if error.is_file():
            try:
                info = json.loads(error.read_text(encoding="utf-8")).get("message", {})
                stamp = str(info.get("extraInfo", {}).get("timestamp", ""))
                said = str(info.get("message", "")).strip().splitlines()
            except (OSError, ValueError, AttributeError):
                stamp, said = "", []
            failed.append((stamp, rank_dir, said[-1] if said else ""))
    if not failed:  # killed, or died before Python could record anything: show every rank
        failed = [("", rank_dir, "") for rank_dir in ranks]
    lines = []
    shown: set[str] = set()
    for _, rank_dir, message in sorted(failed, key=lambda f: f[0]):
        if message and message in shown:
            lines.append(f"dsbuild: error: local rank {rank_dir.name} failed the same way")
            continue
        shown.add(message)
        stderr = rank_dir / "stderr.log"
        try:
            text = stderr.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            text = []
        head = f"dsbuild: error: local rank {rank_dir.name} failed" + (f": {message}" if message else "")
        lines.append(head)
        if text:
            lines.append(f"  last lines of {stderr}:")
            lines.extend(f"    {line}" for line in text[-tail:])
    return lines


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


_COMMANDS: list[Callable[[Commands], None]] = [
    _add_presets,
    _add_show,
    _add_export,
    _add_validate,
    _add_explain,
    _add_plan,
    _add_doctor,
    _add_train,
]
"""Subcommands in ``--help`` order; ``explain``, ``plan``, ``doctor`` and ``train`` slot in here."""
