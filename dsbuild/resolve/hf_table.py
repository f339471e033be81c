"""The one table of what the Hugging Face Trainer fills in a ds_config, and from which training argument.

Each row is one ds key ``"auto"`` may stand in: the training arguments it reads,
the formula HF applies (``trainer_config_process`` / ``trainer_config_finalize`` in
``transformers/integrations/deepspeed.py``, transformers 5), whether an explicit value
must agree with the arguments (HF's ``fill_match``) or is only ever filled
(``fill_only``), whether it is filled only at ZeRO stage 3, and whether a job writes
it as ``"auto"`` when its config leaves it out. Everything that needs this knowledge
reads it from here:

- ``resolve`` fills and checks the rows in this order (HF's), so conflicts are listed in it;
- ``validate`` tells, for an ``"auto"`` left in a config, which argument would fill it;
- a job completes its config from the rows and takes a value the config sets into the
  training arguments it does not set (``takes``);
- ``interop.for_hf`` sets every row's key to ``"auto"`` for ``TrainingArguments(deepspeed=...)``;
- ``interop.for_accelerate`` keeps ``"auto"`` only in the rows Accelerate fills itself in a plain loop
  (``accelerate``, and ``ACCELERATE_FILLS``: together ``ACCELERATE_FILLED``) and resolves the rest.

The formulas read the run through ``RunFacts`` (``resolve`` implements it): the
training arguments by their HF names, the world size, the model's hidden size and the
run's optimizer steps. Nothing here imports torch, transformers or DeepSpeed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, NamedTuple, Protocol

import attrs

__all__ = [
    "ACCELERATE_FILLED",
    "ACCELERATE_FILLS",
    "BATCH_KEYS",
    "FILLS",
    "AccelerateFill",
    "Fact",
    "Fill",
    "Need",
    "RunFacts",
    "fill_of",
]

BATCH_KEYS: Final = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
"""The three sizes of DeepSpeed's batch triangle, in the order of its error messages."""


class Fact(NamedTuple):
    """A value the run gives for a key: the value, how a conflict names it, and where it came from."""

    value: Any
    expr: str
    """The argument in a conflict message: ``learning_rate`` in ``... disagrees with learning_rate = 5e-05``."""
    origin: str
    """The provenance recorded for a filled key."""


class Need(NamedTuple):
    """Why an ``"auto"`` could not be filled: what is missing, and how to give it."""

    message: str
    hint: str | None = None
    needs: tuple[str, ...] = ()
    """``resolve()``'s arguments that would give it (``Problem.needs``)."""


class RunFacts(Protocol):
    """What the formulas read about the run (``resolve``'s view of its arguments)."""

    @property
    def training(self) -> Any:
        """The training arguments (a ``Training``), or ``None`` when none were given."""

    @property
    def world_size(self) -> int:
        """Data-parallel processes (the world size over the sequence-parallel degree)."""

    @property
    def world_text(self) -> str:
        """The world size as messages name it: ``world size 8``."""

    def hidden(self) -> Fact | Need:
        """The model's hidden size, or why it is unknown."""

    def steps(self) -> Fact | Need:
        """The run's optimizer steps, or why they are unknown."""


Formula = Callable[[RunFacts], "Fact | Need"]


TOTAL_STEPS: Final = "total_steps"
"""``resolve``'s own argument among what the rows read (the run's optimizer steps): not a training argument."""


