"""What docs/session.md says of another world size holds: DeepSpeed's universal checkpoint converts a 2-process
ZeRO-3 checkpoint of `dsbuild train` on the CPU accelerator and loads it into 1 process with the weights the run
exported, and `dsbuild train --resume` at another world size is refused with that way out named."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # a 2-process run, a conversion and a load, each in a new process

LOAD = textwrap.dedent(
    """
    import json, sys
    import torch
    from dsbuild.session import distributed
    distributed.init()
    import deepspeed, transformers
    from safetensors.torch import load_file
    run, universal = sys.argv[1], sys.argv[2]
    cfg = json.load(open(run + "/ds_config.json"))
    cfg["train_batch_size"] = cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"]
    cfg.pop("csv_monitor", None)
    cfg["checkpoint"] = {"load_universal": True}
    config = transformers.AutoConfig.from_pretrained(run + "/model")
    torch.manual_seed(123)  # weights unlike the run's until the checkpoint is loaded
    from dsbuild.session import ready_for_zero_init
    ready_for_zero_init(config)  # docs/session.md: transformers >= 5.24 imports torch._dynamo lazily, inside zero.Init
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = transformers.AutoModelForCausalLM.from_config(config)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    engine.load_checkpoint(universal, load_optimizer_states=True, load_lr_scheduler_states=True)
    saved = load_file(run + "/model/model.safetensors")
    worst, compared = 0.0, 0
    for name, p in engine.module.named_parameters():
        with deepspeed.zero.GatheredParameters([p]):
            if name in saved:
                worst = max(worst, (p.detach().float() - saved[name].float()).abs().max().item())
                compared += 1
    print(json.dumps({"step": engine.global_steps, "compared": compared, "worst": worst}))
    """
)


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def test_a_two_process_checkpoint_converts_and_loads_into_one(tmp_path: Path) -> None:
    """ds_to_universal on a real 2-process ZeRO-3 checkpoint; 1 process loads it with the exported weights."""
    run = tmp_path / "run"
    trained = _run(
        [sys.executable, "-m", "dsbuild", "train", "--nproc-per-node", "2", f"--set=training.output_dir='{run}'",
         "--set=training.max_steps=4"], tmp_path,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    refused = _run(
        [sys.executable, "-m", "dsbuild", "train", "--resume", f"--set=training.output_dir='{run}'",
         "--set=training.max_steps=8"], tmp_path,
    )  # fmt: skip
    assert refused.returncode != 0 and "ds_to_universal" in refused.stderr, refused.stderr[-3000:]
    universal = tmp_path / "universal"
    converted = _run(
        [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
         str(run / "checkpoints" / "global_step4"), "--output_folder", str(universal / "global_step4"),
         "--num_extract_workers", "1", "--num_merge_workers", "1"], tmp_path,
    )  # fmt: skip
    assert converted.returncode == 0, converted.stderr[-3000:]
    (universal / "latest_universal").write_text("global_step4")
    loaded = _run([sys.executable, "-c", LOAD, str(run), str(universal)], tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    result = loaded.stdout.strip().splitlines()[-1]
    assert result.startswith("{") and '"step": 4' in result and '"worst": 0.0' in result, result
    assert '"compared": 0' not in result
