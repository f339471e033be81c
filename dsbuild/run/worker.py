"""The training run of ``dsbuild train``: one process of it, reading a job file and training its model.

``dsbuild train`` runs ``run(job)`` in its own process for a one-process job, and
starts ``python -m dsbuild.run.worker JOB --set KEY=VALUE ... [--resume]`` on every rank
through torchrun for more (``dsbuild.run.launch``). Each process:

1. reads the job (the same file and ``--set`` overrides on every rank),
2. builds the tokenizer and the data (the first rank of each node checks and tokenizes the records into
   ``datasets``' cache, the others then read it; each rank trains on its share),
3. builds the model inside ``Session.from_pretrained`` (``zero.Init`` at ZeRO-3, LoRA with peft),
4. with ``--resume``, loads the latest complete checkpoint (engine, data position, RNG),
5. trains with ``Session.fit``: checkpoints every ``save_steps`` (``save_total_limit`` kept),
   evaluation every ``eval_steps``, metrics to DeepSpeed's monitors,
6. saves the model (HF format, or the LoRA adapters) and, on rank 0, ``history.json``
   and ``loss.png``.

Importing this module is light; torch, DeepSpeed, transformers, peft and matplotlib
are imported by the functions that need them. What is worth telling goes to the
``dsbuild`` logger (rank 0 only); the CLI prints it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from ..data import Datasets
from ..job import BYTE_TOKENIZER, Job
from ..outputs import history
from ..outputs.history import read as read_history
from ..outputs.manifest import candidates, fingerprint, read_latest, sha256_file
from ..outputs.plot import Plotter
from ..outputs.run_folder import RunFolder
from ..resolve.schedule import job_steps, steps_between
from .model import build_tokenizer, config_checked, model_source, vocab_size
from .tasks import task_of

if TYPE_CHECKING:
    from ..session.loop import Hooks as SessionHooks

logger = logging.getLogger("dsbuild")

__all__ = [
    "Hooks",
    "Prepared",
    "RunResult",
    "preflight",
    "prepare",
    "run",
    "summary_lines",
]


@attrs.frozen
class Hooks:
    """What a launcher other than torchrun adds to each rank's run (Ray's backend: ``dsbuild.run.ray_train``)."""

    restore: Path | None = None
    """A checkpoint's folder (``.../global_stepN``) to resume from, verified as ``--resume`` verifies: the
    launcher's latest checkpoint (Ray's, after a restart). It comes before ``resume``."""
    session: SessionHooks | None = None
    """The session's hooks (``dsbuild.session.loop.Hooks``): a call after each save, a save or a stop asked for."""


@attrs.frozen
class RunResult:
    """What a run did and where it wrote it."""

    history: list[dict[str, Any]]
    """The whole run's records (a resumed run's include the steps before the checkpoint)."""
    resumed_from: int | None
    """The optimizer step the run resumed at, or ``None``."""
    output_dir: Path


def preflight(job: Job) -> Datasets | None:
    """What can be checked before any process starts: the model config, every data record, and (with a tokenizer
    at hand: the byte one or a local one) that the data has tokens to train on. The tokenized data, when made."""
    from ..data import check, load

    config_checked(job.model)
    task_of(job).check(job)  # a GRPO job's functions found before any process starts
    vocab = vocab_size(job.model)
    if job.model.tokenizer == BYTE_TOKENIZER or (job.model.tokenizer and Path(job.model.tokenizer).exists()):
        # One process (the launcher, or validate): no process group, so nothing of the Session is imported.
        return load(job, build_tokenizer(job.model), vocab_size=vocab)
    check(job.data, vocab_size=vocab)
    return None


# -- data -------------------------------------------------------------------------------


def _datasets(job: Job, tokenizer: Any) -> Datasets:
    """Tokenized training and evaluation samples, and a note on what was cut or left out (or ``""``).

    Data none of whose samples has a token to train on is refused here, before any training: a run on it
    would only produce NaN losses. In a run of several processes the first process of each node loads and
    tokenizes first (into ``datasets``' cache on that node) while the others wait; they then read its cache.
    """
    from ..data import load
    from ..session import distributed

    several = distributed.world_size() > 1
    first_on_node = int(os.environ.get("LOCAL_RANK", "0")) == 0
    if several:
        distributed.init(job.training.ddp_timeout)  # the barrier needs it (Session.from_pretrained reuses it)
        if not first_on_node:
            distributed.barrier()
    try:
        return load(job, tokenizer, vocab_size=vocab_size(job.model))
    finally:
        if several and first_on_node:
            distributed.barrier()  # also when it failed: the others then fail the same way, instead of waiting


