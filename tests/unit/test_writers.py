"""DeepSpeed's checkpoint writers (``checkpoint.writer``): each setting no machine runs refused by its key with the
reason, the node counts its writers read derived in every rank, and the decoupled writer's process spawned."""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

import pytest

from dsbuild.validate.feature_table import refusals, writer_refusals


def _config(stage: int | None = 3, **writer: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"checkpoint": {"writer": writer}}
    if stage is not None:
        config["zero_optimization"] = {"stage": stage}
    return config


def _keys(config: dict[str, Any]) -> list[str]:
    return [p.path for p in writer_refusals(config)]


def test_the_python_writer_decoupled_or_not_runs_at_zero_3() -> None:
    """What the issue's user wrote (decoupled, python) is not refused at ZeRO-3, nor the python writer alone."""
    assert _keys(_config(decoupled=True, type="python")) == []
    assert _keys(_config(type="PYTHON")) == []
    assert writer_refusals({"zero_optimization": {"stage": 1}}) == []  # no writer section: DeepSpeed's default engine


@pytest.mark.parametrize("stage", [None, 0, 1, 2])
def test_a_writer_below_zero_3_is_refused_by_its_key(stage: int | None) -> None:
    """Below stage 3 DeepSpeed 0.19's writer engines die at engine start (AttributeError: dp_rank): refused."""
    problems = writer_refusals(_config(stage, decoupled=True, type="python"))
    assert [p.path for p in problems] == ["checkpoint.writer"]
    assert f"at ZeRO stage {stage or 0}: DeepSpeed 0.19's writer engines fail at engine start" in problems[0].message
    assert refusals(_config(stage, type="python")) == writer_refusals(_config(stage, type="python"))  # train's too


def test_the_mock_writer_and_data_parallel_are_refused_with_the_reason() -> None:
    """The mock writer writes nothing to resume from; data_parallel is ignored at stage 3: both named by their key."""
    mock = writer_refusals(_config(type="mock"))
    assert [p.path for p in mock] == ["checkpoint.writer.type"]
    assert mock[0].message.startswith("MOCK: DeepSpeed's mock writer writes no files")
    assert mock[0].hint == 'set checkpoint.writer.type = "python" for plain file writes, or remove checkpoint.writer'
    parallel = writer_refusals(_config(type="python", data_parallel="replica"))
    assert [p.path for p in parallel] == ["checkpoint.writer.data_parallel"]
    assert parallel[0].message.startswith("replica: ignored by DeepSpeed 0.19 at ZeRO stage 3")


@pytest.mark.train
def test_the_fast_writer_is_refused_exactly_where_its_async_io_op_cannot_be_built() -> None:
    """The fast writer (a writer section's default type) needs DeepSpeed's async_io op: refused where it cannot be
    built, with what to install; the python writer needs nothing."""
    from deepspeed.ops.op_builder import AsyncIOBuilder

    from dsbuild.session.writers import fast_writer_refusal

    reason = fast_writer_refusal(_config(decoupled=True))
    if AsyncIOBuilder().is_compatible(verbose=False):
        assert reason is None
    else:
        assert reason is not None and "async_io op, which cannot be built on this machine" in reason
        assert "apt install libaio-dev" in reason
    assert fast_writer_refusal(_config(type="python")) is None
    assert fast_writer_refusal({}) is None


@pytest.mark.train
@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"RANK": "0", "WORLD_SIZE": "1"}, ("0", "1")),  # the one-process demo: nothing from a launcher
        (  # torchrun, node 1 of 2 with 2 processes each (Slurm's nodes run torchrun too)
            {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"},
            ("1", "2"),
        ),
        ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, ("1", "2")),  # no group keys
        ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "NODE_RANK": "1"}, ("1", "2")),  # Ray Train
        (  # DeepSpeed's own launcher: its values are kept
            {"RANK": "1", "WORLD_SIZE": "2", "CROSS_RANK": "0", "CROSS_SIZE": "1", "LOCAL_SIZE": "2"},
            ("0", "1"),
        ),
    ],
)
def test_every_rank_gets_the_node_counts_deepspeeds_launcher_exports(
    monkeypatch: pytest.MonkeyPatch, given: dict[str, str], expected: tuple[str, str]
) -> None:
    """CROSS_RANK and CROSS_SIZE, which DeepSpeed's writers read (KeyError: 'CROSS_SIZE' under torchrun), come from
    whatever launched the rank; LOCAL_SIZE, which would switch DeepSpeed's shared-memory all-reduce on (and leave
    its 66 MB buffer in /dev/shm), only from DeepSpeed's own launcher."""
    from dsbuild.session import distributed

    keys = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "NODE_RANK", "CROSS_RANK")
    for key in (*keys, "CROSS_SIZE", "LOCAL_SIZE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in given.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(distributed, "is_initialized", lambda: False)
    distributed.node_env()
    assert (os.environ["CROSS_RANK"], os.environ["CROSS_SIZE"]) == expected
    assert os.environ.get("LOCAL_SIZE") == given.get("LOCAL_SIZE")


@pytest.mark.train
def test_the_decoupled_writer_is_spawned_and_the_start_method_put_back() -> None:
    """A forked writer inherits the rank's pipes and threads (a run hung at exit): spawned inside, as before after."""
    from dsbuild.session.writers import spawning

    before = multiprocessing.get_start_method(allow_none=True)
    with spawning(_config(decoupled=True, type="python")):
        assert multiprocessing.get_start_method() == "spawn"
    assert multiprocessing.get_start_method(allow_none=True) == before
    with spawning(_config(type="python")):
        assert multiprocessing.get_start_method(allow_none=True) == before


@pytest.mark.train
@pytest.mark.procs
def test_the_decoupled_writer_ignores_the_stop_signals_and_the_rank_does_not() -> None:
    """A process started inside ignores SIGINT, SIGTERM and SIGUSR1 (a Ctrl-C to the group must not kill the writer
    of the stop's save); the rank's own handlers are back once it has started."""
    import signal

    from dsbuild.session.writers import spawning

    mine = signal.getsignal(signal.SIGTERM)
    with spawning(_config(decoupled=True, type="python")):
        ctx = multiprocessing.get_context()
        queue = ctx.SimpleQueue()
        child = ctx.Process(target=_report_signals, args=(queue,))
        child.start()
        seen = queue.get()
        child.join(timeout=60)
    assert seen == [int(signal.SIG_IGN)] * 3
    assert signal.getsignal(signal.SIGTERM) is mine


def _report_signals(queue: Any) -> None:
    import signal

    queue.put([int(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)])  # type: ignore[arg-type]
