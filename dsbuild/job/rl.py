"""The TRL-named specs of RL post-training: ``DPOSpec`` (TRL 1.16's ``DPOConfig``), ``GRPOSpec`` (``GRPOConfig``),
``RLOOSpec`` (``RLOOConfig``), ``RewardSpec`` (``RewardConfig``), ``KTOSpec``
(``KTOConfig``) and TRL's check of the generation batch
(``check_grpo_batch``, ``dsbuild.job.generations``).

Each key is a field named as TRL names it, with TRL's default and a ``Key`` in its metadata (``spec.Key``: the
value's ``Spec``, checked with the config's coercion policy), so a job's ``[dpo]`` / ``[grpo]`` table can be read
from the same metadata as the other tables. A bad value fails where it is set, named by its dotted key
(``dpo.beta``); ``from_trl`` reads a ``DPOConfig`` / ``GRPOConfig`` (or a dict of their arguments) and reports every
bad value at once; ``to_trl`` gives the keyword arguments that build TRL's config again. The training arguments
TRL's configs also carry (learning rate, batch sizes, ...) are ``[training]``'s, not these specs'.

Where TRL only warns and the run would compute nonsense (``robust`` with ``label_smoothing >= 0.5`` divides by
``1 - 2 * label_smoothing``), the spec refuses; every other refusal is one TRL makes too, with TRL's reason.

Nothing here imports torch, transformers or TRL: the losses that use these values are ``dsbuild.rl.losses`` (DPO),
``dsbuild.rl.grpo`` and ``dsbuild.rl.reward``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import attrs

from .._util.suggest import did_you_mean
from ..config.fields import Spec, check_value, coerce, describe
from ..errors import InvalidValueError, Problem, error_of
from .generations import Generations, check_grpo_batch
from .spec import Key, job_keys

__all__ = [
    "DPO_LOSS_TYPES",
    "F_DIVERGENCE_LOSS_TYPES",
    "F_DIVERGENCE_TYPES",
    "GRPO_LOSS_TYPES",
    "IMPORTANCE_SAMPLING_LEVELS",
    "KTO_LOSS_TYPES",
    "MULTI_OBJECTIVE_AGGREGATIONS",
    "SCALE_REWARDS",
    "TRUNCATION_MODES",
    "DPOSpec",
    "GRPOSpec",
    "KTOSpec",
    "RLOOSpec",
    "RewardSpec",
    "check_grpo_batch",
    "clip_range_problem",
    "loss_weights_problem",
]

T = TypeVar("T")

DPO_LOSS_TYPES: Final = (
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
)
"""TRL 1.16's DPO ``loss_type`` names (``DPOTrainer._compute_loss``), in its order."""

F_DIVERGENCE_TYPES: Final = ("reverse_kl", "forward_kl", "js_divergence", "alpha_divergence")
"""DPO's ``f_divergence_type`` values (f-DPO); ``"reverse_kl"`` is standard DPO."""

F_DIVERGENCE_LOSS_TYPES: Final = ("sigmoid", "sigmoid_norm", "hinge", "ipo", "exo_pair", "robust", "discopop", "sft")
"""The loss types TRL allows with an ``f_divergence_type`` other than ``"reverse_kl"`` (``DPOTrainer.__init__``)."""

TRUNCATION_MODES: Final = ("keep_start", "keep_end")
"""DPO's ``truncation_mode``: keep a sequence's first ``max_length`` tokens, or its last (deprecated in TRL)."""

GRPO_LOSS_TYPES: Final = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
"""TRL 1.16's GRPO ``loss_type`` names (``GRPOConfig.loss_type``)."""

SCALE_REWARDS: Final = ("group", "batch", "none")
"""GRPO's ``scale_rewards``: divide the advantages by the group's reward std, the batch's, or not at all (TRL reads
``True`` as ``"group"`` and ``False`` as ``"none"``)."""

