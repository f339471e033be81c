"""The JSON Schema (draft 2020-12) of a ds_config, generated from the typed model, for editors.

Nothing here is written by hand twice: each section class is a definition under ``$defs``, each
field's ``Spec`` gives its type, bounds and choices, ``"auto"`` where the field takes it, ``null``
where DeepSpeed reads it as the default (``config.takes_null``), and its attribute docstring the
``description``. ``optimizer.params`` and ``scheduler.params`` are typed per ``type`` (``if``/``then``;
DeepSpeed's optimizer names in any case, as it compares them); another name (a ``torch.optim``
class) takes a free table. Legacy spellings (``convert.RENAMED_KEYS``, ``LEGACY_OFFLOAD_KEYS``) are
allowed and marked ``deprecated``; removed sections (``convert.REMOVED_KEYS``) are refused, their
reason in the description. Every section refuses keys it does not know — a typo is what an editor
should flag — except top-level keys starting with ``_`` (``"_comment"``). ``deprecationMessage`` and
``doNotSuggest`` are VS Code's own keywords (a warning's text; not offered for completion); other
tools ignore them, as JSON Schema says unknown keywords are.

The schema is for editing, so it is stricter than the reader where the reader is lenient: a number
written as text (``"3"``) or a boolean written ``"true"`` or ``1`` is refused, although the reader
takes it (with a warning). Integral floats (``5e8``) are integers to JSON Schema, as to the reader.
What it cannot say — rules between fields (fp16 and bf16 both on, ``offload_param`` below stage 3,
the batch triangle) — is ``validate()``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from .._util.docstrings import attribute_docs, one_line
from ..config import PASSTHROUGH_KEYS, PASSTHROUGH_SCHEMAS, ConfigFields, takes_null
from ..config.fields import Spec, key_of, spec_of
from ..config.optim import (
    OPTIMIZER_PARAMS,
    SCHEDULER_PARAMS,
    Optimizer,
    Scheduler,
    optimizer_params_class,
    scheduler_params_class,
)
from ..config.zero import ZeroOptimization
from ..version import VERSION
from .convert import LEGACY_OFFLOAD_KEYS, REMOVED_KEYS, RENAMED_KEYS

__all__ = ["DIALECT", "json_schema", "value_schema"]

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
"""The JSON Schema draft the schema is written in."""


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a ds_config file, JSON or TOML (a new dict on each call)."""
    return _Builder().document()


def value_schema(spec: Spec) -> dict[str, Any]:
    """The JSON Schema of one value a ``Spec`` takes (with ``"auto"`` where it does), outside any section."""
    options = _Builder().values(spec, "")
    if spec.auto:
        options.append({"const": "auto"})
    return options[0] if len(options) == 1 else {"anyOf": options}


def _file_keys() -> dict[str, Any]:
    """The two keys a dsbuild config file may hold besides the ds_config (``dsbuild.io.config_files`` reads and removes them)."""
    return {
        "description": {"type": "string", "description": "dsbuild: a one-line description of the file."},
        "extends": {
            "type": "string",
            "minLength": 1,
            "description": "dsbuild: a packaged preset name, or a path relative to this file, loaded first; "
            "this file's keys are deep-merged over it.",
        },
    }


