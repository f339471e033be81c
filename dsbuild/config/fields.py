"""Field declarations shared by every config section.

A section field says what kind of value it holds (``int``, ``float``, ``bool``,
``str``, one of a set of strings, a list of strings, a nested section, a free
JSON mapping). The same declaration drives the attrs validator (so a bad value
fails where it is set) and the converter (which knows, for instance, that
``5e8`` read from a file is an integer field's ``500000000``).

``None`` is "not set": DeepSpeed's default applies and nothing is written.
``AUTO`` is "fill from the run" and is written ``"auto"``.

``coerce`` is the one reading policy: the builder, the converter (files),
``Training`` and job files all turn what they are given into a field's value
with it, then ``check_value`` says whether it fits.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import attrs

from ..errors import InvalidValueError, Problem

__all__ = [
    "AUTO",
    "Auto",
    "Spec",
    "check_value",
    "coerce",
    "describe",
    "key_of",
    "plain_json",
    "section_class",
    "spec_of",
    "unusual",
]


class _AutoType(enum.Enum):
    AUTO = "auto"

    def __repr__(self) -> str:
        return "AUTO"

    def __str__(self) -> str:
        return "auto"


AUTO: Final = _AutoType.AUTO
"""The one sentinel: "fill this value from the run" (written ``"auto"``, as the HF Trainer expects)."""

Auto = Literal[_AutoType.AUTO]
"""The type of ``AUTO``, for annotations: ``int | Auto | None``."""

Kind = Literal["int", "float", "bool", "str", "choice", "strs", "pair", "section", "mapping", "json"]


@attrs.frozen
class Spec:
    """What a field holds; kept in the attrs field's metadata under ``"dsbuild"``."""

    kind: Kind
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] = ()
    """The values a ``choice`` (or each item of a ``strs``) may take."""
    any_case: bool = False
    """A ``choice`` DeepSpeed upper- or lower-cases before comparing: any case is read as the listed spelling."""
    auto: bool = True
    section: type | None = None
    null: bool | None = None
    """Whether a file's ``null`` is read as "unset" (DeepSpeed takes it as the default) or refused (DeepSpeed
    refuses it); ``None``: as DeepSpeed reads the section (``core.takes_null``, ``core.STRICT_SECTIONS``)."""


def describe(value: object) -> str:
    """A value as the user wrote it, for messages: ``'gpu'``, ``5``, ``true``, ``"auto"``."""
    if value is AUTO:
        return '"auto"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, (list, tuple)):
        return f"a list {list(value)!r}" if len(value) < 6 else "a list"
    return repr(value)


def _expected(spec: Spec) -> str:
    base = {
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "str": "a string",
        "strs": "a list of strings" + (" from " + ", ".join(repr(c) for c in spec.choices) if spec.choices else ""),
        "pair": "a list of two numbers" + (" each" if spec.ge is not None or spec.lt is not None else ""),
        "section": "a table",
        "mapping": "a table",
        "json": "a JSON value",
        "choice": "one of " + ", ".join(repr(c) for c in spec.choices),
    }[spec.kind]
    bounds = []
    if spec.gt is not None:
        bounds.append(f"> {_num(spec.gt)}")
    if spec.ge is not None:
        bounds.append(f">= {_num(spec.ge)}")
    if spec.le is not None:
        bounds.append(f"<= {_num(spec.le)}")
    if spec.lt is not None:
        bounds.append(f"< {_num(spec.lt)}")
    return f"{base} {' and '.join(bounds)}" if bounds else base


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _is_finite_number(v: object) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    return isinstance(v, int) and not isinstance(v, bool)


def _is_json(v: object) -> bool:
    if v is None or isinstance(v, (bool, int, str)):
        return True
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, (list, tuple)):
        return all(_is_json(x) for x in v)
    if isinstance(v, Mapping):
        return all(isinstance(k, str) and _is_json(x) for k, x in v.items())
    return False


def check_value(spec: Spec, value: object) -> str | None:
    """Why ``value`` does not fit ``spec`` (a message), or ``None`` when it fits."""
    if value is None:
        return None
    if value is AUTO:
        return None if spec.auto else f'"auto" is not allowed here; expected {_expected(spec)}'
    kind = spec.kind
    ok: bool
    if kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "float":
        ok = _is_finite_number(value)
    elif kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "str":
        if value == "auto" and spec.auto:
            # A file's "auto" is AUTO; the string itself would not survive a round trip.
            return "got the string 'auto', expected a string (use AUTO for \"auto\")"
        ok = isinstance(value, str)
    elif kind == "choice":
        ok = isinstance(value, str) and (
            value in spec.choices or (spec.any_case and value.lower() in (c.lower() for c in spec.choices))
        )
    elif kind == "strs":
        ok = isinstance(value, tuple) and all(
            isinstance(x, str) and (not spec.choices or x in spec.choices) for x in value
        )
    elif kind == "pair":
        ok = (
            isinstance(value, tuple)
            and len(value) == 2
            and all(x is AUTO or (_is_finite_number(x) and _within(spec, x)) for x in value)
        )
    elif kind == "section":
        ok = spec.section is not None and isinstance(value, spec.section)
    elif kind == "mapping":
        ok = isinstance(value, Mapping) and _is_json(value)
    else:  # json
        ok = _is_json(value)
    if not ok:
        return f"got {describe(value)}, expected {_expected(spec)}"
    if kind in ("int", "float") and not _within(spec, value):
        return f"got {describe(value)}, expected {_expected(spec)}"
    return None