IMPORTANCE_SAMPLING_LEVELS: Final = ("token", "sequence")
"""GRPO's ``importance_sampling_level``: one ratio per token, or one per sequence (GSPO)."""

KTO_LOSS_TYPES: Final = ("kto", "apo_zero_unpaired")
"""TRL 1.16's KTO ``loss_type`` names (``KTOConfig.loss_type``)."""

MULTI_OBJECTIVE_AGGREGATIONS: Final = ("sum_then_normalize", "normalize_then_sum")
"""GRPO's ``multi_objective_aggregation`` of several reward functions."""


def _hint(spec: Spec, value: Any) -> str | None:
    """``did you mean`` for a misspelt choice (or the first misspelt item of a list of choices)."""
    if spec.kind == "choice" and isinstance(value, str):
        return did_you_mean(value, spec.choices)
    if spec.kind == "strs" and isinstance(value, tuple):
        wrong = [x for x in value if isinstance(x, str) and x not in spec.choices]
        return did_you_mean(wrong[0], spec.choices) if wrong else None
    return None


def _problem(path: str, spec: Spec, value: Any, nullable: bool) -> Problem | None:
    """What is wrong with ``value`` for ``spec`` at ``path`` (``check_value``; ``None`` only where TRL takes it)."""
    if value is None:
        return None if nullable else Problem(path, "got null, expected a value", "leave the key out for the default")
    message = check_value(spec, value)
    return None if message is None else Problem(path, message, _hint(spec, value))


Judge = Callable[[str, Any], "Problem | None"]
"""What is wrong with a key's value, given its dotted path: the one check of a field, at construction and in
``from_trl``."""


def _judged(judge: Judge, table: str) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def validate(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        problem = judge(f"{table}.{attribute.name}", value)
        if problem is not None:
            raise InvalidValueError(problem)

    return validate


def _as_tuple(value: Any) -> Any:
    """A list (or TRL's single ``str`` loss type) as the tuple a frozen spec holds."""
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list) else value


def _field(table: str, default: Any, kind: Any, *, nullable: bool = False, **bounds: Any) -> Any:
    """A key of TRL's config: its ``Spec`` (never ``"auto"``) in the field's ``Key``, checked where it is set."""
    spec = Spec(kind, auto=False, **bounds)

    def judge(path: str, value: Any) -> Problem | None:
        return _problem(path, spec, value, nullable)

    return attrs.field(
        default=default,
        converter=_as_tuple if kind == "strs" else None,
        validator=_judged(judge, table),
        metadata={"job": Key(spec), "judge": judge},
    )


def loss_weights_problem(path: str, value: Any) -> Problem | None:
    """``loss_weights``: none, or a list of numbers."""
    value = _as_tuple(value)
    if value is None or (isinstance(value, tuple) and value and all(_finite(x) for x in value)):
        return None
    return Problem(path, f"got {describe(value)}, expected a list of numbers")


def clip_range_problem(path: str, value: Any) -> Problem | None:
    """``reward_clip_range``: none, or ``[low, high]`` with ``low <= high``."""
    value = _as_tuple(value)
    if value is None:
        return None
    if isinstance(value, tuple) and len(value) == 2 and all(_finite(x) for x in value) and value[0] <= value[1]:
        return None
    return Problem(path, f"got {describe(value)}, expected [low, high], two numbers with low <= high")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _read(cls: type[T], table: str, given: Mapping[str, Any]) -> T:
    """``cls`` from the arguments of TRL's config: its keys only (the training arguments are left), each coerced
    and checked as config values are; every bad value reported at once, then the checks across keys."""
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    for field in attrs.fields(cls):  # type: ignore[arg-type]
        if "job" not in field.metadata or field.name not in given:
            continue
        key: Key = field.metadata["job"]
        value = _as_tuple(given[field.name]) if field.converter is _as_tuple else given[field.name]
        value = value if key.spec is None else coerce(key.spec, value)
        problem = field.metadata["judge"](f"{table}.{field.name}", value)
        if problem is None:
            values[field.name] = value
        else:
            problems.append(problem)
    if problems:
        raise InvalidValueError(problems)
    return cls(**values)


