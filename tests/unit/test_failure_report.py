"""``dsbuild train``'s report of a failed torchrun run names the rank that was lost first, and does not take a rank
that torchrun stopped afterwards (it marks itself) for a lost one."""

from __future__ import annotations

import json
from pathlib import Path

from dsbuild.run.failures import FAILURE_FILE, STOPPED_MARK, failure_account, failure_report


def _ranks(tmp_path: Path, *kinds: str) -> Path:
    """A torchrun log folder with one rank per kind: "error" (wrote error.json), "stopped" (marked), "gone" (nothing)."""
    for rank, kind in enumerate(kinds):
        folder = tmp_path / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text(f"rank {rank} last line\n", encoding="utf-8")
        if kind == "error":
            error = {"message": {"message": "RuntimeError: connection reset", "extraInfo": {"timestamp": "1"}}}
            (folder / "error.json").write_text(json.dumps(error), encoding="utf-8")
        elif kind == "stopped":
            (folder / STOPPED_MARK).write_text("SIGTERM\n", encoding="utf-8")
    return tmp_path


def test_a_killed_rank_is_named_first_when_the_other_was_stopped_before_it_recorded_its_error(tmp_path: Path) -> None:
    """Rank 1 SIGKILLed, rank 0 ended by torchrun's SIGTERM while unwinding: rank 1 was lost, rank 0 was stopped."""
    lines = failure_report(_ranks(tmp_path, "stopped", "gone"))
    assert lines[0].startswith("local rank 1 was lost")
    assert lines[-1] == "local rank 0 was stopped by torchrun once another rank had ended"


def test_a_killed_rank_is_named_first_when_the_other_failed_waiting_for_it(tmp_path: Path) -> None:
    """Rank 0 recorded its collective's error: rank 1 is named lost first, then rank 0's error and last lines."""
    lines = failure_report(_ranks(tmp_path, "error", "gone"))
    assert lines[0].startswith("local rank 1 was lost")
    assert lines[1] == "local rank 0 failed: RuntimeError: connection reset"


def test_a_rank_that_failed_is_not_called_lost_when_torchrun_stopped_the_other(tmp_path: Path) -> None:
    """Rank 0 raised, torchrun stopped rank 1: no rank is lost; rank 0's error comes first."""
    lines = failure_report(_ranks(tmp_path, "error", "stopped"))
    assert not [line for line in lines if "was lost" in line]
    assert lines[0] == "local rank 0 failed: RuntimeError: connection reset"
    assert lines[-1] == "local rank 1 was stopped by torchrun once another rank had ended"


def test_with_nothing_recorded_every_rank_is_shown(tmp_path: Path) -> None:
    """No error file and no mark anywhere (every rank killed): each rank and its last lines, none called lost."""
    lines = failure_report(_ranks(tmp_path, "gone", "gone"))
    assert [line for line in lines if line.startswith("local rank")] == ["local rank 0 failed", "local rank 1 failed"]


def _accounts(tmp_path: Path, *accounts: dict[str, list[str]] | None) -> Path:
    """A torchrun log folder whose ranks each wrote error.json and the account ``accounts`` gives (``None``: killed,
    nothing written)."""
    for rank, account in enumerate(accounts):
        folder = tmp_path / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text("Traceback ...\n", encoding="utf-8")
        if account is not None:
            error = {"message": {"message": "FunctionError: x", "extraInfo": {"timestamp": str(rank)}}}
            (folder / "error.json").write_text(json.dumps(error), encoding="utf-8")
            (folder / FAILURE_FILE).write_text(json.dumps(account), encoding="utf-8")
    return tmp_path


def test_one_account_of_a_failure_names_the_rank_whose_code_failed_with_its_frames(tmp_path: Path) -> None:
    """Both ranks stopped on dsbuild's error, rank 1's reward function raised: one account, rank 1's, its frames and
    its log, whatever rank 0 (which only heard of it) said."""
    run = _accounts(
        tmp_path,
        {"said": ["the reward function m:f raised KeyError: 'a' on rank 1"], "frames": []},
        {"said": ["the reward function m:f raised KeyError: 'a' on rank 1"], "frames": ["/u/m.py:3 in f: x['a']"]},
    )
    assert failure_account(run) == [
        "training failed on local rank 1: the reward function m:f raised KeyError: 'a' on rank 1",
        "  /u/m.py:3 in f: x['a']",
        f"  the whole log: {run / 'attempt_0' / '1' / 'stderr.log'}; the other ranks' logs are beside it",
    ]


def test_no_account_when_a_rank_ended_without_one(tmp_path: Path) -> None:
    """A rank killed (nothing written) while the other recorded dsbuild's error: the full report tells it (the lost
    rank first), not the account."""
    assert failure_account(_accounts(tmp_path, {"said": ["x"], "frames": []}, None)) == []


def test_an_unreadable_account_is_no_account(tmp_path: Path) -> None:
    """A FAILURE_FILE that is not what a rank writes (not JSON, another shape) is passed over, never a crash."""
    run = _accounts(tmp_path, {"said": ["x"], "frames": []})
    (run / "attempt_0" / "0" / FAILURE_FILE).write_text("{not json", encoding="utf-8")
    assert failure_account(run) == []
    (run / "attempt_0" / "0" / FAILURE_FILE).write_text('{"said": 3}', encoding="utf-8")
    assert failure_account(run) == []
