"""``Training``: the run's training arguments, by the names and defaults of HF ``TrainingArguments``.

A job's ``[training]`` table and ``--set training.KEY=VALUE`` are read with
``Training.from_dict``; ``resolve`` reads the same names from a ``Training``, a
``transformers.TrainingArguments`` or any object that has them. Every value is
checked when a ``Training`` is made, and every problem is reported at once under
``training.<name>``.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping
from functools import cache
from typing import Any, Final

import attrs

from .._util.suggest import did_you_mean
from ..config.fields import Spec, check_value, coerce
from ..errors import InvalidValueError, Problem, error_of

__all__ = [
    "HF_NAMES_NOT_TAKEN",
    "HF_SCHEDULERS",
    "NOT_TAKEN",
    "REPORT_TO",
    "SCHEDULER_TYPES",
    "NoneValue",
    "Training",
    "training_from",
]

REPORT_TO: Final = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "comet_ml": "comet",
    "csv": "csv_monitor",
    "none": "",
}
"""``report_to`` names dsbuild takes, and the DeepSpeed monitor section each turns on."""

NOT_TAKEN: Final[dict[str, str]] = {
    "optim": "set the strategy config's optimizer section; without one, the HF Trainer's AdamW is used",
    "optim_args": "set the optimizer's params in the strategy config",
    "lr_scheduler_kwargs": "set the scheduler's params in the strategy config",
    "deepspeed": "the job's [strategy] config is the ds_config",
    "resume_from_checkpoint": "use dsbuild train --resume or --resume-from TAG",
    "overwrite_output_dir": "use dsbuild train --overwrite (the earlier run is moved aside, not deleted)",
    "logging_dir": "monitors write under output_dir/logs",
    "do_train": "dsbuild train trains; drop it",
    "do_eval": "give evaluation data ([data] eval_path or eval_split) and an eval_strategy",
    "push_to_hub": "not supported: push the saved model yourself",
    "load_best_model_at_end": "not supported: checkpoints are kept under output_dir/checkpoints",
    "fsdp": "dsbuild runs DeepSpeed, not FSDP",
    "local_rank": "set by the launcher (torchrun), not by the job",
    "tf32": "not supported: set torch.backends.cuda.matmul.allow_tf32 in code",
    "activation_checkpointing": "use gradient_checkpointing",
}
"""HF ``TrainingArguments`` names dsbuild does not take, and what to do instead (any other HF name it does not take
says just that; ``tests/unit/test_training_names.py`` checks the names against the installed transformers)."""

HF_NAMES_NOT_TAKEN: Final = frozenset(NOT_TAKEN) | frozenset(
    {
        "accelerator_config",
        "activation_checkpointing_kwargs",
        "auto_find_batch_size",
        "batch_eval_metrics",
        "data_seed",
        "dataloader_drop_last",
        "dataloader_in_order",
        "dataloader_multiprocessing_context",
        "dataloader_persistent_workers",
        "dataloader_pin_memory",
        "dataloader_prefetch_factor",
        "ddp_backend",
        "ddp_broadcast_buffers",
        "ddp_bucket_cap_mb",
        "ddp_find_unused_parameters",
        "ddp_static_graph",
        "debug",
        "disable_tqdm",
        "do_predict",
        "enable_jit_checkpoint",
        "eval_accumulation_steps",
        "eval_delay",
        "eval_do_concat_batches",
        "eval_on_start",
        "eval_use_gather_object",
        "fsdp_config",
        "full_determinism",
        "gradient_checkpointing_kwargs",
        "greater_is_better",
        "hub_always_push",
        "hub_model_id",
        "hub_private_repo",
        "hub_revision",
        "hub_strategy",
        "hub_token",
        "ignore_data_skip",
        "include_for_metrics",
        "include_num_input_tokens_seen",
        "label_names",
        "label_smoothing_factor",
        "length_column_name",
        "liger_kernel_config",
        "log_level",
        "log_level_replica",
        "log_on_each_node",
        "logging_nan_inf_filter",
        "metric_for_best_model",
        "neftune_noise_alpha",
        "optim_target_modules",
        "parallelism_config",
        "prediction_loss_only",
        "project",
        "remove_unused_columns",
        "restore_callback_states_from_checkpoint",
        "run_name",
        "save_only_model",
        "skip_memory_metrics",
        "torch_empty_cache_steps",
        "trackio_bucket_id",
        "trackio_space_id",
        "trackio_static_space_id",
        "train_sampling_strategy",
        "use_cache",
        "use_cpu",
        "use_liger_kernel",
    }
)
"""The other HF ``TrainingArguments`` names (transformers 5): a job that sets one is told it is an HF name dsbuild
does not take, rather than an unknown key."""

SCHEDULER_TYPES: Final = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
    "greedy",
)
"""HF's ``SchedulerType`` values (transformers 5), the choices of ``Training.lr_scheduler_type``."""