def _attributes(config: Any, cls: type) -> dict[str, Any]:
    """The values of ``cls``'s keys that TRL's config object ``config`` holds."""
    return {name: getattr(config, name) for name in job_keys(cls) if hasattr(config, name)}


def _trl(spec: Any) -> dict[str, Any]:
    """The keyword arguments of TRL's config: every key of ``spec`` (tuples as the lists TRL holds)."""
    values = {name: getattr(spec, name) for name in job_keys(type(spec))}
    return {name: list(v) if isinstance(v, tuple) else v for name, v in values.items()}


def _refuse(problems: list[Problem]) -> None:
    if problems:
        raise error_of(problems)


@attrs.frozen
class DPOSpec:
    """DPO's options, as TRL 1.16's ``DPOConfig`` names them, with its defaults."""

    beta: float = _field("dpo", 0.1, "float", gt=0)
    """How far the policy may move from the reference (higher: less); IPO's τ. Default 0.1."""
    loss_type: tuple[str, ...] = _field("dpo", ("sigmoid",), "strs", choices=DPO_LOSS_TYPES)
    """The loss, or several summed with ``loss_weights`` (``DPO_LOSS_TYPES``); default ``("sigmoid",)``."""
    loss_weights: tuple[float, ...] | None = attrs.field(
        default=None,
        converter=_as_tuple,
        validator=_judged(loss_weights_problem, "dpo"),
        metadata={
            "job": Key(schema={"type": "array", "items": {"type": "number"}, "minItems": 1}),
            "judge": loss_weights_problem,
        },
    )
    """One weight per loss type; default 1.0 each."""
    label_smoothing: float = _field("dpo", 0.0, "float", ge=0, lt=1)
    """The probability a label is flipped (``robust``: below 0.5) or EXO's ε (``exo_pair``: above 0); default 0."""
    f_divergence_type: str = _field("dpo", "reverse_kl", "choice", choices=F_DIVERGENCE_TYPES)
    """The f-divergence between policy and reference (f-DPO); default ``"reverse_kl"`` (standard DPO)."""
    f_alpha_divergence_coef: float = _field("dpo", 0.5, "float")
    """α of ``"alpha_divergence"``; default 0.5."""
    ld_alpha: float | None = _field("dpo", None, "float", nullable=True, ge=0, le=1)
    """LD-DPO's α: the weight of the tokens past the shorter completion's length; default none (no weighting)."""
    use_weighting: bool = _field("dpo", False, "bool")
    """WPO's weighting of each pair by the policy's length-normalised probabilities; default off."""
    discopop_tau: float = _field("dpo", 0.05, "float", gt=0)
    """DiscoPOP's τ (``loss_type = "discopop"``); default 0.05."""
    max_length: int | None = _field("dpo", 1024, "int", nullable=True, ge=1)
    """Tokens of prompt + completion at most; ``None``: no truncation. Default 1024."""
    truncation_mode: str = _field("dpo", "keep_start", "choice", choices=TRUNCATION_MODES)
    """Which end of a too-long sequence is kept; default ``"keep_start"``."""
    padding_free: bool = _field("dpo", False, "bool")
    """TRL 1.16 warns and pads anyway; default off."""
    precompute_ref_log_probs: bool = _field("dpo", False, "bool")
    """Score the whole dataset under the reference once before training, then drop the reference; default off."""
    precompute_ref_batch_size: int | None = _field("dpo", None, "int", nullable=True, gt=0)
    """Rows per forward while precomputing; default the per-device batch size."""
    disable_dropout: bool = _field("dpo", True, "bool")
    """Turn dropout off in the policy and the reference; default on."""
    sync_ref_model: bool = _field("dpo", False, "bool")
    """TR-DPO: mix the policy into the reference every ``ref_model_sync_steps``; default off."""
    ref_model_mixup_alpha: float = _field("dpo", 0.6, "float", ge=0, le=1)
    """TR-DPO's α: ``ref = α · policy + (1 - α) · ref``; default 0.6."""
    ref_model_sync_steps: int = _field("dpo", 512, "int", gt=0)
    """TR-DPO's τ: steps between two syncs; default 512."""

    def __attrs_post_init__(self) -> None:
        _refuse(self.problems())

    def problems(self) -> list[Problem]:
        """What TRL refuses in these values together (each fine alone), as problems of kind ``"rule"``."""
        found = []
        types = self.loss_type
        if not types:
            found.append(Problem("dpo.loss_type", "got an empty list, expected one loss type or more", kind="rule"))
        if self.loss_weights is not None and len(self.loss_weights) != len(types):
            message = f"got {len(self.loss_weights)} weights for {len(types)} loss types"
            found.append(Problem("dpo.loss_weights", message, "give one weight per loss_type", kind="rule"))
        if self.f_divergence_type != "reverse_kl" and not set(types) <= set(F_DIVERGENCE_LOSS_TYPES):
            others = ", ".join(repr(t) for t in types if t not in F_DIVERGENCE_LOSS_TYPES)
            message = f"{self.f_divergence_type!r} does not apply to loss type {others}"
            hint = f"use 'reverse_kl', or loss types from {', '.join(map(repr, F_DIVERGENCE_LOSS_TYPES))}"
            found.append(Problem("dpo.f_divergence_type", message, hint, kind="rule"))
        if "exo_pair" in types and self.label_smoothing == 0.0:
            hint = "EXO's ε: the paper recommends 1e-3"
            found.append(Problem("dpo.label_smoothing", "must be > 0 with 'exo_pair'", hint, kind="rule"))
        if "robust" in types and self.label_smoothing >= 0.5:
            message = f"got {self.label_smoothing}, expected < 0.5 with 'robust' (it divides by 1 - 2 · ε)"
            found.append(Problem("dpo.label_smoothing", message, "the paper's typical value is 0.1", kind="rule"))
        if self.use_weighting and {"aot", "aot_unpaired"} & set(types):
            message = "WPO weighting is not defined for 'aot' / 'aot_unpaired' (they sort the pairs)"
            found.append(Problem("dpo.use_weighting", message, kind="rule"))
        if self.sync_ref_model and self.precompute_ref_log_probs:
            message = "a synced reference makes precomputed log-probs stale"
            hint = "set precompute_ref_log_probs = false or sync_ref_model = false"
            found.append(Problem("dpo.sync_ref_model", message, hint, kind="rule"))
        return found

    @classmethod
    def from_trl(cls, config: Any) -> DPOSpec:
        """The spec of a TRL ``DPOConfig``, or of a dict of its arguments (keys that are not DPO's are left)."""
        given = config if isinstance(config, Mapping) else _attributes(config, cls)
        return _read(cls, "dpo", given)

    def to_trl(self) -> dict[str, Any]:
        """The keyword arguments of TRL's ``DPOConfig`` (with the training arguments: ``DPOConfig(**these, ...)``)."""
        return _trl(self)


