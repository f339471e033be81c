"""resolve() against the HF Trainer's own code: the same ds_config, or the same conflicts, on generated configs.

Each example is a ds_config with every key of HF's "auto" table absent, ``"auto"``, explicit and
agreeing, or explicit and disagreeing; training arguments; a world size; a model stand-in. HF
resolves it with ``HfTrainerDeepSpeedConfig(config).trainer_config_process(args)`` then
``.trainer_config_finalize(args, model, steps)`` (CPU, no distributed init), and DeepSpeed's own
``_set_batch_related_parameters`` derives the batch sizes HF leaves out. dsbuild must then give:

- the same ds_config (all three batch sizes written), when HF succeeds with no ``"auto"`` left;
- an ``UnresolvedAutoError`` naming exactly the keys HF leaves ``"auto"`` (for DeepSpeed to
  replace silently with its defaults);
- a ``ConflictError`` naming the keys HF's mismatch error names, in HF's order, plus only the
  intended extras: batch sizes the config leaves unset whose derived value disagrees with the
  training arguments, and ``checkpoint.use_node_local_storage: false`` under ``save_on_each_node``;
- an ``InvalidValueError`` when DeepSpeed's batch assertion fails on HF's result.
"""

from __future__ import annotations

import types
from types import SimpleNamespace as NS
from typing import Any

import pytest
from deepspeed.runtime.config import DeepSpeedConfig
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from transformers import TrainingArguments
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

from dsbuild import Config, ConfigError, ConflictError, InvalidValueError, UnresolvedAutoError
from dsbuild.resolve.training import Training

pytestmark = pytest.mark.train  # the training extra; tests/conftest.py skips it without

AUTO = "auto"
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
HIDDEN_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
EXAMPLES = settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


# -- what HF reads --------------------------------------------------------------------


@st.composite
def training_args(draw: st.DrawFn) -> NS:
    """A TrainingArguments stand-in with every attribute HF's DeepSpeed integration reads.

    ``get_warmup_steps`` is TrainingArguments' own method, bound to the stand-in.
    """
    precision = draw(st.sampled_from(["fp32", "fp16", "bf16", "fp16_eval", "bf16_eval"]))
    args = NS(
        world_size=draw(st.sampled_from([1, 2, 3, 4, 8])),
        per_device_train_batch_size=draw(st.integers(1, 8)),
        gradient_accumulation_steps=draw(st.integers(1, 4)),
        max_grad_norm=draw(st.sampled_from([0.0, 0.5, 1.0, 1])),
        learning_rate=draw(st.sampled_from([5e-5, 1e-4, 3e-5, 1e-3])),
        adam_beta1=draw(st.sampled_from([0.9, 0.8])),
        adam_beta2=draw(st.sampled_from([0.999, 0.95])),
        adam_epsilon=draw(st.sampled_from([1e-8, 1e-6])),
        weight_decay=draw(st.sampled_from([0.0, 0.01, 0.1])),
        save_on_each_node=draw(st.booleans()),
        fp16=precision == "fp16",
        fp16_full_eval=precision == "fp16_eval",
        bf16=precision == "bf16",
        bf16_full_eval=precision == "bf16_eval",
        warmup_steps=draw(st.one_of(st.integers(0, 50), st.floats(0.01, 0.99), st.sampled_from([1.0, 2.5]))),
    )
    args.get_warmup_steps = types.MethodType(TrainingArguments.get_warmup_steps, args)
    return args