HF_SCHEDULERS: Final = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
)
"""The ``lr_scheduler_type`` values that HF's ``get_scheduler`` builds from the warmup and the run's length alone:
``Session`` and ``dsbuild train`` run the HF Trainer's own scheduler for them when the config has no scheduler."""


class NoneValue:
    """Stands in for ``None`` so that ``check_value`` says ``got None, expected ...`` for a required value."""

    def __repr__(self) -> str:
        return "None"


def _arg(default: Any, spec: Spec, *, optional: bool = False) -> Any:
    """A ``Training`` field: its HF default and what it takes (checked in ``__attrs_post_init__``, all at once)."""
    return attrs.field(default=default, metadata={"training": (spec, optional)})


def _names(value: Any) -> frozenset[str] | None:
    return None if value is None else frozenset(value)


def _path_text(value: str | os.PathLike[str] | None) -> str | None:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _names_list(value: Any) -> Any:
    """``report_to``: one name or a list of names, held as a tuple (HF takes both)."""
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list) else value


_NUMBER_GE0 = Spec("float", ge=0, auto=False)
_STRATEGY = Spec("choice", choices=("no", "steps", "epoch"), auto=False)
_POSITIVE_INT = Spec("int", gt=0, auto=False)
_BOOL = Spec("bool", auto=False)


