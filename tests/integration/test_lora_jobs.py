"""LoRA jobs as users run them (issue 29): the example LoRA ZeRO-3 job on 2 processes, started from another folder
than its file's, preempted by a signal and requeued, resumed in new processes whose hash seeds differ (a fingerprint
that followed set order refused such resumes), exported with the base it was built on so that transformers and peft
load it offline."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_train import LORA_JOB, fresh_env

from dsbuild.outputs import manifest
from dsbuild.outputs.history import read as read_history

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.procs]

STEPS = ["--set=training.max_steps=6", "--set=training.save_steps=3", "--set=training.bf16=false"]
"""6 steps (3 epochs of the notes), a checkpoint every 3, fp32: a resume equals the uninterrupted run to 1e-5."""


def _job(root: Path) -> Path:
    """The example LoRA job and its data, copied to ``root/job``; its output_dir (``out/job_lora_zero3``) is relative
    to the file, so the run writes into ``root/job/out/job_lora_zero3`` from wherever it is started."""
    folder = root / "job"
    shutil.copytree(LORA_JOB.parent / "data", folder / "data")
    shutil.copy(LORA_JOB, folder / "job.toml")
    return folder / "job.toml"


def _train(job: str, *argv: str, cwd: Path, seed: str, **env: str) -> subprocess.Popen[str]:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "dsbuild", "train", job, *STEPS, *argv],
        cwd=cwd,
        env=fresh_env(PYTHONHASHSEED=seed, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _losses(out: Path) -> dict[int, float]:
    if not (out / "history.jsonl").is_file():
        return {}
    return {int(h["step"]): float(h["loss"]) for h in read_history(out / "history.jsonl") if h.get("loss") is not None}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, float]]:
    """The uninterrupted run, started from a folder beside the job's: its output folder and losses."""
    root = tmp_path_factory.mktemp("reference")
    job = _job(root)
    run = _train("../job/job.toml", cwd=root / "elsewhere", seed="1")
    out, err = run.communicate(timeout=900)
    assert run.returncode == 0, err[-4000:]
    folder = job.parent / "out" / "job_lora_zero3"
    assert out.splitlines()[-3] == f"model        {folder}/model  (LoRA adapters; their base in base/)"
    losses = _losses(folder)
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    return folder, losses


def test_adapters_on_a_base_built_from_its_config_come_with_the_base_and_load_offline(
    reference: tuple[Path, dict[int, float]],
) -> None:
    """The base was built from [model.config] (random weights saved nowhere else): model/ holds the trained adapters
    (gathered whole from ZeRO-3, trained) and model/base the base, named by the adapters' config, so that
    AutoPeftModelForCausalLM and AutoModelForCausalLM load the model from model/ alone, offline, as the same model."""
    from safetensors.torch import load_file

    folder, _ = reference
    model = folder / "model"
    adapters = load_file(model / "adapter_model.safetensors")
    assert len(adapters) == 2 * 4 * 2  # layers x (q, k, v, o) x (A, B)
    assert all(t.numel() > 0 for t in adapters.values())
    assert all(t.abs().sum() > 0 for k, t in adapters.items() if "lora_B" in k)  # lora_B starts at zero
    config = json.loads((model / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(model / "base")
    assert {"config.json", "model.safetensors"} <= {p.name for p in (model / "base").iterdir()}
    script = (
        "import torch, transformers, peft, sys\n"
        "ids = torch.tensor([[5, 60, 70, 80, 90]])\n"
        f"a = peft.AutoPeftModelForCausalLM.from_pretrained({str(model)!r}).eval()\n"
        f"b = transformers.AutoModelForCausalLM.from_pretrained({str(model)!r}).eval()\n"
        "with torch.no_grad():\n"
        "    la, lb = a(ids).logits, b(ids).logits\n"
        "    base = a.get_base_model()\n"
        "    with a.disable_adapter():\n"
        "        lc = a(ids).logits\n"
        "assert torch.allclose(la, lb, atol=1e-5), (la - lb).abs().max()\n"
        "assert not torch.allclose(la, lc), 'the adapters change the output'\n"
        "print('loaded')\n"
    )
    env = {**fresh_env(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "loaded", done.stderr[-3000:]


def test_a_preempted_lora_job_resumes_from_another_folder_in_new_processes(
    tmp_path: Path, reference: tuple[Path, dict[int, float]]
) -> None:
    """SIGTERM to `dsbuild train` of the LoRA job (a Slurm array task with --requeue) after step 2: exit 75 in one
    line naming the signal, no traceback, the job requeued once. Started again from another folder, the job finds
    its run (a run without --resume is refused, nothing changed) and resumes it in processes with another hash
    seed (the LoRA fingerprint is the same), giving the uninterrupted run's losses; merge = true exports the
    merged model, which transformers loads offline."""
    _, expected = reference
    job = _job(tmp_path)
    folder = job.parent / "out" / "job_lora_zero3"
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol.calls"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    slurm = {"SLURM_JOB_ID": "1234", "SLURM_ARRAY_JOB_ID": "1200", "SLURM_ARRAY_TASK_ID": "7"}
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    run = _train(str(job), "--requeue", cwd=tmp_path / "a", seed="1", PATH=path, **slurm)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and run.poll() is None and max(_losses(folder), default=0) < 2:
        time.sleep(0.1)
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=600)
    assert run.returncode == 75, err[-4000:]
    stopped = max(_losses(folder))
    assert stopped < 6
    said = [line for line in (out + err).splitlines() if not line.startswith("[node0 rank0]:")]
    assert "Traceback" not in out + err and "ChildFailedError" not in out + err
    assert said[-2:] == [
        f"dsbuild: stopped at step {stopped} by SIGTERM to dsbuild train; checkpoint {folder}/checkpoints/"
        f"global_step{stopped} saved and verified: dsbuild train --resume continues",
        "dsbuild: requeued Slurm job 1200_7 (scontrol requeue 1200_7); it resumes with --resume",
    ], said[-5:]
    assert calls.read_text().splitlines() == ["requeue 1200_7"]
    assert manifest.verify(folder / "checkpoints" / f"global_step{stopped}")["global_step"] == stopped

    again = _train("../job.toml", cwd=job.parent / "b", seed="2")
    _, err = again.communicate(timeout=300)
    assert again.returncode == 2 and f"{folder} holds an earlier run" in err, err[-2000:]

    resumed = _train("../job.toml", "--resume", "--set=model.lora.merge=true", cwd=job.parent / "b", seed="2")
    out, err = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, err[-4000:]
    assert f"dsbuild: resumed from {folder}/checkpoints/global_step{stopped} at step {stopped}" in err
    got = _losses(folder)
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    later = range(stopped + 1, 7)
    assert [got[s] for s in later] == pytest.approx([expected[s] for s in later], rel=1e-5)
    assert out.splitlines()[-3] == f"model        {folder}/model  (HF format, LoRA merged)"
    script = (
        "import torch, transformers\n"
        f"m = transformers.AutoModelForCausalLM.from_pretrained({str(folder / 'model')!r})\n"
        "print(type(m).__name__)\n"
    )
    env = {**fresh_env(), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.stdout.strip() == "LlamaForCausalLM", done.stderr[-3000:]
    assert not (folder / "model" / "adapter_config.json").exists()
