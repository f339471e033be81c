"""One rank of test_weights.py's ZeRO-3 run (torchrun, 2 processes): ``full_parameters`` against the unsharded
model's ``state_dict`` (full and LoRA merged), and how much is whole at each step of the walk. Writes
``rank{N}.json`` into the folder given."""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import json
import sys
from pathlib import Path
from typing import Any

import deepspeed
import torch
from _session_common import batch, tiny_llama
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

from dsbuild import Config, Training
from dsbuild.session import Session

LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
BUCKET_MB = 0.05  # about 52 kB: the tiny Llama's 32 kB attention weights go two by two


def _policy(lora: Any) -> Session:
    # Persistence threshold 0: every weight partitioned (the tiny model's would all stay whole by default).
    config = Config.zero(3).zero_options(stage3_param_persistence_threshold=0).adamw(lr=1e-2).batch(micro=2)
    s = Session.from_pretrained(tiny_llama(), config, Training(seed=7), lora=lora)
    s.step(batch())  # the adapters' B is no longer 0: the merge matters
    return s


def _expected(s: Session, lora: Any) -> dict[str, torch.Tensor]:
    """The unsharded model's state_dict: every weight gathered at once, LoRA merged by peft's merge_and_unload."""
    from dsbuild.session.export import merged_model

    with deepspeed.zero.GatheredParameters(list(s.model.parameters())):
        sd = {k: v.detach().clone() for k, v in s.model.state_dict().items()}
    if lora is None:
        return sd
    return {k: v.clone() for k, v in merged_model(s.model, sd).state_dict().items()}


def _whole_bytes(model: Any) -> int:
    return sum(p.ds_numel * p.element_size() for p in model.parameters() if p.ds_status == ZeroParamStatus.AVAILABLE)


def _case(lora: Any) -> dict[str, Any]:
    s = _policy(lora)
    expected = _expected(s, lora)
    names, worst, largest_live = [], 0.0, 0
    for name, tensor in s.full_parameters(bucket_mb=BUCKET_MB):
        names.append(name)
        worst = max(worst, float((tensor - expected[name]).abs().max()))
        largest_live = max(largest_live, _whole_bytes(s.model))
    return {
        "names": names,
        "expected_names": list(expected),
        "error": worst,
        "largest_live": largest_live,
        "bucket": int(BUCKET_MB * 2**20),
        "after": _whole_bytes(s.model),
        "largest_weight": max(p.ds_numel * p.element_size() for p in s.model.parameters()),
        "total": sum(p.ds_numel * p.element_size() for p in s.model.parameters()),
    }


def main() -> None:
    rank = int(os.environ["RANK"])
    result = {"full": _case(None), "lora": _case(LORA)}
    (Path(sys.argv[1]) / f"rank{rank}.json").write_text(json.dumps(result))
    from dsbuild.session import distributed

    distributed.close_gloo()  # before the interpreter's finalization, where gloo can abort ("terminate called ...")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # and no finalization at all: the result is written; an abort there would fail the test


if __name__ == "__main__":
    main()