@attrs.frozen(kw_only=True)
class Training:
    """The run's training arguments: the names and defaults of HF ``TrainingArguments`` (transformers 5).

    Every value is checked when a ``Training`` is made; every problem is reported at once,
    each under ``training.<name>``. ``resolve`` also takes a ``TrainingArguments`` (or any
    object with these attribute names) in its place.
    """

    output_dir: str | None = attrs.field(
        default=None, converter=_path_text, metadata={"training": (Spec("str", auto=False), True)}
    )
    """Where checkpoints and the final model are written (a path is kept as text); default none (the job decides)."""
    learning_rate: float = _arg(5e-5, _NUMBER_GE0)
    """Peak learning rate (fills ``optimizer.params.lr`` and ``scheduler.params.warmup_max_lr``); default 5e-5."""
    weight_decay: float = _arg(0.0, _NUMBER_GE0)
    """Weight decay (fills ``optimizer.params.weight_decay``); default 0."""
    adam_beta1: float = _arg(0.9, _NUMBER_GE0)
    """Adam's beta1, in [0, 1) (fills ``optimizer.params.betas[0]``); default 0.9."""
    adam_beta2: float = _arg(0.999, _NUMBER_GE0)
    """Adam's beta2, in [0, 1) (fills ``optimizer.params.betas[1]``); default 0.999."""
    adam_epsilon: float = _arg(1e-8, _NUMBER_GE0)
    """Adam's epsilon (fills ``optimizer.params.eps``); default 1e-8."""
    per_device_train_batch_size: int = _arg(8, _POSITIVE_INT)
    """Samples per device per step (fills ``train_micro_batch_size_per_gpu``); default 8."""
    per_device_eval_batch_size: int = _arg(8, _POSITIVE_INT)
    """Samples per device per evaluation step; default 8."""
    gradient_accumulation_steps: int = _arg(1, _POSITIVE_INT)
    """Micro-batches per optimizer step (fills ``gradient_accumulation_steps``); default 1."""
    max_grad_norm: float = _arg(1.0, _NUMBER_GE0)
    """Gradient clipping norm, 0 for none (fills ``gradient_clipping``); default 1.0."""
    warmup_steps: float = _arg(0, _NUMBER_GE0)
    """Warmup steps; a number below 1 is a fraction of the run's steps (HF 5); default 0."""
    warmup_ratio: float = _arg(0.0, Spec("float", ge=0, le=1, auto=False))
    """Warmup as a fraction of the run's steps, used when ``warmup_steps`` is 0 (HF 4 spelling); default 0."""
    num_train_epochs: float = _arg(3.0, _NUMBER_GE0)
    """Epochs to train when ``max_steps`` is not positive; default 3."""
    max_steps: int = _arg(-1, Spec("int", ge=-1, auto=False))
    """Optimizer steps to train, overriding ``num_train_epochs`` when positive; default -1 (unset)."""
    lr_scheduler_type: str = _arg("linear", Spec("choice", choices=SCHEDULER_TYPES, auto=False))
    """HF scheduler used when the config has no ``scheduler``, e.g. ``"cosine"``; default ``"linear"``."""
    bf16: bool = _arg(False, _BOOL)
    """Train in bf16 mixed precision (fills ``bf16.enabled``); default false."""
    fp16: bool = _arg(False, _BOOL)
    """Train in fp16 mixed precision (fills ``fp16.enabled``); default false."""
    bf16_full_eval: bool = _arg(False, _BOOL)
    """Evaluate in pure bf16 (also turns ``bf16.enabled`` on, as in HF); default false."""
    fp16_full_eval: bool = _arg(False, _BOOL)
    """Evaluate in pure fp16 (also turns ``fp16.enabled`` on, as in HF); default false."""
    seed: int = _arg(42, Spec("int", ge=0, auto=False))
    """Random seed set at the start of training; default 42."""
    logging_steps: float = _arg(500, Spec("float", gt=0, auto=False))
    """Log every this many steps; below 1 a fraction of the run's steps; default 500."""
    save_steps: float = _arg(500, Spec("float", gt=0, auto=False))
    """Save a checkpoint every this many steps; below 1 a fraction of the run's steps; default 500."""
    save_strategy: str = _arg("steps", _STRATEGY)
    """When checkpoints are saved: ``"steps"`` (every ``save_steps``), ``"epoch"`` (at each epoch's end) or ``"no"``;
    except with ``"no"``, a checkpoint is also saved at the end of training, as the HF Trainer does; default ``"steps"``."""
    save_total_limit: int | None = _arg(None, Spec("int", ge=0, auto=False), optional=True)
    """Keep at most this many checkpoints (older ones deleted); default none (keep all)."""
    save_on_each_node: bool = _arg(False, _BOOL)
    """Save on every node rather than the main one (fills ``checkpoint.use_node_local_storage``); default false."""
    async_save: bool = _arg(False, _BOOL)
    """Save checkpoints without stopping training (torch distributed checkpoint's, Megatron's and NeMo's name): each
    process copies its state into CPU memory and writes it in the background; the checkpoint counts once every file is
    written and its manifest is (docs/jobs.md, "Runs that lose nothing"); default false."""
    logging_strategy: str = _arg("steps", _STRATEGY)
    """When metrics are logged: ``"steps"`` (every ``logging_steps``), ``"epoch"`` or ``"no"``; default ``"steps"``."""
    logging_first_step: bool = _arg(False, _BOOL)
    """Also log the first optimizer step; default false."""
    eval_strategy: str = _arg("no", _STRATEGY)
    """When ``fit`` evaluates: ``"steps"`` (every ``eval_steps``), ``"epoch"`` or ``"no"`` (once, at the end, when
    given eval data); the end of training is evaluated under each, unless its last step just was; default ``"no"``."""
    eval_steps: float | None = _arg(None, Spec("float", gt=0, auto=False), optional=True)
    """Evaluate every this many steps with ``eval_strategy = "steps"``; below 1 a fraction of the run; default
    ``logging_steps``."""
    report_to: tuple[str, ...] = attrs.field(
        default=("none",), converter=_names_list, metadata={"training": (Spec("strs", auto=False), False)}
    )
    """Where metrics go, as DeepSpeed's monitors: ``"tensorboard"``, ``"wandb"``, ``"comet_ml"``, ``"csv"``, or
    ``"none"``; default ``"none"`` (dsbuild then writes CSV under ``output_dir/logs``)."""
    gradient_checkpointing: bool = _arg(False, _BOOL)
    """Recompute activations in the backward pass (less memory, more compute); default false."""
    average_tokens_across_devices: bool = _arg(True, _BOOL)
    """Weight the loss by the trained tokens of the optimizer step summed over all processes, as the HF Trainer does
    (``num_items_in_batch``); false: over this process's micro-batches only; default true."""
    dataloader_num_workers: int = _arg(0, Spec("int", ge=0, auto=False))
    """Worker processes of the training data loader; default 0 (load in the main process)."""
    torch_compile: bool = _arg(False, _BOOL)
    """Compile the model (``engine.compile()``, as Accelerate does under the HF Trainer); default false. With the
    strategy config's ``compile.deepcompile`` the compiler is DeepCompile."""
    torch_compile_backend: str | None = _arg(None, Spec("str", auto=False), optional=True)
    """The ``torch.compile`` backend; default the accelerator's (``inductor``)."""
    torch_compile_mode: str | None = _arg(None, Spec("str", auto=False), optional=True)
    """The ``torch.compile`` mode (``"default"``, ``"reduce-overhead"``, ``"max-autotune"``); default torch's."""
    ddp_timeout: int = _arg(600, Spec("int", gt=0, auto=False))
    """Seconds a collective may wait for the other processes before the run fails (a lost or frozen rank); default
    600 (the HF Trainer's is 1800)."""
    given: frozenset[str] | None = attrs.field(default=None, eq=False, repr=False, converter=_names)
    """The arguments the user set: the keywords of ``Training(...)``, a job's ``[training]`` keys, ``--set`` values,
    a ``TrainingArguments``' attributes. Only these can disagree with a config's explicit values, as in the HF
    Trainer; an unset one takes the config's value. Recorded when a ``Training`` is made (see ``_record_given``)."""

    def __attrs_post_init__(self) -> None:
        problems = _training_problems(self)
        if problems:
            raise InvalidValueError(problems)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Training:
        """A ``Training`` from a table (a job's ``[training]``); unknown names get a "did you mean"."""
        if not isinstance(data, Mapping):
            raise InvalidValueError(Problem("training", f"got {data!r}, expected a table"))
        names = _training_names()
        problems: list[Problem] = []
        given: dict[str, Any] = {}
        for key, value in data.items():
            if not isinstance(key, str):
                problems.append(Problem("training", f"key {key!r} is not a string"))
            elif key not in names:
                if key in HF_NAMES_NOT_TAKEN:
                    problems.append(
                        Problem(
                            f"training.{key}",
                            "an HF TrainingArguments argument dsbuild does not take",
                            NOT_TAKEN.get(key, "remove it"),
                            kind="unknown-key",
                        )
                    )
                else:
                    problems.append(Problem.unknown_key(f"training.{key}", did_you_mean(key, names)))
            else:
                given[key] = coerce(names[key], value)
        try:
            built = cls(**given, given=frozenset(given))
        except InvalidValueError as error:
            raise error_of([*problems, *error.problems]) from None
        if problems:
            raise error_of(problems)
        return built

    @classmethod
    def of(cls, args: Any) -> Training:
        """A ``Training`` from a ``TrainingArguments`` or any object with those attribute names (others default)."""
        if isinstance(args, Training):
            return args
        return training_from(args, _training_names())

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """Warmup steps of a run of ``num_training_steps``, as HF's ``TrainingArguments.get_warmup_steps``.

        ``warmup_steps`` from 1 up is a count; below 1 a fraction of the run (HF 5); when it
        is 0, ``warmup_ratio`` is that fraction (HF 4).
        """
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        ratio = self.warmup_steps if self.warmup_steps > 0 else self.warmup_ratio
        return math.ceil(num_training_steps * ratio)

    def to_dict(self) -> dict[str, Any]:
        """Every argument by name (``None`` for the unset optional ones)."""
        return {name: getattr(self, name) for name in _training_names()}

    def is_set(self, name: str) -> bool:
        """Whether the user set argument ``name`` (it is in ``given``), whatever its value."""
        return self.given is not None and name in self.given


