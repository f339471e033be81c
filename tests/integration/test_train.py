"""``dsbuild train`` for real: the demo job on one process (and resumed), a LoRA ZeRO-3 job on two processes,
two nodes on one machine, and a failing rank. DeepSpeed on CPU, tiny models built from their configs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

from dsbuild.history import read as read_history
from dsbuild.session.distributed import free_port

ROOT = Path(__file__).resolve().parents[2]
LORA_JOB = ROOT / "examples" / "job_lora_zero3.toml"


def dsbuild(*argv: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """``dsbuild ARGV`` in a fresh process, outside any launcher's environment."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return subprocess.run(
        [sys.executable, "-m", "dsbuild", *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def sets(**values: object) -> list[str]:
    return [f"--set=training.{k}={json.dumps(v)}" for k, v in values.items()]


def train_records(history: list[dict[str, object]]) -> list[dict[str, object]]:
    return [h for h in history if h.get("loss") is not None]


@pytest.mark.slow
def test_demo_job_trains_writes_every_output_and_resumes(tmp_path: Path) -> None:
    """The built-in demo (shortened): the loss falls, every output is where the last lines say; a run
    that stopped after its step-3 checkpoint resumes and reproduces the uninterrupted steps 4-6."""
    out = tmp_path / "demo"
    argv = sets(max_steps=6, save_steps=3, eval_steps=3, warmup_steps=2, logging_steps=1, output_dir=str(out))
    first = ok(dsbuild("train", *argv, cwd=tmp_path))
    assert "Traceback" not in first.stderr

    history = read_history(out / "history.jsonl")
    train = train_records(history)
    assert [h["step"] for h in train] == [1, 2, 3, 4, 5, 6]
    assert train[-1]["loss"] < train[0]["loss"] - 0.3  # visibly learning
    assert [h["step"] for h in history if "eval_loss" in h] == [3, 6]

    tail = first.stdout.splitlines()[-6:]
    assert tail[0].startswith(f"loss {train[0]['loss']:.3f} at step 1 -> {train[-1]['loss']:.3f} at step 6")
    assert tail[1:] == [
        f"ds_config    {out}/ds_config.json  (the resolved config the engine ran with)",
        f"checkpoints  {out}/checkpoints  (latest: global_step6)",
        f"model        {out}/model  (HF format)",
        f"metrics      {out}/logs  (DeepSpeed's CSV monitor; history.jsonl)",
        f"loss plot    {out}/loss.png",
    ]
    ds_config = json.loads((out / "ds_config.json").read_text())
    assert '"auto"' not in json.dumps(ds_config)
    assert ds_config["zero_optimization"]["stage"] == 3 and ds_config["bf16"] == {"enabled": True}
    assert ds_config["scheduler"]["params"]["total_num_steps"] == 6
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir()) == ["global_step3", "global_step6"]
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= {p.name for p in (out / "model").iterdir()}
    assert len((out / "logs" / "train" / "Train_loss.csv").read_text().splitlines()) == 1 + 6
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # As if the run had stopped right after its step-3 checkpoint.
    shutil.rmtree(out / "checkpoints" / "global_step6")
    (out / "checkpoints" / "latest").write_text("global_step3")
    second = ok(dsbuild("train", "--resume", *argv, cwd=tmp_path))
    assert f"resumed from {out}/checkpoints/global_step3 at step 3" in second.stderr
    resumed = train_records(read_history(out / "history.jsonl"))
    assert [h["step"] for h in resumed] == [1, 2, 3, 4, 5, 6]
    assert resumed[:3] == train[:3]  # kept from the first run's history
    # Same data order, RNG and schedule: equal up to CPU Adam's float rounding after a resume (see test_session).
    assert [h["lr"] for h in resumed[3:]] == [h["lr"] for h in train[3:]]
    assert [h["loss"] for h in resumed[3:]] == pytest.approx([h["loss"] for h in train[3:]], rel=1e-5)


@pytest.mark.slow
def test_two_processes_lora_zero3_job(tmp_path: Path) -> None:
    """The example LoRA ZeRO-3 job on 2 processes (from its device_mapping): adapters gathered whole and trained."""
    from safetensors.torch import load_file

    out = tmp_path / "lora"
    done = ok(dsbuild("train", str(LORA_JOB), *sets(max_steps=4, output_dir=str(out)), cwd=tmp_path))
    assert done.stdout.splitlines()[-3] == f"model        {out}/model  (LoRA adapters)"
    ds_config = json.loads((out / "ds_config.json").read_text())
    assert ds_config["train_batch_size"] == 4 * 2 * 2  # micro x accumulation x 2 processes
    assert ds_config["scheduler"]["type"] == "WarmupCosineLR"
    adapters = load_file(out / "model" / "adapter_model.safetensors")
    assert len(adapters) == 2 * 4 * 2  # layers x (q, k, v, o) x (A, B)
    assert all(t.numel() > 0 for t in adapters.values())
    assert all(t.abs().sum() > 0 for k, t in adapters.items() if "lora_B" in k)  # lora_B starts at zero
    assert (out / "checkpoints" / "global_step4" / "dsbuild_rank1.json").is_file()
    logs = list((out / "logs" / "torchrun" / "node0").glob("*/attempt_0/1/stderr.log"))
    assert logs, "every rank's output is kept in a log file"


@pytest.mark.slow
def test_two_nodes_on_one_machine(tmp_path: Path) -> None:
    """Two launches of `dsbuild train --nnodes 2`, node ranks 0 and 1, meeting at 127.0.0.1: one run of 2 processes."""
    out = tmp_path / "nodes"
    port = str(free_port())
    argv = sets(max_steps=4, save_steps=2, output_dir=str(out))
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    launches = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dsbuild",
                "train",
                "--nnodes",
                "2",
                "--node-rank",
                str(rank),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                port,
                *argv,
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    results = [p.communicate(timeout=600) for p in launches]
    for p, (stdout, stderr) in zip(launches, results, strict=True):
        assert p.returncode == 0, stdout[-2000:] + stderr[-4000:]
    assert results[1][0].splitlines()[-1] == f"node 1: done; node 0 has the outputs in {out}"
    assert results[0][0].splitlines()[-4] == f"checkpoints  {out}/checkpoints  (latest: global_step4)"
    assert json.loads((out / "ds_config.json").read_text())["train_batch_size"] == 16 * 2
    assert (out / "checkpoints" / "global_step4" / "dsbuild_rank1.json").is_file()  # rank 1 lives on node 1
    assert [h["step"] for h in train_records(read_history(out / "history.jsonl"))] == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_failing_rank_fails_the_command_and_shows_its_error(tmp_path: Path) -> None:
    """A rank that raises makes `dsbuild train` exit non-zero, naming the rank, its error and its last lines."""
    done = dsbuild(
        "train", "--nproc-per-node", "2", '--set=model.attn_implementation="flash_attention_2"',
        *sets(max_steps=2, output_dir=str(tmp_path / "fail")), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    assert "dsbuild: error: training failed: torchrun exited with 1" in done.stderr
    assert "dsbuild: error: local rank 0 failed: ImportError: FlashAttention2 has been toggled on" in done.stderr
    assert "  last lines of " in done.stderr and "stderr.log:" in done.stderr
    assert not (tmp_path / "fail" / "model").exists()
