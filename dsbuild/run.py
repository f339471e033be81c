"""The training run of ``dsbuild train``: one process of it, reading a job file and training its model.

``dsbuild train`` runs ``run(job)`` in its own process for a one-process job, and
starts ``python -m dsbuild.run JOB --set KEY=VALUE ... [--resume]`` on every rank
through torchrun for more (``dsbuild.launch``). Each process:

1. reads the job (the same file and ``--set`` overrides on every rank),
2. builds the tokenizer and the data (every rank tokenizes the records; each trains on its share),
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

import functools
import json
import logging
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from .atomic import write_atomic
from .errors import ConfigError, Problem
from .job import BYTE_TOKENIZER, Job, ModelSpec
from .plot import plot_in_child
from .suggest import did_you_mean

logger = logging.getLogger("dsbuild")

__all__ = [
    "HISTORY",
    "LOSS_PLOT",
    "Prepared",
    "RunResult",
    "build_tokenizer",
    "model_source",
    "preflight",
    "prepare",
    "run",
    "summary_lines",
]

HISTORY = "history.json"
"""Rank 0 writes the run's history here: one record per optimizer step, one per evaluation."""
LOSS_PLOT = "loss.png"
"""The training (and evaluation) loss, plotted."""

_QUIET = r"`torch\.distributed\.\w+` is deprecated"
"""torch warns on every step that DeepSpeed calls its old collective names; nothing a user can act on."""


@attrs.frozen
class RunResult:
    """What a run did and where it wrote it."""

    history: list[dict[str, Any]]
    """The whole run's records (a resumed run's include the steps before the checkpoint)."""
    resumed_from: int | None
    """The optimizer step the run resumed at, or ``None``."""
    output_dir: Path


# -- model and tokenizer ------------------------------------------------------------------


def model_source(spec: ModelSpec) -> Any:
    """What ``Session.from_pretrained`` builds from: a ``PretrainedConfig`` for ``[model.config]``, else the path / id.

    A config field that is not one of the model type's, but close to one, is a typo and an
    error (transformers would keep it as a stray attribute); others pass (legacy names such
    as ``rope_theta`` are still read by transformers).
    """
    if spec.config is None:
        assert spec.name_or_path is not None
        return spec.name_or_path
    import inspect

    from transformers import CONFIG_MAPPING

    fields = {k: v for k, v in spec.config.items() if k != "model_type"}
    model_type = str(spec.config["model_type"])
    if model_type not in CONFIG_MAPPING:
        names = list(CONFIG_MAPPING.keys())
        raise ConfigError(
            Problem("model.config.model_type", f"unknown model type {model_type!r}", did_you_mean(model_type, names))
        )
    cls = CONFIG_MAPPING[model_type]
    known = set(inspect.signature(cls.__init__).parameters) | set(cls().to_dict()) | set(cls.attribute_map)
    problems = []
    for key in fields:
        if key not in known:
            suggestion = did_you_mean(key, known)
            if suggestion is not None:
                problems.append(Problem(f"model.config.{key}", f"not a {cls.__name__} field", suggestion))
    if problems:
        raise ConfigError(problems)
    try:
        return cls(**fields)
    except (TypeError, ValueError) as e:
        raise ConfigError(Problem("model.config", f"{cls.__name__} refuses it: {e}")) from None


def build_tokenizer(spec: ModelSpec) -> Any:
    """The job's tokenizer: ByT5's byte-level one for ``"byte"``, else ``AutoTokenizer`` from the path / id."""
    if spec.tokenizer == BYTE_TOKENIZER:
        from transformers import ByT5Tokenizer

        return ByT5Tokenizer()
    from transformers import AutoTokenizer

    where = spec.tokenizer or spec.name_or_path
    try:
        return AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError) as e:
        path = "model.tokenizer" if spec.tokenizer else "model.name_or_path"
        raise ConfigError(Problem(path, f"cannot load a tokenizer from {where!r}: {e}".splitlines()[0])) from None