def data_fingerprint(job: Job) -> str:
    """A digest of the job's data as training sees it: the files' contents and how they are read."""
    spec = job.data
    parts: list[Any] = [spec.format, spec.max_length, spec.template, spec.text_field]
    # Options added later count only when set, so that a run that sets none keeps its fingerprint.
    more = {
        "columns": {key: name for key, name in spec.columns.items() if key != "text"},  # text_field is above
        "split": spec.split,
        "eval_split": spec.eval_split,
        "chat_template": spec.chat_template,
        "packing": spec.packing,
        "train_on_prompt": spec.train_on_prompt,
        "assistant_only_loss": spec.assistant_only_loss,
        "completion_only_loss": spec.completion_only_loss,
        "packing_strategy": spec.packing_strategy,
        "padding_free": spec.padding_free,
        "eos_token": spec.eos_token,
    }
    defaults = {
        "columns": {},
        "split": "train",
        "packing": False,
        "train_on_prompt": False,
        "assistant_only_loss": True,
        "completion_only_loss": True,
        "packing_strategy": "bfd",
        "padding_free": False,
    }
    set_now = {key: value for key, value in more.items() if value != defaults.get(key)}
    if set_now:
        parts.append(set_now)
    for path in (spec.path, spec.eval_path):
        parts.append(_source_digest(path) if path is not None else None)
    return fingerprint(*parts)


def _source_digest(path: Path | str) -> str:
    """A data file's digest; a folder's, of its files' names and digests; a hub id itself."""
    if not isinstance(path, Path):
        return f"hub:{path}"
    if path.is_file():
        return _file_digest(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path)}\0{_file_digest(file)}\0".encode())
    return digest.hexdigest()


_WHOLE: Final = 256 * 2**20
"""Data files up to this size are hashed whole; larger ones by their size and samples of their bytes."""


