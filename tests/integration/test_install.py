"""`pip install dsbuild` is the config SDK alone: it installs into a fresh virtual environment without torch and
builds, checks, plans and exports configs there; training says which extra it needs.

The environment is made with the oldest Python dsbuild supports (3.10) when one is on the machine, so the
SDK's own code is run on it too, else with this interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.procs,
]  # builds a wheel and installs into a new environment from the package index


def _oldest_python() -> str:
    """The oldest Python dsbuild supports (3.10) where this machine has one on PATH, else this interpreter; set
    DSBUILD_TEST_PYTHON to name another."""
    for candidate in (os.environ.get("DSBUILD_TEST_PYTHON", ""), "python3.10"):
        found = shutil.which(candidate) if candidate else None
        if found:
            probe = subprocess.run([found, "-c", "import venv, ensurepip"], capture_output=True, timeout=60)
            if probe.returncode == 0:
                return found
    return sys.executable


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, **kwargs)  # type: ignore[call-overload, no-any-return]


@pytest.fixture(scope="module")
def sdk_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment holding dsbuild's wheel and its config-only dependencies."""
    root = tmp_path_factory.mktemp("sdk")
    wheel_dir = root / "wheel"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheel_dir), str(REPO)])
    if built.returncode != 0 and "No matching distribution" in built.stderr:
        pytest.skip("building the wheel needs hatchling from the package index")
    assert built.returncode == 0, built.stderr
    (wheel,) = wheel_dir.glob("dsbuild-*.whl")
    env = root / "venv"
    made = _run([_oldest_python(), "-m", "venv", str(env)])
    assert made.returncode == 0, made.stderr
    installed = _run([str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)])
    if installed.returncode != 0 and "No matching distribution" in installed.stderr:
        pytest.skip("installing dsbuild's dependencies needs the package index")
    assert installed.returncode == 0, installed.stderr
    return env


def test_the_sdk_installs_without_torch(sdk_env: Path) -> None:
    """The wheel's required dependencies are attrs, tomli-w, xxhash (and tomli, typing-extensions): no torch & co."""
    listed = _run([str(sdk_env / "bin" / "python"), "-m", "pip", "list", "--format", "json"])
    names = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert {"attrs", "tomli-w", "xxhash", "dsbuild"} <= names
    assert not names & {"torch", "deepspeed", "transformers", "peft", "datasets", "matplotlib"}


def test_the_cli_works_there(sdk_env: Path, tmp_path: Path) -> None:
    """presets, show, validate, explain, plan and export run in the torch-free environment."""
    dsbuild = str(sdk_env / "bin" / "dsbuild")
    assert "zero3_offload" in _run([dsbuild, "presets"]).stdout
    (tmp_path / "ds.json").write_text(
        json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}})
    )
    checked = _run([dsbuild, "validate", str(tmp_path / "ds.json")])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # A preset alone has no batch size: DeepSpeed refuses it, the HF Trainer fills "auto" ones.
    checked = _run([dsbuild, "validate", "--target", "hf", "hf_zero3"])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    bad = _run([dsbuild, "validate", str(tmp_path / "nope.json")])
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    planned = _run([dsbuild, "plan", "--params", "7B", "--gpus-per-node", "8", "--gpu-memory", "80GiB"])
    assert planned.returncode == 0 and "ZeRO-" in planned.stdout, planned.stderr
    explained = _run([dsbuild, "explain", "hf_zero3", "--set", "training.learning_rate=2e-5", "--hidden-size", "64",
                      "--total-steps", "10"])  # fmt: skip
    assert explained.returncode == 0 and "optimizer.params.lr" in explained.stdout, explained.stderr
    exported = _run([dsbuild, "export", "zero2", "-o", str(tmp_path / "out.toml")])
    assert exported.returncode == 0 and (tmp_path / "out.toml").is_file(), exported.stderr


def test_the_builder_works_there(sdk_env: Path) -> None:
    """The README's builder example runs, round-trips, and imports nothing heavy."""
    script = textwrap.dedent(
        """
        import json, sys
        from dsbuild import AUTO, Config
        cfg = (Config.zero(3).offload_cpu().bf16().adamw(lr=2e-5, weight_decay=0.01)
               .warmup_decay_lr(warmup_steps=AUTO, total_steps=AUTO).batch(micro=2, grad_accum=8).clip_grad(1.0))
        assert Config.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
        cfg.check(target="hf")
        print(sys.version_info[:2])
        """
    )
    done = _run([str(sdk_env / "bin" / "python"), "-c", script])
    assert done.returncode == 0, done.stderr


def test_training_names_the_extra(sdk_env: Path) -> None:
    """Without the [train] extra, `dsbuild train` and `dsbuild.Session` say which pip install fixes it."""
    trained = _run([str(sdk_env / "bin" / "dsbuild"), "train"])
    assert trained.returncode == 2
    assert "pip install 'dsbuild[train]'" in trained.stderr and "Traceback" not in trained.stderr
    session = _run([str(sdk_env / "bin" / "python"), "-c", "import dsbuild; dsbuild.Session"])
    assert "pip install 'dsbuild[train]'" in session.stderr


def test_the_test_suite_collects_without_torch(sdk_env: Path) -> None:
    """Without the [train] extra, every test module still imports: the training tests skip, saying why."""
    python = str(sdk_env / "bin" / "python")
    added = _run([python, "-m", "pip", "install", "--quiet", "pytest", "hypothesis", "pyyaml", "jsonschema"])
    if added.returncode != 0:
        pytest.skip("installing pytest needs the package index")
    collected = _run([python, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"], cwd=REPO)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
