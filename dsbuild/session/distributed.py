"""The process group: from the launcher's environment, or a one-process world for ``python script.py``."""

from __future__ import annotations

import atexit
import contextlib
import datetime
import functools
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ParamSpec, TypeVar

import torch
import torch.distributed as dist

__all__ = [
    "all_objects",
    "all_sum",
    "all_texts",
    "barrier",
    "bound_new_groups",
    "close_gloo",
    "ensure_env",
    "init",
    "is_initialized",
    "local_rank",
    "node_env",
    "node_rank",
    "quiet_old_names",
    "quietly",
    "rank",
    "world_size",
]

# What torchrun / the DeepSpeed launcher set, and what DeepSpeed's MPI discovery reads.
T = TypeVar("T")

_LAUNCHER_KEYS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_WORLD_SIZE_KEYS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def ensure_env(environ: Mapping[str, str] | None = None) -> None:
    """Give a plain ``python script.py`` a one-process world, so DeepSpeed needs neither MPI nor hand-set variables.

    Launched processes (torchrun, the DeepSpeed launcher, mpirun) already carry
    their rank; those are left alone.
    """
    env = os.environ if environ is None else environ
    if is_initialized() or any(k in env for k in _LAUNCHER_KEYS):
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")


def node_env() -> None:
    """Set the node counts DeepSpeed's own launcher exports (``deepspeed/launcher/launch.py``) and other launchers do
    not: ``CROSS_RANK`` (this node), ``CROSS_SIZE`` (the nodes).

    DeepSpeed's checkpoint writers (``checkpoint.writer``: ``model_checkpointing/utils.py``) read them at engine start
    and died with ``KeyError: 'CROSS_SIZE'`` under torchrun, Slurm, Ray and a one-process run. They are derived here,
    in the rank, from what its launcher gave (torchrun's ``GROUP_RANK``, ``GROUP_WORLD_SIZE``, ``LOCAL_WORLD_SIZE``;
    Ray Train's ``NODE_RANK``, ``LOCAL_WORLD_SIZE``; nothing at all for one process), so every launcher, an elastic
    run's renumbered nodes and a user's own torchrun get them alike; values already set (DeepSpeed's launcher) are
    kept. Not its ``LOCAL_SIZE``, which the writers do not read: on CPU it switches DeepSpeed's shared-memory
    all-reduce on, whose 66 MB buffer per rank (``/dev/shm/deepspeed_allreduce_buffer_*``) DeepSpeed never removes,
    so every run left one behind until the machine's memory was full.
    """
    world = world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or world
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "0")) or -(-world // per_node)
    os.environ.setdefault("CROSS_RANK", os.environ.get("NODE_RANK") or str(node_rank()))
    os.environ.setdefault("CROSS_SIZE", str(nodes))


def is_initialized() -> bool:
    return bool(dist.is_available() and dist.is_initialized())


def world_size() -> int:
    """The number of processes, known before the process group exists (from the launcher's environment)."""
    if is_initialized():
        return int(dist.get_world_size())
    for key in _WORLD_SIZE_KEYS:
        if key in os.environ:
            return int(os.environ[key])
    return 1


def rank() -> int:
    if is_initialized():
        return int(dist.get_rank())
    for key in _LAUNCHER_KEYS:
        if key in os.environ:
            return int(os.environ[key])
    return 0


def init(timeout: float | None = None) -> None:
    """Create the process group once per process (DeepSpeed's accelerator picks the backend), or reuse it.

    ``timeout``: seconds a collective waits for the other processes before it fails (``training.ddp_timeout``;
    default ``Training``'s), so a lost or frozen rank ends the run instead of hanging it; it applies to the group
    this call creates (a group that exists keeps its own).
    """
    import deepspeed

    from ..env.build_locks import stale_locks
    from ..errors import SessionError
    from ..resolve.training import Training
    from . import cpu_features, lazy_compile

    # Once per process, before its group exists (init is called again by each Session, and by the data barrier).
    stale = stale_locks(wait=5.0) if not is_initialized() else []
    if stale:  # DeepSpeed would wait for them forever, silently
        paths = " ".join(str(p) for p in stale)
        raise SessionError(
            f"a DeepSpeed op build was killed and left its lock behind: {paths}. DeepSpeed would wait for it forever; "
            f"no build is running there, so remove it (rm {paths}) and start again"
        )
    cpu_features.install()  # DeepSpeed asks py-cpuinfo for every op it loads: once per machine is enough
    lazy_compile.install()  # every engine imports DeepSpeed's Muon, whose kernels need torch.compile only when called
    alone = not is_initialized() and not any(k in os.environ for k in _LAUNCHER_KEYS)
    ensure_env()
    node_env()
    wait = datetime.timedelta(seconds=timeout if timeout is not None else Training().ddp_timeout)
    if alone:
        # One process needs no rendezvous: an in-memory store, so no port is listened on (a free port picked
        # first can be taken by another process before the group binds it).
        from deepspeed.accelerator import get_accelerator

        backend = get_accelerator().communication_backend_name()
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=wait)  # type: ignore[attr-defined]
    fresh = not is_initialized()
    deepspeed.init_distributed(verbose=False, timeout=wait)  # takes the group there is, or makes it
    bound_new_groups(wait)
    if fresh and is_initialized():
        atexit.register(close_gloo)