def _within(spec: Spec, x: Any) -> bool:
    """Whether the number ``x`` lies within the bounds of ``spec`` (compared as is: a huge int stays an int)."""
    return not (
        (spec.gt is not None and not x > spec.gt)
        or (spec.ge is not None and not x >= spec.ge)
        or (spec.le is not None and not x <= spec.le)
        or (spec.lt is not None and not x < spec.lt)
    )


_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")
"""A number written as text: ``"3"``, ``"0.5"``, ``"5e8"`` (YAML reads ``5e8`` as text; DeepSpeed's pydantic
sections read ``"3"`` as 3)."""

_BOOLEAN_TEXT: Final = {"true": True, "false": False}
"""Booleans written as text, in any case (DeepSpeed's pydantic sections read them so)."""


def _number_text(value: str) -> float | int | None:
    text = value.strip()
    if not _NUMBER.fullmatch(text):
        return None
    number = float(text)
    if not math.isfinite(number):
        return None
    if "." not in text and "e" not in text.lower():
        return int(text)  # exact, however large
    return number


def coerce(spec: Spec, value: Any) -> Any:
    """``value`` as field ``spec`` holds it: the one reading policy of the builder, files, ``Training`` and jobs.

    What DeepSpeed accepts is accepted: ``"auto"`` is ``AUTO`` where the field allows it; an
    integral float (``5e8``, ``8.0``) is the integer an integer field needs; a number written as
    text (``"3"``, ``"5e8"``) is that number; ``"true"``/``"false"`` (any case) and ``0``/``1`` are a
    boolean; a choice DeepSpeed compares in any case (``"Warn"``) is read as its listed spelling;
    lists become tuples for list and pair fields (``"auto"`` inside a pair too). Anything else is
    returned as given, for ``check_value`` to judge. ``unusual`` says which of these a file should
    be told about.
    """
    if isinstance(value, str) and value == "auto":
        # A string field without "auto" may hold the word itself (a job's dtype = "auto"); elsewhere it is AUTO,
        # and check_value says where that is not allowed.
        return value if not spec.auto and spec.kind in ("str", "choice") else AUTO
    kind = spec.kind
    if kind == "int":
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            number = _number_text(value)
            if number is not None and float(number).is_integer():
                return int(number)
    elif kind == "float":
        return _text_number(value)
    elif kind == "bool":
        if isinstance(value, str):
            return _BOOLEAN_TEXT.get(value.strip().lower(), value)
        if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
            return bool(value)
    elif kind == "choice":
        if spec.any_case and isinstance(value, str):
            return next((c for c in spec.choices if c.lower() == value.lower()), value)
    elif kind == "strs":
        if isinstance(value, list):
            return tuple(value)  # a module pattern "auto" is a name like any other
    elif kind == "pair":
        if isinstance(value, list):
            items = [AUTO if isinstance(x, str) and x == "auto" else x for x in value]
            return tuple(_text_number(x) for x in items)
    return value


def _text_number(value: Any) -> Any:
    if isinstance(value, str):
        number = _number_text(value)
        return value if number is None else number
    return value


def unusual(original: Any, read: Any) -> bool:
    """Whether a file's value was read as another type (``"3"`` as 3, ``"true"`` or ``1`` as true): worth a warning.

    ``5e8`` for an integer and ``"Warn"`` for ``"WARN"`` are usual and say nothing.
    """
    if read is AUTO or original is read:
        return False
    if isinstance(original, str):
        return not isinstance(read, str)
    if isinstance(original, list):
        return any(unusual(a, b) for a, b in zip(original, read, strict=False))
    return isinstance(read, bool) and not isinstance(original, bool)


