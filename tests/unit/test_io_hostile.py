"""dsbuild._util.safe_read: files unsafe to read (special files, size and nesting limits, YAML bombs) refused."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
from _io_helpers import _error, _write, load

from dsbuild import ConfigError
from dsbuild._util.safe_read import CONFIG_FILES, DATA_FILES, MAX_DEPTH, SizeLimit, count_records, read_text
from dsbuild.io.config_files import read_table

# -- reading: files that are not safe to read ----------------------------------------

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX special files")


@contextlib.contextmanager
def _within(seconds: float) -> Iterator[None]:
    """Fail the test, rather than hang it, when the block takes longer than ``seconds``."""

    def timeout(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, timeout)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@posix_only
def test_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    """A named pipe no one writes to would block a plain open() forever; it is refused at once."""
    path = tmp_path / "ds.json"
    os.mkfifo(path)
    with _within(10):
        assert str(_error(load, path)) == f"{path}: is a named pipe (FIFO), expected a regular file"


@posix_only
def test_symlink_to_a_device_is_refused_before_reading(tmp_path: Path) -> None:
    """A .json link to /dev/zero would be read forever; the device is refused before it is opened."""
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    path = tmp_path / "ds.json"
    path.symlink_to("/dev/zero")
    with _within(10):
        assert str(_error(load, path)) == f"{path}: is a character device, expected a regular file"


@posix_only
def test_unix_socket_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A socket named like a config is not one."""
    monkeypatch.chdir(tmp_path)  # a relative name: socket paths are limited to about 100 bytes
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("ds.toml")
        assert str(_error(load, Path("ds.toml"))) == "ds.toml: is a socket, expected a regular file"


@posix_only
@pytest.mark.parametrize("links", [["ds.json"], ["ds.json", "other.json"]])
def test_symlink_loop_is_refused(tmp_path: Path, links: list[str]) -> None:
    """A link that never reaches a file (to itself, or through another) is named as a loop."""
    for name, target in zip(links, links[1:] + links[:1], strict=True):
        (tmp_path / name).symlink_to(target)
    path = tmp_path / "ds.json"
    assert str(_error(load, path)) == f"{path}: is a symlink loop, expected a regular file"


@posix_only
def test_extends_target_that_is_not_a_regular_file_names_the_target(tmp_path: Path) -> None:
    """``extends`` goes through the same reader: a FIFO parent is refused, and the parent is named."""
    parent = tmp_path / "base.json"
    os.mkfifo(parent)
    path = _write(tmp_path / "mine.toml", 'extends = "base.json"\n')
    with _within(10):
        assert str(_error(load, path)) == f"{parent}: is a named pipe (FIFO), expected a regular file"


def test_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    """A config file larger than CONFIG_FILES is refused by its size, before it is read."""
    path = tmp_path / "ds.json"
    with path.open("wb") as f:
        f.truncate(20 * 2**20)  # sparse: no disk used
    assert CONFIG_FILES.size == 2**20
    assert str(_error(load, path)) == f"{path}: the file is 20 MiB; config files over 1 MiB are refused"


def test_read_text_takes_the_limit_of_the_kind_of_file(tmp_path: Path) -> None:
    """Data files have a larger limit of their own, given to the one reader as a keyword."""
    path = _write(tmp_path / "data.jsonl", "x" * 101)
    err = _error(functools.partial(read_text, limit=SizeLimit(100, "data files")), path)
    assert str(err) == f"{path}: the file is 101 bytes; data files over 100 bytes are refused"
    assert read_text(path, limit=DATA_FILES) == "x" * 101
    assert DATA_FILES.size > CONFIG_FILES.size


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="Linux /proc")
def test_a_file_that_reads_longer_than_its_size_is_cut_at_the_limit() -> None:
    """A file whose size says 0 but that keeps giving bytes (/proc, a growing log) is read to the limit, no further."""
    path = Path("/proc/self/maps")
    err = _error(functools.partial(read_text, limit=SizeLimit(100, "config files")), path)
    assert (
        str(err) == f"{path}: the file grew past 100 bytes while it was read; config files over 100 bytes are refused"
    )


