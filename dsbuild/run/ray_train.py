"""``dsbuild train --backend ray``: a job's ranks as Ray Train workers (docs/ray.md).

The driver (``train``) connects to a Ray cluster (``--ray-address``, ``RAY_ADDRESS``, or a local one it starts)
and runs a ``TorchTrainer`` of ``nproc_per_node x nnodes`` workers: Ray places them, starts the process group
(gloo, or NCCL with GPUs, with the run's ``ddp_timeout``) and restarts the group after a failure
(``launch.max_failures``). Each worker (``run_worker``) runs the job as a torchrun rank does, through ``run.run``,
with three hooks: after each verified checkpoint it reports its own files to Ray, which merges every worker's
into one folder under ``launch.storage_path``; a restarted (or ``--resume``d) run loads Ray's latest checkpoint
through the same verified load as ``--resume``; a preemption notice from Ray saves a checkpoint at the next step.

Only this module imports ray, and only inside its functions: the config SDK and the torchrun path never do.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from ..errors import ConfigError, DsbuildError, RunStopped
from ..outputs.run_folder import RunFolder

__all__ = ["RUN_NAME", "refuse_earlier_run", "run_worker", "storage_path", "train"]

RUN_NAME: Final = "checkpoints"
"""Ray's run name: its checkpoints are ``STORAGE/checkpoints/global_stepN``, a folder ``dsbuild checkpoints``
verifies and ``--resume`` reads."""

_PASSED_ENV: Final = ("DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR", "HF_HOME", "HF_HUB_OFFLINE", "HF_DATASETS_CACHE")
"""Variables of the driver's environment the workers get too (the rest is the cluster's)."""


def storage_path(job: Any) -> str:
    """Where Ray keeps the run's checkpoints: ``launch.storage_path`` (a folder or a URI), else ``output_dir/ray``."""
    given = job.launch.storage_path
    if given is None:
        return str(RunFolder(job.output_dir).ray.resolve())
    return given if "://" in given else str(Path(given).expanduser().resolve())


def _earlier_run(storage: str) -> bool:
    """Whether ``storage`` holds a Ray run of this name (its snapshot of reported checkpoints)."""
    import pyarrow.fs

    fs, root = pyarrow.fs.FileSystem.from_uri(storage)
    info = fs.get_file_info(f"{root.rstrip('/')}/{RUN_NAME}/checkpoint_manager_snapshot.json")
    return bool(info.type != pyarrow.fs.FileType.NotFound)


def refuse_earlier_run(job: Any) -> None:
    """``ConfigError`` when the run's storage holds an earlier Ray run (Ray would silently resume from it)."""
    storage = storage_path(job)
    if _earlier_run(storage):
        raise ConfigError(
            f"launch.storage_path: {storage}/{RUN_NAME} holds an earlier Ray run's checkpoints, which Ray would "
            "resume from; nothing was changed. Pass --resume to continue it, or set launch.storage_path elsewhere"
        )


