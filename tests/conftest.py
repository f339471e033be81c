"""What every test directory shares: markers from what a test needs, and a small job to train or check.

Markers: ``slow`` (multi-process or long runs; CI runs them) and ``train`` (the test needs the training extra:
torch, DeepSpeed, transformers). A config-only install (``pip install dsbuild``, no torch) runs the rest and skips
the ``train`` tests by marker, with the reason, instead of failing them on an import.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from dsbuild.job import demo_job_path

TRAINING_STACK = ("torch", "deepspeed", "transformers")
MISSING = [name for name in TRAINING_STACK if importlib.util.find_spec(name) is None]

TINY_MODEL = """\
[model]
tokenizer = "byte"
[model.config]
model_type = "llama"
hidden_size = 64
intermediate_size = 128
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 4
vocab_size = 384
"""
"""A 2-layer Llama built from its config, with the byte tokenizer: no download, a few seconds a step on a CPU."""

TINY_TRAINING: dict[str, Any] = {"per_device_train_batch_size": 4, "learning_rate": 1e-3, "max_steps": 10}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the ``train`` tests, by marker, where the training extra is not installed."""
    if not MISSING:
        return
    skip = pytest.mark.skip(reason=f"needs the training extra (pip install 'dsbuild[train]'): no {', '.join(MISSING)}")
    for item in items:
        if item.get_closest_marker("train") is not None:
            item.add_marker(skip)


@pytest.fixture
def tiny_job(tmp_path: Path) -> Callable[..., Path]:
    """A writer of a small valid job in ``tmp_path``: the tiny Llama, the demo's arithmetic data copied to
    ``train.jsonl`` (alpaca), preset ``zero2``; ``training`` entries replace or add to ``TINY_TRAINING``, ``data``
    entries to ``[data]``, and ``extra`` is TOML text appended (more tables). Returns the job file's path."""

    def write(
        *,
        training: Mapping[str, Any] | None = None,
        data: Mapping[str, Any] | None = None,
        extra: str = "",
        name: str = "job.toml",
    ) -> Path:
        shutil.copy(demo_job_path().parent / "arith_train.jsonl", tmp_path / "train.jsonl")
        tables = {
            "data": {"path": "train.jsonl", "format": "alpaca", "max_length": 256, **(data or {})},
            "training": {**TINY_TRAINING, **(training or {})},
            "strategy": {"config": "zero2"},
        }
        text = TINY_MODEL + "".join(
            f"\n[{table}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in entries.items())
            for table, entries in tables.items()
        )
        path = tmp_path / name
        path.write_text(text + extra, encoding="utf-8")
        return path

    return write


# -- Hypothesis profiles --------------------------------------------------------------------------------------------
# "ci" (the default: a fixed seed, so every run draws the same examples; 100 examples, each test may ask for more or
# fewer), "deep" (thousands of examples from a fresh seed: run before a release, docs/jobs.md) and "dev" (quick, for
# editing). A failure prints the falsifying example and the blob that replays it (``@reproduce_failure``); the example
# becomes an ``@example`` of the test. Choose one with ``HYPOTHESIS_PROFILE=deep pytest``.

settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "deep",
    max_examples=3000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=20, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
