"""Everything ``dsbuild validate JOB`` checks, for a library user too: the job's config resolved for the run, the
model config against its transformers class, the local data read, checked and tokenized as ``dsbuild train`` reads
it before launch (a hub model must be in the local cache; a hub dataset is not fetched), and on request DeepSpeed's
own verdict on the resolved config.

``Job.validate`` checks the config only: the model and the data are read by the layers above the job (``run.model``,
``data``), so the whole check lives here, beside what runs the job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._util import dotted
from ..env.extras import missing
from ..errors import ConfigError
from ..job import Job
from ..validate import Diagnostic
from ..validate.deepspeed_verdict import deepspeed_verdict
from .model import model_problems

__all__ = ["launch_checks", "parallel_problems", "refused", "staging_problems", "validate_job"]


def validate_job(job: Job, *, world_size: int | None = None, deepspeed: bool = False) -> list[Diagnostic]:
    """Every problem ``dsbuild validate JOB`` reports, errors and warnings, paths dotted from the job's tables: what
    ``dsbuild train`` checks before launch (``launch_checks``), and on request DeepSpeed's verdict.

    ``world_size``: the run's processes (default: the job's ``[launch]``). ``deepspeed``: also DeepSpeed's own
    parser's verdict on the resolved config (imports DeepSpeed). A package the check needs that is not installed is a
    warning naming the ``pip install``, not an error. A hub model must be in the local cache (the hub is not asked).
    """
    found, _ = launch_checks(job, world_size=world_size, hub=False)
    if deepspeed:
        world = world_size or job.launch.world_size
        try:
            config = job.resolve(world_size=world)
        except ConfigError as e:
            why = "; ".join(str(p) for p in e.problems)
            found.append(
                Diagnostic("", "warning", f"deepspeed: not asked: the config resolves only in the run ({why})")
            )
        else:
            found += deepspeed_verdict(config.to_dict(), world)
    return found


def launch_checks(job: Job, *, world_size: int | None = None, hub: bool = True) -> tuple[list[Diagnostic], Any]:
    """Everything checked before any process of a run starts, and the tokenized data when it was made on the way
    (``run.worker.Datasets``, or ``None``): the config resolved for the run, what dsbuild refuses to run, the model
    config against its transformers class and where its weights are (``hub``: a hub id may be fetched at launch;
    else it must be in the local cache), sequence parallelism against the model, and every data record.
    ``dsbuild validate`` and ``dsbuild train`` both run exactly this."""
    world = world_size or job.launch.world_size
    found = job.validate(world_size=world)
    found += refused(job)
    if missing("transformers"):
        found.append(
            Diagnostic("model", "warning", "not checked: transformers is not installed", "pip install 'dsbuild[train]'")
        )
        return found, None
    problems = model_problems(job.model, hub=hub)
    found += [Diagnostic(p.path, "error", p.message, p.hint) for p in problems]
    if not problems:
        found += parallel_problems(job, world)
    if not problems and job.training.async_save:
        found += staging_problems(job, world)
    more, data = _data_checks(job, tokenize=not problems)
    return found + more, data


def refused(job: Job) -> list[Diagnostic]:
    """What the run would not do as its config says: a feature dsbuild refuses (``feature_table.REFUSED``, and the
    ``checkpoint.writer`` settings no machine runs), DeepSpeed's fast checkpoint writer where its ``async_io`` op
    cannot be built, DeepCompile on an accelerator without its op (DeepSpeed's CPU accelerator)."""
    from ..validate.feature_table import refusals

    ds_config = job.config.to_dict()
    found = [Diagnostic(p.path, "error", p.message, p.hint) for p in refusals(ds_config)]
    checkpoint = ds_config.get("checkpoint")
    writer = checkpoint.get("writer") if isinstance(checkpoint, dict) else None
    if writer is not None and not found and not missing("deepspeed"):
        # The Session's package imports torch: only a job with a checkpoint.writer section pays for its check.
        from ..session.writers import fast_writer_refusal  # DeepSpeed's op builders: only for the fast writer

        reason = fast_writer_refusal(ds_config)
        hint = 'set checkpoint.writer.type = "python" for plain file writes, or remove checkpoint.writer'
        found += [Diagnostic("checkpoint.writer.type", "error", reason, hint)] if reason else []
    if job.config.compile is None or job.config.compile.deepcompile is not True or missing("torch"):
        return found
    from ..session.setup import deepcompile_refusal  # torch: only a job that asks for DeepCompile pays for it

    reason = deepcompile_refusal(ds_config)
    return [*found, Diagnostic("compile.deepcompile", "error", reason)] if reason else found


def staging_problems(job: Job, world_size: int) -> list[Diagnostic]:
    """``training.async_save``: the copy each checkpoint takes in CPU memory (``planner.checkpoint_copy``, for the
    job's model, ZeRO stage and processes) against what this node has available; nothing where the model cannot be
    counted here (a hub model not in the cache: the run counts it at its start)."""
    from ..errors import DsbuildError
    from ..planner import Precision, count_params, staging
    from ..planner.checkpoint_copy import REFUSAL_HINT, available_memory
    from ..planner.checkpoint_copy import refusal as staging_refusal
    from ..planner.count import count_lora

    model = dict(job.model.config) if job.model.config is not None else job.model.name_or_path
    try:
        total = count_params(model).params
        trained = count_lora(model, job.model.lora.to_peft()) if job.model.lora is not None else total
    except (DsbuildError, OSError, ValueError, ImportError):  # a hub model not cached: the run counts it at start
        return []
    zero = job.config.zero_optimization
    stage = zero.stage if zero is not None and isinstance(zero.stage, int) else 0
    precision = Precision.of(job.config, job.model.dtype if isinstance(job.model.dtype, str) else None)
    copy = staging(stage, trained, world_size, job.launch.nproc_per_node, precision)
    reason = staging_refusal(copy, available_memory())
    return [Diagnostic("training.async_save", "error", reason, REFUSAL_HINT)] if reason else []


def parallel_problems(job: Job, world_size: int) -> list[Diagnostic]:
    """What the job's model cannot do with its sequence parallelism (its attention, its heads, the world size), found
    from its config before any process starts (transformers is imported)."""
    from ..resolve.batch import degrees

    sp, tp = degrees(job.config)
    if sp == 1 and tp == 1:
        return []
    table = "strategy.overrides" if dotted.sets(job.strategy.overrides, "sequence_parallel_size") else "strategy.config"
    found = []
    if tp > 1 and job.model.lora is not None:
        found.append(Diagnostic("model.lora", "error", "LoRA with tensor_parallel.autotp_size: train LoRA with ZeRO"))
    if sp > 1 and tp > 1:
        found.append(
            Diagnostic(f"{table}.sequence_parallel_size", "error", "with tensor_parallel.autotp_size: one or the other")
        )
    if sp > 1 and job.data.padding_free:
        found.append(
            Diagnostic(
                "data.padding_free",
                "error",
                "with sequence parallelism: DeepSpeed's Ulysses attention is built for per_device_train_batch_size "
                "rows, and a padding-free micro-batch is one row (filling the rest would repeat it)",
                "set padding_free = false (pad, or pack the samples)",
            )
        )
    if sp > 1:
        from ..session.building import pretrained_config
        from ..session.parallel import problems
        from .model import model_source

        config = pretrained_config(model_source(job.model))
        attn = job.model.attn_implementation or getattr(config, "_attn_implementation", None) or "sdpa"
        found += [
            Diagnostic(f"{table}.sequence_parallel_size", "error", r) for r in problems(config, sp, world_size, attn)
        ]
    return found


def _data_checks(job: Job, *, tokenize: bool) -> tuple[list[Diagnostic], Any]:
    """A job's local data checked as before launch (a hub dataset is not fetched): each bad record an error naming
    its file and line; with ``tokenize`` (the model is sound) also tokenized, where the tokenizer is at hand, so data
    with nothing to train on is found here too. The problems, and the tokenized data when made."""
    if missing("datasets"):
        return [
            Diagnostic("data", "warning", "not checked: datasets is not installed", "pip install 'dsbuild[train]'")
        ], None
    if not isinstance(job.data.path, Path):
        return [], None
    from ..data import check
    from .worker import preflight

    try:
        if not tokenize:
            check(job.data)  # the model config failed its checks: its vocabulary size is not known
            return [], None
        made = preflight(job)
    except ConfigError as e:
        where = f"{e.source}: " if e.source else ""
        return [Diagnostic(p.path or "data.path", "error", where + p.message, p.hint) for p in e.problems], None
    if made is None:
        return [], None
    found = [Diagnostic("data.max_length", "warning", cut) for cut in made.cut]
    if made.stop:
        found.append(Diagnostic("data.assistant_only_loss", "warning", made.stop))
    return found, made