def _file_digest(path: Path) -> str:
    size = path.stat().st_size
    if size <= _WHOLE:
        return sha256_file(path)
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        for offset in (0, size // 2, max(size - 2**22, 0)):  # head, middle, tail: 4 MiB each
            f.seek(offset)
            digest.update(f.read(2**22))
    return digest.hexdigest()


# -- the run ------------------------------------------------------------------------------


def run(
    job: Job,
    *,
    resume: bool = False,
    resume_from: str | None = None,
    terminate_on_nan: bool = True,
    data: Datasets | None = None,
    hooks: Hooks | None = None,
) -> RunResult:
    """Train ``job`` in this process (one rank of the run); see the module docstring.

    ``resume``: continue from the newest checkpoint in ``output_dir`` that verifies (``resume_from``: that
    tag). ``data``: the job's data already tokenized (by ``preflight``). The few lines worth telling (what
    was resumed, what the data lost) go to the ``dsbuild`` logger, from rank 0. Guarding the output folder
    is the launcher's (``dsbuild.outputs.run_folder``). ``hooks``: what a launcher other than torchrun adds.
    """
    from ..session import distributed

    # Rank 0's plotting child imports matplotlib while the model is built; it draws loss.png at the end.
    with distributed.quiet_old_names(), Plotter() if distributed.rank() == 0 else contextlib.nullcontext() as plotter:
        return _run(
            job,
            resume=resume or resume_from is not None,
            tag=resume_from,
            terminate_on_nan=terminate_on_nan,
            data=data,
            hooks=hooks or Hooks(),
            plotter=plotter,
        )


@attrs.frozen
class Prepared:
    """A job made ready to train in this process: its Session and its tokenized data."""

    session: Any
    """The ``Session`` (model built, config resolved and checked; the engine starts on first use)."""
    train: Sequence[dict[str, list[int]]]
    evaluation: Sequence[dict[str, list[int]]] | None
    collate_fn: Callable[[list[Any]], Any]
    """Pads a list of samples into a batch of tensors."""
    total_steps: int
    """Optimizer steps of the run."""
    note: str
    """What tokenizing cut, or ``""``."""


def prepare(job: Job, data: Datasets | None = None) -> Prepared:
    """The Session of ``job`` in this process (one rank), with the job's data tokenized for it.

    The model is built the job's way: from ``[model.config]`` or ``name_or_path``, inside
    ``zero.Init`` at ZeRO-3, LoRA applied, gradient checkpointing on when asked.
    """
    from ..data import collate
    from ..data.tokens import keep_trained_template
    from ..session import Session, distributed

    phase = _phase_teller(distributed.rank() == 0)
    source = model_source(job.model)
    tokenizer = build_tokenizer(job.model)
    keep_trained_template(tokenizer, job.data.format, job.data.chat_template)  # saved with the model
    if job.data.eos_token is not None:
        tokenizer.eos_token = job.data.eos_token  # as TRL: the saved tokenizer ends sequences as training did
    if data is None:
        phase(f"reading and tokenizing the data ({job.data.path})")
    datasets = data if data is not None else _datasets(job, tokenizer)
    train, evaluation, note = datasets.train, datasets.evaluation, datasets.note
    world = distributed.world_size()
    total = job_steps(job.samples(len(train), world), job.training, job.config, world_size=world)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    phase(f"building the model ({len(train)} training samples, {total} steps)")
    built = dict(task_of(job).model(job, pad or 0))  # a reward job's model: a sequence classifier with one label
    settings = built.pop("config", {})
    session = Session.from_pretrained(
        source,
        job.config,
        training=job.training,
        lora=job.model.lora.to_peft() if job.model.lora is not None else None,
        dtype=job.model.dtype,
        attn_implementation=job.model.attn_implementation,
        gradient_checkpointing=job.model.gradient_checkpointing,
        tokenizer=tokenizer,
        output_dir=job.output_dir,
        total_steps=total,
        infer_batch_size=job.launch.infer_batch_size,
        data_fingerprint=data_fingerprint(job),
        **built,
    )
    session.model.config.get_text_config().update(settings)  # set after the model is built, as TRL sets them
    tokens: Callable[[list[Any]], Any] = functools.partial(
        collate,
        pad_token_id=pad or 0,
        padding_free=job.data.padding_free,
        pad_to_multiple_of=session.sequence_parallel_size,  # each sequence cut into that many shards
    )
    collate_fn = task_of(job).collate(job, pad or 0, tokens)
    return Prepared(session, train, evaluation, collate_fn, total, note)


def _run(job: Job, *, resume: bool, tag: str | None, terminate_on_nan: bool, data: Datasets | None, hooks: Hooks,
         plotter: Plotter | None) -> RunResult:  # fmt: skip
    from ..session import distributed

    ready = prepare(job, data)
    session = ready.session
    session.terminate_on_nan = terminate_on_nan
    if hooks.session is not None:
        session.hooks = attrs.evolve(hooks.session)
    session.hooks.stop_on_interrupt = True  # dsbuild train: the first Ctrl-C saves at the next step, a second stops
    checkpoint = session.config.checkpoint
    if distributed.world_size() > 1 and not (checkpoint is not None and checkpoint.use_node_local_storage is True):
        from ..session.checkpoints import require_shared

        require_shared(job.output_dir)  # before training: a node-local output folder fails at the first save
    main_process = distributed.rank() == 0
    say = logger.info if main_process else (lambda _: None)
    if ready.note:
        say(ready.note)

    say(
        f"starting DeepSpeed's engine (ZeRO-{session.run_facts.zero_stage}, {distributed.world_size()} process(es)); "
        "the first run on a machine builds its ops, which can take minutes"
    )
    resumed_from = None
    folder = RunFolder(job.output_dir)
    save_dir = folder.checkpoints
    history_file = folder.history
    if hooks.restore is not None:
        position = session.load_checkpoint(hooks.restore.parent, tag=hooks.restore.name)  # verified, as --resume
        resumed_from = position["global_step"]
        say(f"resumed from {hooks.restore} at step {resumed_from}")
    elif resume:
        if tag is None and not candidates(save_dir):
            # Loud: a resume that finds nothing may be looking in the wrong place (the path is absolute).
            earlier = " (an earlier run there left a history but no checkpoint)" if history_file.exists() else ""
            if main_process:
                logger.warning("--resume: no checkpoint in %s%s: training starts at step 0", save_dir, earlier)
        else:
            position = session.load_checkpoint(tag=tag)  # engine, data position, RNG; verified
            resumed_from = position["global_step"]
            say(f"resumed from {save_dir / position['tag']} at step {resumed_from}")
            if main_process and resumed_from >= ready.total_steps:
                logger.warning(
                    "the run already ended at step %d of %d: nothing is trained (raise training.max_steps, e.g. "
                    "--set training.max_steps=%d, to train on)",
                    resumed_from,
                    ready.total_steps,
                    2 * ready.total_steps,
                )

    if main_process:
        # The history goes on from the checkpoint: records of an attempt that died after it are dropped.
        history.cut_after(history_file, resumed_from or 0)
        history.cut_after(folder.completions, resumed_from or 0)  # a GRPO run's: logged again from there

    # Checkpoints (every save_steps, and at the end) and evaluation (every eval_steps, default at each checkpoint,
    # and at the end, as the HF Trainer) come from fit.
    training = job.training
    save_every = steps_between(training.save_steps, ready.total_steps) if training.save_strategy == "steps" else 0
    eval_steps = steps_between(training.eval_steps, ready.total_steps) if training.eval_steps else None
    by_steps = ready.evaluation is not None and training.eval_strategy != "epoch"  # "epoch": fit evaluates at each end
    eval_every = (eval_steps or save_every or None) if by_steps else None
    ready, train, loss_fn, rollout = task_of(job).parts(job, ready, say)
    session.fit(train, eval_data=ready.evaluation, eval_every=eval_every, collate_fn=ready.collate_fn,
                loss_fn=loss_fn, rollout=rollout)  # fmt: skip
    lora = job.model.lora
    session.save_model(merge_lora=lora is not None and lora.merge)  # HF format, or the LoRA adapters; collective

    if plotter is not None:
        why_not = plotter.draw(history_file, folder.loss_plot, title=_title(job))
        if why_not:
            say(f"{folder.loss_plot.name} not written: {why_not}")
    records = read_history(history_file) if history_file.is_file() else []
    return RunResult(history=records, resumed_from=resumed_from, output_dir=job.output_dir)


_MONITOR_NAMES: Final = {"csv_monitor": "CSV", "tensorboard": "TensorBoard", "wandb": "W&B", "comet": "Comet"}


def _phase_teller(main_process: bool) -> Callable[[str], None]:
    """Says (rank 0, to the ``dsbuild`` logger) each start-up phase as it begins, so a long start is not silent."""
    started = time.monotonic()

    def say(what: str) -> None:
        if main_process:
            logger.info("%s (%.0f s since start)", what, time.monotonic() - started)

    return say


def _monitors(ds_config: Path) -> list[str]:
    """The DeepSpeed monitors the run's config turned on, as the summary names them."""
    try:
        config = json.loads(ds_config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    on = [name for key, name in _MONITOR_NAMES.items() if (config.get(key) or {}).get("enabled") is True]
    return [f"DeepSpeed's {' and '.join(on)} monitor{'s' if len(on) > 1 else ''}"] if on else []


def _title(job: Job) -> str:
    from ..session import distributed

    name = Path(job.source).stem if job.source else "job"
    world = distributed.world_size()
    return f"{name}: {job.strategy.ref}, {world} process{'es' if world > 1 else ''}"


# -- what to tell the user ----------------------------------------------------------------


def summary_lines(job: Job) -> list[str]:
    """The closing lines of ``dsbuild train``: how the loss went (a GRPO run's mean reward too), and where each output
    is."""
    out = job.output_dir
    lines = []
    folder = RunFolder(out)
    records = read_history(folder.history) if folder.history.is_file() else []
    train = [r for r in records if r.get("loss") is not None]
    evaluation = [r for r in records if r.get("eval_loss") is not None]
    rewarded = [r for r in records if r.get("reward") is not None]  # GRPO: the loss says little
    if train:
        first, last = train[0], train[-1]
        text = f"loss {first['loss']:.3f} at step {first['step']} -> {last['loss']:.3f} at step {last['step']}"
        if rewarded:
            a, b = rewarded[0], rewarded[-1]
            text += f"; mean reward {a['reward']:.3f} at step {a['step']} -> {b['reward']:.3f} at step {b['step']}"
        if len(evaluation) > 1:
            a, b = evaluation[0], evaluation[-1]
            text += f"; evaluation loss {a['eval_loss']:.3f} at step {a['step']} -> {b['eval_loss']:.3f} at step {b['step']}"
        elif evaluation:
            text += f"; evaluation loss {evaluation[0]['eval_loss']:.3f} at step {evaluation[0]['step']}"
        lines.append(text)
    latest = read_latest(folder.checkpoints) or ""
    lora = job.model.lora
    if lora is None or lora.merge:
        model = "HF format" + (", LoRA merged" if lora is not None else "")
    else:
        model = "LoRA adapters" + ("; their base in base/" if job.model.config is not None else "")
    rows = [
        ("ds_config", folder.ds_config, "the resolved config the engine ran with"),
        ("checkpoints", folder.checkpoints, f"latest: {latest}" if latest else "none saved"),
        ("model", folder.model, model),
        ("metrics", folder.logs, "; ".join([*_monitors(folder.ds_config), folder.history.name])),
        ("loss plot", folder.loss_plot, "the mean reward beside the loss" if rewarded else ""),
    ]
    if folder.completions.is_file():
        rows.append(("completions", folder.completions, "each logged completion, its rewards and advantage"))
    width = max(len(r[0]) for r in rows)
    for label, path, note in rows:
        lines.append(f"{label:<{width}}  {path}" + (f"  ({note})" if note else ""))
    return lines