def preflight(job: Job) -> None:
    """What can be checked before any process starts: the model config, a local tokenizer, every data record."""
    from .data import read_records

    model_source(job.model)
    if job.model.tokenizer == BYTE_TOKENIZER or (job.model.tokenizer and Path(job.model.tokenizer).exists()):
        build_tokenizer(job.model)
    for path in (job.data.path, job.data.eval_path):
        if path is not None:
            read_records(path, job.data.format, text_field=job.data.text_field)


# -- data -------------------------------------------------------------------------------


def _datasets(job: Job, tokenizer: Any) -> tuple[list[dict[str, list[int]]], list[dict[str, list[int]]] | None, str]:
    """Tokenized training and evaluation samples, and a note on what was cut (or ``""``)."""
    from .data import read_records, tokenize

    def load(path: Path) -> Any:
        records = read_records(path, job.data.format, text_field=job.data.text_field)
        return tokenize(records, tokenizer, job.data.format, job.data.max_length, template=job.data.template)

    train = load(job.data.path)
    evaluation = load(job.data.eval_path) if job.data.eval_path is not None else None
    note = ""
    if train.truncated:
        note = f"{train.truncated} training samples cut at max_length {job.data.max_length}"
        if train.dropped:
            note += f", {train.dropped} of them dropped (no response token left)"
    if not train.samples:
        raise ConfigError(Problem("data.max_length", "no training sample is left: every response was cut away"))
    return train.samples, (evaluation.samples if evaluation is not None else None), note


