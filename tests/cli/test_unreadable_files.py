"""Files that cannot be read safely, through the real ``dsbuild`` process: exit 2, the file named, no traceback, no hang.

Each command runs in a subprocess with a timeout, so a reader that blocks (on a FIFO, on /dev/zero) fails the
test instead of hanging the suite.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="POSIX special files"), pytest.mark.procs]

NAME = "cfg"
"""The stem of every file made here; the tests run in its folder, so messages name it as given."""


def _dsbuild(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dsbuild", *argv], capture_output=True, text=True, cwd=cwd, timeout=60, check=False
    )


def _fifo(folder: Path, suffix: str) -> str:
    os.mkfifo(folder / f"{NAME}{suffix}")
    return "is a named pipe (FIFO), expected a regular file"


def _device(folder: Path, suffix: str) -> str:
    (folder / f"{NAME}{suffix}").symlink_to("/dev/zero")
    return "is a character device, expected a regular file"


def _directory(folder: Path, suffix: str) -> str:
    (folder / f"{NAME}{suffix}").mkdir()
    return "is a directory, expected a file"


def _loop(folder: Path, suffix: str) -> str:
    (folder / f"{NAME}{suffix}").symlink_to(f"{NAME}{suffix}")
    return "is a symlink loop, expected a regular file"


def _oversize(folder: Path, suffix: str) -> str:
    with (folder / f"{NAME}{suffix}").open("wb") as f:
        f.truncate(20 * 2**20)
    return "the file is 20 MiB; config files over 1 MiB are refused"


def _deep(folder: Path, suffix: str) -> str:
    text = {".json": "[" * 100_000, ".toml": "a = " + "[" * 100_000, ".yaml": "a: " + "[" * 60_000}[suffix]
    (folder / f"{NAME}{suffix}").write_text(text)
    return "nested deeper than 64 levels"


def _alias_bomb(folder: Path, suffix: str) -> str:
    lines = ['lol0: &lol0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"lol{i}: &lol{i} [{', '.join([f'*lol{i - 1}'] * 9)}]" for i in range(1, 10)]
    (folder / f"{NAME}{suffix}").write_text("\n".join(lines) + "\n")
    return "YAML aliases expand to more than 1,000,000 values"


KINDS: dict[str, tuple[Callable[[Path, str], str], str]] = {
    "fifo": (_fifo, ".json"),
    "device": (_device, ".json"),
    "directory": (_directory, ".toml"),
    "symlink-loop": (_loop, ".json"),
    "oversize": (_oversize, ".json"),
    "deep-json": (_deep, ".json"),
    "deep-toml": (_deep, ".toml"),
    "deep-yaml": (_deep, ".yaml"),
    "alias-bomb": (_alias_bomb, ".yaml"),
}
"""Each unreadable kind: what makes the file, and its suffix."""


def _assert_refused(result: subprocess.CompletedProcess[str], file: str, reason: str) -> None:
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert result.returncode == 2, output
    assert f"dsbuild: error: {file}: " in result.stderr and reason in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["validate", "show", "explain"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_unreadable_file_exits_2_naming_it(tmp_path: Path, kind: str, command: str) -> None:
    """Every unreadable kind is one error line naming the file and why, exit 2, for each command that reads it."""
    make, suffix = KINDS[kind]
    if kind == "device" and not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    reason = make(tmp_path, suffix)
    file = f"{NAME}{suffix}"
    _assert_refused(_dsbuild(command, file, cwd=tmp_path), file, reason)


def test_unix_socket_exits_2_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A socket named like a config is refused like any other special file."""
    monkeypatch.chdir(tmp_path)  # bind a relative name: socket paths are limited to about 100 bytes
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(f"{NAME}.json")
        for command in ("validate", "show"):
            result = _dsbuild(command, f"{NAME}.json", cwd=tmp_path)
            _assert_refused(result, f"{NAME}.json", "is a socket, expected a regular file")


def test_extends_target_goes_through_the_same_reader(tmp_path: Path) -> None:
    """A config that ``extends`` a FIFO is refused, naming the FIFO."""
    _fifo(tmp_path, ".json")
    (tmp_path / "mine.toml").write_text(f'extends = "{NAME}.json"\n')
    for command in ("validate", "show"):
        result = _dsbuild(command, "mine.toml", cwd=tmp_path)
        _assert_refused(result, f"{NAME}.json", "is a named pipe (FIFO), expected a regular file")


def test_training_file_goes_through_the_same_reader(tmp_path: Path) -> None:
    """``--training FILE`` is read like a config: a device behind it is refused, never read."""
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    _device(tmp_path, ".toml")
    result = _dsbuild("explain", "zero3", "--training", f"{NAME}.toml", cwd=tmp_path)
    _assert_refused(result, f"{NAME}.toml", "is a character device, expected a regular file")


def test_strategy_config_of_a_job_goes_through_the_same_reader(tmp_path: Path) -> None:
    """A job whose ``strategy.config`` names an alias bomb reports it under that key, naming the file."""
    pytest.importorskip("yaml")
    _alias_bomb(tmp_path, ".yaml")
    (tmp_path / "job.toml").write_text(
        '[model]\ntokenizer = "byte"\n[model.config]\nmodel_type = "llama"\nhidden_size = 64\n'
        f'[strategy]\nconfig = "{NAME}.yaml"\n'
    )
    result = _dsbuild("explain", "job.toml", cwd=tmp_path)
    assert "Traceback" not in result.stdout + result.stderr
    assert result.returncode == 2, result.stderr
    assert (
        f"strategy.config: {tmp_path / NAME}.yaml: YAML aliases expand to more than 1,000,000 values" in result.stderr
    )


def test_keys_with_control_characters_and_lone_surrogates_print_escaped(tmp_path: Path) -> None:
    """A key holding ESC, a newline or a lone surrogate is printed escaped: no crash, no colours, no forged line."""
    (tmp_path / f"{NAME}.json").write_text('{"train_batch_size": 8, "\\ud800": 1, "x\\u001b[31m\\nforged": 2}')
    for command in ("validate", "show"):
        result = _dsbuild(command, f"{NAME}.json", cwd=tmp_path)
        output = result.stdout + result.stderr
        assert "Traceback" not in output, output
        assert result.returncode in (0, 1, 2)
        assert "\x1b" not in output
        assert not any(line.startswith("forged") for line in output.splitlines())
        assert "\\ud800" in output and "x\\x1b[31m\\nforged" in output


def test_plan_with_a_count_past_float_range_is_a_usage_error(tmp_path: Path) -> None:
    """``--params 1e400`` used to overflow float arithmetic; it is refused with exit 2."""
    result = _dsbuild("plan", "--params", "1e400", cwd=tmp_path)
    assert "Traceback" not in result.stdout + result.stderr
    assert result.returncode == 2
    assert result.stderr == "dsbuild: error: params: got '1e400', expected a count up to 1e15\n"
