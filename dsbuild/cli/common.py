"""What several commands share: naming a config (file, preset or job), ``--set``, the run's facts, formats."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeAlias

from ..api import Config
from ..errors import ConfigError, DsbuildError
from ..io import SUFFIXES, parser_for, read_dict, read_text, to_config
from ..job import Job, load_job, looks_like_job, read_job_dict
from ..overrides import parse_set, set_dotted
from ..presets import preset_names
from ..training import Training
from ..validate import Diagnostic, validate

__all__ = [
    "CONSUMERS",
    "FORMATS",
    "TARGETS",
    "Commands",
    "add_run_facts",
    "add_target",
    "as_path",
    "diagnose",
    "job_of",
    "job_sets",
    "load_ref",
    "load_with_sets",
    "no_training_file",
    "non_negative_int",
    "positive_int",
    "render",
    "resolved",
    "resolved_job",
]

FORMATS = ("json", "toml")

TARGETS = ("deepspeed", "hf")

CONSUMERS = ("deepspeed", "hf", "accelerate")

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def diagnose(
    ref: str, *, strict: bool, world_size: int | None, target: str, sets: Sequence[str] = ()
) -> list[Diagnostic]:
    """Diagnostics of one config or job; a value ``from_dict`` rejects is an error diagnostic, not an unreadable file."""
    path = as_path(ref)
    table = job_data(path) if path is not None else None
    if path is not None and table is not None:
        return diagnose_job(path, table, sets, world_size)
    if sets:
        raise ConfigError(f"{ref}: --set applies to job files; this is a ds_config (edit it, or use export --set)")
    if path is None:
        return validate(Config.preset(ref), world_size=world_size, target=target)
    data, _ = read_dict(path)
    try:
        config = to_config(data, strict=strict, source=str(path), cls=Config)
    except ConfigError as e:
        return [Diagnostic(p.path, "error", p.message, p.hint) for p in e.problems]
    return validate(config, world_size=world_size, target=target)


def diagnose_job(path: Path, data: dict[str, object], sets: Sequence[str], world_size: int | None) -> list[Diagnostic]:
    """A job's problems: what the file gets wrong (unknown keys, bad values), else its config resolved for the run."""
    for key, value in job_sets(sets).items():
        set_dotted(data, key, value)
    try:
        job = Job.from_dict(data, base_dir=path.parent, source=str(path), name=path.stem)
    except ConfigError as e:
        return [Diagnostic(p.path, "error", p.message, p.hint) for p in e.problems]
    return job.validate(world_size=world_size)


def as_path(ref: str) -> Path | None:
    """``ref`` as a file path, or ``None`` when it names a preset."""
    path = Path(ref)
    # A suffix or a directory part means a file; a bare word is a preset unless only a file has that name.
    if path.suffix.lower() in SUFFIXES or os.sep in ref or "/" in ref:
        return path
    if ref in preset_names() or not path.exists():
        return None
    return path


def load_ref(ref: str) -> Config:
    """A config file, or a preset by name."""
    path = as_path(ref)
    return Config.preset(ref) if path is None else Config.load(path)


def job_data(path: Path) -> dict[str, object] | None:
    """The raw table of a job file, or ``None`` when ``path`` is not one (a ds_config, or unreadable: reported later)."""
    try:
        data = read_job_dict(path)
    except DsbuildError:
        return None
    return data if looks_like_job(data) else None


def job_sets(sets: Sequence[str]) -> dict[str, object]:
    """``--set`` values by dotted key."""
    return dict(parse_set(text) for text in sets)


def job_of(ref: str, sets: Sequence[str]) -> Job | None:
    """The job ``ref`` names (with ``--set`` applied), or ``None`` when it is a preset or a ds_config file."""
    path = as_path(ref)
    if path is None or job_data(path) is None:
        return None
    return load_job(path, job_sets(sets))


def no_training_file(args: argparse.Namespace) -> None:
    if getattr(args, "training", None) is not None:
        raise ConfigError(f"{args.config}: a job has its own [training]: change it with --set training.KEY=VALUE")


def resolved_job(job: Job, args: argparse.Namespace) -> Config:
    return job.resolve(world_size=args.world_size, hidden_size=args.hidden_size, total_steps=args.total_steps)


def load_with_sets(ref: str, sets: Sequence[str]) -> tuple[Config, dict[str, object]]:
    """The config of ``ref`` with ``--set`` overrides applied, and the ``training.*`` ones apart."""
    training: dict[str, object] = {}
    overrides: list[tuple[str, object]] = []
    for text in sets:
        key, value = parse_set(text)
        section, _, name = key.partition(".")
        if section == "training" and name and "." not in name:
            training[name] = value
        else:
            overrides.append((key, value))
    if not overrides:
        return load_ref(ref), training
    path = as_path(ref)
    if path is None:
        data, source = Config.preset(ref).to_dict(), f"preset {ref}"
    else:
        data, _ = read_dict(path)
        source = str(path)
    for key, value in overrides:
        set_dotted(data, key, value)
    return to_config(data, source=source, label=f"{source} with --set", cls=Config), training


def add_run_facts(p: argparse.ArgumentParser) -> None:
    """The facts ``resolve`` needs: world size, training arguments, hidden size, total steps."""
    p.add_argument(
        "--world-size", type=positive_int, metavar="N", help="number of processes (default: a job's, else 1)"
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
    p.add_argument("--hidden-size", type=positive_int, metavar="H", help="the model's hidden size")
    p.add_argument("--total-steps", type=positive_int, metavar="N", help="optimizer steps of the run")


def resolved(args: argparse.Namespace) -> Config:
    """The config of ``args.config`` resolved with the run's facts the options give."""
    config, overrides = load_with_sets(args.config, args.set)
    fields: dict[str, object] = {}
    if args.training is not None:
        path = Path(args.training)
        fields.update(parser_for(path, str(path))(read_text(path), path))
        table = fields.get("training")
        if isinstance(table, dict):  # a job file's [training] table
            fields = dict(table)
    fields.update(overrides)
    training = Training.from_dict(fields) if fields else None
    return config.resolve(
        world_size=args.world_size or 1, training=training, hidden_size=args.hidden_size, total_steps=args.total_steps
    )


def render(config: Config, fmt: str) -> str:
    data = config.to_dict()
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    import tomli_w

    try:
        return tomli_w.dumps(data)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"cannot be written as TOML: {e} (use --format json)") from None


def add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default="deepspeed",
        help='who reads the config: "deepspeed" as is (default) or "hf", the HF Trainer / Accelerate, which fill "auto"',
    )


def _int_at_least(least: int, expected: str) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``least`` (``expected`` names it in the error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


positive_int = _int_at_least(1, "a positive integer")
non_negative_int = _int_at_least(0, "an integer >= 0")
