"""``dsbuild train`` for real: the demo job on one process (and resumed) (the LoRA job: test_lora_jobs),
two nodes on one machine (by flags, and as a Slurm job), and a failing rank. DeepSpeed on CPU, tiny models built
from their configs."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dsbuild.outputs import manifest
from dsbuild.outputs.history import read as read_history
from dsbuild.session.distributed import free_port

pytestmark = [pytest.mark.train, pytest.mark.procs]  # the training extra; tests/conftest.py skips it without

ROOT = Path(__file__).resolve().parents[2]
LORA_JOB = ROOT / "examples" / "job_lora_zero3.toml"


def fresh_env(**values: str) -> dict[str, str]:
    """This environment on DeepSpeed's CPU accelerator, outside any launcher's or Slurm job's, plus ``values``."""
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launcher and not k.startswith("SLURM_")}
    return {**env, "DS_ACCELERATOR": "cpu", **values}


def dsbuild(*argv: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """``dsbuild ARGV`` in a fresh process, outside any launcher's environment."""
    return subprocess.run(
        [sys.executable, "-m", "dsbuild", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=fresh_env(),
        timeout=timeout,
    )


def train_on_two_nodes(
    cwd: Path, argv: list[str], node: Callable[[int], tuple[list[str], dict[str, str]]], timeout: float = 600
) -> list[tuple[str, str]]:
    """``dsbuild train ARGV`` started at once as node 0 and node 1 of one run, each with the arguments and
    environment ``node(rank)`` gives; both must succeed. Their stdout and stderr; when one fails, the other is
    stopped rather than left waiting for it."""
    launches = []
    for rank in (0, 1):
        args, env = node(rank)
        with (cwd / f"node{rank}.out").open("w") as stdout, (cwd / f"node{rank}.err").open("w") as stderr:
            launches.append(
                subprocess.Popen(
                    [sys.executable, "-m", "dsbuild", "train", *args, *argv],
                    cwd=cwd,
                    env=fresh_env(**env),
                    stdout=stdout,
                    stderr=stderr,
                    start_new_session=True,  # its torchrun and ranks can be stopped with it
                )
            )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(p.poll() is None for p in launches):
        if any(p.returncode for p in launches):
            break
        time.sleep(0.5)
    for p in launches:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    results = [((cwd / f"node{r}.out").read_text(), (cwd / f"node{r}.err").read_text()) for r in (0, 1)]
    for rank, p, (stdout, stderr) in zip((0, 1), launches, results, strict=True):
        assert p.returncode == 0, f"node {rank}:\n{stdout[-2000:]}{stderr[-4000:]}"
    return results


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def sets(**values: object) -> list[str]:
    return [f"--set=training.{k}={json.dumps(v)}" for k, v in values.items()]


def train_records(history: list[dict[str, object]]) -> list[dict[str, object]]:
    return [h for h in history if h.get("loss") is not None]


@pytest.mark.slow
def test_demo_job_trains_writes_every_output_and_resumes(tmp_path: Path) -> None:
    """The built-in demo (shortened): the loss falls, every output is where the last lines say; a run
    that stopped after its step-3 checkpoint resumes and reproduces the uninterrupted steps 4-6."""
    out = tmp_path / "demo"
    argv = sets(max_steps=6, save_steps=3, eval_steps=3, warmup_steps=2, logging_steps=1, output_dir=str(out))
    first = ok(dsbuild("train", *argv, cwd=tmp_path))
    assert "Traceback" not in first.stderr

    history = read_history(out / "history.jsonl")
    train = train_records(history)
    assert [h["step"] for h in train] == [1, 2, 3, 4, 5, 6]
    assert train[-1]["loss"] < train[0]["loss"] - 0.3  # visibly learning
    assert [h["step"] for h in history if "eval_loss" in h] == [3, 6]

    tail = first.stdout.splitlines()[-6:]
    assert tail[0].startswith(f"loss {train[0]['loss']:.3f} at step 1 -> {train[-1]['loss']:.3f} at step 6")
    assert tail[1:] == [
        f"ds_config    {out}/ds_config.json  (the resolved config the engine ran with)",
        f"checkpoints  {out}/checkpoints  (latest: global_step6)",
        f"model        {out}/model  (HF format)",
        f"metrics      {out}/logs  (DeepSpeed's CSV monitor; history.jsonl)",
        f"loss plot    {out}/loss.png",
    ]
    ds_config = json.loads((out / "ds_config.json").read_text())
    assert '"auto"' not in json.dumps(ds_config)
    assert ds_config["zero_optimization"]["stage"] == 3 and ds_config["bf16"] == {"enabled": True}
    assert "scheduler" not in ds_config  # the HF Trainer's own schedule for lr_scheduler_type runs
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir()) == ["global_step3", "global_step6"]
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= {p.name for p in (out / "model").iterdir()}
    assert len((out / "logs" / "train" / "Train_loss.csv").read_text().splitlines()) == 1 + 6
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # As if the run had stopped right after its step-3 checkpoint.
    shutil.rmtree(out / "checkpoints" / "global_step6")
    (out / "checkpoints" / "latest").write_text("global_step3")
    second = ok(dsbuild("train", "--resume", *argv, cwd=tmp_path))
    assert f"resumed from {out}/checkpoints/global_step3 at step 3" in second.stderr
    resumed = train_records(read_history(out / "history.jsonl"))
    assert [h["step"] for h in resumed] == [1, 2, 3, 4, 5, 6]
    assert resumed[:3] == train[:3]  # kept from the first run's history
    # Same data order, RNG and schedule: equal up to CPU Adam's float rounding after a resume (see test_session).
    assert [h["lr"] for h in resumed[3:]] == [h["lr"] for h in train[3:]]
    assert [h["loss"] for h in resumed[3:]] == pytest.approx([h["loss"] for h in train[3:]], rel=1e-5)


@pytest.mark.slow
def test_two_nodes_of_a_slurm_job(tmp_path: Path) -> None:
    """Two launches of `dsbuild train` with no node flags, inside a simulated Slurm job of two nodes (what `srun` sets
    for one task per node), meeting at 127.0.0.1: each takes the node count, its rank and node 0, the first host of
    the list, from Slurm, and the two are one run of 2 processes whose outputs node 0 has. (The same flags given by
    hand start test_two_nodes_without_a_shared_disk's nodes.)"""
    out = tmp_path / "slurm"
    port = str(free_port())  # through MASTER_PORT: the job's own port (from SLURM_JOB_ID) may be taken here
    hosts = "127.0.0.[1-2]"  # node 0 is 127.0.0.1, and both "nodes" are this machine

    def task(rank: int) -> tuple[list[str], dict[str, str]]:
        slurm = {"SLURM_JOB_ID": "1", "SLURM_NNODES": "2", "SLURM_NODEID": str(rank), "SLURM_JOB_NODELIST": hosts}
        step = {"SLURM_STEP_NODELIST": hosts, "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2"}
        return [], {**slurm, **step, "SLURM_PROCID": str(rank), "SLURM_LOCALID": "0", "MASTER_PORT": port}

    results = train_on_two_nodes(tmp_path, sets(max_steps=2, save_steps=2, output_dir=str(out)), task)
    for rank, (_, stderr) in enumerate(results):
        assert (
            f"dsbuild: 2 nodes from Slurm (SLURM_STEP_NODELIST 127.0.0.[1-2]), node rank {rank}, "
            f"master 127.0.0.1:{port}; port from MASTER_PORT"
        ) in stderr.splitlines()
        assert not [line for line in stderr.splitlines() if line.startswith("dsbuild: warning:") and "Slurm" in line]
    assert results[1][0].splitlines()[-1] == f"node 1: done; node 0 has the outputs in {out}"
    assert results[0][0].splitlines()[-4] == f"checkpoints  {out}/checkpoints  (latest: global_step2)"
    assert json.loads((out / "ds_config.json").read_text())["train_batch_size"] == 16 * 2
    assert (out / "checkpoints" / "global_step2" / "dsbuild_rank1.json").is_file()  # rank 1 lives on node 1
    assert [h["step"] for h in train_records(read_history(out / "history.jsonl"))] == [1, 2]


@pytest.mark.slow
def test_a_failing_rank_fails_the_command_and_shows_its_error(tmp_path: Path) -> None:
    """A rank that raises makes `dsbuild train` exit non-zero, naming the rank, its error and its last lines."""
    done = dsbuild(
        "train", "--nproc-per-node", "2", '--set=model.attn_implementation="flash_attention_2"',
        *sets(max_steps=2, output_dir=str(tmp_path / "fail")), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    assert "dsbuild: error: training failed: torchrun exited with 1" in done.stderr
    assert "dsbuild: error: local rank 0 failed: ImportError: FlashAttention2 has been toggled on" in done.stderr
    assert "  last lines of " in done.stderr and "stderr.log:" in done.stderr
    assert not (tmp_path / "fail" / "model").exists()


def _rank_pid(local_rank: int, under: int) -> int | None:
    """The pid of the ``dsbuild.cli.rank`` process of ``local_rank`` that descends from process ``under`` (not one
    of another run on this machine), if there is one."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"dsbuild.cli.rank" in command and f"LOCAL_RANK={local_rank}".encode() in environ:
            if under in _ancestors(int(entry.name)):
                return int(entry.name)
    return None


def _ancestors(pid: int) -> list[int]:
    found = []
    while pid > 1:
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        found.append(pid)
    return found


def _two_ranks_past_step_3(tmp_path: Path, *flags: str, **values: object) -> tuple[subprocess.Popen[str], int, Path]:
    """``dsbuild train`` of the demo on 2 processes (a checkpoint every 2 steps, ``values`` set, more ``flags``), once
    step 3 is in its history: the running launcher, its local rank 1's pid, and the output folder."""
    out = tmp_path / "out"
    argv = sets(**{"max_steps": 200, "save_steps": 2, "logging_steps": 1, "output_dir": str(out), **values})
    child = subprocess.Popen(
        [sys.executable, "-m", "dsbuild", "train", "--nproc-per-node", "2", *argv, *flags], cwd=tmp_path,
        env=fresh_env(),
        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    _wait_for_step(out, child, 3)
    pid = _rank_pid(1, under=child.pid)
    assert pid is not None and child.poll() is None
    return child, pid, out


def _wait_for_step(out: Path, child: subprocess.Popen[str], step: int) -> None:
    """Until the run in ``out`` has logged ``step`` (or ``child`` ended, or 10 minutes passed)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and child.poll() is None:
        history = out / "history.jsonl"
        if history.is_file() and len(train_records(read_history(history))) >= step:
            return
        time.sleep(0.2)


def _listening(port: int) -> bool:
    """Whether a process of this machine listens on TCP ``port`` (read from /proc: no connection is made)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    return True
    return False


def _said(folder: Path, out: Path) -> str:
    """The tail of what the launchers in ``folder`` and the ranks of the run in ``out`` wrote: why a run hung."""
    files = [*sorted(folder.glob("*.err")), *sorted((out / "logs" / "torchrun").rglob("*.log"))]
    return "\n".join(f"== {f}\n" + f.read_text(errors="replace")[-3000:] for f in files if f.is_file())


def _last_checkpoint_verifies(out: Path) -> None:
    last = manifest.last_complete(out / "checkpoints")
    assert last is not None
    manifest.verify(out / "checkpoints" / last)


@pytest.mark.slow
def test_a_rank_killed_mid_run_ends_the_run_promptly_and_is_named(tmp_path: Path) -> None:
    """A worker SIGKILLed after step 3 of a 2-process run: dsbuild train exits non-zero within 60 s, names the
    lost rank first (not the survivor, which failed waiting for it), and the last complete checkpoint verifies."""
    child, pid, out = _two_ranks_past_step_3(tmp_path)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    _, stderr = child.communicate(timeout=300)
    assert time.monotonic() - killed < 60
    assert child.returncode not in (0, None), stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("dsbuild: error: local rank")]
    assert errors and errors[0].startswith("dsbuild: error: local rank 1 was lost"), stderr[-3000:]
    _last_checkpoint_verifies(out)


FROZEN = {
    "a step at ZeRO-3": [],
    "a save": [],
    "a step at ZeRO-0": ['--set=strategy.config="zero0"'],
    "a step at ZeRO-1": ['--set=strategy.config="zero1"'],
    "a step at ZeRO-2": ['--set=strategy.config="zero2"'],
    "a step with sequence parallelism 2": ["--set=strategy.overrides.sequence_parallel_size=2"],
    "a step with AutoTP 2": ['--set=strategy.config="zero2"', "--set=strategy.overrides.tensor_parallel.autotp_size=2"],
}
"""Where rank 1 is frozen, and the flags of that run: the demo is ZeRO-3, whose collectives are the world group's;
ZeRO-1 and 2 reduce gradients in DeepSpeed's data-parallel group, SP and AutoTP have groups of their own (each made by
DeepSpeed without a timeout: ``distributed.bound_new_groups``)."""


@pytest.mark.slow
@pytest.mark.parametrize("during", list(FROZEN))
def test_a_frozen_rank_ends_the_run_within_the_collective_timeout(tmp_path: Path, during: str) -> None:
    """A worker SIGSTOPped after step 3 of a 2-process run with ddp_timeout = 20, while it steps (at each ZeRO stage,
    with sequence parallelism, with AutoTP) or while it saves (a checkpoint every step; frozen as soon as one is being
    written): the other rank's collective times out, and dsbuild train, which gives the ranks left a few seconds once
    one has failed (torchrun would wait 300 s for a frozen one), ends within ddp_timeout + 60 s, non-zero, naming the
    frozen rank as lost; the last complete checkpoint verifies."""
    save_steps = 1 if during == "a save" else 2  # a step: checkpoint 2 is complete before step 3 is logged
    child, pid, out = _two_ranks_past_step_3(tmp_path, *FROZEN[during], ddp_timeout=20, save_steps=save_steps)
    if during == "a save":
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not [
            p for p in (out / "checkpoints").glob("global_step*") if not (p / manifest.MANIFEST).exists()
        ]:
            time.sleep(0.005)
    os.kill(pid, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        _, stderr = child.communicate(timeout=400)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    waited = time.monotonic() - frozen
    print(f"a rank frozen during {during} ended the run after {waited:.0f} s")  # with -s; the figure in the note
    assert waited < 20 + 60, stderr[-3000:]
    assert child.returncode not in (0, None), stderr[-3000:]
    assert "dsbuild: error: local rank 1 was lost" in stderr, stderr[-3000:]
    _last_checkpoint_verifies(out)


def _two_nodes_apart(cwd: Path, argv: list[str], outs: tuple[Path, Path]) -> list[tuple[int, str]]:
    """``dsbuild train ARGV`` as node 0 and node 1 of one run on this machine, each writing to its own folder (two
    machines without a shared disk); each node's exit code and output."""
    port = str(free_port())
    launches = []
    for rank in (0, 1):
        flags = ["--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", port]
        command = [sys.executable, "-m", "dsbuild", "train", *flags, *argv, *sets(output_dir=str(outs[rank]))]
        log = (cwd / f"apart{rank}.log").open("w")
        launches.append(
            (subprocess.Popen(command, cwd=cwd, env=fresh_env(), stdout=log, stderr=subprocess.STDOUT), log)
        )
    results = []
    for rank, (child, log) in enumerate(launches):
        child.wait(timeout=600)
        log.close()
        results.append((child.returncode, (cwd / f"apart{rank}.log").read_text()))
    return results


@pytest.mark.slow
def test_two_nodes_without_a_shared_disk(tmp_path: Path, demo_on_two: tuple[Path, str]) -> None:
    """Two nodes, each with its own output folder: without save_on_each_node the run is refused before training,
    naming the setting; with it, each node's checkpoint (its own ranks' files, its own manifest) verifies, and
    --resume on both continues with the losses of the same run on one node (the session's 2-process run, fp32,
    <= 1e-6)."""
    outs = (tmp_path / "node0", tmp_path / "node1")
    steps = [*sets(save_steps=2, logging_steps=1, bf16=False)]
    refused = _two_nodes_apart(tmp_path, [*steps, *sets(max_steps=4)], outs)
    assert all(code != 0 for code, _ in refused), refused
    assert "do not see the files rank 0 writes there" in refused[0][1] and "save_on_each_node = true" in refused[0][1]
    assert not (outs[0] / "checkpoints").exists()  # refused before the first step

    for out in outs:
        shutil.rmtree(out, ignore_errors=True)
    apart = [*steps, *sets(save_on_each_node=True)]
    first = _two_nodes_apart(tmp_path, [*apart, *sets(max_steps=4)], outs)
    assert [code for code, _ in first] == [0, 0], first[0][1][-3000:] + first[1][1][-3000:]
    for rank, out in enumerate(outs):
        listed = dsbuild("checkpoints", str(out), cwd=tmp_path)
        assert listed.returncode == 0 and "global_step4" in listed.stdout, listed.stdout + listed.stderr
        held = {p.name for p in (out / "checkpoints" / "global_step4").glob("dsbuild_rank*.json")}
        assert held == {f"dsbuild_rank{rank}.json"}  # each node holds its own rank's files only

    again = _two_nodes_apart(tmp_path, [*apart, *sets(max_steps=6), "--resume"], outs)
    assert [code for code, _ in again] == [0, 0], again[0][1][-3000:] + again[1][1][-3000:]
    one_node = {h["step"]: h["loss"] for h in train_records(read_history(demo_on_two[0] / "history.jsonl"))}
    want = {step: loss for step, loss in one_node.items() if step in range(1, 7)}
    got = {h["step"]: h["loss"] for h in train_records(read_history(outs[0] / "history.jsonl"))}
    assert sorted(got) == sorted(want) == [1, 2, 3, 4, 5, 6]
    for step, loss in want.items():
        assert abs(float(got[step]) - float(loss)) <= 1e-6 * abs(float(loss)), (step, got[step], loss)  # type: ignore[arg-type]


@pytest.mark.slow
def test_an_elastic_run_goes_on_with_the_nodes_that_are_left(tmp_path: Path) -> None:
    """Two nodes' launchers of one elastic run (--nnodes 1:2) on this machine; after step 3 the second node's launcher
    is SIGKILLed. Its torchrun agent, which dies with it (SIGTERM), stops its worker, which saves with every worker at
    the next step, and ends (so the rendezvous no longer waits for it); the first node's agent restarts its worker at
    world size 1, which resumes from that checkpoint through a universal checkpoint and finishes: exit 0, no worker
    and no agent left behind."""
    out = tmp_path / "out"
    port = free_port()
    argv = [
        "train", "--nnodes", "1:2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
        "--master-port", str(port), "--max-restarts", "2",
        *sets(max_steps=10, save_steps=20, logging_steps=1, bf16=False, ddp_timeout=60, output_dir=str(out)),
    ]  # fmt: skip

    def launch_node(name: str) -> subprocess.Popen[str]:
        # LOGLEVEL: torchrun's agent logs its rendezvous rounds (out/logs/torchrun), read when the test fails.
        return subprocess.Popen(
            [sys.executable, "-m", "dsbuild", *argv], cwd=tmp_path, env=fresh_env(LOGLEVEL="INFO"), text=True,
            stdout=open(tmp_path / f"{name}.out", "w"), stderr=open(tmp_path / f"{name}.err", "w"),
            start_new_session=True,
        )  # fmt: skip

    first = launch_node("first")
    # The first node's agent hosts the rendezvous (its store): the second starts once it listens, else the second
    # could host it (a loaded machine starts the first slowly) and take it away when it is killed.
    deadline = time.monotonic() + 300
    while not _listening(port) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    second = launch_node("second")
    try:
        _wait_for_step(out, first, 3)
        orphan = _rank_pid(0, under=second.pid)
        agent = _ancestors(orphan)[0] if orphan is not None else None  # the second node's torchrun agent
        assert orphan is not None and first.poll() is None and second.poll() is None
        os.killpg(second.pid, signal.SIGKILL)  # the second node's launcher: its agent and worker are in other sessions
        try:
            first.wait(timeout=420)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the first node's run did not end in 420 s:\n{_said(tmp_path, out)}")
    finally:
        for p in (first, second):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
    said = (tmp_path / "first.err").read_text()
    assert first.returncode == 0, said[-4000:]
    stops = [int(m) for m in re.findall(r"stopped at step (\d+) by", said)]
    assert stops, said[-4000:]
    assert f"global_step{stops[0]} was saved by 2 process(es)" in said and "universal checkpoint" in said
    assert [h["step"] for h in train_records(read_history(out / "history.jsonl"))] == list(range(1, 11))
    assert manifest.verify(out / "checkpoints" / "global_step10")["run"]["world_size"] == 1
    time.sleep(1)
    for pid, what in ((orphan, "dsbuild.cli.rank"), (agent, "dsbuild.cli.agent")):
        assert not Path(f"/proc/{pid}").exists() or what not in Path(f"/proc/{pid}/cmdline").read_text(), what
