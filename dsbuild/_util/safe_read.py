"""Reading a file a user hands us: every way of not having its text is a ``ConfigError`` naming the file.

Only a regular file is opened (a FIFO, device, socket or directory is refused, a FIFO never waited on), at
most ``CONFIG_FILES.size`` bytes are read (``DATA_FILES`` for training data; YAML stops at
``YAML_FILES.size``), parsed data nested deeper than ``MAX_DEPTH`` is refused, JSON data too deep for a
native parser is refused before one sees it, and YAML aliases may stand for at most ``MAX_ALIAS_VALUES``
values (``io`` counts them) — never a hang, a ``RecursionError`` or memory without bound.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path
from typing import Any

import attrs

from ..errors import ConfigError, Problem

__all__ = [
    "CONFIG_FILES",
    "DATA_FILES",
    "MAX_ALIAS_VALUES",
    "MAX_DEPTH",
    "YAML_FILES",
    "SizeLimit",
    "check_json_depth",
    "check_nesting",
    "check_size",
    "count_records",
    "read_text",
    "real_path",
    "special_file",
]

KiB, MiB, GiB = 2**10, 2**20, 2**30


@attrs.frozen
class SizeLimit:
    """The most bytes ``read_text`` reads from one kind of file: a larger file is refused, the limit named."""

    size: int
    """Bytes at most."""
    files: str
    """The kind of file, as the message names it: ``"config files"``."""


CONFIG_FILES = SizeLimit(1 * MiB, "config files")
"""Config, job and training-argument files, the default of ``read_text``: real ones are a few KiB, and
tomllib (pure Python) reads about a MiB a second."""

YAML_FILES = SizeLimit(64 * KiB, "YAML files")
"""YAML config and job files, on top of ``CONFIG_FILES``: PyYAML's safe loader (pure Python) reads hostile
YAML at about 30 KiB a second."""

DATA_FILES = SizeLimit(1 * GiB, "data files")
"""JSON and JSON Lines training data, which is read whole: ``read_text(path, limit=DATA_FILES)``."""

MAX_DEPTH = 64
"""Tables and lists nested deeper than this are refused (a ds_config or job nests a few levels)."""

MAX_ALIAS_VALUES = 1_000_000
"""What YAML aliases may stand for, all together, in values: a "billion laughs" file is refused while it loads."""


def real_path(path: Path) -> Path:
    """``path`` with its symlinks resolved where they can be (the same file reached two ways compares equal); a
    symlink loop is left for ``read_text`` to report."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop, before Python 3.13
        return path.absolute()


def read_text(path: Path, *, limit: SizeLimit = CONFIG_FILES) -> str:
    """The file's text, with every way of not having one turned into a ``ConfigError``.

    Only a regular file is read (symlinks followed): anything else is refused before it is opened and
    again once it is (it may have been swapped in between); it is opened non-blocking, so a FIFO cannot
    hang the read. At most ``limit.size`` bytes are read: a larger file is refused, as is one that grows
    past the limit while it is read.
    """
    raw = _read_bytes(path, limit)
    try:
        # utf-8-sig: editors on Windows write a byte-order mark, which json and tomllib reject.
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        bad = raw[e.start : e.start + 1].hex()
        raise ConfigError(
            Problem("", f"not UTF-8 text: byte 0x{bad} at line {line}", "save the file as UTF-8"), source=str(path)
        ) from None
    if not text.strip():
        raise ConfigError("the file is empty", source=str(path))
    return text


# O_NONBLOCK: opening a FIFO that no one writes to returns at once (fstat then refuses it).
# O_NOCTTY: a terminal swapped in between stat and open does not become ours.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)

_NOT_REGULAR: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _read_bytes(path: Path, limit: SizeLimit) -> bytes:
    source = str(path)
    try:
        _check_regular(os.stat(path).st_mode, source)
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        raise _unreadable(e, source) from None
    try:
        info = os.fstat(fd)
        _check_regular(info.st_mode, source)
        check_size(info.st_size, limit, source)
        chunks: list[bytes] = []
        left = limit.size + 1  # one byte more than allowed tells a file that grew while we read it
        while left > 0:
            chunk = os.read(fd, min(left, MiB))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as e:
        raise _unreadable(e, source) from None
    finally:
        os.close(fd)
    if left <= 0:
        raise _too_large(f"the file grew past {_amount(limit.size)} while it was read", limit, source)
    return b"".join(chunks)


def _check_regular(mode: int, source: str) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise ConfigError("is a directory, expected a file", source=source)
    raise ConfigError(f"is {_kind(mode)}, expected a regular file", source=source)


def _kind(mode: int) -> str:
    return next((name for test, name in _NOT_REGULAR if test(mode)), "not a regular file")