@attrs.frozen
class GRPOSpec(Generations):
    """GRPO's options, as TRL 1.16's ``GRPOConfig`` names them, with its defaults."""

    num_generations: int = _field("grpo", 8, "int", ge=2)
    """Completions sampled per prompt (G); the generation batch must hold whole groups. Default 8."""
    num_generations_eval: int | None = _field("grpo", None, "int", nullable=True, ge=1)
    """Completions per prompt in evaluation; default ``num_generations``."""
    max_completion_length: int | None = _field("grpo", 512, "int", nullable=True, ge=1)
    """Tokens generated per completion at most (``dr_grpo``'s normaliser); default 512."""
    generation_batch_size: int | None = _field("grpo", None, "int", nullable=True, ge=1)
    """Completions generated at once; default ``per_device_train_batch_size × world size × steps_per_generation``."""
    steps_per_generation: int | None = _field("grpo", None, "int", nullable=True, ge=1)
    """Micro-batch steps one generation feeds; default ``gradient_accumulation_steps``."""
    shuffle_dataset: bool = _field("grpo", True, "bool")
    """Draw the prompts in a seeded random order (TRL's ``RepeatSampler``), or in the file's order; default on."""
    ds3_gather_for_generation: bool = _field("grpo", True, "bool")
    """Under ZeRO-3, gather the whole policy on every rank to generate (fast, needs the memory); default on."""
    temperature: float = _field("grpo", 1.0, "float", gt=0)
    """Sampling temperature (the log-probs divide the logits by it too); default 1."""
    top_p: float = _field("grpo", 1.0, "float", gt=0, le=1)
    """Nucleus sampling's cumulative probability; default 1 (every token)."""
    top_k: int = _field("grpo", 0, "int", ge=0)
    """Sample from the k likeliest tokens; 0 (the default): every token."""
    min_p: float | None = _field("grpo", None, "float", nullable=True, ge=0, le=1)
    """Minimum probability relative to the likeliest token; default none."""
    repetition_penalty: float = _field("grpo", 1.0, "float", gt=0)
    """Penalty of tokens already in the prompt and completion; default 1 (none)."""
    beta: float = _field("grpo", 0.0, "float", ge=0)
    """Weight of the k3 KL to the reference; 0 (the default) loads no reference."""
    num_iterations: int = _field("grpo", 1, "int", ge=1)
    """Optimisation passes over each generation batch (μ); default 1."""
    epsilon: float = _field("grpo", 0.2, "float", ge=0)
    """Lower clipping bound of the ratio (``1 - epsilon``); default 0.2."""
    epsilon_high: float | None = _field("grpo", None, "float", nullable=True, ge=0)
    """Upper clipping bound (``1 + epsilon_high``; ``cispo``'s cap); default ``epsilon`` (DAPO recommends 0.28)."""
    delta: float | None = _field("grpo", None, "float", nullable=True, gt=0)
    """Two-sided GRPO's cap of the unclipped ratio (INTELLECT-2); default none."""
    importance_sampling_level: str = _field("grpo", "token", "choice", choices=IMPORTANCE_SAMPLING_LEVELS)
    """``"token"`` (default) or ``"sequence"`` (GSPO)."""
    scale_rewards: str = _field("grpo", "group", "choice", choices=SCALE_REWARDS)
    """Divide the advantages by the group's std (``"group"``, default), the batch's, or not (``"none"``)."""
    loss_type: str = _field("grpo", "dapo", "choice", choices=GRPO_LOSS_TYPES)
    """How token losses are aggregated (``GRPO_LOSS_TYPES``); default ``"dapo"``."""
    sapo_temperature_neg: float = _field("grpo", 1.05, "float", gt=0)
    """``sapo``'s temperature of the tokens of negative advantage; default 1.05."""
    sapo_temperature_pos: float = _field("grpo", 1.0, "float", gt=0)
    """``sapo``'s temperature of the tokens of positive advantage; default 1."""
    vespo_k_pos: float = _field("grpo", 2.0, "float")
    """``vespo``'s power ``k`` of the sequence weight of a positive advantage; default 2."""
    vespo_lambda_pos: float = _field("grpo", 3.0, "float")
    """``vespo``'s rate ``λ`` of the sequence weight of a positive advantage; default 3."""
    vespo_k_neg: float = _field("grpo", 3.0, "float")
    """``vespo``'s power ``k`` of the sequence weight of a negative advantage; default 3."""
    vespo_lambda_neg: float = _field("grpo", 2.0, "float")
    """``vespo``'s rate ``λ`` of the sequence weight of a negative advantage; default 2."""
    multi_objective_aggregation: str = _field(
        "grpo", "sum_then_normalize", "choice", choices=MULTI_OBJECTIVE_AGGREGATIONS
    )
    """Several reward functions: sum then normalise (default), or normalise each then sum (GDPO)."""
    mask_truncated_completions: bool = _field("grpo", False, "bool")
    """Leave completions cut at ``max_completion_length`` out of the loss (DAPO); default off."""
    top_entropy_quantile: float = _field("grpo", 1.0, "float", ge=0, le=1)
    """Keep only this top quantile of tokens by entropy in the loss; default 1 (all)."""
    use_bias_correction_kl: bool = _field("grpo", True, "bool")
    """Multiply the KL by the importance ratio (DeepSeek-V3.2's unbiased estimate); default on."""
    sync_ref_model: bool = _field("grpo", False, "bool")
    """Mix the policy into the reference every ``ref_model_sync_steps`` (needs ``beta`` > 0); default off."""
    ref_model_mixup_alpha: float = _field("grpo", 0.6, "float", ge=0, le=1)
    """The mix: ``ref = α · policy + (1 - α) · ref``; default 0.6."""
    ref_model_sync_steps: int = _field("grpo", 512, "int", gt=0)
    """Steps between two syncs; default 512."""
    log_completions: bool = _field("grpo", False, "bool")
    """Write each generation batch's prompts, completions, rewards and advantages to the run folder's
    ``completions.jsonl`` and log a few of them; default off."""
    num_completions_to_print: int | None = _field("grpo", None, "int", nullable=True, ge=0)
    """How many completions ``log_completions`` logs at each generation; default all of them."""

    def __attrs_post_init__(self) -> None:
        _refuse(self.problems())

    def problems(self) -> list[Problem]:
        """What TRL refuses in these values together (each fine alone), as problems of kind ``"rule"``."""
        found = []
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            message = "'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time"
            found.append(Problem("grpo.generation_batch_size", message, "keep one", kind="rule"))
        if self.sync_ref_model and self.beta == 0.0:
            message = "there is no reference to sync with beta = 0"
            found.append(Problem("grpo.sync_ref_model", message, "set beta > 0 or sync_ref_model = false", kind="rule"))
        if self.loss_type == "dr_grpo" and self.max_completion_length is None:
            message = "'dr_grpo' divides by max_completion_length"
            found.append(Problem("grpo.max_completion_length", message, "set it", kind="rule"))
        return found

    @classmethod
    def from_trl(cls, config: Any) -> GRPOSpec:
        """The spec of a TRL ``GRPOConfig``, or of a dict of its arguments (keys that are not GRPO's are left).

        A ``GRPOConfig`` has filled both ``generation_batch_size`` and ``steps_per_generation`` from the batch sizes;
        the spec keeps ``steps_per_generation`` (the other follows from it), so ``to_trl`` builds the config again.
        TRL's ``scale_rewards`` ``True`` / ``False`` are ``"group"`` / ``"none"``."""
        values = dict(config) if isinstance(config, Mapping) else _attributes(config, cls)
        if not isinstance(config, Mapping):
            values.pop("generation_batch_size", None)
        if isinstance(values.get("scale_rewards"), bool):
            values["scale_rewards"] = "group" if values["scale_rewards"] else "none"
        return _read(cls, "grpo", values)

    def to_trl(self) -> dict[str, Any]:
        """The keyword arguments of TRL's ``GRPOConfig`` (with the training arguments: ``GRPOConfig(**these, ...)``)."""
        return _trl(self)


