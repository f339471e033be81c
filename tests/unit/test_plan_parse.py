"""dsbuild.planner: parse_size, parse_headroom and parse_count, what they read and what they refuse."""

from __future__ import annotations

from typing import Any

import pytest
from _plan_helpers import GiB

from dsbuild import InvalidValueError
from dsbuild.planner import parse_count, parse_headroom, parse_size

# -- parse_size / parse_count -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * GiB),
        ("80Gi", 80 * GiB),
        ("80 GiB", 80 * GiB),
        ("81920MiB", 80 * GiB),
        ("512MiB", 512 * 2**20),
        ("1.5TiB", 3 * 2**39),
        ("1KiB", 1024),
        ("0.5GiB", GiB // 2),
        ("80GB", 80 * 10**9),
        ("80G", 80 * 10**9),
        ("24g", 24 * 10**9),
        ("512MB", 512 * 10**6),
        ("2T", 2 * 10**12),
        ("1K", 1000),
        ("1kB", 1000),
        ("1073741824B", GiB),
        ("1e3B", 1000),
        ("0", 0),
        ("0B", 0),
        (4096, 4096),
        (1.5 * GiB, 3 * GiB // 2),
    ],
)
def test_parse_size_tells_gb_from_gib(text: Any, expected: int) -> None:
    """GiB/MiB (or Gi/Mi) are binary, GB/MB (or G/M) decimal; B is bytes, and so is a Python number."""
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "80XB", "-1GiB", "80 GiBs", "1.2.3G", True, -5, float("nan")])
def test_parse_size_rejects_what_is_not_a_size(text: Any) -> None:
    """A bad size fails naming the argument and an example of what is expected."""
    with pytest.raises(InvalidValueError) as info:
        parse_size(text, "gpu_memory")
    assert str(info.value) == f"gpu_memory: got {text!r}, expected a size such as '80GiB', '80GB', '512MiB' or '1024B'"


@pytest.mark.parametrize("text", ["24", "1073741824", "1e3", " 80 "])
def test_parse_size_refuses_a_number_without_its_unit(text: str) -> None:
    """'24' could be bytes or GiB: the error offers both spellings (and B), never guesses."""
    number = text.strip()
    with pytest.raises(InvalidValueError) as info:
        parse_size(text, "gpu_memory")
    assert str(info.value) == (
        f"gpu_memory: got {text!r}, expected a unit: '{number}GiB' (2**30 bytes), '{number}GB' (10**9) or '{number}B'"
    )


def test_parse_size_takes_no_unit_past_tib() -> None:
    """An exabyte unit is not one of the units sizes are written in (TiB and TB are the largest)."""
    with pytest.raises(InvalidValueError, match=r"^gpu_memory: got '2EiB', expected a size such as"):
        parse_size("2EiB", "gpu_memory")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB+10%", (2 * GiB, 10.0)),
        ("2GiB + 10%", (2 * GiB, 10.0)),
        ("10%+2GiB", (2 * GiB, 10.0)),
        ("3GiB", (3 * GiB, 0.0)),
        ("12.5%", (0, 12.5)),
        ("0", (0, 0.0)),
        ("0%", (0, 0.0)),
        (GiB, (GiB, 0.0)),
    ],
)
def test_parse_headroom_reads_a_size_a_percent_or_both(text: Any, expected: tuple[int, float]) -> None:
    """The headroom is bytes, a percent of the GPU, or their sum; a Python number is bytes."""
    assert parse_headroom(text) == expected


@pytest.mark.parametrize("text", ["", "2GiB+3GiB", "10%+5%", "2", "-1%", "2GiB+", "ten%"])
def test_parse_headroom_rejects_what_is_not_a_headroom(text: str) -> None:
    """A bad headroom fails naming what is expected."""
    with pytest.raises(InvalidValueError) as info:
        parse_headroom(text)
    assert str(info.value) == (
        f"headroom: got {text!r}, expected a size with its unit, a percent of the GPU or both, "
        "such as '2GiB', '10%' or '2GiB+10%'"
    )
    with pytest.raises(InvalidValueError, match=r"^headroom: got '100%', expected a percent of the GPU below 100%$"):
        parse_headroom("100%")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7B", 7_000_000_000),
        ("7b", 7_000_000_000),
        ("1.5B", 1_500_000_000),
        ("350M", 350_000_000),
        ("70k", 70_000),
        ("1T", 10**12),
        ("1.1T", 1_100_000_000_000),
        ("7G", 7_000_000_000),
        ("7e9", 7_000_000_000),
        ("6738415616", 6_738_415_616),
        (7e9, 7_000_000_000),
        (123, 123),
    ],
)
def test_parse_count_reads_decimal_suffixes(text: Any, expected: int) -> None:
    """Model sizes are decimal: 7B is 7e9, decimals exact (no float rounding)."""
    assert parse_count(text) == expected


@pytest.mark.parametrize("text", ["", "B", "7 billion", "7BB", "-7B", "7GiB", False])
def test_parse_count_rejects_what_is_not_a_count(text: Any) -> None:
    """A bad count fails naming the argument."""
    with pytest.raises(InvalidValueError) as info:
        parse_count(text)
    assert str(info.value) == f"params: got {text!r}, expected a count such as '7B', '1.5B', '350M' or a number"


@pytest.mark.parametrize("text", ["1e400", "1001T", "1e999999999", "1e" + "9" * 5000, 1e300, 10**400])
def test_parse_count_refuses_counts_past_1e15(text: Any) -> None:
    """A count past 1e15 is a typo that would overflow float arithmetic later: refused, naming the argument."""
    with pytest.raises(InvalidValueError) as info:
        parse_count(text)
    assert str(info.value) == f"params: got {text!r}, expected a count up to 1e15"


@pytest.mark.parametrize(
    "text", ["1e400GiB", "2000000TiB", "1e" + "9" * 5000 + "GiB", "1e99999999999999999999B", 1e300, 2**61, 10**400]
)
def test_parse_size_refuses_sizes_past_1_eib(text: Any) -> None:
    """A size past 1 EiB is a typo that would overflow float arithmetic later: refused, naming the argument."""
    with pytest.raises(InvalidValueError) as info:
        parse_size(text, "gpu_memory")
    assert str(info.value) == f"gpu_memory: got {text!r}, expected a size up to 1 EiB"