def special_file(path: Path) -> str | None:
    """What ``path`` is when it is there but neither a regular file nor a directory (``"a named pipe (FIFO)"``,
    a device, a socket, ``"a symlink loop"``); ``None`` for files, directories and what is not there."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return "a symlink loop" if e.errno == errno.ELOOP else None
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else _kind(mode)


def _unreadable(e: OSError, source: str) -> ConfigError:
    if isinstance(e, FileNotFoundError):
        return ConfigError("no such file", source=source)
    if isinstance(e, IsADirectoryError):
        return ConfigError("is a directory, expected a file", source=source)
    if isinstance(e, PermissionError):
        return ConfigError("cannot read the file: permission denied", source=source)
    if e.errno == errno.ELOOP:
        return ConfigError("is a symlink loop, expected a regular file", source=source)
    return ConfigError(f"cannot read the file: {e.strerror or e}", source=source)


def check_size(size: int, limit: SizeLimit, source: str) -> None:
    """Refuse ``size`` bytes of one file over ``limit``, naming the limit."""
    if size > limit.size:
        raise _too_large(f"the file is {_amount(size)}", limit, source)


def _too_large(what: str, limit: SizeLimit, source: str) -> ConfigError:
    return ConfigError(f"{what}; {limit.files} over {_amount(limit.size)} are refused", source=source)


def _amount(n: int) -> str:
    """Bytes as people read them: ``16 MiB``, ``20.5 MiB``, ``300 bytes``."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit:
            return f"{n // unit} {name}" if n % unit == 0 else f"{n / unit:.1f} {name}"
    return f"{n} bytes"


_Trail = tuple[Any, bool, "_Trail"] | None
"""Where a value sits: its key, whether that is a list index, and its parent's trail (``None`` at the top)."""

_NESTED = (dict, list)


def check_nesting(data: Any, source: str) -> None:
    """Refuse dicts and lists (what the parsers make) nested deeper than ``MAX_DEPTH``, naming the dotted key.

    Level by level, never recursing: the data may be deeper than Python's stack (and, from YAML, hold itself).
    """
    level = [data] if isinstance(data, _NESTED) else []
    for _ in range(MAX_DEPTH):
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v) if isinstance(c, _NESTED)]
        if not level:
            return
    raise ConfigError(Problem(_too_deep_at(data), f"nested deeper than {MAX_DEPTH} levels"), source=source)


_JSON_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def check_json_depth(path: Path) -> None:
    """Refuse a JSON or JSON Lines file nested deeper than ``MAX_DEPTH``, naming its line, before a parser sees it.

    pyarrow's JSON reader (under ``datasets``) ends the process on deep nesting and Python's runs out of stack, so
    the brackets outside strings are counted first, a chunk of lines at a time (a JSON string never spans lines).
    """
    depth = 0
    number = 0
    with open(path, "rb") as f:
        while lines := f.readlines(4 * MiB):
            deepest, end = _depths(b"".join(lines), depth)
            if deepest > MAX_DEPTH:
                for line in lines:  # which line: the chunk again, line by line
                    number += 1
                    deepest, depth = _depths(line, depth)
                    if deepest > MAX_DEPTH:
                        raise ConfigError(
                            Problem("", f"line {number}: nested deeper than {MAX_DEPTH} levels"), source=str(path)
                        )
            number += len(lines)
            depth = end


def _depths(chunk: bytes, depth: int) -> tuple[int, int]:
    """The deepest level reached in ``chunk`` starting at ``depth``, and the level at its end."""
    brackets = _JSON_STRING.sub(b"", chunk).translate(None, _NOT_BRACKETS)
    levels = list(accumulate(map(_STEP.__getitem__, brackets), initial=depth))
    return max(levels), levels[-1]


def _too_deep_at(data: Any) -> str:
    """The dotted key of the first value ``MAX_DEPTH`` levels down (``check_nesting`` found one)."""
    # Each entry: a value, its depth, and its trail (key, is a list index, parent's trail).
    stack: list[tuple[Any, int, _Trail]] = [(data, 1, None)]
    while stack:
        value, depth, trail = stack.pop()
        if depth > MAX_DEPTH:
            return _dotted(trail)
        index = isinstance(value, list)
        for key, child in enumerate(value) if index else value.items():
            if isinstance(child, _NESTED):
                stack.append((child, depth + 1, (key, index, trail)))
    return ""


def _dotted(trail: _Trail) -> str:
    """``a.b[0].c`` from a trail."""
    parts: list[str] = []
    while trail is not None:
        key, index, trail = trail
        parts.append(f"[{key}]" if index else f".{key}")
    return "".join(reversed(parts)).lstrip(".")


def count_records(path: str | Path) -> int | None:
    """How many records a JSON array or JSON Lines data file holds (non-blank lines); ``None`` if it cannot tell."""
    try:
        text = read_text(Path(path), limit=DATA_FILES)
    except ConfigError:
        return None
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python's stack
            return None
        return len(data) if isinstance(data, list) else None
    return sum(1 for line in text.splitlines() if line.strip())