_NESTED = {
    ".json": lambda n: '{"a": ' * n + "1" + "}" * n,
    ".toml": lambda n: "a = " + "{a = " * (n - 1) + "1" + "}" * (n - 1),
    ".yaml": lambda n: "a: " + "{a: " * (n - 1) + "1" + "}" * (n - 1),
}
"""Tables ``n`` levels deep in all, the top one included, each under key ``a``."""


@pytest.mark.parametrize("suffix", [".json", ".toml", ".yaml"])
def test_nesting_deeper_than_the_limit_names_the_key(tmp_path: Path, suffix: str) -> None:
    """Tables 65 levels deep are refused at the dotted key of the 65th; 64 levels are read."""
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    path = _write(tmp_path / f"ds{suffix}", _NESTED[suffix](MAX_DEPTH + 1))
    assert str(_error(load, path)) == f"{path}: {'.'.join(['a'] * MAX_DEPTH)}: nested deeper than 64 levels"
    path = _write(tmp_path / f"ds{suffix}", _NESTED[suffix](MAX_DEPTH))
    assert "nested deeper" not in str(_error(load, path))  # read; refused only as a ds_config


@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        (".json", "[" * 100_000),
        (".json", '{"a": ' * 100_000),
        (".toml", "a = " + "[" * 100_000),
        (".toml", "a = " + "{b = " * 100_000),
        (".toml", ".".join(["a"] * 100_000) + " = 1"),
        (".yaml", "a: " + "[" * 60_000),  # under YAML_FILES
        (".yaml", "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 100))),
    ],
)
def test_nesting_past_any_stack_is_a_config_error(tmp_path: Path, suffix: str, text: str) -> None:
    """Nesting too deep for the parser's recursion is reported as nesting, never as a RecursionError."""
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    path = _write(tmp_path / f"ds{suffix}", text)
    err = _error(load, path)
    assert err.source == str(path)
    where = r"( at line \d+(, column \d+)?)?"
    assert re.fullmatch(rf"(.*: )?nested deeper than 64 levels{where}", str(err).split(": ", 1)[1])