def _run_steps(job: Job, samples: int, world: int, pretrained: Any) -> int:
    """Optimizer steps of the run, counted as ``Session.fit`` counts them (``max_steps``, else the epochs)."""
    if job.training.max_steps > 0:
        return job.training.max_steps
    probe = job.config.resolve(world_size=world, training=job.training, model=pretrained, total_steps=1)
    micro, accum = probe.train_micro_batch_size_per_gpu, probe.gradient_accumulation_steps
    assert isinstance(micro, int) and isinstance(accum, int)
    share = math.ceil(samples / world)
    batches = share // micro if probe.dataloader_drop_last else math.ceil(share / micro)
    if batches == 0:
        raise ConfigError(
            Problem("data.path", f"{samples} samples make no micro-batch of {micro} for each of {world} processes")
        )
    return max(math.ceil(job.training.num_train_epochs * max(batches // accum, 1)), 1)


# -- the run ------------------------------------------------------------------------------


def run(job: Job, *, resume: bool = False) -> RunResult:
    """Train ``job`` in this process (one rank of the run); see the module docstring.

    The few lines worth telling (what was resumed, what the data lost) go to the ``dsbuild`` logger, from rank 0.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_QUIET, category=FutureWarning)
        return _run(job, resume=resume)


@attrs.frozen
class Prepared:
    """A job made ready to train in this process: its Session and its tokenized data."""

    session: Any
    """The ``Session`` (model built, config resolved and checked; the engine starts on first use)."""
    train: list[dict[str, list[int]]]
    evaluation: list[dict[str, list[int]]] | None
    collate_fn: Callable[[list[Any]], Any]
    """Pads a list of samples into a batch of tensors."""
    total_steps: int
    """Optimizer steps of the run."""
    note: str
    """What tokenizing cut, or ``""``."""


def prepare(job: Job) -> Prepared:
    """The Session of ``job`` in this process (one rank), with the job's data tokenized for it.

    The model is built the job's way: from ``[model.config]`` or ``name_or_path``, inside
    ``zero.Init`` at ZeRO-3, LoRA applied, gradient checkpointing on when asked.
    """
    from .data import collate
    from .session import Session, distributed
    from .session.building import pretrained_config

    source = model_source(job.model)
    pretrained = pretrained_config(source)
    tokenizer = build_tokenizer(job.model)
    train, evaluation, note = _datasets(job, tokenizer)
    total = _run_steps(job, len(train), distributed.world_size(), pretrained)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
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
    )
    collate_fn = functools.partial(collate, pad_token_id=pad or 0)
    return Prepared(session, train, evaluation, collate_fn, total, note)


def _run(job: Job, *, resume: bool) -> RunResult:
    from .session import checkpoints, distributed

    ready = prepare(job)
    session = ready.session
    main_process = distributed.rank() == 0
    say = logger.info if main_process else (lambda _: None)
    if ready.note:
        say(ready.note)

    resumed_from = None
    save_dir = job.output_dir / "checkpoints"
    if resume:
        latest = checkpoints.read_latest(save_dir)
        if latest is None:
            say(f"--resume: no checkpoint in {save_dir}; starting from step 0")
        else:
            resumed_from = int(session.load_checkpoint()["global_step"])  # engine, data position, RNG
            say(f"resumed from {save_dir / latest} at step {resumed_from}")

    # Checkpoints every save_steps come from fit itself; evaluation every eval_steps (default: at each checkpoint).
    save_steps = job.training.save_steps
    save_every = max(math.ceil(save_steps * ready.total_steps), 1) if save_steps < 1 else int(save_steps)
    eval_every = (job.eval_steps or save_every) if ready.evaluation is not None else None
    history = session.fit(ready.train, eval_data=ready.evaluation, eval_every=eval_every, collate_fn=ready.collate_fn)
    if ready.evaluation is not None and eval_every and session.global_step % eval_every:
        # The end of the run is not an evaluation step: evaluate the final model too.
        history.append({"step": session.global_step, **session.evaluate(ready.evaluation, collate_fn=ready.collate_fn)})
    session.save_model()  # HF format, or the LoRA adapters; collective

    history = _whole_history(job.output_dir / HISTORY, history, resumed_from)
    if main_process:
        write_atomic(job.output_dir / HISTORY, json.dumps(history, indent=1) + "\n")
        why_not = plot_in_child(job.output_dir / HISTORY, job.output_dir / LOSS_PLOT, title=_title(job))
        if why_not:
            say(f"{LOSS_PLOT} not written: {why_not}")
    return RunResult(history=history, resumed_from=resumed_from, output_dir=job.output_dir)


def _whole_history(path: Path, new: list[dict[str, Any]], resumed_from: int | None) -> list[dict[str, Any]]:
    """A resumed run's history: the earlier run's records up to the checkpoint, then this run's."""
    if resumed_from is None or not path.is_file():
        return new
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return new
    return [r for r in old if isinstance(r, dict) and int(r.get("step", 0)) <= resumed_from] + new


def _title(job: Job) -> str:
    from .session import distributed

    name = Path(job.source).stem if job.source else "job"
    world = distributed.world_size()
    return f"{name}: {job.strategy.ref}, {world} process{'es' if world > 1 else ''}"


# -- what to tell the user ----------------------------------------------------------------


def summary_lines(job: Job) -> list[str]:
    """The closing lines of ``dsbuild train``: how the loss went, and where each output is."""
    out = job.output_dir
    lines = []
    try:
        history = json.loads((out / HISTORY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        history = []
    train = [r for r in history if r.get("loss") is not None]
    evaluation = [r for r in history if r.get("eval_loss") is not None]
    if train:
        first, last = train[0], train[-1]
        text = f"loss {first['loss']:.3f} at step {first['step']} -> {last['loss']:.3f} at step {last['step']}"
        if len(evaluation) > 1:
            a, b = evaluation[0], evaluation[-1]
            text += f"; evaluation loss {a['eval_loss']:.3f} at step {a['step']} -> {b['eval_loss']:.3f} at step {b['step']}"
        elif evaluation:
            text += f"; evaluation loss {evaluation[0]['eval_loss']:.3f} at step {evaluation[0]['step']}"
        lines.append(text)
    try:
        latest = (out / "checkpoints" / "latest").read_text(encoding="utf-8").strip()
    except OSError:
        latest = ""
    model = "LoRA adapters" if job.model.lora is not None else "HF format"
    rows = [
        ("ds_config", out / "ds_config.json", "the resolved config the engine ran with"),
        ("checkpoints", out / "checkpoints", f"latest: {latest}" if latest else "none saved"),
        ("model", out / "model", model),
        ("metrics", out / "logs", "DeepSpeed's CSV monitor; history.json"),
        ("loss plot", out / LOSS_PLOT, ""),
    ]
    width = max(len(r[0]) for r in rows)
    for label, path, note in rows:
        lines.append(f"{label:<{width}}  {path}" + (f"  ({note})" if note else ""))
    return lines
