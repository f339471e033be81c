"""GRPO jobs as TRL computes them, on configs nobody chose (issue 42): Hypothesis draws a ``GRPOConfig`` over the keys
dsbuild runs — every loss type, ``beta``, ``epsilon`` / ``epsilon_high``, ``num_iterations``, ``steps_per_generation``,
``scale_rewards``, ``importance_sampling_level``, ``mask_truncated_completions``, ``max_completion_length``,
``num_generations`` and the batch shape — and ``dsbuild train`` of that job must log, per step, TRL 1.16's
``GRPOTrainer``'s numbers on ZeRO-3 to 1e-5, both given the fixed completions and reward of ``_grpo_functions.py``
(TRL's generation batch cut in order, as dsbuild cuts it: its shuffle draws from a global RNG the sides do not share).

Each example trains twice (a process each side, ~1 minute here): the default profile runs ``EXAMPLES``, the deep
profile (``HYPOTHESIS_PROFILE=deep``) 200.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_grpo_trl import COMPARED, JOB, ROOT, WORKER, _ours, _run

from dsbuild.job.rl import GRPO_LOSS_TYPES, IMPORTANCE_SAMPLING_LEVELS, SCALE_REWARDS

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.procs]

EXAMPLES = {"deep": 200, "dev": 8}.get(os.environ.get("HYPOTHESIS_PROFILE", "ci"), 3)
"""Examples: 3 in the default profile (the same 3 each run: it is derandomized), more drawn afresh in the others; each
is two training runs."""

CLIPPED = ("grpo", "dr_grpo", "dapo", "bnpo", "luspo")
"""The loss types whose clipping ``epsilon`` / ``epsilon_high`` bound (TRL logs ``clip_ratio/*`` for these)."""


@st.composite
def grpo_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A GRPOConfig's keys dsbuild runs, and a batch shape both trainers accept: the generation batch (micro-batch ×
    ``steps_per_generation``) holds whole groups of ``num_generations``."""
    generations = draw(st.sampled_from([2, 4]))
    micro = draw(st.sampled_from([generations, 2 * generations]))
    accumulation = draw(st.integers(1, 2))
    loss_type = draw(st.sampled_from(GRPO_LOSS_TYPES))
    keys: dict[str, Any] = {
        "num_generations": generations,
        "max_completion_length": draw(st.integers(4, 12)),
        "num_iterations": draw(st.integers(1, 2)),
        "steps_per_generation": accumulation * draw(st.integers(1, 2)),
        "scale_rewards": draw(st.sampled_from(SCALE_REWARDS)),
        "importance_sampling_level": draw(st.sampled_from(IMPORTANCE_SAMPLING_LEVELS)),
        "mask_truncated_completions": draw(st.booleans()),
    }
    if loss_type in CLIPPED:
        keys["epsilon"] = draw(st.sampled_from([0.1, 0.2, 0.3]))
        keys["epsilon_high"] = draw(st.sampled_from([keys["epsilon"], 0.28]))
    beta = draw(st.sampled_from([0.0, 0.04, 0.2]))
    return {"loss_type": loss_type, "beta": beta, "micro": micro, "accumulation": accumulation, "keys": keys}


def _toml(value: Any) -> str:
    return json.dumps(value)  # TOML's strings, integers, floats and booleans are written as JSON writes them


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(ROOT / "examples"))
    import _grpo_worker
    import dpo_loop

    tmp = tmp_path_factory.mktemp("grpo_property")
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _grpo_worker.PROMPTS))
    return dpo_loop.write_base(tmp / "base")


@given(config=grpo_configs())
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_drawn_grpo_config_trains_as_trls_grpotrainer(base: Path, config: dict[str, Any]) -> None:
    """Per logged step, the loss and every metric TRL logs (kl, clip ratios, rewards, completion lengths, num_tokens,
    entropy) equal TRL's GRPOTrainer's to 1e-5 for a drawn GRPOConfig and batch shape."""
    tmp = base.parent
    name = f"case{len(list(tmp.glob('case*.toml')))}"
    keys = config["keys"]
    job = JOB.replace("num_generations = 4\nmax_completion_length = 16\n", "").format(
        base=base, prompts=tmp / "prompts.jsonl", loss_type=config["loss_type"], beta=config["beta"], out=tmp / name,
        micro=config["micro"], accumulation=config["accumulation"], processes=1,
        passes="\n".join(f"{key} = {_toml(value)}" for key, value in keys.items()),
    )  # fmt: skip
    (tmp / f"{name}.toml").write_text(job)
    _run(str(WORKER), "jobs", str(tmp / f"{name}.toml"), cwd=tmp)
    trl = tmp / "trl" / name
    _run(str(WORKER), str(base), str(trl), "--ds-config", str(tmp / name / "ds_config.json"), "--loss-types",
         config["loss_type"], "--beta", str(config["beta"]), "--micro", str(config["micro"]), "--accumulation",
         str(config["accumulation"]), "--in-order", "--config", json.dumps(keys))  # fmt: skip
    theirs = json.loads((trl / config["loss_type"] / "result.json").read_text())["records"]
    ours, _ = _ours(tmp / name)
    assert len(ours) == len(theirs) == 3, (ours, theirs)
    for step, (mine, other) in enumerate(zip(ours, theirs, strict=True), start=1):
        names = [n for n in COMPARED if n in other]
        assert [n for n in COMPARED if n in mine] == names, (config, step, mine, other)
        for n in names:
            assert mine[n] == pytest.approx(other[n], abs=1e-5, rel=1e-5), (config, step, n, mine[n], other[n])
