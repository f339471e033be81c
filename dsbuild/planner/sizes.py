"""Sizes and counts as people write them: ``80GiB`` and ``80GB`` (not the same), ``7B``, ``1.5e9``."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from ..errors import InvalidValueError, Problem

__all__ = [
    "MAX_COUNT",
    "MAX_SIZE",
    "GiB",
    "bad",
    "count_text",
    "decimal_unit",
    "gib",
    "parse_count",
    "parse_headroom",
    "parse_size",
]

GiB = 2**30

MAX_COUNT = 10**15
"""The largest count taken (a thousand trillion parameters): larger ones are typos, and overflow float arithmetic."""

MAX_SIZE = 2**60
"""The largest size taken (1 EiB): larger ones are typos, and overflow float arithmetic."""


_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?"


_SIZE_RE = re.compile(rf"^\s*{_NUMBER}\s*(?:([kmgt])(i?)b?|(b))?\s*$", re.IGNORECASE)


_COUNT_RE = re.compile(rf"^\s*{_NUMBER}\s*([kmbgt]?)\s*$", re.IGNORECASE)


_BINARY_UNITS = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


_DECIMAL_UNITS = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


_SIZE_EXPECTED = "a size such as '80GiB', '80GB', '512MiB' or '1024B'"


_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def _decimal(mantissa: str, exponent: str | None) -> Decimal:
    value = Decimal(mantissa)
    if not exponent:
        return value
    # Past 1e±9999 a value is 0 or far over every limit; Decimal could not scale it (nor int() parse the digits).
    digits = exponent.lstrip("+-").lstrip("0")
    power = int(exponent) if len(digits) <= 4 else -9999 if exponent.startswith("-") else 9999
    return value.scaleb(power)


def parse_size(text: str | int | float, name: str = "size") -> int:
    """Bytes in ``"80GiB"``, ``"80GB"``, ``"512MiB"``, ``"1.5T"``, ``"1024B"``; a Python number is bytes.

    ``KiB``/``MiB``/``GiB``/``TiB`` (or ``Ki``...) are binary, 2**10 to 2**40;
    ``KB``/``MB``/``GB``/``TB`` (or ``K``...) are decimal, 10**3 to 10**12,
    as the SI and the IEC define them (and Kubernetes reads them). A number
    in text needs its unit: ``"24"`` could mean bytes or GiB, so it is refused
    (``"0"`` is zero in any unit). At most 1 EiB. ``name`` is the argument the
    text came from, for the error message.
    """
    if isinstance(text, bool):
        raise bad(name, text, _SIZE_EXPECTED)
    if isinstance(text, int | float):
        if (isinstance(text, float) and not math.isfinite(text)) or text < 0:  # an int past float range is fine
            raise bad(name, text, _SIZE_EXPECTED)
        return _at_most(text, MAX_SIZE, name, text, "a size up to 1 EiB")
    match = _SIZE_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise bad(name, text, _SIZE_EXPECTED)
    mantissa, exponent, unit, binary, plain_bytes = match.groups()
    try:
        value = _decimal(mantissa, exponent)
    except InvalidOperation:
        raise bad(name, text, _SIZE_EXPECTED) from None
    if unit is None and plain_bytes is None and value != 0:
        number = text.strip()
        raise bad(
            name, text, f"a unit: {number + 'GiB'!r} (2**30 bytes), {number + 'GB'!r} (10**9) or {number + 'B'!r}"
        )
    if unit is not None:
        value *= (_BINARY_UNITS if binary else _DECIMAL_UNITS)[unit.lower()]
    return _at_most(value, MAX_SIZE, name, text, "a size up to 1 EiB")


def decimal_unit(text: object) -> bool:
    """Whether ``text`` is a size in decimal units (``"80GB"``, ``"80G"``), which a GPU's "80GB" is not."""
    match = _SIZE_RE.match(text) if isinstance(text, str) else None
    return match is not None and match.group(3) is not None and not match.group(4)


_HEADROOM_EXPECTED = "a size with its unit, a percent of the GPU or both, such as '2GiB', '10%' or '2GiB+10%'"


_PERCENT_RE = re.compile(rf"^\s*{_NUMBER}\s*%\s*$")


def parse_headroom(text: str | int | float, name: str = "headroom") -> tuple[int, float]:
    """(bytes, percent of the GPU) in ``"2GiB+10%"``, ``"3GiB"``, ``"15%"`` or ``"0"``; a Python number is bytes.

    The size is read by ``parse_size``; the percent is below 100.
    """
    if not isinstance(text, str):
        return parse_size(text, name), 0.0
    sizes: list[str] = []
    percents: list[re.Match[str]] = []
    for part in text.split("+"):
        match = _PERCENT_RE.match(part)
        if match is None:
            sizes.append(part)
        else:
            percents.append(match)
    if len(sizes) > 1 or len(percents) > 1:
        raise bad(name, text, _HEADROOM_EXPECTED)
    try:
        size = parse_size(sizes[0], name) if sizes else 0
    except InvalidValueError:
        raise bad(name, text, _HEADROOM_EXPECTED) from None
    percent = _decimal(*percents[0].groups()) if percents else Decimal(0)
    if percent >= 100:
        raise bad(name, text, "a percent of the GPU below 100%")
    return size, float(percent)


def parse_count(text: str | int | float, name: str = "params") -> int:
    """A count in ``"7B"``, ``"1.5B"``, ``"350M"``, ``"70k"``, ``"1T"``, ``"7e9"`` or a plain number.

    ``K``/``M``/``B`` (or ``G``)/``T`` are 10**3/10**6/10**9/10**12, as model
    sizes are named.
    """
    if isinstance(text, bool):
        raise bad(name, text, "a count such as '7B', '1.5B', '350M' or a number")
    if isinstance(text, int | float):
        if (isinstance(text, float) and not math.isfinite(text)) or text < 0:  # an int past float range is fine
            raise bad(name, text, "a count such as '7B', '1.5B', '350M' or a number")
        return _at_most(round(text), MAX_COUNT, name, text, "a count up to 1e15")
    match = _COUNT_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise bad(name, text, "a count such as '7B', '1.5B', '350M' or a number")
    mantissa, exponent, unit = match.groups()
    value = _decimal(mantissa, exponent) * _COUNT_UNITS[unit.lower()]
    return _at_most(value.to_integral_value(), MAX_COUNT, name, text, "a count up to 1e15")


def _at_most(value: Decimal | int | float, limit: int, name: str, text: object, expected: str) -> int:
    """``value`` as an int, or an error when it is over ``limit`` (checked before converting: 1e400 is exact)."""
    if value > limit:
        raise bad(name, text, expected)
    return int(value)


def bad(name: str, value: object, expected: str) -> InvalidValueError:
    return InvalidValueError(Problem(name, f"got {value!r}, expected {expected}"))


def gib(n: int | float) -> str:
    """Bytes as GiB with 2 decimals: ``"1.50 GiB"``."""
    return f"{n / GiB:.2f} GiB"


def count_text(n: int) -> str:
    """A parameter count as people write it: ``6.74B``, ``4.19M``."""
    for unit, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)
