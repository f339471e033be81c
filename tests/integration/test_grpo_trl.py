"""GRPO jobs as TRL computes them (issue 33): ``task = "grpo"`` by ``dsbuild train`` against TRL 1.16's
``GRPOTrainer`` on real DeepSpeed ZeRO-3, both given the same fixed completions (``rollout.backend = "function"`` /
TRL's ``rollout_func``) and the same deterministic reward (``_grpo_functions.py``): 3 steps of 4 completions ×
accumulation 2, 4 completions per prompt, fp32, lr 1e-5; then 2 processes against the 1-process run.

Measured: loss, ``kl``, ``reward``, ``reward_std``, ``frac_reward_zero_std``, ``clip_ratio/*`` and ``completions/*``
to 5e-7 (the loss to 3e-8); step 1's gradient norm to 1.3e-5 relative. Weights: about 0.07% of the elements differ by
more than 1e-6, at most 1.7e-5 (Adam's first update is about ``lr · sign(gradient)``: an element whose gradient is ~0
moves by up to ``lr`` either way on a rounding difference, as in test_dpo_trl.py); the update itself to 1.4%.
``bnpo`` runs with one micro-batch per step: TRL shuffles a generation batch before cutting it into micro-batches,
and ``bnpo``'s normaliser is per micro-batch (dsbuild cuts in order; the other loss types are the same either way).

Several passes per generation batch (issue 42, ``PASSES``) run against TRL with its generation batch cut in order, as
dsbuild cuts it (its shuffle draws from the global RNG, which the two sides do not share): ``num_iterations`` 2,
``steps_per_generation`` 4, a ``generation_batch_size`` whose generations straddle optimizer steps; every number,
``entropy``, ``num_tokens`` and the terminated lengths included, to 4e-7, the weights to 2e-5.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.procs]  # each side trains in a process of its own

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_grpo_worker.py"
ROOT = HERE.parents[1]

JOB = """
task = "grpo"
[model]
name_or_path = "{base}"
tokenizer = "byte"
[data]
path = "{prompts}"
format = "prompt"
[rollout]
backend = "function"
function = "_grpo_functions:complete"
[rewards]
functions = ["_grpo_functions:reward"]
[grpo]
num_generations = 4
max_completion_length = 16
loss_type = "{loss_type}"
beta = {beta}
{passes}
[training]
output_dir = "{out}"
per_device_train_batch_size = {micro}
gradient_accumulation_steps = {accumulation}
learning_rate = 1e-5
weight_decay = 0.0
lr_scheduler_type = "constant"
max_steps = 3
logging_steps = 1
save_strategy = "no"
seed = 0
[strategy]
name = "deepspeed_train"
config = "zero3"
[launch]
nproc_per_node = {processes}
"""

CASES = {  # name: (loss_type, beta, micro, accumulation)
    "grpo": ("grpo", 0.0, 4, 2),
    "dr_grpo": ("dr_grpo", 0.0, 4, 2),
    "dapo": ("dapo", 0.0, 4, 2),
    "dapo_kl": ("dapo", 0.04, 4, 2),
    "bnpo": ("bnpo", 0.0, 8, 1),
}
PASSES = {  # name: (loss_type, beta, micro, accumulation, [grpo] keys): several passes per generation batch
    # one generation feeds 4 micro-steps (2 optimizer steps), each trained on twice: steps 1-2 one pass, step 3 the
    # second pass over step 1's micro-batches, the policy having moved twice (old log-probs, ratio, clipping)
    "iterations": ("dapo", 0.04, 4, 2, {"num_iterations": 2, "steps_per_generation": 4}),
    # 3 micro-steps a generation, 2 an optimizer step: step 2 trains on the end of one and the start of the next
    # (dsbuild also writes the completions it logs: TRL's run does not)
    "straddle": (
        "bnpo",
        0.0,
        4,
        2,
        {"generation_batch_size": 12, "log_completions": "true", "num_completions_to_print": 2},
    ),
    # each generation twice (steps 1, 2), a second generation at step 3
    "twice": ("grpo", 0.04, 4, 2, {"num_iterations": 2}),
}
COMPARED = ("loss", "kl", "reward", "reward_std", "frac_reward_zero_std", "clip_ratio/low_mean", "clip_ratio/high_mean",
            "clip_ratio/region_mean", "clip_ratio/low_min", "clip_ratio/high_max", "completions/mean_length",
            "completions/min_length", "completions/max_length", "completions/clipped_ratio",
            "completions/mean_terminated_length", "completions/min_terminated_length",
            "completions/max_terminated_length", "num_tokens", "entropy", "rewards/reward/mean",
            "rewards/reward/std")  # fmt: skip


def _env() -> dict[str, str]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(HERE), "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _run(*args: str, cwd: Path = ROOT) -> None:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=_env(), cwd=cwd, timeout=900)
    assert done.returncode == 0, done.stderr[-5000:]


def _job(tmp: Path, base: Path, name: str, case: tuple[Any, ...], processes: int = 1) -> Path:
    loss_type, beta, micro, accumulation, *rest = case
    passes = "\n".join(f"{key} = {value}" for key, value in (rest[0] if rest else {}).items())
    path = tmp / f"{name}.toml"
    path.write_text(JOB.format(base=base, prompts=tmp / "prompts.jsonl", loss_type=loss_type, beta=beta, out=tmp / name,
                               micro=micro, accumulation=accumulation, processes=processes, passes=passes))  # fmt: skip
    return path


def _trl_passes(tmp: Path, base: Path, name: str) -> Path:
    """TRL's run of ``PASSES[name]`` (its generation batches cut in order, as dsbuild's): where its result is."""
    loss_type, beta, micro, accumulation, passes = PASSES[name]
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in passes.items() if "completions" not in key]
    _run(str(WORKER), str(base), str(tmp / "trl" / name), "--ds-config", str(tmp / name / "ds_config.json"),
         "--loss-types", loss_type, "--beta", str(beta), "--micro", str(micro), "--accumulation", str(accumulation),
         *flags, "--in-order")  # fmt: skip
    return tmp / "trl" / name / loss_type


def _ours(out: Path) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    weights = {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(out / "model").named_parameters()}
    return [r for r in records if "loss" in r], weights


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "examples"))
    sys.path.insert(0, str(HERE))
    import _grpo_worker
    import dpo_loop
    from transformers import AutoModelForCausalLM

    tmp = tmp_path_factory.mktemp("grpo")
    base = dpo_loop.write_base(tmp / "base")
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _grpo_worker.PROMPTS))
    cases: dict[str, tuple[Any, ...]] = {**CASES, **PASSES}
    _run(str(WORKER), "jobs", *(str(_job(tmp, base, name, case)) for name, case in cases.items()), cwd=tmp)
    ds_config = str(tmp / "dapo" / "ds_config.json")
    trl = tmp / "trl"
    _run(str(WORKER), str(base), str(trl), "--ds-config", ds_config, "--loss-types", "grpo", "dr_grpo", "dapo")
    _run(str(WORKER), str(base), str(trl / "kl"), "--ds-config", ds_config, "--loss-types", "dapo", "--beta", "0.04")
    _run(str(WORKER), str(base), str(trl / "one"), "--ds-config", str(tmp / "bnpo" / "ds_config.json"), "--loss-types",
         "bnpo", "--micro", "8", "--accumulation", "1")  # fmt: skip
    where = {"grpo": trl / "grpo", "dr_grpo": trl / "dr_grpo", "dapo": trl / "dapo", "dapo_kl": trl / "kl" / "dapo",
             "bnpo": trl / "one" / "bnpo", **{name: _trl_passes(tmp, base, name) for name in PASSES}}  # fmt: skip
    theirs = {
        name: (json.loads((w / "result.json").read_text())["records"], torch.load(w / "weights.pt"))
        for name, w in where.items()
    }
    two = _job(tmp, base, "two", ("dapo", 0.04, 2, 2), processes=2)
    _run("-m", "dsbuild", "train", str(two), cwd=tmp)
    two_passes = _job(tmp, base, "two_passes", (*PASSES["twice"][:2], 2, 2, PASSES["twice"][4]), processes=2)
    _run("-m", "dsbuild", "train", str(two_passes), cwd=tmp)
    start = {k: v.detach().clone() for k, v in AutoModelForCausalLM.from_pretrained(base).named_parameters()}
    completions = [json.loads(line) for line in (tmp / "straddle" / "completions.jsonl").read_text().splitlines()]
    return {"start": start, "ours": {n: _ours(tmp / n) for n in [*cases, "two", "two_passes"]}, "trl": theirs,
            "completions": completions}  # fmt: skip


SPLIT = ("entropy",)
"""A mean over each micro-batch's tokens (TRL's ``global_masked_mean``), averaged over the step's micro-batches: it
depends on which completions make a micro-batch, so it is compared where both sides cut the same micro-batches (TRL
shuffles a generation batch first, and 2 processes cut it otherwise than 1)."""


def _same_records(
    ours: list[dict[str, Any]], theirs: list[dict[str, Any]], tolerance: float = 1e-5, *, split: bool = True
) -> None:
    """The same numbers per step; ``split``: the micro-batches were cut alike (``SPLIT``'s numbers compared too)."""
    assert len(ours) == len(theirs) == 3
    compared = [n for n in COMPARED if split or n not in SPLIT]
    for mine, other in zip(ours, theirs, strict=True):
        names = [n for n in compared if n in other]
        assert [n for n in compared if n in mine] == names, (mine, other)
        for name in names:
            assert mine[name] == pytest.approx(other[name], abs=tolerance), (name, mine, other)


def _same_update(
    start: dict[str, torch.Tensor], ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]
) -> None:
    assert list(ours) == list(theirs)
    mine = torch.cat([(ours[k] - start[k]).flatten() for k in theirs])
    trl = torch.cat([(theirs[k] - start[k]).flatten() for k in theirs])
    gap = (mine - trl).abs()
    assert float(gap.max()) <= 2e-5
    assert float((gap > 1e-6).float().mean()) <= 2e-3
    assert float(trl.norm()) > 0 and float((mine - trl).norm() / trl.norm()) <= 0.05


