"""``dsbuild.job.rl``: the DPO and GRPO specs hold TRL 1.16's names and defaults, build TRL's real configs, read them
back, and refuse what TRL refuses, each problem under its dotted key.

The tests that hold a spec to TRL import TRL (and so torch) inside, and are marked ``train``; the refusals need
nothing but dsbuild.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dsbuild.config.fields import Spec
from dsbuild.errors import ConfigError, InvalidValueError, Problem
from dsbuild.job.rl import DPOSpec, GRPOSpec, check_grpo_batch
from dsbuild.job.spec import job_keys

SPECS = {"DPOConfig": DPOSpec, "GRPOConfig": GRPOSpec}


def _trl_config(name: str) -> Any:
    import trl

    return getattr(trl, name)


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


@pytest.mark.train
@pytest.mark.parametrize("config", sorted(SPECS))
def test_every_key_has_trls_name_and_default(config: str) -> None:
    """Each key of DPOSpec / GRPOSpec is a field of TRL's DPOConfig / GRPOConfig, with its default (read from the
    installed TRL, not copied)."""
    trl_fields = {f.name: f for f in dataclasses.fields(_trl_config(config))}
    spec = SPECS[config]
    assert sorted(set(job_keys(spec)) - set(trl_fields)) == []
    defaults = spec().to_trl()
    assert defaults == {name: _default(trl_fields[name]) for name in job_keys(spec)}


def _value(spec: Spec) -> st.SearchStrategy[Any]:
    """Values a key's ``Spec`` takes."""
    if spec.kind == "bool":
        return st.booleans()
    if spec.kind == "choice":
        return st.sampled_from(spec.choices)
    if spec.kind == "strs":
        return st.lists(st.sampled_from(spec.choices), min_size=1, max_size=3, unique=True).map(tuple)
    low = spec.ge if spec.ge is not None else spec.gt if spec.gt is not None else -10
    if spec.kind == "int":
        return st.integers(int(low) + (spec.gt is not None), int(low) + 600)
    high = spec.le if spec.le is not None else spec.lt if spec.lt is not None else low + 10
    return st.floats(low, high, exclude_min=spec.gt is not None, exclude_max=spec.lt is not None)


@st.composite
def specs(draw: st.DrawFn, cls: type) -> Any:
    """A spec with values drawn from each key's ``Spec`` (``None`` where TRL takes it), TRL's refusals left out."""
    values: dict[str, Any] = {}
    for field in attrs.fields(cls):
        key = field.metadata["job"]
        if key.spec is None or not draw(st.booleans()):
            continue
        value = _value(key.spec)
        values[field.name] = draw(st.none() | value if field.default is None else value)
    if cls is DPOSpec and draw(st.booleans()):
        count = len(values.get("loss_type", ("sigmoid",)))
        values["loss_weights"] = draw(st.lists(st.floats(0.1, 2.0), min_size=count, max_size=count))
    if cls is GRPOSpec and values.get("generation_batch_size") is not None:
        values["generation_batch_size"] = values.get("num_generations", 8) * draw(st.integers(1, 4))
    try:
        return cls(**values)
    except ConfigError:
        assume(False)


@pytest.mark.train
@given(spec=specs(DPOSpec))
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
def test_dpo_spec_builds_trls_config_and_reads_it_back(spec: DPOSpec, tmp_path: Path) -> None:
    """to_trl() builds a real DPOConfig, and from_trl() reads that config back into the same spec."""
    config = _trl_config("DPOConfig")(output_dir=str(tmp_path), use_cpu=True, **spec.to_trl())
    assert DPOSpec.from_trl(config) == spec
    assert DPOSpec.from_trl(spec.to_trl()) == spec


@pytest.mark.train
@given(spec=specs(GRPOSpec))
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
def test_grpo_spec_builds_trls_config_and_reads_it_back(spec: GRPOSpec, tmp_path: Path) -> None:
    """to_trl() builds a real GRPOConfig (a batch of whole groups), and from_trl() reads it back: the same spec, with
    the steps per generation TRL derived in place of a generation batch size, which builds the same config again."""
    build = _trl_config("GRPOConfig")
    batch = {"output_dir": str(tmp_path), "use_cpu": True, "per_device_train_batch_size": spec.num_generations}
    config = build(**batch, **spec.to_trl())
    back = GRPOSpec.from_trl(config)
    assert back == attrs.evolve(spec, generation_batch_size=None, steps_per_generation=config.steps_per_generation)
    again = build(**batch, **back.to_trl())
    assert (again.generation_batch_size, again.steps_per_generation) == (
        config.generation_batch_size,
        config.steps_per_generation,
    )
    assert GRPOSpec.from_trl(spec.to_trl()) == spec


