"""Do the newest releases that pyproject.toml's ranges allow still pass the suite? Which upgrade breaks it?

    python tools/check_newest.py                      # the fast suite (-m "not slow"), torch held at the lock's
    python tools/check_newest.py --pytest-args=""     # the whole suite
    python tools/check_newest.py --include-torch      # newest torch too (a CUDA build of several GB on PyPI)

1. Builds ``.venv-newest`` with ``pip install -e '.[train,dev]'``: the newest release of every package the ranges
   allow (torch stays at the lock's release unless ``--include-torch``), and runs the tests there.
2. Compares it with the lock (``constraints.txt``): the packages whose newest release differs.
3. When tests fail, builds ``.venv-bisect`` from the lock and upgrades one differing package at a time to its
   newest release (pip upgrades its dependencies only where it must), runs the tests that failed, and puts the
   lock back before the next package.

It prints (and with ``--output`` writes) a Markdown table: package, locked version, newest version, good / broken,
the first failing test and the first line of its error. Exit 0 when everything is good, 1 when something broke,
2 when an environment could not be built. Nothing of the project's own ``.venv`` is touched.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "constraints.txt"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, str]:
    """``name==version`` lines of a lock or of ``pip freeze`` (local labels such as ``+cpu`` dropped)."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if match:
            pins[canonical(match.group(1))] = match.group(2).split("+", 1)[0]
    return pins


def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    print("$", shlex.join(argv), file=sys.stderr, flush=True)
    return subprocess.run(argv, cwd=ROOT, text=True, capture_output=True, **kwargs)  # type: ignore[call-overload]


def make_venv(path: Path, install: list[str]) -> Path:
    """A fresh virtual environment at ``path`` with ``pip install`` of ``install``; its python."""
    if path.exists():
        shutil.rmtree(path)
    made = run([sys.executable, "-m", "venv", str(path)])
    python = path / "bin" / "python"
    if made.returncode != 0:
        sys.exit(f"check_newest: cannot create {path}: {made.stderr.strip()}")
    installed = run([str(python), "-m", "pip", "install", "--quiet", *install])
    if installed.returncode != 0:
        print(installed.stdout[-3000:], installed.stderr[-3000:], file=sys.stderr)
        sys.exit(2)
    return python


def freeze(python: Path) -> dict[str, str]:
    return read_pins(run([str(python), "-m", "pip", "freeze", "--exclude-editable"]).stdout)


def failures(python: Path, pytest_args: list[str], tests: list[str] | None = None) -> dict[str, str]:
    """Failing test id -> first line of its error (empty: everything passed)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        argv = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *pytest_args]
        done = run([*argv, *(tests or [])])
        if not report.exists():
            return {"(pytest)": (done.stdout.strip().splitlines() or ["pytest did not run"])[-1]}
        failed: dict[str, str] = {}
        for case in ET.parse(report).iter("testcase"):
            problem = case.find("failure")
            if problem is None:
                problem = case.find("error")
            if problem is None:
                continue
            path = case.get("classname", "").replace(".", "/")
            name = f"{path}.py::{case.get('name')}" if path else str(case.get("name"))
            failed[name] = first_error(f"{problem.get('message') or ''}\n{problem.text or ''}")
        return failed


def first_error(text: str) -> str:
    """The line that names the exception (``TypeError: ...``, the last one: the cause a traceback ends with), else
    the first line of ``text``."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"^(\[rank\d+\]:\s*)?(E\s+)?[A-Za-z_][\w.]*(Error|Exception):", line)]
    causes = [line for line in named if "AssertionError" not in line]  # the test's own assert says less
    return ((causes or named)[-1] if named else lines[0] if lines else "")[:200]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pytest-args", default="-m 'not slow'", help="what pytest runs (default: the fast suite)")
    parser.add_argument("--include-torch", action="store_true", help="take torch's newest release too")
    parser.add_argument("--output", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    pytest_args = shlex.split(args.pytest_args)
    locked = read_pins(LOCK.read_text())

    hold = [] if args.include_torch else [f"torch=={locked['torch']}"]
    newest_python = make_venv(ROOT / ".venv-newest", ["--upgrade", *hold, "-e", ".[train,dev]"])
    newest = freeze(newest_python)
    changed = sorted(name for name in newest if name in locked and newest[name] != locked[name])
    added = sorted(name for name in newest if name not in locked)
    failed = failures(newest_python, pytest_args)

    rows: list[tuple[str, str, str, str, str, str]] = []
    if not failed:
        rows = [(name, locked[name], newest[name], "good", "", "") for name in changed]
    else:
        lock_python = make_venv(ROOT / ".venv-bisect", ["-c", str(LOCK), "-e", ".[train,dev]"])
        tests = [t for t in failed if "::" in t]
        for name in changed:
            upgraded = run([str(lock_python), "-m", "pip", "install", "--quiet", f"{name}=={newest[name]}"])
            if upgraded.returncode != 0:
                rows.append((name, locked[name], newest[name], "not installable", "", upgraded.stderr.strip()[:200]))
            else:
                broken = failures(lock_python, [], tests)  # just the tests that failed on the newest set
                first = next(iter(broken.items()), ("", ""))
                rows.append((name, locked[name], newest[name], "broken" if broken else "good", *first))
            run([str(lock_python), "-m", "pip", "install", "--quiet", "-r", str(LOCK)])  # back to the lock
    for name in added:
        rows.append((name, "(not in the lock)", newest[name], "new dependency", "", ""))

    table = ["| package | locked | newest | verdict | first failing test | first line of the error |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    table += [f"| {' | '.join(cell.replace('|', '/') for cell in row)} |" for row in rows]
    summary = (
        f"newest set: {len(changed)} package(s) newer than the lock; "
        + ("the tests pass" if not failed else f"{len(failed)} test(s) fail: " + ", ".join(list(failed)[:5]))
        + f" (pytest {args.pytest_args or '(whole suite)'}; torch {'newest' if args.include_torch else 'held'})"
    )
    text = summary + "\n\n" + "\n".join(table) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
