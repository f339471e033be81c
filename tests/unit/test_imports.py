"""`import dsbuild` and building, converting and reading configs import none of the heavy packages."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.procs

HEAVY = ("torch", "deepspeed", "transformers", "peft")

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import dsbuild
    from dsbuild import AUTO, Config
    import dsbuild.config, dsbuild.io.convert, dsbuild.errors

    cfg = (Config.zero(3).offload_cpu().bf16().adamw(lr=AUTO).warmup_decay_lr(warmup_steps=AUTO, total_steps=AUTO)
           .batch(micro=2, grad_accum=AUTO).clip_grad(1.0).comm_dtype("fp32").zero_options(overlap_comm=True)
           .set(steps_per_print=10))
    d = cfg.to_dict()
    assert Config.from_dict(json.loads(json.dumps(d))) == cfg
    Config.from_dict({"_comment": "x", "bfloat16": {"enabled": True}}, strict=False)
    try:
        Config.from_dict({"zero_optimization": {"stage": 9}})
    except dsbuild.ConfigError:
        pass
    heavy = sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY))
    print(json.dumps(heavy))
    """
)


def test_building_and_converting_imports_no_heavy_package() -> None:
    """A fresh interpreter that imports dsbuild and builds, writes and reads configs has not loaded torch & co."""
    result = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{SCRIPT}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