@pytest.mark.parametrize("case", [*CASES, *PASSES])
def test_a_grpo_job_trains_as_trls_grpotrainer(runs: dict[str, Any], case: str) -> None:
    """For each loss type (and the KL term on): per step the loss and TRL's metrics to 1e-5, and the weights moved
    as TRL's (to 2e-5, 2 · lr: Adam's sign of a zero gradient; the update to 5%)."""
    ours, theirs = runs["ours"][case], runs["trl"][case]
    _same_records(ours[0], theirs[0], split=case in PASSES)  # TRL's generation batch shuffled for CASES
    if case in ("dapo_kl", "iterations", "twice"):
        assert all(r["kl"] >= 0 for r in ours[0]) and ours[0][0]["kl"] == 0.0  # the reference is the policy at step 1
    _same_update(runs["start"], ours[1], theirs[1])


def test_a_grpo_job_on_two_processes_trains_as_on_one(runs: dict[str, Any]) -> None:
    """2 processes × 2 completions × accumulation 2 (the reference on each, ZeRO-3) see the 1-process run's 8
    completions per step: the rewards gathered over processes before the group advantages, the token count of the
    whole generation batch: the same records (1e-5) and weights (1e-6) as the 1-process run held against TRL."""
    (two, weights), (one, one_weights) = runs["ours"]["two"], runs["ours"]["dapo_kl"]
    _same_records(two, one, split=False)
    assert max(float((weights[k] - one_weights[k]).abs().max()) for k in one_weights) <= 1e-6