def train(
    job: Any,
    job_path: Path,
    worker: Callable[[dict[str, Any]], None],
    *,
    workers: int,
    address: str | None,
    sets: Mapping[str, Any],
    resume: bool,
    terminate_on_nan: bool,
) -> tuple[int, list[str]]:
    """Run ``job`` on ``workers`` Ray Train workers, each running ``worker`` (``dsbuild.cli.rank.ray_worker``, which
    calls ``run_worker``), and wait: the exit code and the lines worth telling."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    storage = storage_path(job)
    if not resume:
        refuse_earlier_run(job)
    address = address or os.environ.get("RAY_ADDRESS") or None
    _connect(address, workers)
    try:
        resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
        gpus = bool(resources.get("GPU", 0))
        if address is None and gpus and resources["GPU"] < workers:  # Ray would wait for them forever
            raise ConfigError(
                f"launch: {workers} workers, and this machine has {int(resources['GPU'])} GPU(s): Ray gives each "
                "worker one; pass --nproc-per-node, or --ray-address of a cluster with more"
            )
        keep = job.training.save_total_limit or None  # 0 or unset: Ray keeps every checkpoint
        trainer = TorchTrainer(
            worker,
            train_loop_config={
                "job": str(job_path.resolve()),
                # Ray Train moves each worker into a folder of its own: the run's folder, as the driver sees it.
                "sets": {**sets, "training.output_dir": str(Path(job.output_dir).resolve())},
                "resume": resume,
                "terminate_on_nan": terminate_on_nan,
            },
            scaling_config=ScalingConfig(num_workers=workers, use_gpu=gpus),
            torch_config=TorchConfig(backend="nccl" if gpus else "gloo", timeout_s=int(job.training.ddp_timeout)),
            run_config=RunConfig(
                name=RUN_NAME,
                storage_path=storage,
                failure_config=FailureConfig(max_failures=job.launch.max_failures),
                checkpoint_config=CheckpointConfig(num_to_keep=keep),
            ),
        )
        folder = RunFolder(job.output_dir)
        folder.stop_request.unlink(missing_ok=True)  # a request of an earlier attempt is not this run's
        stop = _DriverStop(folder)
        try:
            result = stop.run(trainer.fit)
        except Exception as e:  # Ray's TrainingFailedError: every worker's error, by rank
            return _failed(e, storage)
        finally:
            folder.stop_request.unlink(missing_ok=True)
        if stop.first is not None:
            return stop.outcome(storage)
        where = result.checkpoint.path if result.checkpoint is not None else "none"
        return 0, [f"Ray kept the run's checkpoints in {storage}/{RUN_NAME} (latest: {where})"]
    finally:
        session = _local_session_dir() if address is None else None
        ray.shutdown()
        if session is not None:
            _end_leftovers(session)


def _connect(address: str | None, workers: int) -> None:
    """``ray.init``: the cluster at ``address``, else a local one where every worker gets one CPU; the workers get the
    driver's variables of ``_PASSED_ENV`` and log warnings only."""
    import ray

    env = {key: os.environ[key] for key in _PASSED_ENV if key in os.environ}
    # Ray's own workers log warnings only (dsbuild's lines have their own logger): without a dashboard, Ray Train's
    # placement-group cleaner would warn every second that the state API is unavailable.
    common: dict[str, Any] = {
        "runtime_env": {"env_vars": env},
        "log_to_driver": True,
        "configure_logging": False,
        "logging_config": ray.LoggingConfig(log_level="ERROR"),
    }
    if address is None:  # a local cluster: every worker gets one CPU, however many cores there are
        ray.init(
            num_cpus=max(os.cpu_count() or 1, workers),
            include_dashboard=False,
            object_store_memory=256 * 2**20,
            **common,
        )
    else:
        ray.init(address=address, **common)


