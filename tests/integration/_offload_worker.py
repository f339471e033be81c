"""One rank of the offload parity run, started by tests/integration/test_offload.py under torchrun.

    python -m torch.distributed.run --nproc_per_node 2 --master_port PORT \
        tests/integration/_offload_worker.py OUT_DIR

At ZeRO stages 1, 2 and 3 in turn, the tiny Llama in bf16 trains 3 optimizer steps twice from the same start: once
plainly, once with ``offloaded()`` (DeepSpeed's default states) before, between and after the steps. The optimizer
is DeepSpeed's FusedAdam with two parameter groups (weight decay on the matrices, none on the norms), the case
DeepSpeed PR #7050 once misaligned on reload. Each rank saves, per stage and run, the full weights and its own
partition's Adam states to ``OUT_DIR/stage{N}_{run}_rank{R}.pt``; rank 0 writes ``OUT_DIR/result.json`` with what
each offload moved.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch
from _session_common import batch, tiny_llama

from dsbuild import Config
from dsbuild.session import Session
from dsbuild.session.offload import offloaded

STEPS = 3


def two_groups(params: Any) -> Any:
    """DeepSpeed's FusedAdam over two groups, as HF's Trainer splits them: decay on matrices, none on 1-D norms."""
    from deepspeed.ops.adam import FusedAdam

    params = list(params)
    matrix = [p for p in params if len(getattr(p, "ds_shape", p.shape)) >= 2]  # ZeRO-3: the shape before partitioning
    vector = [p for p in params if len(getattr(p, "ds_shape", p.shape)) < 2]
    groups = [{"params": matrix, "weight_decay": 0.1}, {"params": vector, "weight_decay": 0.0}]
    return FusedAdam(groups, lr=1e-2, adam_w_mode=True)


def masters(s: Session) -> list[torch.Tensor]:
    """This rank's fp32 master partitions, one flat tensor per group (the keys of the optimizer's states). ZeRO-3
    puts them into the optimizer's groups only while it steps."""
    zero = s.engine.optimizer
    flat = zero.fp32_partitioned_groups_flat if s.engine.zero_optimization_stage() == 3 else None
    return list(flat if flat is not None else zero.single_partition_of_fp32_groups)


def pointers(s: Session) -> dict[str, list[int]]:
    """Where each state's tensors live now (storage addresses): on CPU, a move shows as a new address."""
    opt = s.engine.optimizer.optimizer
    masters_ = masters(s)
    return {
        "optim_states": [
            opt.state[p][k].data_ptr() for p in masters_ for k in ("exp_avg", "exp_avg_sq") if k in opt.state[p]
        ],
        "hp_params": [p.data_ptr() for p in masters_],
        "lp_params": [getattr(p, "ds_tensor", p).data_ptr() for p in s.model.parameters()],
    }


def saved(s: Session) -> dict[str, torch.Tensor]:
    """The full weights by name (gathered under ZeRO-3) and this rank's partition of the fp32 master weights and
    Adam states, by group and position."""
    out: dict[str, torch.Tensor] = {}
    params = dict(s.model.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        out.update({f"weight.{name}": p.detach().clone() for name, p in params.items()})
    opt = s.engine.optimizer.optimizer
    for g, p in enumerate(masters(s)):
        state = opt.state[p]
        out[f"group{g}.hp"] = p.detach().clone()
        for key in ("exp_avg", "exp_avg_sq"):
            out[f"group{g}.{key}"] = state[key].detach().clone()
        out[f"group{g}.step"] = torch.as_tensor(state["step"]).detach().clone()
    return out


def train(stage: int, offload: bool, out: Path) -> dict[str, Any]:
    s = Session.from_pretrained(tiny_llama(), Config.zero(stage).bf16().batch(micro=2), optimizer=two_groups)
    moved: list[list[str]] = []
    changed: dict[str, list[bool]] = {}  # per state, per offload: whether its storage moved
    losses = []
    for step in range(STEPS + 1):
        if offload:
            before = pointers(s)
            with offloaded(s) as states:
                moved.append(list(states))
                for k, now in pointers(s).items():
                    changed.setdefault(k, []).append(bool(now) and now != before[k])
        if step < STEPS:
            losses.append(s.step(batch(seed=100 * s.rank + step)).loss)
    torch.save(saved(s), out / f"stage{stage}_{'offloaded' if offload else 'plain'}_rank{s.rank}.pt")
    groups = len(masters(s))
    return {"moved": moved, "changed": changed, "losses": losses, "groups": groups, "world_size": s.world_size}


def main(out: Path) -> None:
    result = {f"stage{stage}_{mode}": train(stage, mode == "offloaded", out) for stage in (1, 2, 3) for mode in
              ("plain", "offloaded")}  # fmt: skip
    if int(os.environ.get("RANK", "0")) == 0:
        (out / "result.json").write_text(json.dumps(result))
    from dsbuild.session import distributed

    distributed.close_gloo()  # before the interpreter's finalization, where gloo can abort ("terminate called ...")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # and no finalization at all: the result is written; an abort there would fail the test


if __name__ == "__main__":
    main(Path(sys.argv[1]))