def _record_given(generated: Any) -> Any:
    """``Training.__init__`` that records the keywords it was called with as ``given``.

    attrs writes the typed ``__init__`` (mypy checks every keyword against it); a default cannot tell whether it
    was passed, so the call's own keywords are the record: ``Training(adam_epsilon=1e-8)`` sets ``adam_epsilon``
    although 1e-8 is HF's default, and conflicts with ``"eps": 1e-7`` as the HF Trainer does.
    """

    def __init__(self: Training, **arguments: Any) -> None:
        given = arguments.pop("given", None)
        generated(self, **arguments, given=frozenset(arguments) if given is None else given)

    __init__.__doc__ = generated.__doc__
    return __init__


setattr(Training, "__init__", _record_given(Training.__init__))  # noqa: B010 - keeps attrs' typed signature for mypy


@cache
def _training_names() -> dict[str, Spec]:
    return {a.name: a.metadata["training"][0] for a in attrs.fields(Training) if "training" in a.metadata}


def _training_problems(training: Training) -> list[Problem]:
    """Every problem of a ``Training``, in field order, then the ones between fields."""
    problems: list[Problem] = []
    for a in attrs.fields(Training):
        if "training" not in a.metadata:
            continue
        spec, optional = a.metadata["training"]
        value = getattr(training, a.name)
        if value is None and optional:
            continue
        message = check_value(spec, NoneValue() if value is None else value)
        if message is not None:
            problems.append(Problem(f"training.{a.name}", message))
    bad = {p.path for p in problems}
    ok = {name: getattr(training, name) for name in _training_names() if f"training.{name}" not in bad}
    return problems + _relations(ok)


