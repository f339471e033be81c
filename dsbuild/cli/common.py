"""What several commands share: naming a config (file, preset or job), ``--set``, the run's facts, formats."""

from __future__ import annotations

import argparse
import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from .._util import dotted
from .._util.overrides import parse_set
from ..api import Config
from ..config.walk import leaves
from ..errors import ConfigError, DsbuildError, Problem, UnresolvedAutoError
from ..interop import for_accelerate, with_deepspeed_scheduler
from ..io.config_files import config_ref, read_dict, read_table, to_config
from ..job import Job, looks_like_job, read_job_dict
from ..resolve.resolution import model_hidden_size
from ..resolve.training import Training
from ..run.checks import validate_job
from ..validate import Diagnostic, validate
from ..validate.deepspeed_verdict import deepspeed_verdict

logger = logging.getLogger("dsbuild")

__all__ = [
    "as_diagnostics",
    "as_path",
    "diagnose",
    "for_accelerate_of",
    "job_in",
    "job_of",
    "job_sets",
    "load_problems",
    "load_ref",
    "load_with_sets",
    "no_training_file",
    "raw_with_sets",
    "render",
    "resolved",
    "resolved_job",
    "with_sets",
]


def diagnose(
    ref: str,
    *,
    strict: bool,
    world_size: int | None,
    target: str,
    sets: Sequence[str] = (),
    deepspeed: bool = False,
) -> list[Diagnostic]:
    """Diagnostics of one config or job; a value ``from_dict`` rejects is an error diagnostic, not an unreadable file.

    ``deepspeed``: DeepSpeed's own parser's verdict too, on what dsbuild would hand it (the file as it is when
    dsbuild cannot read its values), at ``world_size`` (default 1).
    """
    path = as_path(ref)
    table = job_data(path) if path is not None else None
    if path is not None and table is not None:
        return diagnose_job(path, table, sets, world_size, deepspeed=deepspeed)
    if sets:
        raise ConfigError(f"{ref}: --set applies to job files; this is a ds_config (edit it, or use export --set)")
    if path is None:
        config = Config.preset(ref)
        data = config.to_dict()
        found = validate(config, world_size=world_size, target=target)
    else:
        data, _ = read_dict(path)
        try:
            config = to_config(data, strict=strict, source=str(path), cls=Config)
        except ConfigError as e:
            found = as_diagnostics(e)
        else:
            found = validate(config, world_size=world_size, target=target)
    if deepspeed:  # the file as written (after extends): a key dsbuild only warns about reaches DeepSpeed too
        found += deepspeed_verdict(data, world_size or 1)
    return found


def diagnose_job(
    path: Path, data: dict[str, object], sets: Sequence[str], world_size: int | None, *, deepspeed: bool = False
) -> list[Diagnostic]:
    """A job's problems: what the file gets wrong (unknown keys, bad values), else its config resolved for the run
    (and with ``deepspeed``, DeepSpeed's verdict on that resolved config)."""
    with_sets(data, sets)
    try:
        job = job_in(path, data)
    except ConfigError as e:
        return as_diagnostics(e)
    return validate_job(job, world_size=world_size, deepspeed=deepspeed)


def as_diagnostics(e: ConfigError) -> list[Diagnostic]:
    """The values ``from_dict`` rejects, as ``validate`` lists them: one error diagnostic per problem."""
    return [Diagnostic(p.path, "error", p.message, p.hint, needs=p.needs) for p in e.problems]


def load_problems(ref: str, sets: Sequence[str]) -> list[Diagnostic]:
    """The values of ``ref`` (``--set`` applied) that do not load, as ``validate`` lists them; ``[]`` when it loads.

    Unreadable input and a bad ``--set`` raise, as they do when loading.
    """
    path = as_path(ref)
    table = job_data(path) if path is not None else None
    load: Callable[[], object]  # read first, outside the try: only what the reader refuses is a problem here
    if path is not None and table is not None:
        load = functools.partial(job_in, path, with_sets(table, sets))
    else:
        data, source, label, _ = raw_with_sets(ref, sets)
        load = functools.partial(to_config, data, source=source, label=label, cls=Config)
    try:
        load()
    except ConfigError as e:
        return as_diagnostics(e)
    return []