@attrs.frozen
class Fill:
    """One row: a ds key the HF Trainer fills, from what, and how."""

    path: str
    """The dotted ds key, e.g. ``optimizer.params.lr``."""
    arguments: str
    """What fills it, as messages and docs say it: ``learning_rate``, ``adam_beta1 and adam_beta2``."""
    formula: Formula
    """The value for a run (or why it is unknown)."""
    must_match: bool = True
    """An explicit value must equal the formula's (HF's ``fill_match``); else it is only filled (``fill_only``)."""
    stage3_only: bool = False
    """Filled only at ZeRO stage 3 (the stage-3 buckets)."""
    takes: str | tuple[str, ...] | None = None
    """The training argument(s) an explicit value stands for: a job whose ``[training]`` does not set them takes
    them from the config (``betas`` gives both ``adam_beta1`` and ``adam_beta2``)."""
    job_default: bool = False
    """A job writes ``"auto"`` here when its config leaves the key out (in a section the job writes, for the
    optimizer's params; when the training arguments turn the precision on, for ``fp16``/``bf16``)."""
    reads: tuple[str, ...] = ()
    """The training arguments the formula reads (default: ``takes``); with dsbuild's ``Training``, an explicit
    config value can disagree only with arguments the user set (``total_steps``: ``resolve``'s own argument)."""
    accelerate: str | None = None
    """What Accelerate fills the ``"auto"`` from in a plain loop (``accelerator.prepare`` with ``DummyOptim`` /
    ``DummyScheduler``, ``Accelerator._prepare_deepspeed`` in accelerate 1.x), as docs say it; ``None`` where it
    does not fill it from the run: it stops on it (``betas``, ``eps``), writes a constant (``gradient_clipping``
    1.0, whatever ``max_grad_norm`` says), or reads its ``mixed_precision`` setting, which an Accelerate config
    with a ``deepspeed_config_file`` may not set (``fp16``/``bf16``)."""

    @property
    def arguments_read(self) -> tuple[str, ...]:
        if self.reads:
            return self.reads
        return self.takes if isinstance(self.takes, tuple) else (self.takes,) if self.takes else ()

    @property
    def section(self) -> tuple[str, ...]:
        """The keys of the section the row writes into: ``("optimizer", "params")``; ``()`` at the top."""
        return tuple(self.path.split(".")[:-1])

    @property
    def key(self) -> str:
        """The key within its section: ``lr``."""
        return self.path.rpartition(".")[2]


def _argument(name: str) -> Formula:
    """The value of one training argument, by its HF name."""
    need = Need(f'"auto" needs the training argument {name}', needs=("training",))
    origin = f"training argument {name}"

    def formula(run: RunFacts) -> Fact | Need:
        return need if run.training is None else Fact(getattr(run.training, name), name, origin)

    return formula


def _train_batch_size(run: RunFacts) -> Fact | Need:
    t = run.training
    if t is None:
        return Need('"auto" needs per_device_train_batch_size and gradient_accumulation_steps', needs=("training",))
    micro, accum = t.per_device_train_batch_size, t.gradient_accumulation_steps
    text = f"{run.world_text} × per_device_train_batch_size {micro} × gradient_accumulation_steps {accum}"
    return Fact(run.world_size * micro * accum, text, f"training arguments: {text}")


def _betas(run: RunFacts) -> Fact | Need:
    t = run.training
    if t is None:
        return Need('"auto" needs the training arguments adam_beta1 and adam_beta2', needs=("training",))
    return Fact((t.adam_beta1, t.adam_beta2), "[adam_beta1, adam_beta2]", "training arguments adam_beta1, adam_beta2")


def _precision(name: str) -> Formula:
    full_eval = f"{name}_full_eval"

    def formula(run: RunFacts) -> Fact | Need:
        if run.training is None:
            return Need(f'"auto" needs the training arguments {name} and {full_eval}', needs=("training",))
        value = bool(getattr(run.training, name) or getattr(run.training, full_eval))
        return Fact(value, f"{name} or {full_eval}", f"training arguments {name}, {full_eval}")

    return formula


def _zero(run: RunFacts) -> Fact:
    return Fact(0, "0", "the HF Trainer's 0 (not a training argument)")


def _hidden_based(formula: Callable[[int], int], text: str) -> Formula:
    def of_hidden(run: RunFacts) -> Fact | Need:
        hidden = run.hidden()
        if isinstance(hidden, Need):
            return hidden
        return Fact(formula(hidden.value), text, f"{hidden.origin} ({text})")

    return of_hidden


