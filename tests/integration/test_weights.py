"""``full_parameters`` and ``stream_to`` (issue 32): the plain model's ``state_dict`` names and tensors, LoRA merged per
layer as peft merges it, at most one bucket whole at a time under ZeRO-3 on 2 processes (``_weights_worker.py``)."""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _session_common import batch, tiny_llama

from dsbuild import Config, InvalidValueError, Training
from dsbuild.session import Session
from dsbuild.session.export import merged_model
from dsbuild.session.weights import stream_to

pytestmark = pytest.mark.train

ROOT = Path(__file__).resolve().parents[2]
LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def _trained(lora: Any) -> Session:
    s = Session.from_pretrained(tiny_llama(), Config.zero(0).adamw(lr=1e-2).batch(micro=2), Training(seed=3), lora=lora)
    s.step(batch())
    return s


@pytest.mark.engine
@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_full_parameters_are_the_plain_models_state_dict(lora: Any) -> None:
    """At ZeRO-0, names in the plain model's order and tensors equal (LoRA: merged as peft's merge_and_unload, 1e-6),
    whatever the bucket size; the model itself unchanged (the merge is computed, not applied)."""
    s = _trained(lora)
    sd = {k: v.detach().clone() for k, v in s.model.state_dict().items()}
    expected = merged_model(s.model, sd).state_dict() if lora else sd
    for bucket_mb in (1e-3, 1024):
        got = {name: tensor.clone() for name, tensor in s.full_parameters(bucket_mb=bucket_mb)}
        assert list(got) == list(expected)
        for name, tensor in got.items():
            torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6)
    assert all(torch.equal(v, s.model.state_dict()[k]) for k, v in sd.items())


@pytest.mark.engine
def test_lora_unmerged_keeps_peft_names_and_a_sink_gets_every_weight() -> None:
    """``merge_lora=False`` yields peft's own names (adapters included); ``stream_to`` hands each weight to the sink
    once and counts them."""
    s = _trained(LORA)
    names = [n for n, _ in s.full_parameters(merge_lora=False)]
    assert names == [n for n, _ in s.model.named_parameters()] and any(".lora_A." in n for n in names)
    seen: dict[str, tuple[int, ...]] = {}
    count = stream_to(s, lambda name, tensor: seen.__setitem__(name, tuple(tensor.shape)))
    assert count == len(seen) == len([n for n in s.model.state_dict() if ".lora_" not in n])


@pytest.mark.engine
@pytest.mark.parametrize("bucket_mb", [0, -1, True, "8"])
def test_a_bucket_that_is_not_a_positive_size_is_refused(bucket_mb: Any) -> None:
    """A zero, negative, boolean or text bucket size is an InvalidValueError naming ``bucket_mb``."""
    s = _trained(None)
    with pytest.raises(InvalidValueError, match="bucket_mb"):
        next(iter(s.full_parameters(bucket_mb=bucket_mb)))


@pytest.mark.procs
@pytest.mark.slow
def test_zero3_on_two_processes_streams_the_unsharded_weights_one_bucket_at_a_time(tmp_path: Path) -> None:
    """ZeRO-3 on 2 processes, every weight partitioned: both ranks walk the plain model's names with its tensors
    (LoRA merged, 1e-6), never more than one bucket (or one weight larger than it) whole, nothing whole after."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(Path(__file__).parent / "_weights_worker.py"), str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-5000:]
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for kind in ("full", "lora"):
            r = result[kind]
            assert r["names"] == r["expected_names"], (rank, kind)
            assert r["error"] <= 1e-6, (rank, kind, r["error"])
            assert 0 < r["largest_live"] <= max(r["bucket"], r["largest_weight"]) < r["total"], (rank, kind, r)
            assert r["after"] == 0, (rank, kind)
