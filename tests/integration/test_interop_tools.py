"""The exports run in the tools they are for: ``accelerate launch`` takes ``--for accelerate``'s YAML and
ds_config and trains a plain Accelerate loop (``DummyOptim`` / ``DummyScheduler``) and the HF Trainer on
them; the HF Trainer trains on ``--for hf``'s ds_config. One process, DeepSpeed on its CPU accelerator, a
tiny Llama built from its config (no download). Lightning is not installed here, and its DeepSpeed strategy
refuses a CPU: ``test_examples.py`` checks the dict it is handed.

The job's training arguments differ from the HF defaults where ``--for accelerate`` resolves them
(``adam_beta2``, ``max_grad_norm``), so the engine's config shows where each value came from.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsbuild.cli import main

pytestmark = pytest.mark.train  # the training extra; tests/conftest.py skips it without


WORKER = Path(__file__).parent / "_interop_worker.py"

TRAINING: dict[str, Any] = {
    "per_device_train_batch_size": 4,
    "learning_rate": 1e-3,
    "adam_beta2": 0.95,
    "max_grad_norm": 0.5,
    "max_steps": 3,
    "warmup_steps": 1,
}
"""The job's [training], and the arguments the scripts give the Trainer / DummyOptim / DummyScheduler."""


@pytest.fixture
def job(tiny_job: Callable[..., Path]) -> Path:
    """The suite's tiny job with these tests' training arguments and short samples."""
    return tiny_job(training=TRAINING, data={"max_length": 64})


def export(*argv: str) -> None:
    assert main(["export", *argv]) == 0


@pytest.fixture
def accelerate_files(job: Path) -> tuple[Path, Path]:
    """``dsbuild export job.toml --for accelerate -o accel.yaml``: the YAML and the ds_config named after it."""
    yaml_path = job.parent / "accel.yaml"
    export(str(job), "--for", "accelerate", "-o", str(yaml_path))
    return yaml_path, job.parent / "accel.ds_config.json"


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without a launcher's, Slurm's or Accelerate's variables, DeepSpeed on the CPU."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("SLURM_", "ACCELERATE_"))}
    return {**env, "DS_ACCELERATOR": "cpu", **extra}