class _DriverStop:
    """The signals the driver receives while Ray trains. ``trainer.fit`` runs in a thread of its own, so that Ray
    Train installs no Ctrl-C handler of its own and the signals come here: the first SIGINT, SIGTERM or SIGUSR1 asks
    the workers (``RunFolder.stop_request``, read at each step) to save a checkpoint at the next step and stop; a
    second SIGINT ends the run at once (``ray.shutdown``)."""

    def __init__(self, folder: RunFolder) -> None:
        self.folder = folder
        self.first: signal.Signals | None = None
        self.hard = False
        self.saved_before: str | None = None

    def receive(self, number: int, _: object) -> None:
        received = signal.Signals(number)
        if self.first is None:
            from ..outputs.manifest import last_complete

            self.first = received
            self.saved_before = last_complete(self.folder.checkpoints)
            self.folder.stop_request.write_text(f"{received.name} to dsbuild train\n", encoding="utf-8")
        elif received == signal.SIGINT:
            self.hard = True

    def run(self, fit: Callable[[], Any]) -> Any:
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["result"] = fit()
            except BaseException as e:  # handed to the main thread
                outcome["error"] = e

        thread = threading.Thread(target=target, name="ray-train-fit", daemon=True)
        handlers = {s: signal.signal(s, self.receive) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
        try:
            thread.start()
            while thread.is_alive() and not self.hard:
                thread.join(0.2)
        finally:
            for number, handler in handlers.items():
                signal.signal(number, handler)
        if self.hard:
            return None  # the caller's ray.shutdown ends the workers
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    def outcome(self, storage: str) -> tuple[int, list[str]]:
        """75 when the workers saved this stop's checkpoint, else 128 + the signal (130 for Ctrl-C)."""
        from ..outputs.manifest import last_complete

        assert self.first is not None
        saved = last_complete(self.folder.checkpoints)
        where = f"checkpoint {self.folder.checkpoints / saved}" if saved else "no checkpoint"
        if saved is not None and saved != self.saved_before and not self.hard:
            return RunStopped.EXIT_CODE, [
                f"stopped by {self.first.name} to dsbuild train: {where} is this stop's, verified (Ray keeps it in "
                f"{storage}/{RUN_NAME} too); --resume continues"
            ]
        how = "a second Ctrl-C ended the run at once" if self.hard else f"stopped by {self.first.name}"
        if saved is None:
            return 128 + int(self.first), [f"{how}, before any checkpoint was saved: a new run starts from step 0"]
        return 128 + int(self.first), [
            f"{how}, before this stop's checkpoint was saved; {where} is the last verified one: --resume continues"
        ]


def _local_session_dir() -> str | None:
    """The session folder of the local Ray cluster this process started (``/tmp/ray/session_...``), or ``None``."""
    try:
        import ray._private.worker as ray_worker

        node = ray_worker._global_node
        return str(node.get_session_dir_path()) if node is not None else None
    except Exception:  # Ray's private layout changed: nothing to look for
        return None


def _end_leftovers(session: str, *, grace: float = 5.0) -> None:
    """End what the local cluster of ``session`` left running after ``ray.shutdown`` (its dashboard and runtime-env
    agents outlive the raylet that started them for a while, re-parented to init): SIGTERM, then SIGKILL after
    ``grace`` seconds. A process is the session's when its command line names the session's folder (Linux)."""

    def theirs() -> list[int]:
        found = []
        for entry in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if session.encode() in entry.read_bytes() and int(entry.parent.name) != os.getpid():
                    found.append(int(entry.parent.name))
            except (OSError, ValueError):
                continue
        return found

    for number in (signal.SIGTERM, signal.SIGKILL):
        left = theirs()
        if not left:
            return
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, number)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and theirs():
            time.sleep(0.1)


def _failed(error: BaseException, storage: str) -> tuple[int, list[str]]:
    """The exit code and lines for a run Ray gave up on: each worker's own error, first line of each."""
    failures: Mapping[int, BaseException] = getattr(error, "worker_failures", None) or {}
    controller = getattr(error, "controller_failure", None)  # Ray's ControllerError: the group could not run
    causes = dict(failures) or {-1: controller or error.__cause__ or error}
    lines = ["training failed under Ray"]
    codes = []
    for rank, cause in sorted(causes.items()):
        own = _own_error(cause)
        codes.append(RunStopped.EXIT_CODE if isinstance(own, RunStopped) else 1)
        said = str(own).strip().splitlines()
        who = f"rank {rank}" if rank >= 0 else "Ray"
        lines.append(f"  {who}: {type(own).__name__}: {said[0] if said else ''}")
    lines.append(f"  Ray's checkpoints are in {storage}/{RUN_NAME}; dsbuild train --resume continues from the latest")
    return (RunStopped.EXIT_CODE if set(codes) == {RunStopped.EXIT_CODE} else 1), lines


def _own_error(error: BaseException) -> BaseException:
    """The exception a worker raised, out of Ray's wrappers around it."""
    seen = 0
    while seen < 8 and not isinstance(error, DsbuildError) and error.__cause__ is not None:
        error, seen = error.__cause__, seen + 1
    return error


# -- on each worker ------------------------------------------------------------------------------