def as_path(ref: str) -> Path | None:
    """``ref`` as a file path, or ``None`` when it names a preset (``io.config_ref``: the one rule)."""
    return config_ref(ref)


def load_ref(ref: str, *, lenient: bool = False) -> Config:
    """A config file, a preset by name, or a job file's config (``Job.config``: its strategy, [training] filled in).

    ``lenient``: a file read as ``validate`` reads it and judged as it judges it (``judged``): its warnings on
    stderr, its errors a ``ConfigError``, so ``validate``, ``explain`` and ``doctor`` agree on every file."""
    job = job_of(ref, ())
    if job is not None:
        return job.config
    path = as_path(ref)
    if path is None:
        return Config.preset(ref)
    config = Config.load(path, strict=not lenient)
    return judged(config, str(path)) if lenient else config


def judged(config: Config, where: str) -> Config:
    """``config`` when ``validate`` finds no error in it (its warnings printed as ``dsbuild: warning:`` lines naming
    ``where``); else ``ConfigError`` listing its errors, as ``validate`` words them (exit 1)."""
    from .output import said, warning

    found = validate(config)
    errors = [Problem(d.path, d.message, d.hint, needs=d.needs) for d in found if d.severity == "error"]
    if errors:
        raise ConfigError(errors, source=where, checks=True)
    for d in found:
        warning(f"{where}: {said(d)}")
    return config


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


def with_sets(table: dict[str, object], sets: Sequence[str]) -> dict[str, object]:
    """A job file's table with ``--set`` applied (in place)."""
    for key, value in job_sets(sets).items():
        dotted.put(table, key, value)
    return table


def job_in(path: Path, table: dict[str, object]) -> Job:
    """The job of job file ``path``'s table; ``ConfigError`` lists every value it refuses."""
    return Job.from_dict(table, base_dir=path.parent, source=str(path), name=path.stem)


def job_of(ref: str, sets: Sequence[str]) -> Job | None:
    """The job ``ref`` names (with ``--set`` applied), or ``None`` when it is a preset or a ds_config file."""
    path = as_path(ref)
    table = job_data(path) if path is not None else None
    if path is None or table is None:
        return None
    job = job_in(path, with_sets(table, sets))
    for prefix in ("strategy.config.", "strategy.overrides."):
        marks = {k.removeprefix(prefix): v for k, v in job_sets(sets).items() if k.startswith(prefix)}
        if marks:
            strategy = attrs.evolve(job.strategy, config=set_by_flag(job.strategy.config, marks, prefix))
            job = attrs.evolve(job, strategy=strategy, config=set_by_flag(job.config, marks, prefix))
    return job


def set_by_flag(config: Config, values: Mapping[str, object], prefix: str = "") -> Config:
    """``config`` with each key set on the command line (``--set PREFIX.KEY=...``) said so in its provenance (for
    ``explain``)."""
    marks = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            marks.update({f"{key}.{path}": f"--set {prefix}{key}" for path, _ in leaves(value)})
        else:
            marks[key] = f"--set {prefix}{key}"
    return attrs.evolve(config, provenance={**config.provenance, **marks})


def no_training_file(args: argparse.Namespace) -> None:
    if getattr(args, "training", None) is not None:
        raise ConfigError(f"{args.config}: a job has its own [training]: change it with --set training.KEY=VALUE")


def resolved_job(job: Job, args: argparse.Namespace) -> Config:
    return job.resolve(world_size=args.world_size, hidden_size=hidden_size(args), total_steps=args.total_steps)


def hidden_size(args: argparse.Namespace) -> int | None:
    """``--hidden-size``, else the hidden size in ``--model``'s config.json (read safely; a ``ConfigError`` if not
    there), else ``None``."""
    if args.hidden_size is not None or args.model is None:
        return args.hidden_size  # type: ignore[no-any-return]
    model = Path(args.model)
    file = model / "config.json" if model.is_dir() else model
    found = model_hidden_size(read_table(file))
    if isinstance(found, str):
        raise ConfigError(f"{file}: {found}")
    return found


