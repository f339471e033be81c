"""Sizes and counts as people write them: ``80GiB`` and ``80GB`` (not the same), ``7B``, ``1.5e9``."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from ..errors import InvalidValueError, Problem

__all__ = ["GiB", "bad", "gib", "parse_count", "parse_size"]

GiB = 2**30


_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?"


_SIZE_RE = re.compile(rf"^\s*{_NUMBER}\s*(?:([kmgt])(i?)b?|b?)\s*$", re.IGNORECASE)


_COUNT_RE = re.compile(rf"^\s*{_NUMBER}\s*([kmbgt]?)\s*$", re.IGNORECASE)


_SIZE_UNITS = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def _decimal(mantissa: str, exponent: str | None) -> Decimal:
    value = Decimal(mantissa)
    return value.scaleb(int(exponent)) if exponent else value


def parse_size(text: str | int | float, name: str = "size") -> int:
    """Bytes in ``"80GiB"``, ``"80GB"``, ``"512MiB"``, ``"1.5T"``, ``"24g"`` or a plain number of bytes.

    Units are binary whether or not they carry the ``i`` (``GB`` = ``GiB`` =
    2**30), as GPU memory is sized and as DeepSpeed's estimator prints it.
    ``name`` is the argument the text came from, for the error message.
    """
    if isinstance(text, bool):
        raise bad(name, text, "a size such as '80GiB', '512MiB' or a number of bytes")
    if isinstance(text, int | float):
        if not math.isfinite(text) or text < 0:
            raise bad(name, text, "a size such as '80GiB', '512MiB' or a number of bytes")
        return int(text)
    match = _SIZE_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise bad(name, text, "a size such as '80GiB', '512MiB' or a number of bytes")
    mantissa, exponent, unit, _binary = match.groups()
    try:
        value = _decimal(mantissa, exponent) * _SIZE_UNITS.get((unit or "").lower(), 1)
    except InvalidOperation:
        raise bad(name, text, "a size such as '80GiB', '512MiB' or a number of bytes") from None
    return int(value.to_integral_value())


def parse_count(text: str | int | float, name: str = "params") -> int:
    """A count in ``"7B"``, ``"1.5B"``, ``"350M"``, ``"70k"``, ``"1T"``, ``"7e9"`` or a plain number.

    ``K``/``M``/``B`` (or ``G``)/``T`` are 10**3/10**6/10**9/10**12, as model
    sizes are named.
    """
    if isinstance(text, bool):
        raise bad(name, text, "a count such as '7B', '1.5B', '350M' or a number")
    if isinstance(text, int | float):
        if not math.isfinite(text) or text < 0:
            raise bad(name, text, "a count such as '7B', '1.5B', '350M' or a number")
        return round(text)
    match = _COUNT_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise bad(name, text, "a count such as '7B', '1.5B', '350M' or a number")
    mantissa, exponent, unit = match.groups()
    value = _decimal(mantissa, exponent) * _COUNT_UNITS[unit.lower()]
    return int(value.to_integral_value())


def bad(name: str, value: object, expected: str) -> InvalidValueError:
    return InvalidValueError(Problem(name, f"got {value!r}, expected {expected}"))


def gib(n: int | float) -> str:
    """Bytes as GiB with 2 decimals: ``\"1.50 GiB\"``."""
    return f"{n / GiB:.2f} GiB"
