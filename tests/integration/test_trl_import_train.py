"""An SFT job imported from a TRL config trains as TRL's SFTTrainer does on that config: the same tiny Llama (saved
with ByT5's byte tokenizer), the same text records, 1 process on CPU, fp32. TRL's side is what ``trl sft --config``
builds (the config parsed by TRL's own parser, ``SFTTrainer(model=model_name_or_path, ...)``); dsbuild's is
``dsbuild import trl`` then ``dsbuild train`` on the job it wrote, in a process of its own (DeepSpeed at ZeRO-0: TRL
started without an Accelerate config runs without DeepSpeed). Every step trains on all 8 records at once, so the
samplers' orders do not matter; the losses of the 3 steps agree to 1e-5 relative."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsbuild.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.procs]  # dsbuild train runs in a process of its own

HERE = Path(__file__).resolve().parent
TEXTS = [f"record {i}: " + "the quick brown fox jumps over the lazy dog " * (1 + i % 3) for i in range(8)]
CONFIG = {
    "dataset_text_field": "text",
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "learning_rate": "1e-3",
    "max_steps": 3,
    "logging_steps": 1,
    "max_length": 64,
    "bf16": False,
    "save_strategy": "no",
    "seed": 0,
}


def _inputs(tmp: Path) -> dict[str, Any]:
    import torch
    from transformers import ByT5Tokenizer, LlamaForCausalLM

    sys.path.insert(0, str(HERE))
    from _session_common import tiny_llama

    torch.manual_seed(0)
    model = tmp / "model"
    LlamaForCausalLM(tiny_llama(attention_dropout=0.0)).save_pretrained(model)
    ByT5Tokenizer().save_pretrained(model)
    (tmp / "data.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return {"model_name_or_path": str(model), "dataset_name": "data.jsonl", "output_dir": str(tmp / "out"), **CONFIG}


def _trl_losses(config: dict[str, Any], tmp: Path) -> list[float]:
    """What ``trl sft --config`` runs: TRL's parser, then SFTTrainer on the model's name and the records."""
    from datasets import load_dataset
    from trl import SFTTrainer
    from trl.scripts.sft import make_parser

    parser = make_parser()
    parser.set_defaults_with_config(**{**config, "output_dir": str(tmp / "trl")}, use_cpu=True, report_to="none")
    _, args, model_args, _ = parser.parse_args_into_dataclasses(args=[])
    args.model_init_kwargs = {"dtype": model_args.dtype, "attn_implementation": model_args.attn_implementation}
    data = load_dataset("json", data_files=str(tmp / "data.jsonl"))["train"]
    trainer = SFTTrainer(model=model_args.model_name_or_path, args=args, train_dataset=data)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _dsbuild_losses(config: dict[str, Any], tmp: Path) -> list[float]:
    (tmp / "sft.yaml").write_text(yaml.safe_dump(config))
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        assert main(["import", "trl", "sft.yaml", "-o", "job.toml"]) == 0
    finally:
        os.chdir(cwd)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-m", "dsbuild", "train", str(tmp / "job.toml")], capture_output=True,
                          text=True, env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in (tmp / "out" / "history.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


def test_an_imported_sft_job_trains_as_trls_sft_trainer(tmp_path: Path) -> None:
    """The losses of 3 steps of the imported job are TRL's SFTTrainer's on the same config."""
    config = _inputs(tmp_path)
    ours = _dsbuild_losses(config, tmp_path)
    theirs = _trl_losses(config, tmp_path)
    assert len(ours) == len(theirs) == 3, (ours, theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert abs(a - b) <= 1e-5 * abs(b), (ours, theirs)
    assert theirs[0] > theirs[-1]  # it trained
