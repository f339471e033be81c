"""resolve(): no "auto" survives, the batch triangle holds, it is idempotent, and conflicts are exactly the disagreements."""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import event, given
from hypothesis import strategies as st
from strategies import configs

from dsbuild import AUTO, Config, ConfigError, ConflictError, UnresolvedAutoError
from dsbuild.config.walk import DEEPSPEED_AUTOS, auto_paths
from dsbuild.resolve.hf_table import FILLS as RULES
from dsbuild.resolve.resolution import resolve
from dsbuild.resolve.training import Training

# -- strategies for resolve ---------------------------------------------------------------


def _all_set(**fields: Any) -> Training:
    """Training arguments all counted as set, as the HF Trainer counts a TrainingArguments' values."""
    return Training(**fields, given=frozenset(Training().to_dict()))


trainings = st.builds(
    _all_set,
    learning_rate=st.sampled_from([5e-5, 1e-4, 2e-5, 0.0]),
    weight_decay=st.sampled_from([0.0, 0.01]),
    adam_beta1=st.sampled_from([0.9, 0.8]),
    adam_beta2=st.sampled_from([0.999, 0.95]),
    adam_epsilon=st.sampled_from([1e-8, 1e-6]),
    per_device_train_batch_size=st.integers(1, 16),
    gradient_accumulation_steps=st.integers(1, 8),
    max_grad_norm=st.sampled_from([0.0, 1.0, 0.3]),
    warmup_steps=st.one_of(st.integers(0, 100), st.floats(0.0, 0.99)),
    max_steps=st.sampled_from([-1, 50]),
    bf16=st.booleans(),
    save_on_each_node=st.booleans(),
)

run_kwargs = st.fixed_dictionaries(
    {
        "world_size": st.integers(1, 16),
        "training": st.one_of(st.none(), trainings),
        "hidden_size": st.one_of(st.none(), st.integers(1, 8192)),
        "total_steps": st.one_of(st.none(), st.integers(0, 10_000)),
    }
)
"""The facts of a run, any of them missing."""

facts = st.fixed_dictionaries(
    {
        "world_size": st.integers(1, 16),
        "training": st.one_of(st.none(), trainings, trainings),
        "hidden_size": st.integers(1, 8192),
        "total_steps": st.integers(0, 10_000),
    }
)
"""The facts of a run, training arguments sometimes missing."""


@st.composite
def resolvable(draw: st.DrawFn) -> tuple[Config, dict[str, Any]]:
    """A builder-made config (any "auto" anywhere) with a batch that can be resolved, and the facts of a run.

    The batch is "auto" for training arguments to fill, or numbers when there are none.
    """
    kwargs = draw(facts)
    config = attrs.evolve(draw(configs(max_steps=6)), train_batch_size=None)
    sizes = st.integers(1, 8) if kwargs["training"] is None else st.one_of(st.just(AUTO), st.just(AUTO), st.none())
    config = config.batch(micro=draw(st.one_of(st.just(AUTO), sizes)), grad_accum=draw(st.one_of(st.none(), sizes)))
    if kwargs["training"] is None and config.train_micro_batch_size_per_gpu is AUTO:
        config = config.batch(micro=draw(st.integers(1, 8)))
    return config, kwargs


HF_KEYS: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": lambda t, ws: t.per_device_train_batch_size,
    "gradient_accumulation_steps": lambda t, ws: t.gradient_accumulation_steps,
    "train_batch_size": lambda t, ws: ws * t.per_device_train_batch_size * t.gradient_accumulation_steps,
    "gradient_clipping": lambda t, ws: t.max_grad_norm,
    "optimizer.params.lr": lambda t, ws: t.learning_rate,
    "optimizer.params.betas": lambda t, ws: [t.adam_beta1, t.adam_beta2],
    "optimizer.params.eps": lambda t, ws: t.adam_epsilon,
    "optimizer.params.weight_decay": lambda t, ws: t.weight_decay,
    "scheduler.params.warmup_max_lr": lambda t, ws: t.learning_rate,
    "fp16.enabled": lambda t, ws: t.fp16,
    "bf16.enabled": lambda t, ws: t.bf16,
}
"""The keys HF checks (fill_match) that need only the training arguments and the world size."""


def _disagreeing(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, list):
        return [value[0], 0.5 if value[1] != 0.5 else 0.25]
    if isinstance(value, int):
        return value + 1
    return value + 0.5


def _put(data: dict[str, Any], path: str, value: Any) -> None:
    *sections, key = path.split(".")
    for name in sections:
        data = data.setdefault(name, {})
    data[key] = value