def _validator(spec: Spec) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def validate(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        message = check_value(spec, value)
        if message is not None:
            raise InvalidValueError(Problem(attribute.name, message))

    return validate


def _convert_sequence(value: Any) -> Any:
    # Lists given in Python become tuples so that a frozen config stays immutable.
    return tuple(value) if isinstance(value, list) else value


def plain_json(value: Any) -> Any:
    """A JSON value as a file holds it: tuples become lists, mappings dicts (copied), all the way down.

    A table given in Python with a tuple inside then equals the same table read back from a file.
    """
    if isinstance(value, (list, tuple)):
        return [plain_json(x) for x in value]
    if isinstance(value, Mapping):
        return {k: plain_json(x) for k, x in value.items()}
    return value


def _convert_mapping(value: Any) -> Any:
    return plain_json(value) if isinstance(value, Mapping) and _is_json(value) else value


def _field(spec: Spec, alias: str | None = None) -> Any:
    return attrs.field(default=None, alias=alias, **_field_options(spec))


def _field_options(spec: Spec) -> dict[str, Any]:
    converter = (
        _convert_sequence if spec.kind in ("strs", "pair") else _convert_mapping if spec.kind == "mapping" else None
    )
    # A free table is a dict (unhashable): it counts for equality, not for the hash (equal configs still hash equal).
    return {
        "validator": _validator(spec),
        "converter": converter,
        "metadata": {"dsbuild": spec},
        "hash": False if spec.kind in ("mapping", "json") else None,
    }


def int_(
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    auto: bool = True,
    null: bool | None = None,
) -> Any:
    """An integer field (``5e8`` in a file is read as ``500000000``)."""
    return _field(Spec("int", ge=ge, gt=gt, le=le, auto=auto, null=null))


def float_(
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    auto: bool = True,
    null: bool | None = None,
) -> Any:
    """A number field (integers are kept as written)."""
    return _field(Spec("float", ge=ge, gt=gt, le=le, lt=lt, auto=auto, null=null))


def bool_(*, auto: bool = True, null: bool | None = None) -> Any:
    """A true/false field (``"true"``, ``"false"``, ``1`` and ``0`` read as DeepSpeed reads them)."""
    return _field(Spec("bool", auto=auto, null=null))


def str_(*, auto: bool = True, null: bool | None = None) -> Any:
    """A string field."""
    return _field(Spec("str", auto=auto, null=null))


def choice(*choices: str, auto: bool = True, any_case: bool = False, null: bool | None = None) -> Any:
    """A string field with a fixed set of values (``any_case``: DeepSpeed compares them in any case)."""
    return _field(Spec("choice", choices=choices, auto=auto, any_case=any_case, null=null))


def strs(*, choices: tuple[str, ...] = (), auto: bool = False, null: bool | None = None) -> Any:
    """A list of strings (held as a tuple), each one of ``choices`` when given."""
    return _field(Spec("strs", choices=choices, auto=auto, null=null))


def pair(*, ge: float | None = None, lt: float | None = None) -> Any:
    """Two numbers, e.g. Adam's ``betas`` (held as a tuple, written as a list), each within the bounds."""
    return _field(Spec("pair", ge=ge, lt=lt))


def section(cls: type, *, key: str | None = None, null: bool | None = None) -> Any:
    """A nested section (a table in the file), written under ``key`` when the attribute name differs."""
    return _field(Spec("section", section=cls, auto=False, null=null), alias=key)


def section_options(cls: type) -> dict[str, Any]:
    """``attrs.field`` options of a nested section, for the few whose key differs from the attribute name.

    Those are written ``attrs.field(default=None, alias="fp16", **section_options(FP16))`` so that
    mypy sees the alias (``Config(fp16=...)``).
    """
    return _field_options(Spec("section", section=cls, auto=False))


def mapping(*, null: bool | None = None) -> Any:
    """A free table of JSON values, passed to DeepSpeed as written."""
    return _field(Spec("mapping", auto=False, null=null))


def short_repr(self: Any) -> str:
    """``ZeroOptimization(stage=3, overlap_comm=True)``: only what is set."""
    parts = []
    for a in attrs.fields(type(self)):
        value = getattr(self, a.name)
        if (
            value is None
            or a.name in ("ignored", "coerced", "source", "provenance")
            or (a.name == "extra" and not value)
        ):
            continue
        parts.append(f"{a.alias or a.name}={value!r}")
    return f"{type(self).__name__}({', '.join(parts)})"


T = TypeVar("T")


if TYPE_CHECKING:
    # mypy's attrs plugin knows attrs' own decorators only: this lets it see every section as an
    # attrs class (its __init__, aliases such as Config(fp16=...), attrs.evolve, attrs.fields).
    # It does not see kw_only=True, which the runtime decorator below applies.
    from attrs import frozen as section_class
else:

    def section_class(cls: type[T]) -> type[T]:
        """Make ``cls`` a config section: frozen, keyword-only attrs class with a short repr."""
        cls.__repr__ = short_repr
        return attrs.frozen(kw_only=True, repr=False)(cls)


def key_of(attribute: attrs.Attribute[Any]) -> str:
    """The ds_config key of a field: its attrs alias (``fp16`` for ``Config.fp16_config``), else its name."""
    return attribute.alias or attribute.name


def spec_of(attribute: attrs.Attribute[Any]) -> Spec:
    """The ``Spec`` of a section field."""
    spec: Spec = attribute.metadata["dsbuild"]
    return spec
