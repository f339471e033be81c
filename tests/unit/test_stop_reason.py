"""What a stopped run says stopped it (``dsbuild.session.loop.stop_reason``): a signal to ``dsbuild train``, which
the launcher passed on to every rank, is the launcher's, not the rank's it reached (issue 41); a signal to a rank
itself is that rank's."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

pytestmark = pytest.mark.train  # dsbuild.session imports torch; tests/conftest.py skips it without the extra

from dsbuild.run.launch import FORWARDED_SIGNAL  # noqa: E402
from dsbuild.session import loop  # noqa: E402


@pytest.mark.parametrize(
    ("rank", "received", "this_rank", "said"),
    [
        (0, "SIGTERM to dsbuild train", 0, "SIGTERM to dsbuild train"),
        (1, "SIGINT to dsbuild train", 0, "SIGINT to dsbuild train"),
        (0, "SIGTERM", 0, "SIGTERM to rank 0 (this process)"),
        (1, "SIGUSR1", 0, "SIGUSR1 to rank 1"),
        (1, loop.LAUNCHER_LOST, 1, "the end of rank 1 (this process)'s launcher (torchrun's agent)"),
    ],
)
def test_the_stop_names_where_the_signal_went(rank: int, received: str, this_rank: int, said: str) -> None:
    """To dsbuild train when the launcher passed it on; to the rank (this process, or another) when it was the rank's."""
    assert loop.stop_reason(rank, received, this_rank) == said
    assert loop.stop_name(loop.stop_code(received)) == received  # what the ranks tell each other at a step


def test_a_signal_the_launcher_noted_is_the_launchers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's signal is dsbuild train's when the launcher noted one in the file its environment names (written
    before it passes the signal on); without a note, or a note that names nothing dsbuild wrote, it is the rank's."""
    note = tmp_path / "forwarded_signal"
    monkeypatch.setenv(loop.FORWARDED, str(note))
    before = signal.getsignal(signal.SIGTERM)
    stop = loop.StopSignals()
    try:
        stop.received = "SIGTERM"
        assert stop.check() == "SIGTERM"  # no note: a signal to this rank itself
        note.write_text("garbage\n", encoding="utf-8")
        assert stop.check() == "SIGTERM"
        note.write_text("SIGINT to dsbuild train\n", encoding="utf-8")  # Ctrl-C, passed on to the ranks as SIGTERM
        assert stop.check() == "SIGINT to dsbuild train"
        note.unlink()
        assert stop.check() == "SIGINT to dsbuild train"  # decided once
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_launcher_and_the_ranks_name_the_same_variable() -> None:
    """dsbuild train (which imports no torch, so not the session's module) sets the variable the ranks read."""
    assert FORWARDED_SIGNAL == loop.FORWARDED
