"""``deepspeed_verdict``: the installed DeepSpeed's own config parser, asked about a config, its answer as diagnostics.

Real DeepSpeed on its CPU accelerator; the world size is simulated for the call and restored after.
"""

from __future__ import annotations

import pytest
from deepspeed.runtime import config as ds_config

from dsbuild import Config
from dsbuild.validate import Diagnostic
from dsbuild.validate.deepspeed_verdict import LABEL, SECTIONS, deepspeed_verdict

pytestmark = pytest.mark.train  # the training extra; tests/conftest.py skips it without


def lines(found: list[Diagnostic]) -> list[str]:
    return [str(d) for d in found]


def test_a_config_deepspeed_accepts_has_no_finding() -> None:
    """A config DeepSpeed reads gives an empty verdict."""
    assert deepspeed_verdict(Config.zero(2).bf16().batch(micro=2).to_dict()) == []


def test_a_pydantic_refusal_names_the_dotted_key() -> None:
    """A section model's error is one line per error, its location under the section's ds_config key."""
    found = deepspeed_verdict({"train_micro_batch_size_per_gpu": 1, "compile": {"disable": False}})
    assert found == [
        Diagnostic(
            "", "error", f"{LABEL}: ValidationError: compile.disable: Extra inputs are not permitted", rule="deepspeed"
        )
    ]
    assert str(found[0]) == "deepspeed: DeepSpeedConfig refuses it: ValidationError: compile.disable: " + (
        "Extra inputs are not permitted"
    )


def test_each_pydantic_error_is_its_own_line() -> None:
    """Two problems in one section are two findings, nested locations dotted."""
    found = deepspeed_verdict(
        {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"overlap_com": True, "offload_optimizer": {"device": "gpu"}},
        }
    )
    assert len(found) == 2
    assert lines(found)[0].startswith(f"{LABEL}: ValidationError: zero_optimization.offload_optimizer.device: ")
    assert lines(found)[1] == f"{LABEL}: ValidationError: zero_optimization.overlap_com: Extra inputs are not permitted"


@pytest.mark.parametrize("model", sorted(SECTIONS))
def test_the_section_table_matches_the_installed_deepspeed(model: str) -> None:
    """Each model in SECTIONS is the one DeepSpeed uses for its key, so an unknown key there is named in full."""
    for section in SECTIONS[model]:
        key = section or "tensorboard"  # a model reading top-level keys: its locations start with the key
        config: dict[str, object] = {"train_micro_batch_size_per_gpu": 1}
        table: dict[str, object] = {"dsbuild_unknown": 1}
        *parents, last = key.split(".")
        here = config
        for parent in parents:
            here = here.setdefault(parent, {})  # type: ignore[assignment]
        here[last] = table
        assert lines(deepspeed_verdict(config)) == [
            f"{LABEL}: ValidationError: {key}.dsbuild_unknown: Extra inputs are not permitted"
        ]


def test_auto_is_judged_as_deepspeed_sees_it() -> None:
    """An "auto" batch size reaches DeepSpeed as written, and its TypeError is the verdict."""
    (finding,) = deepspeed_verdict({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 1})
    assert str(finding).startswith(f"{LABEL}: TypeError: ")


def test_the_world_size_is_the_one_asked_for_and_restored() -> None:
    """Train 8 with micro 4 divides for 1 and 2 processes, not for 3; the patched world size does not outlive the call."""
    config = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4}
    get_world_size, get_rank = ds_config.dist.get_world_size, ds_config.dist.get_rank
    assert deepspeed_verdict(config, world_size=1) == []
    assert deepspeed_verdict(config, world_size=2) == []
    assert lines(deepspeed_verdict(config, world_size=3)) == [
        f"{LABEL}: AssertionError: Gradient accumulation steps: 0 has to be greater than 0"
    ]
    assert (ds_config.dist.get_world_size, ds_config.dist.get_rank) == (get_world_size, get_rank)


def test_deepspeed_says_nothing_on_the_terminal(capfd: pytest.CaptureFixture[str]) -> None:
    """DeepSpeed's logging and prints during the parse are silenced: the verdict is the only output."""
    deepspeed_verdict({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})
    deepspeed_verdict({"train_micro_batch_size_per_gpu": 1, "compile": {"disable": False}})
    assert capfd.readouterr() == ("", "")


def test_the_input_is_not_changed() -> None:
    """DeepSpeed gets a copy: the caller's dict is as it was."""
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
    deepspeed_verdict(config)
    assert config == {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
