"""The same job on a Ray cluster: ``dsbuild train --backend ray`` runs the demo job's ranks as Ray Train workers on
a local cluster (2 gloo workers, no dashboard), with the losses of the same job under torchrun; Ray keeps a merged
checkpoint that ``dsbuild checkpoints`` verifies, resumes from it, and restarts a killed worker's group from it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsbuild.cli import main
from dsbuild.outputs.history import read as read_history

pytestmark = pytest.mark.procs

FEW_STEPS = [
    "--set=training.max_steps=6",
    "--set=training.save_steps=2",
    "--set=training.logging_steps=1",
    "--set=training.bf16=false",
    "--set=model.lora.r=8",
    '--set=model.lora.target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]',
]
"""The demo job with LoRA adapters (a set of target modules: its order follows each process's hash seed), 6 steps
with a checkpoint every 2 (evaluation every 40 steps, so none), in fp32: a resume in bf16 differs from the
uninterrupted run by bf16's rounding (4e-5 of the loss two steps later), not by 1e-6."""


def test_without_ray_installed_the_backend_names_the_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--backend ray without Ray installed: exit 2 naming pip install 'dsbuild[ray]', before the job is read."""
    pytest.importorskip("deepspeed")
    monkeypatch.setitem(sys.modules, "ray", None)  # find_spec: not installed
    code = main(["train", "--backend", "ray", "no-such-job.toml"])
    err = capsys.readouterr().err
    assert code == 2
    assert "dsbuild train --backend ray needs the 'ray' package: pip install 'dsbuild[ray]'" in err


def test_ray_address_needs_the_ray_backend(capsys: pytest.CaptureFixture[str]) -> None:
    """--ray-address with the torchrun backend is a usage error, not silently ignored."""
    pytest.importorskip("deepspeed")
    code = main(["train", "--ray-address", "ray://head:10001"])
    assert code == 2
    assert "--ray-address: only with --backend ray" in capsys.readouterr().err


@pytest.mark.train
def test_the_config_sdk_and_the_torchrun_path_never_import_ray() -> None:
    """Reading a job, the CLI's parsers and the torchrun launcher import no ray module (only ray_train does)."""
    code = (
        "import sys; import dsbuild, dsbuild.cli, dsbuild.run.launch, dsbuild.run.worker, dsbuild.cli.rank; "
        "from dsbuild.job import load_job, demo_job_path; load_job(demo_job_path()); "
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_ray_backend_refuses_node_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """Ray places the workers: --node-rank and --master-addr with --backend ray are a usage error naming them."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("ray")
    code = main(["train", "--backend", "ray", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1"])
    assert code == 2
    assert "--node-rank, --master-addr: not with the Ray backend" in capsys.readouterr().err


def test_the_ray_backend_refuses_node_local_checkpoints(capsys: pytest.CaptureFixture[str]) -> None:
    """save_on_each_node with --backend ray: refused before anything starts, naming the key (not supported yet)."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("ray")
    assert main(["train", "--backend", "ray", "--set", "training.save_on_each_node=true"]) == 2
    assert "training.save_on_each_node: not with the Ray backend yet" in capsys.readouterr().err


# -- real runs on a local Ray cluster -------------------------------------------------------------


def _env() -> dict[str, str]:
    """This environment, outside a launcher's or a Ray cluster's, without Ray's memory monitor: on a cgroup v1
    machine it counts the page cache (``usage_in_bytes`` less only the inactive files) as used, so after the rest of
    the suite has written its checkpoints it killed these tests' workers at its 95% "out of memory" with GBs free."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "RAY_memory_monitor_refresh_ms": "0"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RAY_ADDRESS"):
        env.pop(key, None)
    return env


def _train(
    out: Path, *args: str, wait: bool = True, cwd: Path | None = None, seed: str = "1"
) -> subprocess.Popen[str] | subprocess.CompletedProcess[str]:
    """``dsbuild train`` of the demo job on 2 processes, writing to ``out`` (relative to ``cwd`` when given), its
    processes (and Ray's workers, started from it) with the hash seed ``seed``."""
    command = [sys.executable, "-m", "dsbuild", "train", "--nproc-per-node", "2", *FEW_STEPS, *args]
    command.append(f"--set=training.output_dir={json.dumps(str(out))}")
    env = {**_env(), "PYTHONHASHSEED": seed}
    if wait:
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, cwd=cwd)
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)


def _ray_processes() -> set[int]:
    """The processes of a local Ray cluster on this machine: Ray's workers (``ray::...``) and every process whose
    command line names a Ray session folder (the GCS, the raylet, the dashboard and runtime-env agents)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if command.startswith(b"ray::") or b"/ray/session_" in command:
                found.add(int(entry.name))
    return found


def _assert_nothing_left(before: set[int]) -> None:
    """No process of the local Ray cluster a run started outlives it (within a few seconds of its end)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _ray_processes() - before:
        time.sleep(0.2)
    left = _ray_processes() - before
    assert not left, [Path(f"/proc/{pid}/cmdline").read_bytes()[:120] for pid in left if Path(f"/proc/{pid}").exists()]


def _losses(out: Path) -> dict[int, float]:
    if not (out / "history.jsonl").is_file():
        return {}
    return {int(h["step"]): float(h["loss"]) for h in read_history(out / "history.jsonl") if h.get("loss") is not None}


def _ray_workers() -> list[int]:
    """The pids of Ray Train's worker processes on this machine (their title is ``ray::RayTrainWorker...``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                title = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if title.startswith(b"ray::RayTrainWorker"):
                found.append(int(entry.name))
    return sorted(found)


def _kill_a_worker_after_step(out: Path, step: int, child: subprocess.Popen[str]) -> int:
    """SIGKILL one Ray Train worker once ``step`` is in the run's history (a checkpoint before it is in Ray's
    storage: Ray's report is a barrier); its pid."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and child.poll() is None:
        history = out / "history.jsonl"
        if history.is_file() and max(_losses(out), default=0) >= step:
            workers = _ray_workers()
            assert len(workers) == 2, workers
            os.kill(workers[-1], signal.SIGKILL)
            return workers[-1]
        time.sleep(0.2)
    raise AssertionError(f"step {step} never came: {child.communicate()[0][-3000:]}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """The losses of the same 6 steps under torchrun, 2 processes: the uninterrupted run."""
    pytest.importorskip("deepspeed")
    out = tmp_path_factory.mktemp("torchrun") / "out"
    done = _train(out)
    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = _losses(out)
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    return losses


def _equal(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == sorted(want)
    for step, loss in want.items():
        assert abs(got[step] - loss) <= 1e-6 * abs(loss), (step, got[step], loss)


@pytest.mark.slow
def test_a_ctrl_c_stopped_ray_run_verifies_and_resumes_exactly(tmp_path: Path, reference: dict[int, float]) -> None:
    """Ctrl-C (SIGINT to `dsbuild train`) of a LoRA run under Ray once step 3 is logged: the workers save at the next
    step and stop (exit 75, the step after the signal at most), leaving merged checkpoints in Ray's storage that
    dsbuild checkpoints verifies, and no process of the local cluster behind. --resume, in processes with another
    hash seed, continues from the newest verified checkpoint and gives the uninterrupted run's losses. The output
    folder is given relative to the command's folder, as the demo's default is: the workers (which Ray moves into
    folders of their own) write there."""
    pytest.importorskip("ray")
    out = tmp_path / "out"
    before = _ray_processes()
    first = _train(Path("out"), "--backend", "ray", cwd=tmp_path, wait=False)
    assert isinstance(first, subprocess.Popen)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and first.poll() is None and max(_losses(out), default=0) < 3:
        time.sleep(0.1)
    signalled_at = max(_losses(out))
    first.send_signal(signal.SIGINT)
    said, _ = first.communicate(timeout=600)
    assert first.returncode == 75, said[-3000:]
    stopped = max(_losses(out))
    assert stopped <= signalled_at + 1 < 6, (signalled_at, stopped)  # no training on after the signal
    assert f"checkpoint {out / 'checkpoints' / f'global_step{stopped}'} is this stop's" in said, said[-3000:]
    assert not (out / "model").exists()  # a stopped run exports nothing
    _assert_nothing_left(before)
    storage = out / "ray"
    listed = subprocess.run(
        [sys.executable, "-m", "dsbuild", "checkpoints", str(storage)], capture_output=True, text=True, timeout=300
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr  # every checkpoint Ray merged verifies
    assert "global_step2" in listed.stdout

    again = _train(Path("out"), "--backend", "ray", "--resume", cwd=tmp_path, seed="2")
    assert isinstance(again, subprocess.CompletedProcess)
    assert again.returncode == 0, again.stderr[-3000:]
    said = again.stdout + again.stderr
    assert re.search(rf"resumed from \S+/checkpoints/global_step{stopped} at step {stopped}\n", said), said[-3000:]
    _equal(_losses(out), reference)
    _assert_nothing_left(before)


@pytest.mark.slow
def test_a_lost_worker_without_restarts_fails_the_run_and_says_where_to_resume(tmp_path: Path) -> None:
    """launch.max_failures = 0 (the default) and a worker SIGKILLed after step 3: exit 1 with Ray's reason, and
    where the checkpoints are for --resume; nothing hangs, and nothing of the local cluster is left running."""
    pytest.importorskip("ray")
    out = tmp_path / "out"
    before = _ray_processes()
    child = _train(out, "--backend", "ray", wait=False)
    assert isinstance(child, subprocess.Popen)
    _kill_a_worker_after_step(out, 3, child)
    said, _ = child.communicate(timeout=600)
    assert child.returncode == 1, said[-3000:]
    _assert_nothing_left(before)  # a failed run leaves no process of its local cluster either
    assert "dsbuild: error: training failed under Ray" in said
    assert re.search(r"^  (rank \d|Ray): \w+", said, re.MULTILINE), said[-3000:]  # what Ray gave up on
    assert "dsbuild train --resume continues from the latest" in said


@pytest.mark.slow
def test_a_killed_worker_is_restarted_from_the_last_checkpoint(tmp_path: Path, reference: dict[int, float]) -> None:
    """launch.max_failures = 1 and a worker SIGKILLed after step 3: Ray restarts the group, which resumes from the
    last checkpoint (Ray's latest, or the run's own when Ray had not registered it yet) and finishes; every step's
    loss equals the uninterrupted torchrun run's."""
    pytest.importorskip("ray")
    out = tmp_path / "out"
    child = _train(out, "--backend", "ray", "--set=launch.max_failures=1", wait=False)
    assert isinstance(child, subprocess.Popen)
    _kill_a_worker_after_step(out, 3, child)
    said, _ = child.communicate(timeout=900)
    assert child.returncode == 0, said[-3000:]
    assert re.search(r"dsbuild: resumed from \S+/checkpoints/global_step[24] at step [24]\n", said), said[-3000:]
    _equal(_losses(out), reference)
    assert (out / "model" / "adapter_config.json").is_file() and (out / "model" / "base" / "config.json").is_file()


@pytest.mark.slow
def test_a_fresh_run_does_not_take_an_earlier_ray_run_in_its_storage(tmp_path: Path) -> None:
    """A storage path that holds an earlier Ray run's checkpoints: a run without --resume is refused (Ray would
    resume from them) and nothing there is changed."""
    pytest.importorskip("ray")
    storage = tmp_path / "storage" / "checkpoints"
    storage.mkdir(parents=True)
    (storage / "checkpoint_manager_snapshot.json").write_text("{}")
    done = _train(
        tmp_path / "out", "--backend", "ray", f"--set=launch.storage_path={json.dumps(str(tmp_path / 'storage'))}"
    )
    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "holds an earlier Ray run's checkpoints" in done.stderr and "Traceback" not in done.stderr
    assert (storage / "checkpoint_manager_snapshot.json").read_text() == "{}"
    assert not (tmp_path / "out").exists()  # refused before the output folder is made