def bound_new_groups(wait: datetime.timedelta) -> None:
    """Every process group made from now on without a timeout of its own waits at most ``wait`` in a collective.

    DeepSpeed makes its data-parallel, sequence-parallel, tensor-parallel and expert groups with
    ``dist.new_group(ranks)`` (``deepspeed/utils/groups.py``, no timeout), which torch gives its own default: 30
    minutes for gloo, 10 for NCCL, whatever the world group was given. A rank frozen in a ZeRO-1/2 gradient
    all-reduce (the data-parallel group) then held the run for half an hour. torch reads that default from
    ``_get_default_timeout`` at each ``new_group``, ``new_subgroups`` and ``split_group`` call, so this is the one
    place all of them take it from; the last ``init`` of the process sets it (each ``Session`` passes the run's
    ``ddp_timeout``)."""
    c10d = dist.distributed_c10d
    if not hasattr(c10d, "_get_default_timeout"):  # torch moved it: the test of this bound fails and says so
        return

    def run_timeout(backend: object) -> datetime.timedelta:
        return wait

    c10d._get_default_timeout = run_timeout


_GLOO_SETTLE = 0.1
"""Seconds ``close_gloo`` leaves gloo's worker threads after the destroy, the interpreter still whole (see there)."""


def close_gloo() -> None:
    """At exit, while the interpreter is whole: destroy a gloo process group this process made, then give gloo's
    worker threads a moment. Each of those threads lets go of a collective's tensors a moment after the collective
    has completed, and that needs the GIL when Python had already dropped them; a thread that asks for it once the
    interpreter is finalizing is ended by CPython in C++ code, which aborts the process after all its work is done
    ("terminate called without an active exception", seen in runs that end right after a save's barrier). The
    destroy alone does not end those threads: DeepSpeed's engines and ``deepspeed.utils.groups`` still hold the
    groups, so they live on into the finalization. Measured with a 2-process script that exits right after an
    all-gather and a barrier, on a loaded 2-core machine: 7 of 30 runs aborted after the destroy alone, none of 70
    with this pause. Only gloo: destroying an NCCL group while another rank may still be in a collective can hang."""
    try:
        if not (is_initialized() and dist.get_backend() == "gloo"):
            return
        dist.destroy_process_group()
    except (RuntimeError, ValueError):
        return  # already being torn down: nothing more to do at exit
    time.sleep(_GLOO_SETTLE)  # the GIL released: the threads let go of what they hold while it can be taken


def barrier() -> None:
    if is_initialized():
        dist.barrier()


def all_objects(value: T) -> list[T]:
    """Each process's ``value`` (a small JSON-like object), in rank order, on every process (one collective)."""
    if not is_initialized() or dist.get_world_size() == 1:
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def all_texts(text: str | None) -> list[str | None]:
    """Each process's ``text``, in rank order, on every process (one collective): what each one found."""
    return all_objects(text)


def local_rank() -> int:
    """This process's rank on its node (the launcher's ``LOCAL_RANK``)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def node_rank() -> int:
    """This process's node (torchrun's ``GROUP_RANK``; else the global rank over the processes per node)."""
    if "GROUP_RANK" in os.environ:
        return int(os.environ["GROUP_RANK"])
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or 1
    return rank() // per_node


def all_sum(values: list[float], device: torch.device | str) -> list[float]:
    """Sum ``values`` over all processes (one collective)."""
    if not is_initialized() or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return [float(v) for v in t.tolist()]


_OLD_NAMES = r"`torch\.distributed\.\w+` is deprecated"
"""What torch says, as a FutureWarning, each time DeepSpeed calls one of its old collective names
(``all_gather_into_tensor``, ...): nothing a user can act on."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


@contextlib.contextmanager
def quiet_old_names() -> Iterator[None]:
    """Inside: torch's warning about DeepSpeed's old collective names is not shown (only that one)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_OLD_NAMES, category=FutureWarning)
        yield


def quietly(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """``method`` run inside ``quiet_old_names``: what a ``Session`` method that reaches DeepSpeed's collectives wears."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with quiet_old_names():
            return method(*args, **kwargs)

    return wrapper
