"""What a failed torchrun run left, told: which rank failed first, which was lost (killed, frozen, out of memory) and
which torchrun stopped once another had ended, each rank's last lines, or, when the ranks stopped on dsbuild's own
errors (user code that raised), one account of it (``failure_account``). Read from torchrun's log folder of the run:
each rank's ``error.json`` (torchrun's ``record``), the marks and accounts ``dsbuild.cli.rank`` leaves beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

from ..errors import RunStopped

__all__ = [
    "FAILURE_FILE",
    "STOPPED_MARK",
    "failure_account",
    "failure_report",
    "recorded_error",
    "stopped_by_a_signal",
]


def stopped_by_a_signal(run_dir: Path | None) -> str | None:
    """What the ranks said when every rank of the newest attempt stopped on a signal (``RunStopped``, each after the
    agreed save), or ``None`` when any rank failed otherwise."""
    if run_dir is None:
        return None
    attempts = sorted(run_dir.glob("attempt_*"), key=lambda p: p.name)
    ranks = [p for p in attempts[-1].iterdir() if p.is_dir()] if attempts else []
    said = []
    for rank_dir in ranks:
        _, message = recorded_error(rank_dir)
        if not message.startswith(f"{RunStopped.__name__}: "):
            return None
        said.append(message.removeprefix(f"{RunStopped.__name__}: ").strip().splitlines()[0])
    return said[0] if said else None


def recorded_error(rank_dir: Path) -> tuple[str, str]:
    """(timestamp, message) of the error torchrun's ``record`` wrote for a rank (``error.json``); empty when none."""
    try:
        info = json.loads((rank_dir / "error.json").read_text(encoding="utf-8")).get("message", {})
        return str(info.get("extraInfo", {}).get("timestamp", "")), str(info.get("message", ""))
    except (OSError, ValueError, AttributeError):
        return "", ""


STOPPED_MARK: Final = "stopped_by_torchrun"
"""The file a rank writes beside its error file when a SIGTERM ends it outside ``fit``'s agreed stop (torchrun
stopping the ranks left once one has ended; ``dsbuild.cli.rank``), so the report tells it from a rank that was lost."""


FAILURE_FILE: Final = "failure.json"
"""What a rank that stopped on dsbuild's own error writes beside its error file (``dsbuild.cli.rank``): the lines it
said and the frames of the user's own code, from which ``failure_account`` tells the failure once."""


def failure_account(run_dir: Path | None) -> list[str]:
    """One account of a run whose ranks stopped on dsbuild's own errors (each wrote ``FAILURE_FILE``; none was lost
    or killed): the rank whose user code failed (its frames), else the first to fail, what it said, the frames in the
    user's files, and where its whole log is. Empty when that is not the case (``failure_report`` tells it)."""
    if run_dir is None:
        return []
    attempts = sorted(run_dir.glob("attempt_*"), key=lambda p: p.name)
    ranks = sorted((p for p in attempts[-1].iterdir() if p.is_dir()), key=lambda p: p.name) if attempts else []
    accounts: list[tuple[str, Path, list[str], list[str]]] = []
    for rank_dir in ranks:
        said, frames = _failure_of(rank_dir)
        if said:
            accounts.append((recorded_error(rank_dir)[0], rank_dir, said, frames))
        elif not (rank_dir / STOPPED_MARK).is_file():
            return []  # a rank that ended otherwise (killed, lost, another error): the full report
    if not accounts:
        return []
    _, rank_dir, said, frames = min(accounts, key=lambda a: (not a[3], a[0]))  # user frames first, then the earliest
    first, *more = said
    others = "; the other ranks' logs are beside it" if len(ranks) > 1 else ""
    return [
        f"training failed on local rank {rank_dir.name}: {first}",
        *(f"  {line}" for line in more),
        *(f"  {line}" for line in frames),
        f"  the whole log: {rank_dir / 'stderr.log'}{others}",
    ]


def _failure_of(rank_dir: Path) -> tuple[list[str], list[str]]:
    """What a rank said of its failure and its user frames (``FAILURE_FILE``); empty lists when it wrote none or an
    unreadable one."""
    try:
        account = json.loads((rank_dir / FAILURE_FILE).read_text(encoding="utf-8"))
        said = [line for text in account["said"] for line in str(text).splitlines() if line.strip()]
        frames = [str(line) for line in account["frames"]]
    except (OSError, ValueError, KeyError, TypeError):
        return [], []
    return (said, frames) if said else ([], [])


def failure_report(run_dir: Path | None, tail: int = 15) -> list[str]:
    """The failed ranks of a torchrun run (those that wrote an error file, first failure first) and their last stderr
    lines; a line starting with a space continues the one before it."""
    if run_dir is None:
        return []
    ranks = sorted((p for p in run_dir.glob("attempt_*/*") if p.is_dir()), key=lambda p: p.name)
    failed: list[tuple[str, Path, str]] = []
    for rank_dir in ranks:
        if (rank_dir / "error.json").is_file():
            stamp, message = recorded_error(rank_dir)
            failed.append((stamp, rank_dir, message.strip()))
    recorded = {rank_dir for _, rank_dir, _ in failed}
    stopped = [p for p in ranks if p not in recorded and (p / STOPPED_MARK).is_file()]
    lost = [p for p in ranks if p not in recorded and p not in stopped]
    lines: list[str] = []
    if lost and len(lost) < len(ranks):
        # A rank that left no error and no mark of its own while the others did was lost first (a signal, the
        # out-of-memory killer, its node): the others then failed waiting for it, or torchrun stopped them. Name it
        # first.
        lines.extend(
            f"local rank {rank_dir.name} was lost: it ended without an error of its own (killed by a signal, "
            "or by the out-of-memory killer), and the others failed waiting for it"
            for rank_dir in lost
        )
    elif not failed and not stopped:  # killed, or died before Python could record anything: show every rank
        failed = [("", rank_dir, "") for rank_dir in ranks]
    shown: set[str] = set()
    for _, rank_dir, message in sorted(failed, key=lambda f: f[0]):
        if message and message in shown:
            lines.append(f"local rank {rank_dir.name} failed the same way")
            continue
        shown.add(message)
        stderr = rank_dir / "stderr.log"
        try:
            text = stderr.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            text = []
        # The error's first line heads the report; the lines after it (a table, what to do) continue it.
        first, *more = message.splitlines() or [""]
        lines.append(f"local rank {rank_dir.name} failed" + (f": {first}" if first else ""))
        lines.extend(f"  {line}" for line in more if line.strip())
        if text:
            lines.append(f"  last lines of {stderr}:")
            lines.extend(f"    {line}" for line in text[-tail:])
    lines.extend(
        f"local rank {rank_dir.name} was stopped by torchrun once another rank had ended" for rank_dir in stopped
    )
    return lines
