"""The config of a DeepSpeed engine without an optimizer (a reference or reward model), made from a training config.

Every RL post-training loop runs, beside the policy it trains, engines that only run forward passes: the
reference model, a reward model, an EMA copy. Each is ``deepspeed.initialize(model=..., config=...)`` with no
optimizer and a config derived from the training one. TRL (``prepare_deepspeed`` in ``trl/models/utils.py``) and
OpenRLHF (``get_eval_ds_config``) derive it by hand, differently; ``for_inference`` is dsbuild's one rule. It works
on the ds_config as DeepSpeed reads it (``to_dict``), so each step reads like the key it changes:

- **ZeRO stage**: 3 stays 3 (DeepSpeed builds a ``DeepSpeedZeRoOffload``, which partitions the parameters without an
  optimizer); 1 and 2 become 0, because DeepSpeed asserts ``"zero stage {} requires an optimizer"``
  (``_configure_zero_optimizer`` in ``runtime/engine.py``); 0, or no stage, stays. ``"auto"`` is refused: the rule
  needs the training stage. ``stage`` (0 or 3) sets the engine's own instead: a reward model kept whole on every
  process beside a partitioned policy, or partitioned beside a policy trained at stage 0-2.
- **offload** (``offload=True``): ``zero_optimization.offload_param`` becomes ``{device: cpu, pin_memory: true}``,
  as OpenRLHF writes for its reference and reward engines; refused below stage 3, where DeepSpeed ignores it.
  ``offload=False`` keeps the training config's ``offload_param`` as written.
- **"auto" from the model**: the rows of the one fill table (``hf_table.FILLS``) that read no training argument (the
  hidden-size buckets) are filled from ``hidden_size``, the inference model's own, where the config says ``"auto"``;
  without it they stay for ``resolve(model=...)``. Below stage 3 the stage-3-only rows' ``"auto"`` is removed:
  nothing fills it there (the HF Trainer fills them only at stage 3) and DeepSpeed reads them only at stage 3.
- **DeepCompile** (``compile.deepcompile``) is turned off where it is on or ``"auto"``: ZeRO inference has no
  DeepCompile mode (OpenRLHF PR #979 turns it off in every eval config; DeepSpeed PR #7225 guards the crash).
- **removed** (``REMOVED``): what only an optimizer's step reads, each with DeepSpeed's reason.
- **kept as written**: the precision, the batch sizes (DeepSpeed needs one even without an optimizer,
  ``runtime/config.py``), AutoTP (``tensor_parallel``), sequence parallelism, the other ZeRO settings, and
  ``gradient_clipping``: DeepSpeed reads it only in an optimizer step (``_take_model_step``, the optimizers'
  ``clip_grad``), which such an engine never takes, so it is inert; kept, the two configs differ only where they
  must (OpenRLHF writes 1.0, DeepSpeed's default). Every other ``"auto"`` stays for ``resolve``.

Each changed key's provenance names the rule (``explain``); ``removed_by_for_inference`` lists what it removes. Pure:
the config given is not changed. Nothing here imports torch or DeepSpeed.
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

import attrs

from ..config import ConfigBase
from ..config.fields import Spec, check_value, describe
from ..config.walk import leaves
from ..errors import InvalidValueError, Problem
from ..io.convert import from_dict, to_dict
from .explain import Explanation
from .hf_table import FILLS, Fact, Need

C = TypeVar("C", bound=ConfigBase)

__all__ = ["ORIGIN", "REMOVED", "Removal", "for_inference", "removed_by_for_inference"]

ORIGIN: Final = "for_inference"
"""How the provenance of every key the rule writes (and the reason of every key it removes) starts."""


@attrs.frozen
class Removal:
    """A key an engine without an optimizer has no use for: removed, and why."""

    path: str
    """The dotted ds key (a whole section, or one key of one)."""
    why: str
    """What it is for, and what DeepSpeed does with it in an engine without an optimizer."""


REMOVED: Final = (
    Removal(
        "optimizer",
        "an engine without an optimizer: DeepSpeed would build this one (with offload_optimizer, a CPU Adam over the "
        "parameters: trl #955)",
    ),
    Removal("scheduler", "the learning-rate schedule of an optimizer there is none of"),
    Removal("zero_optimization.offload_optimizer", "where the optimizer's states live: there are none"),
    Removal(
        "zero_optimization.zenflow",
        "ZenFlow runs an offloaded optimizer's step; without one DeepSpeed still sets the engine's "
        'gradient_accumulation_steps to its update_interval (0 for "auto")',
    ),
    Removal(
        "zero_optimization.compute_grad_norm",
        "the gradient norm of an optimizer step; DeepSpeed refuses false outside stages 1-2 "
        '("compute_grad_norm=false is supported only with ZeRO Stage 1 or 2")',
    ),
    Removal(
        "fp16.fp16_master_weights_and_grads",
        "the optimizer's master weights; at stage 0 DeepSpeed asserts "
        '"Fp16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3."',
    ),
    Removal(
        "bf16.bf16_master_weights_and_grads",
        "the optimizer's master weights; at stage 0 DeepSpeed asserts "
        '"Bf16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3."',
    ),
    Removal(
        "bf16.bf16_optimizer_states",
        "the optimizer's states; at stage 0 DeepSpeed asserts "
        '"bf16_optimizer_states is only supported with ZeRO Stage 1, 2, or 3."',
    ),
    Removal(
        "managed_gradient_accumulation",
        "gradient accumulation between optimizer steps; false, with overlap_comm at stage 0, DeepSpeed asserts "
        '"managed_gradient_accumulation=False supports ZeRO overlap_comm only with ZeRO stage 2"',
    ),
)
"""What ``for_inference`` removes wherever the training config sets it: the keys only an optimizer step reads, some of
which DeepSpeed refuses once the stage is 0."""

_STAGE3_ONLY_AUTO: Final = (
    'the HF Trainer fills this "auto" only at ZeRO stage 3 and DeepSpeed reads the key only there; the inference '
    "engine runs at stage 0"
)
_DEEPCOMPILE: Final = (
    "ZeRO inference has no DeepCompile mode (OpenRLHF PR #979 turns it off for every engine without an optimizer; "
    "DeepSpeed PR #7225)"
)
_OFFLOAD: Final = "offload=True puts the parameters in pinned CPU memory between uses (OpenRLHF's eval config)"
_HIDDEN_SIZE: Final = Spec("int", gt=0, auto=False)
_MISSING: Final = object()


class _ModelOnly:
    """The run as ``for_inference`` knows it (``hf_table.RunFacts``): the inference model's hidden size, when given.

    It has no training arguments, so only the fill table's rows that read none are asked (``_fill_from_model``).
    """

    def __init__(self, hidden_size: int | None) -> None:
        self.hidden_size = hidden_size

    @property
    def training(self) -> None:
        return None

    @property
    def world_size(self) -> int:
        raise AttributeError("for_inference knows no world size: the rows that read one are left for resolve")

    @property
    def world_text(self) -> str:
        raise AttributeError("for_inference knows no world size: the rows that read one are left for resolve")

    def hidden(self) -> Fact | Need:
        if self.hidden_size is None:
            return Need('"auto" needs the inference model\'s hidden size', needs=("hidden_size",))
        return Fact(self.hidden_size, "hidden_size", f"hidden_size argument {self.hidden_size}")

    def steps(self) -> Fact | Need:
        return Need('"auto" needs the number of optimizer steps', needs=("total_steps",))


class _Derivation:
    """One ``for_inference`` call: the ds_config dict being rewritten, the provenance of what it wrote, what it
    removed."""

    def __init__(self, config: ConfigBase) -> None:
        self.data = to_dict(config)
        self.origins: dict[str, str] = {}
        self.removed: list[Explanation] = []

    def get(self, path: str) -> Any:
        node: Any = self.data
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                return _MISSING
            node = node[key]
        return node

    def write(self, path: str, value: Any, why: str) -> None:
        *sections, key = path.split(".")
        node = self.data
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = list(value) if isinstance(value, tuple) else value
        self.origins[path] = f"{ORIGIN}: {why}"

    def remove(self, path: str, why: str) -> None:
        *sections, key = path.split(".")
        node: Any = self.data
        for section in sections:
            node = node.get(section) if isinstance(node, dict) else None
        if isinstance(node, dict) and key in node:
            self.removed.append(Explanation(path, node.pop(key), f"{ORIGIN}: {why}", removed=True))


def _training_stage(config: ConfigBase) -> int:
    """The training config's ZeRO stage (0 when it sets none); ``"auto"`` is refused."""
    stage = None if config.zero_optimization is None else config.zero_optimization.stage
    if stage is None:
        return 0
    if not isinstance(stage, int):
        raise InvalidValueError(
            Problem(
                "zero_optimization.stage",
                f"got {describe(stage)}, expected 0, 1, 2 or 3: for_inference keeps stage 3 and turns 0-2 into 0",
                'set the training stage; Accelerate fills "auto" from its zero_stage setting',
            )
        )
    return stage