def _total_num_steps(run: RunFacts) -> Fact | Need:
    return run.steps()


def _warmup_num_steps(run: RunFacts) -> Fact | Need:
    """``max(1, args.get_warmup_steps(total))``: HF 5 reads a ``warmup_steps`` below 1 as a ratio of the run."""
    t = run.training
    if t is None:
        return Need('"auto" needs the training argument warmup_steps', needs=("training",))
    name, ratio = ("warmup_steps", t.warmup_steps) if t.warmup_steps > 0 else ("warmup_ratio", t.warmup_ratio)
    if t.warmup_steps >= 1 or ratio == 0:
        return Fact(
            max(1, t.get_warmup_steps(0)), "max(1, warmup_steps)", "training argument warmup_steps (at least 1)"
        )
    total = run.steps()
    if isinstance(total, Need):
        return Need(
            f'"auto" needs the number of optimizer steps to turn {name}={ratio!r} into steps', needs=("total_steps",)
        )
    text = f"{name} {ratio!r} × {total.value} steps"
    return Fact(
        max(1, t.get_warmup_steps(total.value)), f"max(1, ceil({text}))", f"training argument {text} (at least 1)"
    )


_MODEL_HIDDEN: Final = "the model's config.hidden_size (accelerator.prepare)"

FILLS: Final = (
    # trainer_config_process, in HF's order (conflicts are listed in this order too)
    Fill(
        "train_micro_batch_size_per_gpu",
        "per_device_train_batch_size",
        _argument("per_device_train_batch_size"),
        takes="per_device_train_batch_size",
        job_default=True,
        accelerate="the batch_size of the DataLoader given to accelerator.prepare",
    ),
    Fill(
        "gradient_accumulation_steps",
        "gradient_accumulation_steps",
        _argument("gradient_accumulation_steps"),
        takes="gradient_accumulation_steps",
        job_default=True,
        accelerate="Accelerator(gradient_accumulation_steps=...)",
    ),
    Fill(
        "train_batch_size",
        "world_size x per_device_train_batch_size x gradient_accumulation_steps",
        _train_batch_size,
        reads=("per_device_train_batch_size", "gradient_accumulation_steps"),
        accelerate="the DataLoader's batch_size × gradient_accumulation_steps × processes",
    ),
    # Accelerate writes 1.0 here whatever max_grad_norm says: not one of its fills from the run.
    Fill("gradient_clipping", "max_grad_norm", _argument("max_grad_norm"), takes="max_grad_norm", job_default=True),
    Fill(
        "optimizer.params.lr",
        "learning_rate",
        _argument("learning_rate"),
        takes="learning_rate",
        job_default=True,
        accelerate="DummyOptim(lr=...)",
    ),
    Fill(
        "optimizer.params.betas",
        "adam_beta1 and adam_beta2",
        _betas,
        takes=("adam_beta1", "adam_beta2"),
        job_default=True,
    ),
    Fill("optimizer.params.eps", "adam_epsilon", _argument("adam_epsilon"), takes="adam_epsilon", job_default=True),
    Fill(
        "optimizer.params.weight_decay",
        "weight_decay",
        _argument("weight_decay"),
        takes="weight_decay",
        job_default=True,
        accelerate="DummyOptim(weight_decay=...)",
    ),
    Fill("scheduler.params.warmup_min_lr", "0", _zero, must_match=False, accelerate="0 (with a DummyScheduler)"),
    Fill(
        "scheduler.params.warmup_max_lr",
        "learning_rate",
        _argument("learning_rate"),
        takes="learning_rate",
        accelerate="the DummyOptim's lr (with a DummyScheduler)",
    ),
    Fill("fp16.enabled", "fp16", _precision("fp16"), takes="fp16", job_default=True, reads=("fp16", "fp16_full_eval")),
    Fill("bf16.enabled", "bf16", _precision("bf16"), takes="bf16", job_default=True, reads=("bf16", "bf16_full_eval")),
    # trainer_config_finalize
    Fill(
        "zero_optimization.reduce_bucket_size",
        "the model's hidden_size",
        _hidden_based(lambda h: h * h, "hidden size²"),
        must_match=False,
        accelerate=_MODEL_HIDDEN,
    ),
    Fill(
        "zero_optimization.stage3_prefetch_bucket_size",
        "the model's hidden_size (stage 3)",
        _hidden_based(lambda h: int(0.9 * h * h), "0.9 × hidden size²"),
        must_match=False,
        stage3_only=True,
        accelerate=_MODEL_HIDDEN,
    ),
    Fill(
        "zero_optimization.stage3_param_persistence_threshold",
        "the model's hidden_size (stage 3)",
        _hidden_based(lambda h: 10 * h, "10 × hidden size"),
        must_match=False,
        stage3_only=True,
        accelerate=_MODEL_HIDDEN,
    ),
    Fill(
        "scheduler.params.total_num_steps",
        "the run's optimizer steps (total_steps / max_steps)",
        _total_num_steps,
        reads=("max_steps", TOTAL_STEPS),
        accelerate="DummyScheduler(total_num_steps=...) over the processes",
    ),
    Fill(
        "scheduler.params.warmup_num_steps",
        "warmup_steps or warmup_ratio",
        _warmup_num_steps,
        takes="warmup_steps",
        reads=("warmup_steps", "warmup_ratio"),
        accelerate="DummyScheduler(warmup_num_steps=...)",
    ),
)
"""What the HF Trainer fills, in its order (``trainer_config_process`` then ``trainer_config_finalize``)."""

