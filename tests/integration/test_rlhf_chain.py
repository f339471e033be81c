"""examples/rlhf/: the RLHF chain as three job files, run in order as a user runs them (SFT, a reward model from the
SFT model, GRPO of the SFT model against that reward model), each stage's output folder the next stage's input."""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dsbuild import load_job

CHAIN = Path(__file__).resolve().parents[2] / "examples" / "rlhf"
FILES = ["README.md", "demonstrations.jsonl", "grpo.toml", "make_data.py", "pairs.jsonl", "pairs_eval.jsonl",
         "prompts.jsonl", "reward.toml", "sft.toml"]  # fmt: skip


def train(job: Path, *sets: str) -> None:
    """``dsbuild train JOB --set ...`` in a fresh process on the CPU accelerator, from another folder than the job's."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    command = [sys.executable, "-m", "dsbuild", "train", str(job), *(f"--set={s}" for s in sets)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=job.parent.parent, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def history(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]


def test_the_chain_folder_holds_what_its_readme_names() -> None:
    """A new file in examples/rlhf/ needs a place in this test; the README names each job file's command."""
    assert sorted(p.name for p in CHAIN.iterdir() if p.is_file()) == FILES
    readme = (CHAIN / "README.md").read_text()
    assert all(f"dsbuild train examples/rlhf/{name}.toml" in readme for name in ("sft", "reward", "grpo"))


@pytest.mark.parametrize("name", ["sft.toml", "reward.toml", "grpo.toml"])
def test_the_job_files_validate_against_the_job_schema(name: str) -> None:
    """What an editor checks against ``dsbuild schema --job`` (tests/unit/test_job_schema.py reads examples/*.toml
    only): the three job files hold no key or value the reader refuses."""
    import jsonschema
    import tomllib

    from dsbuild.job.schema import job_schema

    job = tomllib.loads((CHAIN / name).read_text())
    assert [e.message for e in jsonschema.Draft202012Validator(job_schema()).iter_errors(job)] == []


def test_make_data_writes_the_shipped_data(tmp_path: Path) -> None:
    """The data files in the repo are what make_data.py writes (seeded), so its docstring describes them."""
    runpy.run_path(str(CHAIN / "make_data.py"), run_name="example")["main"](tmp_path)
    for name in ("demonstrations.jsonl", "pairs.jsonl", "pairs_eval.jsonl", "prompts.jsonl"):
        assert (tmp_path / name).read_bytes() == (CHAIN / name).read_bytes(), name
    pairs = [json.loads(line) for line in (CHAIN / "pairs_eval.jsonl").read_text().splitlines()]
    assert all(p["chosen"].count("a") > p["rejected"].count("a") for p in pairs)


@pytest.mark.procs
@pytest.mark.train
@pytest.mark.slow
def test_the_rlhf_chain_runs_end_to_end(tmp_path: Path) -> None:
    """The three jobs of examples/rlhf/ run in order with fewer steps: the SFT model loads as the reward job's
    model and as the GRPO job's policy and reference (kl 0 at step 1), the reward model ranks held-out pairs
    right, and the GRPO policy's mean reward from that reward model rises."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    chain = tmp_path / "rlhf"
    shutil.copytree(CHAIN, chain, ignore=shutil.ignore_patterns("out", "__pycache__"))
    train(chain / "sft.toml")
    sft = chain / "out" / "sft" / "model"
    assert AutoModelForCausalLM.from_pretrained(sft).config.num_hidden_layers == 2

    train(chain / "reward.toml", "training.max_steps=24", "training.eval_steps=24", "training.save_steps=24")
    reward_model = chain / "out" / "reward" / "model"
    assert load_job(chain / "reward.toml").model.name_or_path == str(sft)
    (evaluation,) = [r for r in history(chain / "out" / "reward") if "eval_accuracy" in r]
    assert evaluation["step"] == 24 and evaluation["eval_accuracy"] >= 0.8  # 64 held-out pairs; chance is 0.5
    assert AutoModelForSequenceClassification.from_pretrained(reward_model).config.num_labels == 1

    train(chain / "grpo.toml", "training.max_steps=10", "training.save_steps=10")
    grpo = load_job(chain / "grpo.toml")
    assert grpo.model.name_or_path == str(sft) and grpo.reference is not None and grpo.reference.path == str(sft)
    assert grpo.rewards is not None and grpo.rewards.models == (str(reward_model),)
    steps = [r for r in history(chain / "out" / "grpo") if "reward" in r]
    assert [r["step"] for r in steps] == list(range(1, 11)) and steps[0]["kl"] == 0.0  # the reference is the start
    first, last = (sum(r["reward"] for r in part) / 3 for part in (steps[:3], steps[-3:]))
    assert last > first + 0.5, [round(r["reward"], 3) for r in steps]