def _check_arguments(offload: Any, hidden_size: Any) -> None:
    problems = []
    if not isinstance(offload, bool):
        problems.append(
            Problem(
                "offload",
                f"got {describe(offload)}, expected true or false",
                "True puts the parameters in CPU memory (ZeRO stage 3); False keeps the training config's offload_param",
            )
        )
    message = None if hidden_size is None else check_value(_HIDDEN_SIZE, hidden_size)
    if message is not None:
        problems.append(Problem("hidden_size", message, "give the inference model's config.hidden_size"))
    if problems:
        raise InvalidValueError(problems)


def _offload_params(d: _Derivation, training: int, stage: int | None) -> None:
    """``offload=True``: parameters to CPU, pinned; only when the inference engine runs at stage 3."""
    if stage is None and training != 3:
        why = f"the training config has stage {training}, so the inference engine runs at stage 0"
        fix = "train at ZeRO stage 3 to offload the inference model's parameters"
    elif stage == 0:
        why, fix = "the engine is given stage=0", "give it stage=3 to offload its parameters"
    else:
        why = ""
    if why:
        raise InvalidValueError(
            Problem(
                "zero_optimization.offload_param",
                f"offload=True writes {{device: cpu, pin_memory: true}} here, which needs ZeRO stage 3; {why}, where "
                "DeepSpeed ignores offload_param",
                f"{fix}, or call for_inference() without offload",
            )
        )
    d.data["zero_optimization"].pop("offload_param", None)  # replaced whole: an NVMe path or buffers would not fit
    d.write("zero_optimization.offload_param.device", "cpu", _OFFLOAD)
    d.write("zero_optimization.offload_param.pin_memory", True, _OFFLOAD)


