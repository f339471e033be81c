"""One of 2 gloo processes (under torchrun): TRL 1.16's ``GRPOTrainer._compute_loss``, its accelerator reducing and
gathering over the processes, against ``grpo_loss(...).metrics(over_processes=True)`` on random micro-batches
(ragged, some completions empty, each process its own tokens) and options; rank 0 writes what it found to ARGV[1]."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from test_rl_losses import VESPO, _trl_grpo

from dsbuild.job.rl import GRPO_LOSS_TYPES
from dsbuild.rl.grpo import grpo_loss

CASES_PER_LOSS_TYPE = 6


def _accelerator() -> SimpleNamespace:
    """What TRL's loss reads of Accelerate's: the process count, ``reduce(sum)`` and ``gather`` (concatenated)."""

    def reduce(t: torch.Tensor, reduction: str) -> torch.Tensor:
        assert reduction == "sum"
        t = t.clone()
        dist.all_reduce(t)
        return t

    def gather(t: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts)

    return SimpleNamespace(num_processes=dist.get_world_size(), reduce=reduce, gather=gather)


def _case(seed: int, loss_type: str, rank: int) -> dict[str, Any]:
    """The options of ``seed`` (the same on every process) and this process's micro-batch (its own tokens)."""
    shared = random.Random(seed)
    rows = shared.randint(1, 5)
    beta = shared.choice([0.0, shared.uniform(1e-3, 0.5)])
    options = {
        "beta": beta,
        "loss_type": loss_type,
        "importance_sampling_level": shared.choice(["token", "sequence"]),
        "epsilon_low": shared.uniform(0.05, 0.4),
        "epsilon_high": shared.uniform(0.05, 0.4),
        "delta": shared.choice([None, shared.uniform(1.1, 3.0)]),
        "use_bias_correction_kl": shared.random() < 0.5,
        "gradient_accumulation_steps": shared.randint(1, 3),
        "steps_per_generation": shared.randint(1, 3),
        "num_processes": 2,
    }
    own = random.Random(seed * 7919 + rank)
    length = own.randint(1, 6)
    g = torch.Generator().manual_seed(seed * 7919 + rank)

    def uniform(low: float, high: float, shape: tuple[int, ...]) -> torch.Tensor:
        return low + (high - low) * torch.rand(shape, generator=g, dtype=torch.float64)

    mask = torch.zeros(rows, length, dtype=torch.long)
    for row in range(rows):
        mask[row, : own.randint(0, length)] = 1
    logps = uniform(-3.0, 0.0, (rows, length))
    return {
        **options,
        "mask": mask,
        "logps": logps,
        "old": logps + uniform(-0.6, 0.6, (rows, length)),
        "ref": logps + uniform(-1.0, 1.0, (rows, length)) if beta else None,
        "advantages": uniform(-2.0, 2.0, (rows,)),
        "entropies": uniform(0.0, 3.0, (rows, length)),
        "max_completion_length": 8,
        "num_items_in_batch": 2 * rows * length,
    }


def _ours(case: dict[str, Any], *, over_processes: bool) -> dict[str, float]:
    out = grpo_loss(
        case["logps"], case["old"], case["advantages"], case["mask"], ref_per_token_logps=case["ref"],
        beta=case["beta"], epsilon_low=case["epsilon_low"], epsilon_high=case["epsilon_high"], delta=case["delta"],
        loss_type=case["loss_type"], importance_sampling_level=case["importance_sampling_level"],
        use_bias_correction_kl=case["use_bias_correction_kl"], max_completion_length=case["max_completion_length"],
        gradient_accumulation_steps=case["gradient_accumulation_steps"],
        num_items_in_batch=case["num_items_in_batch"], num_processes=2,
        steps_per_generation=case["steps_per_generation"], vespo=VESPO, entropies=case["entropies"],
    )  # fmt: skip
    return out.metrics(over_processes=over_processes)


def _gap(mine: dict[str, float], theirs: dict[str, float]) -> float:
    assert sorted(mine) == sorted(theirs), (mine, theirs)
    nan = {n for n in mine if math.isnan(mine[n])}, {n for n in theirs if math.isnan(theirs[n])}
    if nan[0] != nan[1]:
        return math.inf
    gaps = [abs(mine[n] - theirs[n]) for n in mine if n not in nan[0]]
    return max(gaps, default=0.0)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    worst, local_gap, cases = 0.0, 0.0, 0
    for index, loss_type in enumerate(GRPO_LOSS_TYPES):
        for seed in range(CASES_PER_LOSS_TYPE):
            case = _case(1000 * index + seed, loss_type, rank)
            _, theirs = _trl_grpo(case, case["logps"].clone().requires_grad_(True), _accelerator())
            worst = max(worst, _gap(_ours(case, over_processes=True), theirs))
            local_gap = max(local_gap, _gap(_ours(case, over_processes=False), theirs))
            cases += 1
    if rank == 0:
        Path(sys.argv[1]).write_text(json.dumps({"cases": cases, "worst": worst, "this_process_only": local_gap}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