def _billion_laughs() -> str:
    lines = ['lol0: &lol0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):
        lines.append(f"lol{i}: &lol{i} [{', '.join([f'*lol{i - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    """The 9-level "billion laughs" document is refused while it loads, well under a second."""
    pytest.importorskip("yaml")
    path = _write(tmp_path / "ds.yaml", _billion_laughs())
    start = time.monotonic()
    err = _error(load, path)
    assert time.monotonic() - start < 1.0
    assert str(err) == f"{path}: YAML aliases expand to more than 1,000,000 values (write the values out)"


def test_yaml_merge_key_bomb_is_refused(tmp_path: Path) -> None:
    """Merge keys (``<<``) that merge the mapping before nine times, nine times over, are counted like aliases."""
    pytest.importorskip("yaml")
    lines = ["m0: &m0 {a: 1, b: 2}"]
    lines += [f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 9)}], k{i}: 1}}" for i in range(1, 10)]
    path = _write(tmp_path / "ds.yaml", "\n".join(lines))
    assert (
        str(_error(load, path)) == f"{path}: YAML aliases expand to more than 1,000,000 values (write the values out)"
    )


def test_yaml_value_holding_itself_is_refused_as_nesting(tmp_path: Path) -> None:
    """``&a [*a]`` loads as a list inside itself: infinitely deep, so refused by the depth limit."""
    pytest.importorskip("yaml")
    path = _write(tmp_path / "ds.yaml", "a: &a [*a]\n")
    assert str(_error(load, path)) == f"{path}: a{'[0]' * (MAX_DEPTH - 1)}: nested deeper than 64 levels"


def test_yaml_aliases_within_the_budget_are_read(tmp_path: Path) -> None:
    """An anchor used a few times, as people use them, is fine."""
    pytest.importorskip("yaml")
    text = (
        "optimizer: {type: AdamW, params: {lr: &lr 0.001}}\nscheduler: {type: WarmupLR, params: {warmup_max_lr: *lr}}\n"
    )
    path = _write(tmp_path / "ds.yaml", text)
    assert load(path).to_dict()["scheduler"]["params"]["warmup_max_lr"] == 0.001


def test_large_yaml_is_refused_by_its_own_limit(tmp_path: Path) -> None:
    """PyYAML reads slowly, so YAML has a smaller limit than JSON and TOML."""
    pytest.importorskip("yaml")
    path = _write(tmp_path / "ds.yaml", ("# " + "x" * 1022 + "\n") * 200 + "train_batch_size: 8\n")
    assert str(_error(load, path)) == f"{path}: the file is 200.2 KiB; YAML files over 64 KiB are refused"


@pytest.mark.parametrize(
    ("suffix", "text", "reason"),
    [
        (".json", '{"a": ' + "9" * 5000 + "}", "invalid JSON"),
        (".toml", "a = " + "9" * 5000, "invalid TOML"),
        (".yaml", "a: " + "9" * 5000, "invalid YAML"),
    ],
)
def test_number_of_thousands_of_digits_is_a_config_error(tmp_path: Path, suffix: str, text: str, reason: str) -> None:
    """Python refuses to convert integers of over 4300 digits; that is the file's fault, said as such."""
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    path = _write(tmp_path / f"ds{suffix}", text)
    assert str(_error(load, path)) == (
        f"{path}: {reason}: Exceeds the limit (4300 digits) for integer string conversion: value has 5000 digits"
    )


def test_lone_surrogate_key_is_an_unknown_key_naming_the_file(tmp_path: Path) -> None:
    """A JSON key "\\ud800" is kept as written and reported as any unknown key is."""
    path = _write(tmp_path / "ds.json", '{"\\ud800": 1}')
    err = _error(load, path)
    assert err.source == str(path)
    assert [p.path for p in err.problems] == ["\ud800"]


@posix_only
def test_count_records_of_a_device_cannot_tell(tmp_path: Path) -> None:
    """Counting records reads through the same reader: a device or a FIFO is not read (a FIFO would wait for a
    writer forever), and counts as unknown."""
    assert count_records(Path(os.devnull)) is None
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    with _within(5):
        assert count_records(fifo) is None
        with pytest.raises(ConfigError, match="is a named pipe"):
            read_text(fifo, limit=DATA_FILES)


def test_count_records_of_deeply_nested_json_is_none(tmp_path: Path) -> None:
    """A JSON array nested past Python's stack is not counted, and does not crash the count."""
    path = _write(tmp_path / "data.json", "[" * 100_000 + "]" * 100_000)
    assert count_records(path) is None


@pytest.mark.parametrize(("suffix", "text"), [(".json", "1"), (".json", "null"), (".yaml", "!"), (".yaml", "just")])
def test_scalar_at_the_top_is_refused_after_the_nesting_check(tmp_path: Path, suffix: str, text: str) -> None:
    """The depth check takes any parsed value: a scalar document reaches the "top level" message."""
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    path = _write(tmp_path / f"ds{suffix}", text)
    assert "the top level is" in str(_error(load, path))


def test_read_table_parses_by_suffix_with_the_same_limits(tmp_path: Path) -> None:
    """The raw table of any file the user names (a job, training arguments) goes through the same checks."""
    path = _write(tmp_path / "t.toml", "[training]\nlearning_rate = 1e-5\n")
    assert read_table(path) == {"training": {"learning_rate": 1e-5}}
    deep = _write(tmp_path / "deep.json", _NESTED[".json"](MAX_DEPTH + 1))
    assert str(_error(read_table, deep)).endswith(": nested deeper than 64 levels")