def _fill_from_model(d: _Derivation, inference_stage: int, hidden_size: int | None) -> None:
    """The fill table's ``"auto"`` that the model alone fills, from ``hidden_size``; the stage-3-only ones go below
    stage 3."""
    run = _ModelOnly(hidden_size)
    for fill in FILLS:
        if d.get(fill.path) != "auto":
            continue
        if fill.stage3_only and inference_stage != 3:
            d.remove(fill.path, _STAGE3_ONLY_AUTO)
        elif not fill.arguments_read:
            fact = fill.formula(run)
            if isinstance(fact, Fact):
                d.write(fill.path, fact.value, fact.origin)


def _inference_stage(training: int, stage: Any) -> int:
    """The engine's ZeRO stage: ``stage`` when given (0 or 3), else the training stage's rule (3 stays, 0-2: 0)."""
    if stage is None:
        return 3 if training == 3 else 0
    if isinstance(stage, bool) or stage not in (0, 3):
        raise InvalidValueError(
            Problem(
                "zero_optimization.stage",
                f"got {describe(stage)} for the engine without an optimizer, expected 0 or 3",
                "0: a whole copy on every process; 3: partitioned over the processes (DeepSpeed asserts "
                '"zero stage {1, 2} requires an optimizer")',
            )
        )
    return int(stage)


def _derive(config: C, offload: bool, hidden_size: int | None, stage: int | None) -> tuple[C, list[Explanation]]:
    """The inference config of ``config`` and what the rule removed from it."""
    _check_arguments(offload, hidden_size)
    d = _Derivation(config)
    training = _training_stage(config)
    inference_stage = _inference_stage(training, stage)
    for removal in REMOVED:
        d.remove(removal.path, removal.why)
    if stage is not None and stage != training:
        d.write("zero_optimization.stage", inference_stage, f"the engine's own stage (stage={stage})")
    elif training != inference_stage:
        d.write("zero_optimization.stage", 0, f'DeepSpeed asserts "zero stage {training} requires an optimizer"')
    if offload:
        _offload_params(d, training, stage)
    if d.get("compile.deepcompile") in (True, "auto"):
        d.write("compile.deepcompile", False, _DEEPCOMPILE)
    _fill_from_model(d, inference_stage, hidden_size)
    inference = from_dict(d.data, cls=type(config))
    written = {path for path, _ in leaves(d.data)}
    kept = {path: origin for path, origin in config.provenance.items() if path in written}
    return attrs.evolve(inference, source=config.source, provenance={**kept, **d.origins}), d.removed


def for_inference(config: C, offload: bool = False, *, hidden_size: int | None = None, stage: int | None = None) -> C:
    """The config of an engine without an optimizer (a reference, reward or EMA model) made from training ``config``.

    ZeRO stage 3 stays 3 and stages 1-2 become 0 (DeepSpeed asserts ``"zero stage {} requires an optimizer"``), or
    ``stage`` (0 or 3) when given;
    ``offload=True`` puts the parameters in pinned CPU memory (stage 3 only: ``InvalidValueError`` below it); the
    ``"auto"`` hidden-size buckets are filled from ``hidden_size`` (the inference model's ``config.hidden_size``);
    DeepCompile is turned off; the optimizer, the scheduler and what only an optimizer step reads (``REMOVED``) are
    removed; the precision, the batch sizes, AutoTP and ``gradient_clipping`` are kept. The module docstring gives
    each step's reason. Provenance says which keys the rule wrote (``explain``); ``source`` is kept.
    """
    inference, _ = _derive(config, offload, hidden_size, stage)
    return inference


def removed_by_for_inference(config: ConfigBase) -> list[Explanation]:
    """What ``for_inference`` removes from ``config``: one ``Explanation`` per key (``removed=True``), with the value it
    had and why, in the order the rule removes them."""
    _, removed = _derive(config, False, None, None)
    return removed
