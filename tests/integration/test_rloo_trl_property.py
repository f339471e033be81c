"""RLOO jobs as TRL computes them, on configs nobody chose (issue 44): Hypothesis draws an ``RLOOConfig`` over the
keys dsbuild runs — ``beta`` (the KL penalty against a reference, or none), ``epsilon`` / ``epsilon_high``,
``num_iterations``, ``steps_per_generation``, ``normalize_advantages``, ``reward_clip_range``,
``mask_truncated_completions``, ``max_completion_length``, ``num_generations`` — and the batch shape, and ``dsbuild
train`` of that job must log, per step, TRL 1.16's ``RLOOTrainer``'s numbers on ZeRO-3 to 1e-5, both given the fixed
completions and reward of ``_grpo_functions.py`` (TRL's generation batch cut in order, as test_rloo_trl.py's worker
cuts it).

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
from test_rloo_trl import COMPARED, HERE, JOB, ROOT, _ours, _run, _toml

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.procs]

EXAMPLES = {"deep": 200, "dev": 8}.get(os.environ.get("HYPOTHESIS_PROFILE", "ci"), 2)
"""Examples: 2 in the default profile (the same each run: it is derandomized), more drawn afresh in the others; each
is two training runs."""


@st.composite
def rloo_configs(draw: st.DrawFn) -> dict[str, Any]:
    """An RLOOConfig's keys dsbuild runs, and a batch shape both trainers accept: the generation batch (micro-batch ×
    ``steps_per_generation``) holds whole groups of ``num_generations``."""
    generations = draw(st.sampled_from([2, 4]))
    micro = draw(st.sampled_from([generations, 2 * generations]))
    accumulation = draw(st.integers(1, 2))
    keys: dict[str, Any] = {
        "num_generations": generations,
        "max_completion_length": draw(st.integers(4, 12)),
        "num_iterations": draw(st.integers(1, 2)),
        "steps_per_generation": accumulation * draw(st.integers(1, 2)),
        "beta": draw(st.sampled_from([0.0, 0.05, 0.2])),
        "epsilon": draw(st.sampled_from([0.01, 0.2])),
        "normalize_advantages": draw(st.booleans()),
        "mask_truncated_completions": draw(st.booleans()),
    }
    if draw(st.booleans()):
        keys["epsilon_high"] = draw(st.sampled_from([0.1, 0.28]))
    if draw(st.booleans()):
        keys["reward_clip_range"] = draw(st.sampled_from([[-1.0, 0.5], [0.0, 2.0], [-0.2, 0.2]]))
    return {"micro": micro, "accumulation": accumulation, "keys": keys}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(ROOT / "examples"))
    sys.path.insert(0, str(HERE))
    import _grpo_worker
    import dpo_loop

    tmp = tmp_path_factory.mktemp("rloo_property")
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _grpo_worker.PROMPTS))
    return dpo_loop.write_base(tmp / "base")


@given(config=rloo_configs())
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_drawn_rloo_config_trains_as_trls_rlootrainer(base: Path, config: dict[str, Any]) -> None:
    """Per logged step, the loss and every metric TRL logs (kl, clip ratios, rewards, completion lengths, num_tokens,
    entropy) equal TRL's RLOOTrainer's to 1e-5 for a drawn RLOOConfig and batch shape."""
    tmp = base.parent
    name = f"case{len(list(tmp.glob('case*.toml')))}"
    keys = config["keys"]
    job = JOB.replace("num_generations = 4\nmax_completion_length = 16\n", "").format(
        base=base, prompts=tmp / "prompts.jsonl", out=tmp / name, micro=config["micro"],
        accumulation=config["accumulation"], processes=1,
        options="\n".join(f"{key} = {_toml(value)}" for key, value in keys.items()),
    )  # fmt: skip
    (tmp / f"{name}.toml").write_text(job)
    _run("-m", "dsbuild", "train", str(tmp / f"{name}.toml"), cwd=tmp)
    trl = tmp / "trl" / name
    _run(str(HERE / "_rloo_worker.py"), str(base), str(trl), "--ds-config", str(tmp / name / "ds_config.json"),
         "--micro", str(config["micro"]), "--accumulation", str(config["accumulation"]),
         *(f"--option={k}={json.dumps(v)}" for k, v in keys.items()))  # fmt: skip
    theirs = json.loads((trl / "result.json").read_text())["records"]
    ours, _ = _ours(tmp / name)
    assert len(ours) == len(theirs) == 3, (ours, theirs)
    for step, (mine, other) in enumerate(zip(ours, theirs, strict=True), start=1):
        names = [n for n in COMPARED if n in other]
        assert [n for n in COMPARED if n in mine] == names, (config, step, mine, other)
        for n in names:
            assert mine[n] == pytest.approx(other[n], abs=1e-5, rel=1e-5), (config, step, n, mine[n], other[n])
