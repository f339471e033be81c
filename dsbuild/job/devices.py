"""``launch.device_mapping``: device ids from a list or ROLL's text forms, parsed and never evaluated."""

from __future__ import annotations

import re
from typing import Any

from ..config.fields import describe
from ..errors import ConfigError, Problem

__all__ = ["MAX_DEVICES", "parse_device_mapping"]

MAX_DEVICES = 65536
"""The most device ids a mapping may name: counted before any list is made, so ``"0-99999999999"`` is an error,
not a list that fills memory."""

_INT = r"\s*(\d{1,18})\s*"


_RANGE_ARGS = rf"{_INT}(?:,{_INT}(?:,{_INT})?)?"


_RANGE = re.compile(rf"(?:list\s*\(\s*range\s*\({_RANGE_ARGS}\)\s*\)|range\s*\({_RANGE_ARGS}\))")


_SPAN = re.compile(r"\s*(\d{1,18})\s*(?:-\s*(\d{1,18})\s*)?")


def parse_device_mapping(value: Any) -> tuple[int, ...]:
    """Device ids from a list, ``"0-15"``, ``"0,1,2"``, ``"0-3,8-11"``, ``"[0, 1]"`` or ``"list(range(0,16))"``.

    Text is matched against these forms only; nothing is ever evaluated, and the ids are counted before they are
    listed (at most ``MAX_DEVICES``). Raises ``ConfigError`` for anything else, for duplicates and for an empty
    mapping.
    """
    expected = 'expected a list of device ids, "0-15", "0,1,2" or "list(range(0,16))"'
    ids: list[int]
    if isinstance(value, (list, tuple)):
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value):
            raise ConfigError(Problem("", f"got {describe(value)}, expected non-negative integers"))
        _bounded(len(value))
        ids = list(value)
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        ids = [value]
    elif isinstance(value, str):
        parsed = _parse_mapping_text(value)
        if parsed is None:
            shown = value if len(value) <= 60 else value[:57] + "..."
            raise ConfigError(Problem("", f"cannot read {shown!r}: {expected}"))
        ids = parsed
    else:
        raise ConfigError(Problem("", f"got {describe(value)}, {expected}"))
    if not ids:
        raise ConfigError(Problem("", "empty: list at least one device"))
    seen: set[int] = set()
    twice = sorted({x for x in ids if x in seen or seen.add(x)})  # type: ignore[func-returns-value]
    if twice:
        raise ConfigError(Problem("", f"device {', '.join(map(str, twice))} listed twice"))
    return tuple(ids)


def _parse_mapping_text(text: str) -> list[int] | None:
    text = text.strip()
    match = _RANGE.fullmatch(text)
    if match is not None:
        numbers = [int(g) for g in match.groups() if g is not None]
        if len(numbers) == 1:
            numbers = [0, numbers[0]]
        start, stop, step = numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else 1
        if step == 0:
            return None
        ids = range(start, stop, step)
        _bounded(len(ids))  # a range's length is known without listing it
        return list(ids)
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    spans: list[range] = []
    for part in text.split(","):
        span = _SPAN.fullmatch(part)
        if span is None:
            return None
        first = int(span.group(1))
        last = int(span.group(2)) if span.group(2) is not None else first
        if last < first:
            return None
        spans.append(range(first, last + 1))
    _bounded(sum(len(span) for span in spans))
    return [i for span in spans for i in span]


def _bounded(count: int) -> None:
    if count > MAX_DEVICES:
        raise ConfigError(Problem("", f"names {count} devices; at most {MAX_DEVICES} are supported"))