def _relations(ok: Mapping[str, Any]) -> list[Problem]:
    """The checks beyond one field's type and range, on the fields that passed those."""
    problems = []
    for name in ("adam_beta1", "adam_beta2"):
        if name in ok and ok[name] >= 1:
            problems.append(Problem(f"training.{name}", f"got {ok[name]!r}, expected a number >= 0 and < 1"))
    report_to = ok.get("report_to", ())
    unknown = [name for name in report_to if name not in REPORT_TO]
    if unknown or ("none" in report_to and len(report_to) > 1):
        what = f"{unknown[0]!r} is not one of DeepSpeed's monitors" if unknown else '"none" together with others'
        problems.append(
            Problem(
                "training.report_to",
                what,
                "use " + ", ".join(map(repr, REPORT_TO)) + '; for "all", name them; other HF integrations are not '
                "DeepSpeed monitors",
            )
        )
    for name in ("logging_steps", "save_steps", "eval_steps"):
        if ok.get(name) is not None and ok[name] > 1 and not float(ok[name]).is_integer():
            problems.append(
                Problem(
                    f"training.{name}", f"got {ok[name]!r}, expected a whole number above 1 (or a fraction below 1)"
                )
            )
    if ok.get("output_dir") == "":
        problems.append(Problem("training.output_dir", "empty: it names no folder", "leave it out for out/<job name>"))
    for a, b in (("fp16", "bf16"), ("fp16_full_eval", "bf16_full_eval")):
        if ok.get(a) is True and ok.get(b) is True:
            problems.append(Problem(f"training.{b}", f"true together with {a}; at most one of {a} and {b} can be true"))
    return problems


def _plain_arg(value: Any) -> Any:
    """An argument as ``Training`` holds it: HF's string enums (``SchedulerType.LINEAR``) become their value."""
    return value.value if isinstance(value, enum.Enum) else value


def training_from(args: Any, names: Mapping[str, Any]) -> Training:
    """A ``Training`` of the attributes ``names`` that ``args`` has (the others keep their defaults).

    Every attribute ``args`` has counts as set, as the HF Trainer counts a ``TrainingArguments``' values.
    """
    missing: Any = object()
    given = {}
    optional = {a.name for a in attrs.fields(Training) if "training" in a.metadata and a.metadata["training"][1]}
    for name in names:
        value: Any = getattr(args, name, missing)
        if value is missing or (value is None and name not in optional):
            continue  # HF's None for "not set" (gradient_checkpointing): the default
        if name == "report_to":
            # The HF Trainer reports to its integrations itself; the DeepSpeed monitors among them are kept.
            value = [n for n in ([value] if isinstance(value, str) else value) if n in REPORT_TO] or ["none"]
        given[name] = _plain_arg(value)
    return Training(**given, given=frozenset(given))