def test_several_passes_on_two_processes_train_as_on_one(runs: dict[str, Any]) -> None:
    """2 processes × 2 completions × accumulation 2, each generation batch trained on twice: each process keeps its
    share, its old and reference log-probs; the same records (1e-5) and weights (1e-6) as the 1-process run held
    against TRL. (With a generation batch longer than a step, a step of 2 processes trains on other completions than
    a step of 1, in TRL too: each process's share of the batch is contiguous.)"""
    (two, weights), (one, one_weights) = runs["ours"]["two_passes"], runs["ours"]["twice"]
    _same_records(two, one, split=False)
    assert max(float((weights[k] - one_weights[k]).abs().max()) for k in one_weights) <= 1e-6


def test_logged_completions_are_written_with_their_rewards_and_advantages(runs: dict[str, Any]) -> None:
    """``log_completions``: each generation batch's 12 completions once, with the step that made it (1 and 2 of
    "straddle"), each with its reward (the history's mean reward to 1e-6) and its advantage (mean 0 in each group of
    4, TRL's group advantages)."""
    rows = runs["completions"]
    assert [r["step"] for r in rows] == [1] * 12 + [2] * 12
    history = {r["step"]: r for r in runs["ours"]["straddle"][0]}
    for step in (1, 2):
        mine = [r for r in rows if r["step"] == step]
        assert sum(r["rewards"]["reward"] for r in mine) / 12 == pytest.approx(history[step]["reward"], abs=1e-6)
        for group in range(3):
            advantages = [r["advantage"] for r in mine[group * 4 : group * 4 + 4]]
            assert len({json.dumps(r["prompt"]) for r in mine[group * 4 : group * 4 + 4]}) == 1
            assert sum(advantages) == pytest.approx(0.0, abs=1e-5)
