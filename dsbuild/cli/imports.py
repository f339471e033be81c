"""``dsbuild import trl``: a job file from a TRL config and its Accelerate config."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, Problem
from .args import Commands
from .output import error, escape, out, plural, said

if TYPE_CHECKING:
    from ..job.accelerate_import import Note

__all__ = ["add_import", "export_trl"]


def add_import(commands: Commands) -> None:
    p = commands.add_parser(
        "import",
        help="write the job file that runs what a TRL config runs (trl sft|dpo|grpo --config)",
        description=(
            "Write the job file that runs what `trl sft|dpo|grpo --config CONFIG.yaml`, launched with the Accelerate "
            "config --accelerate, would run: the model, the dataset, the trainer's arguments and the ds_config "
            "Accelerate's DeepSpeed plugin builds. Every key of the files is carried or named, with why not; the "
            "job is validated before it is written (exit 1 and nothing written when it fails its checks)."
        ),
    )
    p.add_argument("source", choices=("trl",), help="what the config is for: trl (TRL's scripts)")
    p.add_argument("config", metavar="CONFIG.yaml", help="the TRL config (trl sft --config CONFIG.yaml)")
    p.add_argument("-o", "--output", required=True, metavar="JOB", help="the job file to write (TOML, atomically)")
    p.add_argument("--accelerate", metavar="ACCELERATE.yaml", help="the Accelerate config TRL is launched with")
    p.add_argument("--deepspeed", metavar="DS.json", help="a ds_config file (the trainer's deepspeed argument)")
    p.add_argument("--task", choices=("sft", "dpo", "grpo"), help="the TRL script (default: from the config's keys)")
    p.add_argument(
        "--format",
        dest="data_format",
        metavar="FORMAT",
        help="the [data] format of SFT records: text, messages, prompt_completion, ... (TRL tells it at run time)",
    )
    p.add_argument("--force", action="store_true", help="write over an existing JOB")
    p.set_defaults(handler=_import)


def _import(args: argparse.Namespace) -> int:
    from .._util.atomic import write_atomic
    from ..io.config_files import read_table
    from ..job import Job
    from ..job.trl_import import import_job, task_fields, task_of, trl_arguments

    output = Path(args.output)
    if output.exists() and not args.force:
        error(f"{output}: exists; give --force to write over it (nothing was written)")
        return 2
    if output.suffix.lower() != ".toml":
        error(f"{output}: a job file is written as TOML: name it .toml")
        return 2
    data = read_table(args.config)
    accelerate = read_table(args.accelerate) if args.accelerate else None
    task = args.task or task_of(data, task_fields())
    trl = trl_arguments(task, data, args.config)
    ds_file, ds_source = _ds_file(args, trl.given, accelerate)
    sources = {"accelerate": args.accelerate, "deepspeed": ds_source}
    try:
        imported = import_job(trl, accelerate, ds_file, data_format=args.data_format,
                              sources={k: v for k, v in sources.items() if v})  # fmt: skip
    except ConfigError as e:
        raise e if e.source else e.with_source(args.config) from None
    base = output.parent.resolve()
    try:
        job = Job.from_dict(imported.job, base_dir=base, source=str(output), name=output.stem)
        found = [d for d in job.validate() if d.severity == "error"]
    except ConfigError as e:
        found = list(e.problems)  # type: ignore[arg-type]
    _notes(imported.notes, args)
    if found:
        for item in found:
            error(f"{output}: {escape(said(item))}")
        error(f"not written: the job {task} would run fails its checks (as TRL would stop on it)")
        return 1
    write_atomic(output, _header(args, task) + _toml(imported.job))
    carried = len(imported.of("carried"))
    out(f"wrote {output} (task {task}; {plural(carried, 'key')} carried, {len(imported.of('not carried'))} not)")
    return 0


def _ds_file(
    args: argparse.Namespace, given: Mapping[str, Any], accelerate: Mapping[str, Any] | None
) -> tuple[Mapping[str, Any] | None, str | None]:
    """The ds_config TRL's run reads, and the file it came from: ``--deepspeed``, the trainer's ``deepspeed`` (a path,
    or the ds_config itself), Accelerate's ``deepspeed_config_file`` (a relative path read from where TRL runs:
    here)."""
    from ..io.config_files import read_table

    if isinstance(given.get("deepspeed"), Mapping) and not args.deepspeed:
        return given["deepspeed"], args.config
    plugin = (accelerate or {}).get("deepspeed_config") or {}
    named = plugin.get("deepspeed_config_file") if isinstance(plugin, Mapping) else None
    path = args.deepspeed or given.get("deepspeed") or named
    if path is None:
        return None, None
    if not isinstance(path, str):
        key = "deepspeed" if given.get("deepspeed") is not None else "deepspeed_config.deepspeed_config_file"
        source = args.config if key == "deepspeed" else args.accelerate
        raise ConfigError(Problem(key, "expected a path to a ds_config file"), source=source, checks=True)
    return read_table(path), path


def _notes(notes: list[Note], args: argparse.Namespace) -> None:
    """What was not carried, with why, then what changes nothing."""
    files = {"trl": args.config, "accelerate": getattr(args, "accelerate", None), "job": args.config}
    for kind in ("not carried", "no effect"):
        chosen = [n for n in notes if n.kind == kind]
        if chosen:
            out(f"{kind} ({len(chosen)}):")
        for n in chosen:
            instead = f" ({n.instead})" if n.instead else ""
            out(escape(f"  {files.get(n.file) or n.file}: {n.key} = {n.value!r}: {n.why}{instead}"))


def _header(args: argparse.Namespace, task: str) -> str:
    made = f"dsbuild import trl {args.config}" + (f" --accelerate {args.accelerate}" if args.accelerate else "")
    return f"# {made} (trl {task}); what was not carried was said when it was written\n"


def _toml(job: Mapping[str, Any]) -> str:
    import tomli_w

    def plain(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: plain(v) for k, v in value.items() if v is not None}
        return [plain(v) for v in value] if isinstance(value, (list, tuple)) else value

    return tomli_w.dumps(plain(job))


def export_trl(args: argparse.Namespace) -> int:
    """``dsbuild export JOB --for trl -o trl.yaml``: the TRL config, ``trl.accelerate.yaml`` and
    ``trl.ds_config.json`` (``--ds-config``), each written atomically; what TRL has no key for is said."""
    from .._util.atomic import write_atomic
    from ..interop import accelerate_config, to_yaml, zero_stage
    from ..job.trl_export import trl_config
    from .common import job_of

    output = Path(args.output)
    if output.suffix.lower() not in (".yaml", ".yml"):
        error(f"{output}: --for trl writes TRL's config: name it .yaml or .yml")
        return 2
    job = job_of(args.config, args.set)
    if job is None:
        error(f"{args.config}: --for trl exports a job file (TRL's config holds the model and data too)")
        return 2
    ds_path = Path(args.ds_config) if args.ds_config else output.with_name(f"{output.stem}.ds_config.json")
    accelerate_path = output.with_name(f"{output.stem}.accelerate.yaml")
    config, notes = trl_config(job)
    job.config.to_json(ds_path)  # its "auto": TRL's Trainer fills them from the same arguments the job's run does
    settings = accelerate_config(str(ds_path), num_processes=job.launch.world_size, num_machines=job.launch.nnodes,
                                 zero3_init=zero_stage(job.config) == 3)  # fmt: skip
    write_atomic(accelerate_path, to_yaml(settings))
    write_atomic(output, to_yaml(config))
    _notes(notes, args)
    task = job.task
    out(f"wrote {output}, {accelerate_path}, {ds_path}  (accelerate launch --config_file {accelerate_path} "
        f"$(which trl) {task} --config {output})")  # fmt: skip
    return 0