@st.composite
def hf_style(draw: st.DrawFn) -> tuple[dict[str, Any], Training, int, list[str]]:
    """A ds_config whose HF keys are each "auto", or explicit and agreeing or disagreeing with the training;
    returns it with the training, the world size and the keys drawn to disagree (in HF's order)."""
    training = draw(trainings)
    world_size = draw(st.integers(1, 8))
    data: dict[str, Any] = {
        "optimizer": {"type": draw(st.sampled_from(["AdamW", "Adam"])), "params": {}},
        "scheduler": {"type": "WarmupLR", "params": {}},
        "fp16": {},
        "bf16": {},
        "zero_optimization": {"stage": draw(st.integers(0, 3)), "reduce_bucket_size": AUTO},
    }
    disagreeing = []
    for path, fact in HF_KEYS.items():
        value = fact(training, world_size)
        how = draw(st.sampled_from(["auto", "auto", "same", "other"]))
        if how == "other":
            disagreeing.append(path)
        _put(data, path, AUTO if how == "auto" else value if how == "same" else _disagreeing(value))
    order = [rule.path for rule in RULES]
    return data, training, world_size, sorted(disagreeing, key=order.index)


def _leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _validate_all(obj: Any) -> None:
    attrs.validate(obj)
    for a in attrs.fields(type(obj)):
        value = getattr(obj, a.name)
        if attrs.has(type(value)):
            _validate_all(value)


def _resolve(config: Config, kwargs: dict[str, Any]) -> Config | ConfigError:
    try:
        result: Config | ConfigError = resolve(config, **kwargs)
    except ConfigError as error:
        result = error
    event(type(result).__name__)
    return result


# -- the properties ------------------------------------------------------------------------------


@given(st.one_of(st.tuples(configs(), run_kwargs), resolvable()))
def test_no_auto_survives_resolve(case: tuple[Config, dict[str, Any]]) -> None:
    """Either every "auto" is filled (DeepSpeed's own keep_in_fp32_modules aside), or resolve says which are not."""
    config, kwargs = case
    result = _resolve(config, kwargs)
    if isinstance(result, UnresolvedAutoError):
        assert {p.path for p in result.problems} <= set(auto_paths(config))
    elif isinstance(result, Config):
        assert set(auto_paths(result)) <= DEEPSPEED_AUTOS
        _validate_all(result)  # built without validators: every value written must still fit
        assert Config.from_dict(result.to_dict()) == result


@given(resolvable())
def test_the_batch_triangle_holds(case: tuple[Config, dict[str, Any]]) -> None:
    """train_batch_size == micro x accumulation x world size, all three written, after any successful resolve."""
    config, kwargs = case
    result = _resolve(config, kwargs)
    if isinstance(result, Config):
        tb, micro, accum = (
            result.train_batch_size,
            result.train_micro_batch_size_per_gpu,
            result.gradient_accumulation_steps,
        )
        assert isinstance(tb, int) and isinstance(micro, int) and isinstance(accum, int)
        assert tb == micro * accum * kwargs["world_size"]


@given(resolvable())
def test_resolve_is_idempotent_and_keeps_explicit_values(case: tuple[Config, dict[str, Any]]) -> None:
    """Resolving twice changes nothing; no value the config sets is changed; the input is untouched."""
    config, kwargs = case
    before = config.to_dict()
    result = _resolve(config, kwargs)
    assert config.to_dict() == before
    if not isinstance(result, Config):
        return
    again = resolve(result, **kwargs)
    assert again == result and again.provenance == result.provenance
    resolved = _leaves(result.to_dict())
    for path, value in _leaves(before).items():
        if value != "auto" and not (isinstance(value, list) and "auto" in value):
            assert resolved[path] == value, path
    for path in set(resolved) - set(_leaves(before)):
        assert path in result.provenance  # every key resolve added says where it came from


@given(hf_style())
def test_conflicts_are_exactly_the_explicit_values_that_disagree(
    case: tuple[dict[str, Any], Training, int, list[str]],
) -> None:
    data, training, world_size, disagreeing = case
    config = Config.from_dict(data)
    kwargs = {"world_size": world_size, "training": training, "hidden_size": 64, "total_steps": 100}
    if disagreeing:
        try:
            resolve(config, **kwargs)
        except ConflictError as error:
            assert [p.path for p in error.problems] == disagreeing
        else:
            raise AssertionError(f"no conflict, expected {disagreeing}")
    else:
        result = resolve(config, **kwargs)
        assert auto_paths(result) == []
        assert result.train_batch_size == world_size * training.per_device_train_batch_size * (
            training.gradient_accumulation_steps
        )