class _Builder:
    """One schema: the ``$defs`` made so far, and the one path each section class sits at."""

    def __init__(self) -> None:
        self.defs: dict[str, dict[str, Any]] = {}
        self.paths: dict[type, str] = {}

    def document(self) -> dict[str, Any]:
        root = self.section(ConfigFields, "")
        properties = root["properties"]
        for key, what in PASSTHROUGH_KEYS.items():
            known = PASSTHROUGH_SCHEMAS.get(key)
            properties[key] = {**(self.ref(known, key) if known else {"type": "object"}), "description": f"{what}."}
        for key, reason in REMOVED_KEYS.items():
            # Refused whatever it holds, the reason shown on the key, never offered for completion.
            why = f"{reason[0].upper()}{reason[1:]}."
            properties[key] = {
                "not": {},
                "deprecated": True,
                "description": why,
                "deprecationMessage": why,
                "doNotSuggest": True,
            }
        properties.update(_file_keys())
        return {
            "$schema": DIALECT,
            "title": "DeepSpeed config (ds_config)",
            "description": f"A DeepSpeed config as dsbuild {VERSION} reads it, generated from its typed model "
            "(rules between keys are `dsbuild validate`'s).",
            "type": "object",
            "properties": properties,
            "patternProperties": {"^_": {"description": "A comment: DeepSpeed ignores it; `dsbuild validate` warns."}},
            "additionalProperties": False,
            "$defs": self.defs,
        }

    def ref(self, cls: type, path: str) -> dict[str, Any]:
        """``{"$ref": ...}`` to the definition of section ``cls`` (made on first use)."""
        seen = self.paths.setdefault(cls, path)
        # A definition holds the null rule of its one path; a class at two paths would need two.
        assert seen == path, f"{cls.__name__} sits at {seen!r} and {path!r}"
        if cls.__name__ not in self.defs:
            self.defs[cls.__name__] = {}  # its place taken first, so that a section comes before those inside it
            self.defs[cls.__name__] = self.section(cls, path)
        return {"$ref": f"#/$defs/{cls.__name__}"}

    def section(self, cls: type, path: str) -> dict[str, Any]:
        """The object schema of section ``cls`` at the dotted ``path``: its keys (legacy ones too), no others."""
        docs = attribute_docs(cls)
        typed = cls is Optimizer or cls is Scheduler
        properties = self.type_and_params(cls, docs) if typed else {}
        for a in attrs.fields(cls):
            if "dsbuild" in a.metadata:
                properties[key_of(a)] = self.field(spec_of(a), path, key_of(a), docs.get(a.name))
        for old, new in RENAMED_KEYS.get(cls, {}).items():
            properties[old] = _deprecated(properties[new], f"Legacy spelling of `{new}`.", new)
        if cls is ZeroOptimization:
            for old, new in LEGACY_OFFLOAD_KEYS.items():
                properties[old] = _deprecated({"type": "boolean"}, f"Legacy: true is `{new}` on the CPU.", new)
        schema = _described({"type": "object"}, cls.__doc__)
        if typed:
            schema["required"] = ["type"]
        schema["properties"] = properties
        schema["additionalProperties"] = False
        if typed:
            schema["allOf"] = self.params_by_type(cls, path)
        return schema

    def field(self, spec: Spec, path: str, key: str, doc: str | None) -> dict[str, Any]:
        """The schema of a field of the section at ``path``: its value, ``"auto"`` and ``null`` where they are read."""
        options = self.values(spec, f"{path}.{key}" if path else key)
        if spec.auto:
            options.append({"const": "auto"})
        if takes_null(spec, path):
            options.append({"type": "null"})
        return _described(options[0] if len(options) == 1 else {"anyOf": options}, doc)

    def values(self, spec: Spec, path: str) -> list[dict[str, Any]]:
        """The schemas a field's value may match: one, or a choice's spellings and (when read so) any case of them."""
        kind = spec.kind
        if kind == "int":
            return [{"type": "integer", **_bounds(spec)}]
        if kind == "float":
            return [{"type": "number", **_bounds(spec)}]
        if kind == "bool":
            return [{"type": "boolean"}]
        if kind == "str":
            return [{"type": "string"}]
        if kind == "choice":
            listed = {"enum": list(spec.choices)}
            return [listed, {"type": "string", "pattern": _any_case(spec.choices)}] if spec.any_case else [listed]
        if kind == "strs":
            return [{"type": "array", "items": {"enum": list(spec.choices)} if spec.choices else {"type": "string"}}]
        if kind == "pair":
            number = {"type": "number", **_bounds(spec)}
            item = {"anyOf": [number, {"const": "auto"}]} if spec.auto else number
            return [{"type": "array", "items": item, "minItems": 2, "maxItems": 2}]
        if kind == "section":
            assert spec.section is not None
            return [self.ref(spec.section, path)]
        if kind == "mapping":
            return [{"type": "object"}]
        return [{}]  # json: any value

    def type_and_params(self, cls: type, docs: Mapping[str, str | None]) -> dict[str, Any]:
        """``type`` (DeepSpeed's names offered, any other allowed) and ``params`` (a table) of optimizer / scheduler."""
        names = list(OPTIMIZER_PARAMS if cls is Optimizer else SCHEDULER_PARAMS)
        name = {"anyOf": [{"enum": names}, {"type": "string", "minLength": 1}]}
        return {
            "type": _described(name, docs.get("type")),
            "params": _described({"type": "object"}, docs.get("params")),
        }

    def params_by_type(self, cls: type, path: str) -> list[dict[str, Any]]:
        """``if type is X then params is X's params class``, one per class; other names keep a free table."""
        table, lookup = (
            (OPTIMIZER_PARAMS, optimizer_params_class)
            if cls is Optimizer
            else (SCHEDULER_PARAMS, scheduler_params_class)
        )
        by_class: dict[type, list[str]] = {}
        for name, params in table.items():
            by_class.setdefault(params, []).append(name)
        cases = []
        for params, names in by_class.items():
            # The lookup itself says whether DeepSpeed compares the names in any case.
            match = (
                {"pattern": _any_case(names)} if all(lookup(n.swapcase()) is params for n in names) else {"enum": names}
            )
            cases.append(
                {
                    "if": {"properties": {"type": match}, "required": ["type"]},
                    "then": {"properties": {"params": self.ref(params, f"{path}.params")}},
                }
            )
        return cases


def _bounds(spec: Spec) -> dict[str, float]:
    keywords = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
    out: dict[str, float] = {}
    for name, keyword in keywords.items():
        bound = getattr(spec, name)
        if bound is not None:
            out[keyword] = int(bound) if float(bound).is_integer() else bound
    return out


def _any_case(words: tuple[str, ...] | list[str]) -> str:
    """A pattern (ECMA-262, as JSON Schema's) matching any of ``words`` in any case: ``^(?:[Ww][Aa][Rr][Nn]|...)$``."""
    return "^(?:" + "|".join("".join(_either_case(c) for c in w) for w in words) + ")$"


def _either_case(c: str) -> str:
    if c.upper() != c.lower():
        return f"[{c.upper()}{c.lower()}]"
    # Only ECMA-262's syntax characters are escaped: it refuses other escapes (``\\-``) in Unicode mode.
    return f"\\{c}" if c in _SYNTAX else c


_SYNTAX: Final = frozenset("^$\\.*+?()[]{}|/")


def _described(schema: dict[str, Any], doc: str | None) -> dict[str, Any]:
    """``schema`` with the docstring's first paragraph as its description (``code`` as Markdown, as editors show it)."""
    text = one_line(doc)
    return {**schema, "description": text.replace("``", "`")} if text else dict(schema)


def _deprecated(schema: dict[str, Any], what: str, modern: str) -> dict[str, Any]:
    """``schema`` for a legacy key: the values it takes, marked deprecated, naming the key that replaces it."""
    plain = {k: v for k, v in schema.items() if k != "description"}
    about = f"{what} DeepSpeed reads it; dsbuild writes `{modern}`."
    return {**plain, "deprecated": True, "description": about, "deprecationMessage": f"use {modern}"}