def load_with_sets(ref: str, sets: Sequence[str], *, lenient: bool = False) -> tuple[Config, dict[str, object]]:
    """The config of ``ref`` with ``--set`` overrides applied, and the ``training.*`` ones apart (``lenient``: as
    ``load_ref``)."""
    data, source, label, training = raw_with_sets(ref, sets)
    config = to_config(data, strict=not lenient, source=source, label=label, cls=Config)
    if lenient and as_path(ref) is not None:  # a file (a preset is a part, completed by other options)
        config = judged(config, source)
    flags = {key: value for key, value in job_sets(sets).items() if not key.startswith("training.")}
    return set_by_flag(config, flags), training


def raw_with_sets(ref: str, sets: Sequence[str]) -> tuple[dict[str, Any], str, str, dict[str, object]]:
    """The raw ds_config of ``ref`` (a file or a preset) with the ``--set`` overrides applied, where it came from
    (for errors), the label its config gets, and the ``training.*`` overrides apart."""
    training: dict[str, object] = {}
    overrides: list[tuple[str, object]] = []
    for text in sets:
        key, value = parse_set(text)
        section, _, name = key.partition(".")
        if section == "training" and name and "." not in name:
            training[name] = value
        else:
            overrides.append((key, value))
    path = as_path(ref)
    if path is None:
        source = label = f"preset {ref}"
        data = Config.preset(ref).to_dict()
    else:
        source, label = str(path), f"file {path}"
        data, _ = read_dict(path)
    for key, value in overrides:
        dotted.put(data, key, value)
    return data, source, label, training


def resolved(args: argparse.Namespace, *, hf_defaults: bool = False) -> Config:
    """The config of ``args.config`` resolved with the run's facts the options give; ``hf_defaults``: without training
    arguments, the HF Trainer's defaults (``TrainingArguments()``), as the Trainer always has them."""
    config, overrides = load_with_sets(args.config, args.set, lenient=hf_defaults)
    training = _training_of(args, overrides)
    if training is None and hf_defaults:
        logger.info('no training arguments given: the HF Trainer\'s defaults fill the "auto" values they fill')
        training = Training()
    try:
        return config.resolve(
            world_size=args.world_size or 1,
            training=training,
            hidden_size=hidden_size(args),
            total_steps=args.total_steps,
        )
    except UnresolvedAutoError:
        raise  # a fact the command was not given: exit 2
    except ConfigError as e:  # the config's values fail their checks at this world size (as validate says): exit 1
        raise e.failing_checks() from None


def for_accelerate_of(args: argparse.Namespace, job: Job | None) -> Config:
    """The config of ``args.config`` (or of its job) for Accelerate (``interop.for_accelerate``), with the run's facts:
    a job's, else those the options give."""
    if job is None:
        config, overrides = load_with_sets(args.config, args.set)
        return for_accelerate(
            config,
            world_size=args.world_size or 1,
            training=_training_of(args, overrides),
            hidden_size=hidden_size(args),
            total_steps=args.total_steps,
        )
    try:
        return for_accelerate(
            with_deepspeed_scheduler(job.config, job.training.lr_scheduler_type),
            world_size=args.world_size or job.launch.world_size,
            training=job.training,
            hidden_size=hidden_size(args) or job.model.hidden_size,
            total_steps=args.total_steps,
        )
    except ConfigError as e:  # named as Job.resolve names them: under strategy.config, in the job file
        error = e.prefixed("strategy.config")
        raise error.with_source(job.source) if job.source else error from None


def _training_of(args: argparse.Namespace, overrides: Mapping[str, object]) -> Training | None:
    """The training arguments of ``--training FILE`` and the ``--set training.NAME=VALUE`` ``overrides``, if any."""
    fields: dict[str, object] = {}
    if args.training is not None:
        path = Path(args.training)
        fields.update(read_table(path))
        table = fields.get("training")
        if isinstance(table, dict):  # a job file's [training] table
            fields = dict(table)
    fields.update(overrides)
    try:
        return Training.from_dict(fields) if fields else None
    except ConfigError as e:  # read: its values fail the checks
        raise e.failing_checks() from None


def render(config: Config, fmt: str) -> str:
    data = config.to_dict()
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    import tomli_w

    try:
        return tomli_w.dumps(data)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"cannot be written as TOML: {e} (use --format json)") from None
