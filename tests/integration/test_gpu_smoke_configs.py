"""The GPU smoke script's cases (benchmarks/gpu_smoke.py) are configs both dsbuild and DeepSpeed's own parser read:
on a GPU machine the script fails only for what the GPU run finds, never for a key written wrong here."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from dsbuild import Config

pytestmark = pytest.mark.train

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_smoke.py"


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SMOKE = _script()


@pytest.mark.parametrize("case", sorted(SMOKE.CASES))
def test_each_case_reads_and_deepspeed_accepts_it(case: str) -> None:
    """Strict reading, no validation error, and DeepSpeed's parser accepts the case at its GPU count."""
    from dsbuild.validate.deepspeed_verdict import deepspeed_verdict

    world = SMOKE.GPUS.get(case, 1)
    data = SMOKE.ds_config(case, world, False)
    config = Config.from_dict(data)  # strict: a misspelt key raises
    assert [d for d in config.validate(world_size=world) if d.severity == "error"] == []
    assert deepspeed_verdict(data, world) == []
