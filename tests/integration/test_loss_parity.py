"""dsbuild trains the model the HF Trainer trains: the loss of an optimizer step weighs every trained token of its
micro-batches (over every process) the same, HF's ``num_items_in_batch``, so ragged micro-batches give the HF
Trainer's logged losses and weights, not the mean of per-micro-batch means.

1 process × accumulation 8 is held against the HF Trainer itself (real Trainer, real DeepSpeed, CPU) and against
the steps computed by hand with plain torch; 2 processes × accumulation 4 (the HF Trainer on CPU under torchrun sees
one process) against the same hand computation over both processes' shares.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from dsbuild.session.distributed import free_port

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.procs]  # each side trains in a process of its own

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_loss_parity_worker.py"
SAMPLES = 48  # 3 steps × 8 micro-batches × 2, and 3 steps × 2 processes × 4 × 2


def chat_samples() -> list[dict[str, list[int]]]:
    """Conversations with the loss on the assistant's answer only (ragged prompts, 2-3 trained tokens each)."""
    from transformers import ByT5Tokenizer

    from dsbuild.data import read_records, tokenize
    from dsbuild.job import demo_job_path

    records = read_records(demo_job_path().parent / "arith_train.jsonl", "alpaca")[:SAMPLES]
    messages = [
        {"messages": [
            {"role": "user", "content": f"{r['instruction']} {r.get('input', '')}".strip()},
            {"role": "assistant", "content": r["output"]},
        ]}
        for r in records
    ]  # fmt: skip
    return list(tokenize(messages, ByT5Tokenizer(), "messages", max_length=128).samples)


def text_samples() -> list[dict[str, list[int]]]:
    """Plain text of lengths from 4 to 90 tokens, every token trained."""
    rng = random.Random(7)
    out = []
    for _ in range(SAMPLES):
        ids = [rng.randrange(3, 380) for _ in range(rng.choice([4, 9, 17, 33, 60, 90]))]
        out.append({"input_ids": ids, "labels": list(ids)})
    return out


def run(side: str, data: Path, out: Path, accumulation: int, processes: int = 1) -> dict[str, Any]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(HERE)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    argv = [str(WORKER), side, str(data), str(out), f"--accumulation={accumulation}", f"--processes={processes}"]
    if processes > 1:
        argv = ["-m", "torch.distributed.run", f"--nproc-per-node={processes}", f"--master-port={free_port()}", *argv]
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    result["weights"] = torch.load(out / "weights.pt", weights_only=True)
    return result


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert len(a["losses"]) == len(b["losses"]) == 3
    for x, y in zip(a["losses"], b["losses"], strict=True):
        assert abs(x - y) <= 1e-6 * abs(y), (a["losses"], b["losses"])
    assert a["weights"].keys() == b["weights"].keys()
    worst = max(float((a["weights"][k] - b["weights"][k]).abs().max()) for k in a["weights"])
    assert worst <= 1e-6, worst


def mean_of_means(samples: list[dict[str, list[int]]], accumulation: int) -> float:
    """The first step's loss as the per-micro-batch mean would log it, with the weights every side starts from."""
    import _loss_parity_worker as worker

    net = worker.model()
    with torch.no_grad():
        means = [float(net(**worker.collate(samples[i * 2 : i * 2 + 2])).loss) for i in range(accumulation)]
    return sum(means) / len(means)


@pytest.mark.parametrize("kind", ["text", "chat"])
def test_one_process_with_accumulation_8_trains_as_the_hf_trainer(kind: str, tmp_path: Path) -> None:
    """Logged losses and weights after 3 steps equal the HF Trainer's and the hand computation's."""
    samples = text_samples() if kind == "text" else chat_samples()
    data = tmp_path / "data.json"
    data.write_text(json.dumps(samples))
    hf = run("hf", data, tmp_path / "hf", 8)
    ours = run("dsbuild", data, tmp_path / "dsbuild", 8)
    hand = run("hand", data, tmp_path / "hand", 8)
    assert_same(ours, hf)
    assert_same(hand, hf)
    # The differential can tell: the per-micro-batch mean logs a first loss over 10 times the tolerance away.
    assert abs(mean_of_means(samples, 8) - hf["losses"][0]) > 1e-5 * hf["losses"][0]


@pytest.mark.parametrize("kind", ["text", "chat"])
def test_two_processes_with_accumulation_4_weigh_tokens_over_both(kind: str, tmp_path: Path) -> None:
    """2 processes × accumulation 4 under torchrun: the losses and weights of the hand computation over both."""
    samples = text_samples() if kind == "text" else chat_samples()
    data = tmp_path / "data.json"
    data.write_text(json.dumps(samples))
    ours = run("dsbuild", data, tmp_path / "dsbuild", 4, processes=2)
    hand = run("hand", data, tmp_path / "hand", 4, processes=2)
    assert_same(ours, hand)