@pytest.mark.train
@given(
    per_device=st.integers(1, 8),
    accumulation=st.integers(1, 8),
    generations=st.integers(1, 12),
    steps=st.none() | st.integers(1, 4),
    generation_batch=st.none() | st.integers(1, 64),
)
@settings(max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_check_grpo_batch_refuses_what_grpoconfig_refuses(
    per_device: int,
    accumulation: int,
    generations: int,
    steps: int | None,
    generation_batch: int | None,
    tmp_path: Path,
) -> None:
    """check_grpo_batch finds a problem exactly where TRL's GRPOConfig raises, and says what TRL says."""
    problems = check_grpo_batch(
        per_device, accumulation, 1, generations, steps_per_generation=steps, generation_batch_size=generation_batch
    )
    try:
        _trl_config("GRPOConfig")(
            output_dir=str(tmp_path),
            use_cpu=True,
            per_device_train_batch_size=per_device,
            gradient_accumulation_steps=accumulation,
            num_generations=generations,
            steps_per_generation=steps,
            generation_batch_size=generation_batch,
        )
    except ValueError as error:
        assert str(error) in [p.message for p in problems]
    else:
        assert problems == []


def test_check_grpo_batch_names_the_key_and_the_sizes_that_fit() -> None:
    """A generation batch that splits a group is reported under grpo.num_generations, with the batch's arithmetic and
    the group sizes that would fit; the global-batch check counts every process."""
    assert check_grpo_batch(2, 3, 2, 4) == []
    assert check_grpo_batch(2, 3, 2, 5) == [
        Problem(
            "grpo.num_generations",
            "generation_batch_size (12) must be divisible by num_generations (5).",
            "the generation batch is 2 per device × 2 processes × 3 steps per generation = 12: choose num_generations "
            "in 2, 3, 4, 6, 12, or change the batch",
        )
    ]
    assert [p.path for p in check_grpo_batch(2, 1, 2, 2, generation_batch_size=6)] == ["grpo.generation_batch_size"]
    assert [p.path for p in check_grpo_batch(4, 1, 1, 1)] == ["grpo.num_generations"]


def test_a_bad_value_fails_where_it_is_set() -> None:
    """Building a spec with a bad value raises InvalidValueError under the dotted key, with a did-you-mean."""
    with pytest.raises(InvalidValueError) as raised:
        DPOSpec(beta=0.0)
    assert str(raised.value) == "dpo.beta: got 0.0, expected a number > 0"
    with pytest.raises(InvalidValueError) as raised:
        DPOSpec(loss_type=("sigmoid", "hnge"))
    assert raised.value.problems[0].hint == "did you mean 'hinge'?"
    with pytest.raises(InvalidValueError) as raised:
        GRPOSpec(scale_rewards="grop")
    assert str(raised.value) == (
        "grpo.scale_rewards: got 'grop', expected one of 'group', 'batch', 'none' (did you mean 'group'?)"
    )
    with pytest.raises(InvalidValueError, match=r"^grpo.num_generations: got null, expected a value"):
        GRPOSpec(num_generations=None)  # type: ignore[arg-type]


def test_from_trl_reports_every_bad_value_at_once() -> None:
    """from_trl reads TRL's spellings (a single loss type, True for "group", numbers written as text), leaves the
    training arguments alone, and names every bad value together."""
    spec = DPOSpec.from_trl({"loss_type": "ipo", "beta": "0.5", "max_length": 5e2, "learning_rate": 1e-6})
    assert (spec.loss_type, spec.beta, spec.max_length) == (("ipo",), 0.5, 500)
    assert GRPOSpec.from_trl({"scale_rewards": False}).scale_rewards == "none"
    with pytest.raises(InvalidValueError) as raised:
        GRPOSpec.from_trl({"epsilon": -1, "loss_type": "ppo", "top_p": 1.5, "num_generations": 1})
    assert [str(p) for p in raised.value.problems] == [
        "grpo.num_generations: got 1, expected an integer >= 2",
        "grpo.top_p: got 1.5, expected a number > 0 and <= 1",
        "grpo.epsilon: got -1, expected a number >= 0",
        "grpo.loss_type: got 'ppo', expected one of 'grpo', 'dr_grpo', 'dapo', 'bnpo', 'cispo', 'sapo', 'luspo', "
        "'vespo'",
    ]


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"loss_type": ("ipo", "sft"), "loss_weights": (1.0,)}, "dpo.loss_weights: got 1 weights for 2 loss types"),
        ({"loss_type": "exo_pair"}, "dpo.label_smoothing: must be > 0 with 'exo_pair'"),
        ({"loss_type": []}, "dpo.loss_type: got an empty list, expected one loss type or more"),
        ({"loss_type": "robust", "label_smoothing": 0.5}, "dpo.label_smoothing: got 0.5, expected < 0.5 with 'robust'"),
        ({"loss_type": "aot", "f_divergence_type": "js_divergence"}, "dpo.f_divergence_type: 'js_divergence' does"),
        ({"loss_type": "aot", "use_weighting": True}, "dpo.use_weighting: WPO weighting is not defined"),
        ({"sync_ref_model": True, "precompute_ref_log_probs": True}, "dpo.sync_ref_model: a synced reference"),
    ],
)
def test_dpo_spec_refuses_what_trl_refuses(values: dict[str, Any], problem: str) -> None:
    """Values each fine alone that TRL's DPOConfig or DPOTrainer refuses together are refused, by their key."""
    with pytest.raises(ConfigError) as raised:
        DPOSpec(**values)
    assert str(raised.value.problems[0]).startswith(problem)


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        (
            {"generation_batch_size": 8, "steps_per_generation": 2},
            "grpo.generation_batch_size: 'generation_batch_size'",
        ),
        ({"sync_ref_model": True}, "grpo.sync_ref_model: there is no reference to sync with beta = 0"),
        ({"loss_type": "dr_grpo", "max_completion_length": None}, "grpo.max_completion_length: 'dr_grpo' divides"),
    ],
)
def test_grpo_spec_refuses_what_trl_refuses(values: dict[str, Any], problem: str) -> None:
    """Values each fine alone that TRL's GRPOConfig or GRPOTrainer refuses together are refused, by their key."""
    with pytest.raises(ConfigError) as raised:
        GRPOSpec(**values)
    assert str(raised.value.problems[0]).startswith(problem)


def test_the_trainer_epsilons() -> None:
    """GRPOSpec gives the clipping bounds as GRPOTrainer derives them: epsilon_high falls back to epsilon."""
    assert (GRPOSpec().epsilon_low, GRPOSpec().upper_epsilon) == (0.2, 0.2)
    assert GRPOSpec(epsilon=0.1, epsilon_high=0.28).upper_epsilon == 0.28