@st.composite
def models(draw: st.DrawFn) -> NS:
    """Stand-ins for the hidden-size lookups HF makes, and one without any hidden size."""
    size = draw(st.integers(1, 5000))
    form = draw(st.sampled_from(["hidden_size", "hidden_sizes", "text_config", "text_config_sizes", "none"]))
    if form == "hidden_size":
        return NS(config=NS(hidden_size=size))
    if form == "hidden_sizes":
        return NS(config=NS(hidden_sizes=[max(1, size // 2), size]))
    if form == "text_config":
        return NS(config=NS(text_config=NS(hidden_size=size)))
    if form == "text_config_sizes":
        return NS(config=NS(text_config=NS(hidden_sizes=[size, max(1, size // 3)])))
    return NS(config=NS(vocab_size=size))


# -- the config ----------------------------------------------------------------------


def _other(value: Any) -> Any:
    """A valid value that disagrees with ``value``."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, list):
        return [value[0], 0.5 if value[1] != 0.5 else 0.6]
    if isinstance(value, int):
        return value + 1
    return value * 2 + 0.25


_HOW = ["absent"] * 6 + ["auto"] * 8 + ["same"] * 5 + ["other"]
"""Mostly agreeing keys: one in twenty disagrees, so that many configs resolve."""


def _choose(draw: st.DrawFn, section: dict[str, Any], key: str, fact: Any, *, fill_only: bool = False) -> None:
    """Leave ``key`` out, or set it to "auto", to ``fact``, or to a value that disagrees."""
    how = draw(st.sampled_from(_HOW))
    if how == "auto":
        section[key] = AUTO
    elif how == "same":
        section[key] = fact
    elif how == "other":
        section[key] = _other(fact) if not fill_only else draw(st.integers(1, 10**6))


@st.composite
def hf_configs(draw: st.DrawFn, args: NS, steps: int) -> dict[str, Any]:
    """A ds_config over HF's table, each key's value chosen relative to what ``args`` give it."""
    config: dict[str, Any] = {}
    warmup = max(1, args.get_warmup_steps(steps))
    batch = args.world_size * args.per_device_train_batch_size * args.gradient_accumulation_steps
    for key, fact in zip(
        BATCH_KEYS, (batch, args.per_device_train_batch_size, args.gradient_accumulation_steps), strict=True
    ):
        _choose(draw, config, key, fact)
    _choose(draw, config, "gradient_clipping", args.max_grad_norm)

    if draw(st.booleans()):
        kind = draw(st.sampled_from(["AdamW", "Adam", "Lamb", "Lion", "AdamW8bit"]))
        params: dict[str, Any] = {}
        _choose(draw, params, "lr", args.learning_rate)
        _choose(draw, params, "betas", [args.adam_beta1, args.adam_beta2])
        if kind != "Lion":
            _choose(draw, params, "eps", args.adam_epsilon)
        _choose(draw, params, "weight_decay", args.weight_decay)
        config["optimizer"] = {"type": kind, "params": params}

    if draw(st.booleans()):
        kind = draw(st.sampled_from(["WarmupLR", "WarmupDecayLR", "WarmupCosineLR"]))
        params = {}
        if kind != "WarmupCosineLR":
            _choose(draw, params, "warmup_min_lr", 0, fill_only=True)
            _choose(draw, params, "warmup_max_lr", args.learning_rate)
        else:
            params["cos_min_ratio"] = draw(st.sampled_from([1e-4, AUTO]))  # an "auto" HF does not fill
        if kind != "WarmupLR":
            _choose(draw, params, "total_num_steps", steps)
        _choose(draw, params, "warmup_num_steps", warmup)
        config["scheduler"] = {"type": kind, "params": params}

    for name in ("fp16", "bf16"):
        if draw(st.booleans()):
            section: dict[str, Any] = {}
            _choose(draw, section, "enabled", bool(getattr(args, name) or getattr(args, f"{name}_full_eval")))
            config[name] = section

    if draw(st.booleans()):
        zero: dict[str, Any] = {"stage": draw(st.sampled_from([0, 1, 2, 3, 3, AUTO]))}
        for key in HIDDEN_KEYS:
            _choose(draw, zero, key, 1, fill_only=True)
        gather = draw(st.sampled_from([None, None, True, AUTO]))  # "auto" here is Accelerate's, not HF's
        if gather is not None:
            zero["stage3_gather_16bit_weights_on_model_save"] = gather
        config["zero_optimization"] = zero

    if draw(st.integers(0, 5)) == 0:
        config["checkpoint"] = {"use_node_local_storage": draw(st.booleans())}
    return config


# -- the oracle: HF, then DeepSpeed's batch rules ---------------------------------------------


class HfResult:
    """What the HF Trainer makes of a config: the config it hands on, or the keys of its mismatch error."""

    def __init__(self, config: dict[str, Any], args: NS, model: NS, steps: int) -> None:
        self.mismatches: list[str] = []
        self.hidden_error = False
        hf = HfTrainerDeepSpeedConfig(config)  # deep-copies the dict
        try:
            hf.trainer_config_process(args)
            hf.trainer_config_finalize(args, model, steps)
        except ValueError as error:
            text = str(error)
            if "hidden_size" in text:
                self.hidden_error = True
            else:
                self.mismatches = [
                    line[len("- ds ") :].split("=")[0] for line in text.splitlines() if line.startswith("- ds ")
                ]
        finally:
            unset_hf_deepspeed_config()
        self.config: dict[str, Any] = hf.config


def deepspeed_batch(config: dict[str, Any], world_size: int) -> tuple[dict[str, int] | None, bool]:
    """The batch sizes DeepSpeed derives from ``config`` (its own ``_set_batch_related_parameters``; ``None``
    when it refuses: no batch size given), and whether its ``_batch_assertion`` passes."""
    parser: Any = NS(world_size=world_size, **{key: config.get(key) for key in BATCH_KEYS})
    try:
        DeepSpeedConfig._set_batch_related_parameters(parser)
    except AssertionError:
        return None, False
    try:
        DeepSpeedConfig._batch_assertion(parser)
        ok = True
    except AssertionError:
        ok = False
    return {key: getattr(parser, key) for key in BATCH_KEYS}, ok


def autos_left(config: Any, prefix: str = "") -> list[str]:
    found: list[str] = []
    if isinstance(config, dict):
        for key, value in config.items():
            if value == AUTO:
                found.append(f"{prefix}{key}")
            else:
                found.extend(autos_left(value, f"{prefix}{key}."))
    return found


def expected_extras(config: dict[str, Any], hf: HfResult, args: NS) -> tuple[list[str], bool]:
    """dsbuild's intended extra conflicts, and whether DeepSpeed's batch assertion passes on HF's result."""
    effective, ok = deepspeed_batch(hf.config, args.world_size)
    facts = {
        "train_batch_size": args.world_size * args.per_device_train_batch_size * args.gradient_accumulation_steps,
        "train_micro_batch_size_per_gpu": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
    }
    extras = [key for key in BATCH_KEYS if effective and key not in config and effective[key] != facts[key]]
    if args.save_on_each_node and config.get("checkpoint", {}).get("use_node_local_storage") is False:
        extras.append("checkpoint.use_node_local_storage")
    return extras, ok


# -- the property ----------------------------------------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, Any], NS, NS, int]:
    args = draw(training_args())
    steps = draw(st.integers(1, 2000))
    return draw(hf_configs(args, steps)), args, draw(models()), steps


@EXAMPLES
@given(scenarios())
def test_resolve_matches_the_hf_trainer(scenario: tuple[dict[str, Any], NS, NS, int]) -> None:
    """dsbuild resolves a config as the HF Trainer does, or fails where it fails, naming the same keys."""
    config, args, model, steps = scenario
    hf = HfResult(config, args, model, steps)
    try:
        resolved: Config | ConfigError = Config.from_dict(config).resolve(
            world_size=args.world_size, training=args, model=model, total_steps=steps
        )
    except ConfigError as error:
        resolved = error
    # The same arguments typed as Python keywords (every one given, HF's defaults included) resolve the same.
    keywords = Training(**{k: v for k, v in vars(args).items() if k not in ("world_size", "get_warmup_steps")})
    try:
        typed: Config | ConfigError = Config.from_dict(config).resolve(
            world_size=args.world_size, training=keywords, model=model, total_steps=steps
        )
    except ConfigError as error:
        typed = error
    assert type(typed) is type(resolved) and str(typed) == str(resolved)
    extras, batch_ok = expected_extras(config, hf, args)

    if hf.hidden_error:
        event("HF: no hidden size")
        allowed = (ConflictError, UnresolvedAutoError) if batch_ok else (ConflictError, InvalidValueError)
        assert isinstance(resolved, allowed), resolved
        if isinstance(resolved, UnresolvedAutoError):
            assert any(p.path.startswith("zero_optimization.") for p in resolved.problems)
        return

    if hf.mismatches or extras:
        event("HF: mismatch" if hf.mismatches else "dsbuild only: derived conflict")
        assert isinstance(resolved, ConflictError), resolved
        paths = [p.path for p in resolved.problems]
        assert [p for p in paths if p in hf.mismatches] == hf.mismatches  # the same keys, in HF's order
        if batch_ok:
            assert sorted(set(paths) - set(hf.mismatches)) == sorted(extras)
        else:
            assert set(paths) - set(hf.mismatches) <= {*BATCH_KEYS, "checkpoint.use_node_local_storage"}
        return

    if not batch_ok:
        event("DeepSpeed: refuses the batch sizes")
        assert isinstance(resolved, InvalidValueError), resolved
        assert len(resolved.problems) == 1
        assert resolved.problems[0].path in ("train_batch_size", "train_micro_batch_size_per_gpu")
        return

    left = autos_left(hf.config)
    if left:
        event("HF leaves auto")
        assert isinstance(resolved, UnresolvedAutoError), resolved
        assert sorted(p.path for p in resolved.problems) == sorted(left)
        return

    event("same config")
    assert isinstance(resolved, Config), resolved
    effective = deepspeed_batch(hf.config, args.world_size)[0]
    assert effective is not None
    expected = {**hf.config, **effective}
    assert resolved.to_dict() == expected


# -- fixed examples: the corpus configs HF ships, and the divergences --------------------------------


def _hf_args(**overrides: Any) -> NS:
    values: dict[str, Any] = {
        "world_size": 4,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 4,
        "max_grad_norm": 1.0,
        "learning_rate": 3e-5,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_epsilon": 1e-8,
        "weight_decay": 0.0,
        "save_on_each_node": False,
        "fp16": False,
        "fp16_full_eval": False,
        "bf16": True,
        "bf16_full_eval": False,
        "warmup_steps": 0.1,
        **overrides,
    }
    args = NS(**values)
    args.get_warmup_steps = types.MethodType(TrainingArguments.get_warmup_steps, args)
    return args


ZERO3_ALL_AUTO: dict[str, Any] = {
    "fp16": {"enabled": AUTO, "loss_scale": 0, "initial_scale_power": 16},
    "bf16": {"enabled": AUTO},
    "optimizer": {"type": "AdamW", "params": {"lr": AUTO, "betas": AUTO, "eps": AUTO, "weight_decay": AUTO}},
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {"warmup_min_lr": AUTO, "warmup_max_lr": AUTO, "warmup_num_steps": AUTO, "total_num_steps": AUTO},
    },
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "reduce_bucket_size": AUTO,
        "stage3_prefetch_bucket_size": AUTO,
        "stage3_param_persistence_threshold": AUTO,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "gradient_accumulation_steps": AUTO,
    "gradient_clipping": AUTO,
    "train_batch_size": AUTO,
    "train_micro_batch_size_per_gpu": AUTO,
    "steps_per_print": 2000,
}


def test_the_hf_zero3_config_resolves_identically() -> None:
    """The HF-style ZeRO-3 "all auto" config: byte for byte what the HF Trainer hands DeepSpeed."""
    args, model = _hf_args(), NS(config=NS(hidden_size=4096))
    hf = HfResult(ZERO3_ALL_AUTO, args, model, 1000)
    assert not hf.mismatches and not hf.hidden_error
    resolved = Config.from_dict(ZERO3_ALL_AUTO).resolve(world_size=4, training=args, model=model, total_steps=1000)
    assert resolved.to_dict() == hf.config


def test_the_hf_trainer_leaves_a_stage3_bucket_auto_below_stage_3() -> None:
    """HF fills the stage-3 buckets only at stage 3 and hands "auto" on; dsbuild names the key instead."""
    config = {**ZERO3_ALL_AUTO, "zero_optimization": {"stage": 2, "stage3_prefetch_bucket_size": AUTO}}
    args, model = _hf_args(), NS(config=NS(hidden_size=64))
    hf = HfResult(config, args, model, 1000)
    assert hf.config["zero_optimization"]["stage3_prefetch_bucket_size"] == AUTO
    with pytest.raises(UnresolvedAutoError) as info:
        Config.from_dict(config).resolve(world_size=4, training=args, model=model, total_steps=1000)
    assert [p.path for p in info.value.problems] == ["zero_optimization.stage3_prefetch_bucket_size"]


@pytest.mark.parametrize(
    ("config", "keywords", "key"),
    [
        ({"optimizer": {"type": "AdamW", "params": {"eps": 1e-7}}}, {"adam_epsilon": 1e-8}, "optimizer.params.eps"),
        ({"gradient_clipping": 2.0}, {"max_grad_norm": 1.0}, "gradient_clipping"),  # HF's test_hf_ds_config_mismatch
        (
            {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}},
            {"warmup_steps": 0},
            "scheduler.params.warmup_num_steps",
        ),
    ],
)
def test_an_explicit_argument_equal_to_hfs_default_conflicts_as_in_hf(
    config: dict[str, Any], keywords: dict[str, Any], key: str
) -> None:
    """``Training(adam_epsilon=1e-8)`` is given although 1e-8 is HF's default: HF refuses the mismatch, so does
    dsbuild; ``Training()`` without it defers to the config."""
    config = {**config, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}
    args = _hf_args(**keywords)
    hf = HfResult(config, args, NS(config=NS(hidden_size=64)), 100)
    assert hf.mismatches == [key]
    with pytest.raises(ConflictError) as info:
        Config.from_dict(config).resolve(world_size=4, training=Training(**keywords), total_steps=100)
    assert [p.path for p in info.value.problems] == [key]
    resolved = Config.from_dict(config).resolve(world_size=4, training=Training(), total_steps=100)
    assert Config.from_dict(config).to_dict().items() <= resolved.to_dict().items()  # the config's values kept


def test_an_unset_accumulation_that_disagrees_is_a_conflict_only_in_dsbuild() -> None:
    """HF fills the micro batch and lets DeepSpeed default accumulation to 1 while the arguments say 4."""
    config = {"train_micro_batch_size_per_gpu": AUTO}
    args = _hf_args()
    hf = HfResult(config, args, NS(), 100)
    assert hf.config == {"train_micro_batch_size_per_gpu": 2} and not hf.mismatches
    assert deepspeed_batch(hf.config, 4)[0] == {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
    }
    with pytest.raises(ConflictError) as info:
        Config.from_dict(config).resolve(world_size=4, training=args, total_steps=100)
    assert [p.path for p in info.value.problems] == ["gradient_accumulation_steps", "train_batch_size"]


def _real_models() -> list[Any]:
    from transformers import ConvNextConfig, LlamaConfig, LlavaConfig, Qwen2VLConfig

    return [
        LlamaConfig(hidden_size=64),
        ConvNextConfig(hidden_sizes=[16, 32, 48, 24]),
        LlavaConfig(text_config={"model_type": "llama", "hidden_size": 96}),
        Qwen2VLConfig(),
    ]


@pytest.mark.parametrize("model_config", _real_models(), ids=lambda c: type(c).__name__)
def test_hidden_size_of_real_model_configs_as_hf_finds_it(model_config: Any) -> None:
    """Real transformers configs (hidden_size, hidden_sizes, text_config): the buckets HF computes, for a model
    (``.config``) and for its config alone."""
    args = _hf_args()
    hf = HfResult(ZERO3_ALL_AUTO, args, NS(config=model_config), 1000)
    assert not hf.hidden_error
    for model in (NS(config=model_config), model_config):
        resolved = Config.from_dict(ZERO3_ALL_AUTO).resolve(world_size=4, training=args, model=model, total_steps=1000)
        assert resolved.to_dict()["zero_optimization"] == hf.config["zero_optimization"]


def test_a_real_model_and_real_training_arguments() -> None:
    """A tiny LlamaForCausalLM and real TrainingArguments: dsbuild reads them as HF does."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64)
    )
    args = TrainingArguments(
        output_dir="unused",
        per_device_train_batch_size=3,
        gradient_accumulation_steps=2,
        learning_rate=2e-5,
        warmup_steps=0.05,
        report_to="none",
        use_cpu=True,
    )
    try:
        hf = HfTrainerDeepSpeedConfig(ZERO3_ALL_AUTO)
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, model, 500)
    finally:
        unset_hf_deepspeed_config()
    resolved = Config.from_dict(ZERO3_ALL_AUTO).resolve(
        world_size=args.world_size, training=args, model=model, total_steps=500
    )
    assert resolved.to_dict() == hf.config


@EXAMPLES
@given(
    st.one_of(st.integers(0, 10_000), st.floats(0, 0.999), st.floats(1, 1000)),
    st.integers(0, 100_000),
)
def test_warmup_steps_as_hf_counts_them(warmup_steps: float, num_training_steps: int) -> None:
    """Training.get_warmup_steps is TrainingArguments.get_warmup_steps (HF 5: below 1 is a ratio)."""
    hf = TrainingArguments.get_warmup_steps(NS(warmup_steps=warmup_steps), num_training_steps)  # type: ignore[arg-type]
    assert Training(warmup_steps=warmup_steps).get_warmup_steps(num_training_steps) == hf
