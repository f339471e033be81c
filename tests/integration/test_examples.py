"""Every file in examples/ runs, with small settings: the scripts end to end, the job files checked
(examples/job_lora_zero3.toml trains in test_train.py), the Lightning snippet's config part."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from dsbuild import Config, load_job

pytestmark = pytest.mark.procs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def example(name: str, *argv: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """``python examples/NAME ARGV`` in a fresh process, with its own port for a one-process DeepSpeed world."""
    from dsbuild.session.distributed import free_port  # imports torch: only the examples that run need it

    env = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_PORT": str(free_port())}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        env.pop(key, None)
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def test_every_example_is_covered() -> None:
    """A new example needs a test here."""
    assert sorted(p.name for p in EXAMPLES.iterdir() if p.is_file()) == [
        "build_config.py",
        "custom_loop.py",
        "dpo_loop.py",
        "grpo_loop.py",
        "grpo_rewards.py",
        "hf_trainer.py",
        "job_dpo.toml",
        "job_grpo.toml",
        "job_grpo_reward_model.toml",
        "job_lora_zero3.toml",
        "job_reward.toml",
        "job_rloo.toml",
        "lightning_snippet.py",
        "make_reward_model.py",
    ]


@pytest.mark.train
def test_build_config(tmp_path: Path) -> None:
    """Builds a config in Python and writes it and every preset as JSON and TOML."""
    done = example("build_config.py", str(tmp_path / "out"), cwd=tmp_path)
    assert "wrote" in done.stdout.splitlines()[-1]
    assert Config.load(tmp_path / "out" / "zero3_offload_adamw.json") == Config.load(
        tmp_path / "out" / "zero3_offload_adamw.toml"
    )


@pytest.mark.slow
def test_custom_loop(tmp_path: Path) -> None:
    """Your own loop on a Session: ZeRO-3 + LoRA, checkpoint, resume reproducing the losses, adapters reloaded."""
    done = example("custom_loop.py", "--steps", "4", "--out", str(tmp_path / "loop"), cwd=tmp_path)
    assert "resumed losses equal to the uninterrupted run's: True" in done.stdout
    assert "trained LoRA B matrices loaded with peft" in done.stdout


@pytest.mark.slow
def test_dpo_loop(tmp_path: Path) -> None:
    """DPO in your own loop at ZeRO-3: a reference, log-probs, TRL's loss; step 1 starts at the reference (log 2)."""
    done = example("dpo_loop.py", "--steps", "2", "--out", str(tmp_path / "dpo"), cwd=tmp_path)
    assert "step 1 starts at the reference: loss log 2 = 0.6931, got 0.6931" in done.stdout
    assert len(json.loads((tmp_path / "dpo" / "dpo_history.json").read_text())) == 2


@pytest.mark.slow
def test_grpo_loop(tmp_path: Path) -> None:
    """GRPO in your own loop at ZeRO-3: sampling inside gathered(), rewards, group advantages, TRL's loss with a KL
    to the reference that is 0 at step 1 and grows after."""
    done = example("grpo_loop.py", "--iterations", "2", "--out", str(tmp_path / "grpo"), cwd=tmp_path)
    assert "kl to the reference at step 1 (policy = reference): 0.0e+00" in done.stdout
    steps = [line for line in done.stdout.splitlines() if line.startswith("  step ")]
    assert len(steps) == 2 and float(steps[1].split("kl ")[1].split()[0]) > 0


@pytest.mark.slow
def test_hf_trainer_with_an_exported_config(tmp_path: Path) -> None:
    """`dsbuild export zero3 --for hf` then a real Trainer.train() on it: ZeRO-3, bf16, every "auto" filled."""
    out = tmp_path / "hf"
    done = example("hf_trainer.py", "--steps", "3", "--out", str(out), cwd=tmp_path)
    lines = done.stdout.splitlines()
    assert "DeepSpeedEngine, ZeRO stage 3, bf16 True, built partitioned: True" in lines
    assert 'the Trainer filled every "auto": True' in lines
    (trained,) = [line for line in lines if line.startswith("trained ")]
    first, last = (float(x) for x in trained.split("loss ")[1].split(" -> "))
    assert trained.startswith("trained 3 steps") and last < first
    exported = json.loads((out / "ds_config.json").read_text())
    assert exported["train_micro_batch_size_per_gpu"] == "auto" and exported["zero_optimization"]["stage"] == 3


@pytest.mark.slow
def test_hf_trainer_on_two_processes(tmp_path: Path) -> None:
    """The docstring's torchrun line: the Trainer and DeepSpeed both see 2 processes at ZeRO-3 on CPU, and train."""
    out = tmp_path / "hf2"
    script = str(EXAMPLES / "hf_trainer.py")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", script, "--steps", "3"]
    from dsbuild.session.distributed import free_port

    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    command += ["--out", str(out)]
    command[3:3] = ["--master_port", str(free_port())]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "DeepSpeedEngine, ZeRO stage 3, bf16 True, built partitioned: True" in lines
    assert "processes: 2, DeepSpeed's data-parallel size: 2" in lines
    (trained,) = [line for line in lines if line.startswith("trained ")]
    assert trained.startswith("trained 3 steps")


def test_lightning_snippet_config() -> None:
    """The config Lightning's DeepSpeedStrategy gets: resolved (Lightning fills no "auto"), checked."""
    snippet = runpy.run_path(str(EXAMPLES / "lightning_snippet.py"), run_name="example")
    config = snippet["lightning_config"](8)
    assert '"auto"' not in json.dumps(config)
    assert config["train_batch_size"] == 4 * 4 * 8 and config["bf16"] == {"enabled": True}
    assert config["scheduler"]["params"]["total_num_steps"] == 2_000
    assert Config.from_dict(config).validate(world_size=8, resolved=True) == []