@attrs.frozen
class RLOOSpec(Generations):
    """RLOO's options, as TRL 1.16's ``RLOOConfig`` names them, with its defaults (the generation keys are
    ``GRPOSpec``'s, with RLOO's defaults: 2 generations, ``beta`` 0.05)."""

    num_generations: int = _field("rloo", 2, "int", ge=2)
    """Completions sampled per prompt; the generation batch must hold whole groups. Default 2."""
    num_generations_eval: int | None = _field("rloo", None, "int", nullable=True, ge=1)
    """Completions per prompt in evaluation; default ``num_generations``."""
    max_completion_length: int | None = _field("rloo", 512, "int", nullable=True, ge=1)
    """Tokens generated per completion at most; default 512."""
    ds3_gather_for_generation: bool = _field("rloo", True, "bool")
    """Under ZeRO-3, gather the whole policy on every rank to generate; default on."""
    shuffle_dataset: bool = _field("rloo", True, "bool")
    """Draw the prompts in a seeded random order, or in the file's order; default on."""
    generation_batch_size: int | None = _field("rloo", None, "int", nullable=True, ge=1)
    """Completions generated at once; default ``per_device_train_batch_size × world size × steps_per_generation``."""
    steps_per_generation: int | None = _field("rloo", None, "int", nullable=True, ge=1)
    """Micro-batch steps one generation feeds; default ``gradient_accumulation_steps``."""
    temperature: float = _field("rloo", 1.0, "float", gt=0)
    """Sampling temperature (the log-probs divide the logits by it too); default 1."""
    top_p: float = _field("rloo", 1.0, "float", gt=0, le=1)
    """Nucleus sampling's cumulative probability; default 1."""
    top_k: int = _field("rloo", 0, "int", ge=0)
    """Sample from the k likeliest tokens; 0 (the default): every token."""
    min_p: float | None = _field("rloo", None, "float", nullable=True, ge=0, le=1)
    """Minimum probability relative to the likeliest token; default none."""
    repetition_penalty: float = _field("rloo", 1.0, "float", gt=0)
    """Penalty of tokens already in the prompt and completion; default 1 (none)."""
    beta: float = _field("rloo", 0.05, "float", ge=0)
    """Weight of the KL penalty on each completion's reward (first order, summed over its tokens); 0 loads no
    reference. Default 0.05."""
    num_iterations: int = _field("rloo", 1, "int", ge=1)
    """Optimisation passes over each generation batch; default 1."""
    epsilon: float = _field("rloo", 0.2, "float", ge=0)
    """Lower clipping bound of the sequence ratio (``1 - epsilon``); default 0.2."""
    epsilon_high: float | None = _field("rloo", None, "float", nullable=True, ge=0)
    """Upper clipping bound (``1 + epsilon_high``); default ``epsilon``."""
    normalize_advantages: bool = _field("rloo", False, "bool")
    """Normalise the advantages over the generation batch (mean 0, std 1); default off."""
    reward_clip_range: tuple[float, ...] | None = attrs.field(
        default=None,
        converter=_as_tuple,
        validator=_judged(clip_range_problem, "rloo"),
        metadata={
            "job": Key(schema={"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}),
            "judge": clip_range_problem,
        },
    )
    """``[low, high]``: each reward clipped to it before the KL penalty; default none (not clipped)."""
    mask_truncated_completions: bool = _field("rloo", False, "bool")
    """Leave completions cut at ``max_completion_length`` out of the loss; default off."""
    sync_ref_model: bool = _field("rloo", False, "bool")
    """Mix the policy into the reference every ``ref_model_sync_steps`` (needs ``beta`` > 0); default off."""
    ref_model_mixup_alpha: float = _field("rloo", 0.6, "float", ge=0, le=1)
    """The mix: ``ref = α · policy + (1 - α) · ref``; default 0.6."""
    ref_model_sync_steps: int = _field("rloo", 512, "int", gt=0)
    """Steps between two syncs; default 512."""
    log_completions: bool = _field("rloo", False, "bool")
    """Write each generation batch's completions, rewards and advantages to ``completions.jsonl``; default off."""
    num_completions_to_print: int | None = _field("rloo", None, "int", nullable=True, ge=0)
    """How many completions ``log_completions`` logs at each generation; default all of them."""

    def __attrs_post_init__(self) -> None:
        _refuse(self.problems())

    def problems(self) -> list[Problem]:
        """What TRL refuses in these values together (each fine alone), as problems of kind ``"rule"``."""
        found = []
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            message = "'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time"
            found.append(Problem("rloo.generation_batch_size", message, "keep one", kind="rule"))
        if self.sync_ref_model and self.beta == 0.0:
            message = "there is no reference to sync with beta = 0"
            found.append(Problem("rloo.sync_ref_model", message, "set beta > 0 or sync_ref_model = false", kind="rule"))
        return found

    @classmethod
    def from_trl(cls, config: Any) -> RLOOSpec:
        """The spec of a TRL ``RLOOConfig``, or of a dict of its arguments (``GRPOSpec.from_trl``'s rules)."""
        values = dict(config) if isinstance(config, Mapping) else _attributes(config, cls)
        if not isinstance(config, Mapping):
            values.pop("generation_batch_size", None)
        return _read(cls, "rloo", values)

    def to_trl(self) -> dict[str, Any]:
        """The keyword arguments of TRL's ``RLOOConfig`` (with the training arguments)."""
        return _trl(self)


@attrs.frozen
class RewardSpec:
    """Reward modelling's options, as TRL 1.16's ``RewardConfig`` names them, with its defaults."""

    max_length: int | None = _field("reward", 1024, "int", nullable=True, ge=1)
    """Tokens of prompt + completion at most: a pair whose chosen or rejected sequence is longer is left out (not
    cut); ``None``: every pair is kept. Default 1024."""
    center_rewards_coefficient: float | None = _field("reward", None, "float", nullable=True, ge=0)
    """Weight of ``mean((r_chosen + r_rejected)²)`` added to the loss, which pulls the rewards toward a mean of zero
    (Eisenstein et al., 2023; TRL recommends 0.01); default none (no term)."""
    disable_dropout: bool = _field("reward", True, "bool")
    """Turn dropout off in the model; default on."""

    @classmethod
    def from_trl(cls, config: Any) -> RewardSpec:
        """The spec of a TRL ``RewardConfig``, or of a dict of its arguments (keys that are not its own are left)."""
        given = config if isinstance(config, Mapping) else _attributes(config, cls)
        return _read(cls, "reward", given)

    def to_trl(self) -> dict[str, Any]:
        """The keyword arguments of TRL's ``RewardConfig`` (with the training arguments)."""
        return _trl(self)


@attrs.frozen
class KTOSpec:
    """KTO's options, as TRL 1.16's ``KTOConfig`` names them, with its defaults."""

    beta: float = _field("kto", 0.1, "float", gt=0)
    """How far the policy may move from the reference (higher: less); default 0.1."""
    loss_type: str = _field("kto", "kto", "choice", choices=KTO_LOSS_TYPES)
    """``"kto"`` (with the KL estimate from mismatched pairs) or ``"apo_zero_unpaired"`` (no KL); default ``"kto"``."""
    desirable_weight: float = _field("kto", 1.0, "float", gt=0)
    """Weight of each desirable completion's loss; default 1.0."""
    undesirable_weight: float = _field("kto", 1.0, "float", gt=0)
    """Weight of each undesirable completion's loss; default 1.0."""
    max_length: int | None = _field("kto", 1024, "int", nullable=True, ge=1)
    """Tokens of prompt + completion at most, the end cut (a record whose prompt alone fills it is left out);
    ``None``: no truncation. Default 1024."""
    precompute_ref_batch_size: int | None = _field("kto", None, "int", nullable=True, gt=0)
    """Records per forward while the reference scores them before training (``[reference] precompute``); default
    the per-device batch size."""
    disable_dropout: bool = _field("kto", True, "bool")
    """Turn dropout off in the policy and the reference; default on."""

    @classmethod
    def from_trl(cls, config: Any) -> KTOSpec:
        """The spec of a TRL ``KTOConfig``, or of a dict of its arguments (keys that are not its own are left)."""
        given = config if isinstance(config, Mapping) else _attributes(config, cls)
        return _read(cls, "kto", given)

    def to_trl(self) -> dict[str, Any]:
        """The keyword arguments of TRL's ``KTOConfig`` (with the training arguments)."""
        return _trl(self)