def run_worker(config: Mapping[str, Any]) -> None:
    """One rank of the run, on a Ray Train worker (``dsbuild.cli.rank.ray_worker``, which sets up its log lines
    first): the job as a torchrun rank runs it (``run.run``), with Ray's checkpoint to resume from, each saved
    checkpoint reported to Ray, and Ray's preemption notice heeded."""
    import ray.train

    from ..job import load_job
    from ..outputs import manifest
    from .worker import Hooks, run

    job = load_job(Path(config["job"]), config["sets"])
    folder = RunFolder(job.output_dir)
    # The newest checkpoint wins, wherever it is: Ray's latest registered one, or the run's own newest in its folder
    # (Ray registers a report some time after it, and a worker lost in between, or a driver stopped, loses it). A
    # fresh run's folder holds none (dsbuild train guards it), so any there were saved by an earlier attempt.
    checkpoint = ray.train.get_checkpoint()
    own = manifest.last_complete(folder.checkpoints)
    rays = Path(checkpoint.path).name if checkpoint is not None else None
    restore = _local(checkpoint, job) if rays is not None and _step(rays) >= _step(own) else None
    from ..session.loop import Hooks as SessionHooks

    on_session = SessionHooks(after_save=_report, save_requested=_Preemption(), stop_requested=_StopRequest(folder))
    hooks = Hooks(restore=restore, session=on_session)
    try:
        run(job, resume=config["resume"] or own is not None, terminate_on_nan=config["terminate_on_nan"], hooks=hooks)
    except RunStopped:
        return  # the driver asked, and the checkpoint is saved: a finished attempt, which Ray does not start again


def _step(tag: str | None) -> int:
    """The step of a checkpoint tag (``global_step12``: 12), -1 for none or another name."""
    if tag is None or not tag.startswith("global_step") or not tag.removeprefix("global_step").isdigit():
        return -1
    return int(tag.removeprefix("global_step"))


class _StopRequest:
    """Asked at each step: what the driver's stop request says (``RunFolder.stop_request``), or ``None``."""

    def __init__(self, folder: RunFolder) -> None:
        self.path = folder.stop_request

    def __call__(self) -> str | None:
        try:
            text = self.path.read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return text if text in _REQUESTS else None


_REQUESTS: Final = {f"{s.name} to dsbuild train" for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}


def _local(checkpoint: Any, job: Any) -> Path:
    """Ray's checkpoint as a folder here: itself in a folder this node sees, else downloaded beside the run."""
    import pyarrow.fs

    path = Path(checkpoint.path)
    if isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem) and path.is_dir():
        return path
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    here = RunFolder(job.output_dir).ray_restore(rank) / path.name
    shutil.rmtree(here, ignore_errors=True)
    checkpoint.to_directory(str(here))
    return here


def _report(tag_dir: Path) -> None:
    """Hand this rank's files of the checkpoint in ``tag_dir`` to Ray, which merges every rank's into one folder
    of its storage (rank 0 adds the manifest and the files no rank claims); a collective of Ray's."""
    import ray.train

    from ..outputs import manifest
    from ..session import distributed

    rank = distributed.rank()
    mine = manifest.rank_files(tag_dir, manifest.read_manifest(tag_dir), rank)
    if rank == 0:
        mine.append(manifest.MANIFEST)
    staging = Path(tempfile.mkdtemp(prefix=f".ray-{tag_dir.name}-rank{rank}-", dir=tag_dir.parent))
    try:
        for name in mine:
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(tag_dir / name, target)  # no copy on the same disk
            except OSError:
                shutil.copy2(tag_dir / name, target)
        step = int(tag_dir.name.removeprefix("global_step")) if tag_dir.name.startswith("global_step") else None
        ray.train.report(
            {"global_step": step} if step is not None else {},
            checkpoint=ray.train.Checkpoint.from_directory(str(staging)),
            checkpoint_dir_name=tag_dir.name,
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class _Preemption:
    """Asked after each step: ``True`` once, at the first step after Ray noticed that a node of this run is being
    preempted (a spot instance reclaimed), so that every rank saves a checkpoint then and trains on, as Ray Train
    advises; Ray restarts the run from it when the node goes. A collective of Ray's."""

    def __init__(self) -> None:
        self.noticed = False

    def __call__(self) -> bool:
        import ray.train

        if self.noticed or ray.train.get_preemption_info() is None:
            return False
        self.noticed = True
        return True