def test_lightning_snippet_strategy() -> None:
    """With Lightning installed, its DeepSpeedStrategy takes the dict as it is."""
    pytest.importorskip("lightning", reason="Lightning is not installed (pip install lightning)")
    from lightning.pytorch.strategies import DeepSpeedStrategy

    snippet = runpy.run_path(str(EXAMPLES / "lightning_snippet.py"), run_name="example")
    strategy = DeepSpeedStrategy(config=snippet["lightning_config"](2))
    assert strategy.config["zero_optimization"]["stage"] == 2


@pytest.mark.train
def test_dpo_job_file_trains(tmp_path: Path) -> None:
    """The DPO job: valid, and dsbuild train runs its 3 steps from the reference (step 1's loss log 2, TRL's metrics
    in the history)."""
    job = load_job(EXAMPLES / "job_dpo.toml")
    assert job.task == "dpo" and job.dpo is not None and job.reference is not None and job.validate() == []
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "dsbuild", "train", str(EXAMPLES / "job_dpo.toml"), f"--set=training.output_dir='{out}'"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert len(steps) == 3 and abs(steps[0]["loss"] - 0.6931472) < 1e-6 and "rewards/margins" in steps[0]
    assert (out / "model" / "config.json").is_file()


@pytest.mark.train
def test_grpo_job_file_trains(tmp_path: Path) -> None:
    """The GRPO job: valid, its reward functions found beside it, and dsbuild train runs its 3 steps, the policy
    sampling under ZeRO-3 (TRL's metrics in the history: the reward per function, the KL from 0 at step 1)."""
    job = load_job(EXAMPLES / "job_grpo.toml")
    assert job.task == "grpo" and job.grpo is not None and job.rewards is not None and job.validate() == []
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "dsbuild", "train", str(EXAMPLES / "job_grpo.toml"), f"--set=training.output_dir='{out}'"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert len(steps) == 3 and steps[0]["kl"] == 0.0 and "rewards/length/mean" in steps[0] and "reward_std" in steps[0]
    assert (out / "model" / "config.json").is_file()


@pytest.mark.train
def test_rloo_job_file_trains(tmp_path: Path) -> None:
    """The RLOO job: valid, its reward functions found beside it, and dsbuild train runs its 3 steps, the policy
    sampling under ZeRO-3 against a reference (TRL's RLOO metrics in the history: the first-order KL 0 at step 1,
    the clip ratios, the reward per function)."""
    job = load_job(EXAMPLES / "job_rloo.toml")
    assert job.task == "rloo" and job.rloo is not None and job.rewards is not None and job.validate() == []
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "dsbuild", "train", str(EXAMPLES / "job_rloo.toml"), f"--set=training.output_dir='{out}'"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert len(steps) == 3 and steps[0]["kl"] == 0.0 and "clip_ratio/region_mean" in steps[0]
    assert "rewards/length/mean" in steps[0] and (out / "model" / "config.json").is_file()


@pytest.mark.train
@pytest.mark.slow
def test_grpo_job_with_a_reward_model_trains_on_two_processes(tmp_path: Path) -> None:
    """make_reward_model.py writes a reward model folder beside a copy of the job; dsbuild train runs it on 2
    processes under ZeRO-3 (the reward model on its own partitioned inference engine, scored before the function),
    and logs its rewards under TRL's name for it (``rewards/reward_model/mean``) beside the function's."""
    import shutil

    for name in ("job_grpo_reward_model.toml", "grpo_rewards.py"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    example("make_reward_model.py", str(tmp_path / "reward_model"), cwd=tmp_path)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "dsbuild", "train", str(tmp_path / "job_grpo_reward_model.toml"),
         "--nproc-per-node=2", "--set=training.max_steps=2", f"--set=training.output_dir='{out}'"],
        capture_output=True, text=True, env={**os.environ, "DS_ACCELERATOR": "cpu"}, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "loss" in r]
    assert len(steps) == 2 and all("rewards/reward_model/mean" in r and "rewards/no_spaces/mean" in r for r in steps)
    assert all(abs(r["rewards/reward_model/std"]) > 0 for r in steps)  # the model scores completions apart


@pytest.mark.train
def test_reward_job_file_trains(tmp_path: Path) -> None:
    """The reward job: valid, and dsbuild train runs its 3 steps (TRL's RewardTrainer metrics in the history) and
    saves a model that loads as a one-label sequence classifier."""
    from transformers import AutoModelForSequenceClassification

    job = load_job(EXAMPLES / "job_reward.toml")
    assert job.task == "reward" and job.reward is not None and job.validate() == []
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "dsbuild", "train", str(EXAMPLES / "job_reward.toml"), f"--set=training.output_dir='{out}'"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert len(steps) == 3 and all({"accuracy", "margin", "min_reward", "mean_reward", "max_reward"} <= set(r)
                                   for r in steps)  # fmt: skip
    model = AutoModelForSequenceClassification.from_pretrained(out / "model")
    assert model.config.num_labels == 1 and model.config.pad_token_id == 0


def test_lora_job_file_is_valid() -> None:
    """The LoRA ZeRO-3 job: two processes from its ROLL-style device_mapping, a clean config."""
    job = load_job(EXAMPLES / "job_lora_zero3.toml")
    assert job.launch.device_mapping == (0, 1) and job.launch.world_size == 2
    assert job.model.lora is not None and job.model.lora.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj")
    assert job.data.format == "text" and job.validate() == []