def run_worker(command: list[str], out: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run a worker command (a subprocess, under a time limit) and read the result it wrote."""
    out.mkdir()
    done = subprocess.run(command, capture_output=True, text=True, cwd=out.parent, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result


def accelerate_launch(yaml_path: Path, mode: str, out: Path) -> dict[str, Any]:
    """``accelerate launch --config_file YAML _interop_worker.py MODE ...`` on a port of its own."""
    from dsbuild.session.distributed import free_port

    port = str(free_port())
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(yaml_path),
               "--main_process_port", port, str(WORKER), mode, str(out), json.dumps(TRAINING)]  # fmt: skip
    return run_worker(command, out, clean_env(MASTER_PORT=port))


def assert_trained(result: dict[str, Any]) -> None:
    assert result["engine"] == "DeepSpeedEngine"
    assert len(result["losses"]) == TRAINING["max_steps"] and all(math.isfinite(x) for x in result["losses"])
    assert result["changed"] is True


def test_accelerate_launch_accepts_the_exported_config(
    accelerate_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `accelerate launch` checks before it trains, in-process: its config validation, then DeepSpeedPlugin
    refusing settings beside a deepspeed_config_file. The same YAML with `mixed_precision` is refused."""
    launch = pytest.importorskip("accelerate.commands.launch")
    from accelerate.utils import DeepSpeedPlugin

    yaml_path, ds_path = accelerate_files

    def plugin(config_file: Path) -> Any:
        args = launch.launch_command_parser().parse_args(["--config_file", str(config_file), str(WORKER)])
        args, defaults, mixed_precision_from_config = launch._validate_launch_command(args)
        # What launch_command hands the processes (accelerate 1.x): the config's DeepSpeed settings by name.
        fields = [*defaults.deepspeed_config, *(["mixed_precision"] if mixed_precision_from_config else [])]
        monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", ",".join(fields).lower())
        assert defaults.deepspeed_config["deepspeed_config_file"] == str(ds_path)
        return DeepSpeedPlugin(hf_ds_config=str(ds_path))

    for key in [k for k in os.environ if k.startswith("ACCELERATE_")]:
        monkeypatch.delenv(key)
    config = plugin(yaml_path).deepspeed_config
    assert config["optimizer"]["params"]["betas"] == [0.9, 0.95] and config["gradient_clipping"] == 0.5
    with_precision = yaml_path.with_name("with_precision.yaml")
    with_precision.write_text(yaml_path.read_text() + "mixed_precision: bf16\n")
    with pytest.raises(ValueError, match="When using `deepspeed_config_file`"):
        plugin(with_precision)


def test_sequence_parallelism_reaches_accelerates_launcher(job: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job with sequence_parallel_size 2 exports an Accelerate config whose parallelism_config Accelerate's launcher
    reads as Ulysses over DeepSpeed (sp_size 2, sp_backend deepspeed) and hands its processes; without it, none."""
    launch = pytest.importorskip("accelerate.commands.launch")
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    for key in [k for k in os.environ if k.startswith(("ACCELERATE_", "PARALLELISM_CONFIG_"))]:
        monkeypatch.delenv(key)
    yaml_path = job.parent / "sp.yaml"
    export(str(job), "--for", "accelerate", "-o", str(yaml_path), "--set", "strategy.overrides.sequence_parallel_size=2",
           "--set", "launch.nproc_per_node=2")  # fmt: skip
    args = launch.launch_command_parser().parse_args(["--config_file", str(yaml_path), str(WORKER)])
    args, defaults, _ = launch._validate_launch_command(args)
    assert args.use_parallelism_config and args.parallelism_config_sp_size == 2
    args.deepspeed_fields_from_accelerate_config = list(defaults.deepspeed_config)  # as launch_command sets it
    _, env = prepare_deepspeed_cmd_env(args)
    assert env["PARALLELISM_CONFIG_SP_SIZE"] == "2" and env["PARALLELISM_CONFIG_SP_BACKEND"] == "deepspeed"
    assert env["PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION"] == "sdpa"
    assert json.loads(yaml_path.with_name("sp.ds_config.json").read_text())["sequence_parallel_size"] == 2
    plain = job.parent / "plain.yaml"
    export(str(job), "--for", "accelerate", "-o", str(plain))
    assert "parallelism_config" not in plain.read_text()


@pytest.mark.procs
@pytest.mark.slow
def test_a_plain_accelerate_loop_trains_on_the_export(accelerate_files: tuple[Path, Path]) -> None:
    """`accelerate launch` with the exported YAML, a DummyOptim / DummyScheduler loop: 3 steps, finite losses, weights
    changed; the script's values and the job's resolved ones reach the engine."""
    yaml_path, _ = accelerate_files
    result = accelerate_launch(yaml_path, "loop", yaml_path.parent / "loop")
    assert_trained(result)
    config = result["config"]
    assert config["optimizer"]["params"] == {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0}
    assert config["gradient_clipping"] == 0.5 and config["train_micro_batch_size_per_gpu"] == 4
    assert config["scheduler"]["params"]["total_num_steps"] == 3


@pytest.mark.procs
@pytest.mark.slow
def test_the_hf_trainer_trains_under_accelerate_launch_on_the_export(accelerate_files: tuple[Path, Path]) -> None:
    """The HF Trainer under `accelerate launch` with the exported YAML (no deepspeed= argument): it fills the "auto"
    left and accepts the values resolved from the job, which its arguments match."""
    yaml_path, _ = accelerate_files
    result = accelerate_launch(yaml_path, "trainer", yaml_path.parent / "trainer")
    assert_trained(result)
    assert result["steps"] == 3 and '"auto"' not in json.dumps(result["config"])
    assert result["config"]["optimizer"]["params"]["betas"] == [0.9, 0.95]


@pytest.mark.procs
@pytest.mark.slow
def test_the_hf_trainer_trains_on_the_hf_export(job: Path) -> None:
    """`dsbuild export job.toml --for hf`, then TrainingArguments(deepspeed=that file) in a plain `python` process."""
    from dsbuild.session.distributed import free_port

    ds_path = job.parent / "hf.json"
    export(str(job), "--for", "hf", "-o", str(ds_path))
    out = job.parent / "hf"
    command = [sys.executable, str(WORKER), "trainer", str(out), json.dumps(TRAINING), "--deepspeed", str(ds_path)]
    world = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "LOCAL_RANK": "0",
             "WORLD_SIZE": "1"}  # fmt: skip
    result = run_worker(command, out, clean_env(**world))
    assert_trained(result)
    assert json.loads(ds_path.read_text())["optimizer"]["params"]["betas"] == "auto"
    assert (
        result["config"]["optimizer"]["params"]["betas"] == [0.9, 0.95] and result["config"]["gradient_clipping"] == 0.5
    )