_BY_PATH: Final = {fill.path: fill for fill in FILLS}


def fill_of(path: str) -> Fill | None:
    """The row of ds key ``path``, or ``None`` when the HF Trainer does not fill it."""
    return _BY_PATH.get(path)


@attrs.frozen
class AccelerateFill:
    """A ds key whose ``"auto"`` Accelerate's DeepSpeed plugin fills from its own settings, not the HF Trainer."""

    path: str
    setting: str
    """Accelerate's setting (``accelerate config``, ``ACCELERATE_DEEPSPEED_*``)."""
    default: str
    """Its default, as a ds_config value."""
    hint: str
    """What to write instead of ``"auto"``."""


ACCELERATE_FILLS: Final = (
    AccelerateFill("zero_optimization.stage", "zero_stage", "2", "set 0, 1, 2 or 3"),
    AccelerateFill(
        "zero_optimization.offload_optimizer.device",
        "offload_optimizer_device",
        "'none'",
        "set 'cpu', 'nvme' or 'none'",
    ),
    AccelerateFill(
        "zero_optimization.offload_param.device", "offload_param_device", "'none'", "set 'cpu', 'nvme' or 'none'"
    ),
    AccelerateFill(
        "zero_optimization.offload_optimizer.nvme_path", "offload_optimizer_nvme_path", "none", "set the NVMe directory"
    ),
    AccelerateFill(
        "zero_optimization.offload_param.nvme_path", "offload_param_nvme_path", "none", "set the NVMe directory"
    ),
    AccelerateFill(
        "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        "zero3_save_16bit_model",
        "false",
        "set true to save a usable 16-bit model at stage 3, or false",
    ),
)
"""``"auto"`` the HF Trainer leaves for Accelerate to fill from its own settings (beyond ``FILLS``; Accelerate also
fills the stage-3 buckets at any stage)."""

ACCELERATE_FILLED: Final = frozenset(
    [fill.path for fill in FILLS if fill.accelerate is not None] + [fill.path for fill in ACCELERATE_FILLS]
)
"""The ds keys whose ``"auto"`` Accelerate fills itself in a plain loop (``--for accelerate`` leaves them)."""
