"""Config files: JSON, TOML and (optionally) YAML in, JSON and TOML out.

Reading collects nothing silently: a missing, empty, non-UTF-8 or malformed
file is a ``ConfigError`` that names the file and, where the parser knows it,
the line and column. A file may carry two reserved top-level keys besides the
ds_config: ``description`` (one line, dropped) and ``extends`` (a preset name
or a path relative to the file), whose target is loaded first and deep-merged
under the file. Writing is atomic: a reader never sees half a file.

Every file a user hands us is untrusted input, read by ``files.read_text``
alone (limits, special files, nesting: see ``files``); the YAML loader here
counts what aliases stand for, up to ``files.MAX_ALIAS_VALUES`` values.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import attrs

from .._util.atomic import write_atomic
from .._util.compat import tomllib
from .._util.safe_read import (
    MAX_ALIAS_VALUES,
    MAX_DEPTH,
    YAML_FILES,
    check_nesting,
    check_size,
    read_text,
    real_path,
)
from .._util.suggest import did_you_mean
from ..config import ConfigBase, ConfigFields
from ..config.fields import describe
from ..errors import ConfigError, MissingDependencyError, PresetNotFoundError, Problem, UnknownKeyError
from .convert import from_dict, to_dict
from .presets import PRESET_SUFFIX, preset_names, preset_path

__all__ = [
    "SUFFIXES",
    "config_ref",
    "load",
    "merge",
    "parser_for",
    "read_dict",
    "read_json",
    "read_preset",
    "read_table",
    "read_toml",
    "read_yaml",
    "to_config",
    "write_json",
    "write_toml",
]

C = TypeVar("C", bound=ConfigBase)

SUFFIXES = (".json", ".toml", ".yaml", ".yml")
"""File suffixes ``load`` understands (case-insensitive)."""

Parser = Callable[[str, Path], dict[str, Any]]


def config_ref(ref: str, base: Path | None = None) -> Path | None:
    """The one rule for a string that names a config (``Session(model, "zero3")``, ``dsbuild validate zero3``,
    a job's ``strategy.config``): the file it names, or ``None`` for the packaged preset of that name.

    A separator or a config suffix (``./zero3``, ``ds.json``) makes it a path. A bare word that is a preset's name is
    that preset, whatever file sits beside it (``./zero3`` is the file); another bare word is the file of that name
    in ``base`` (default the current directory) when there is one, else a preset name that is not there (its error
    lists the presets).
    """
    path = Path(ref).expanduser()
    if "/" in ref or "\\" in ref or path.suffix.lower() in SUFFIXES:
        return path if base is None or path.is_absolute() else base / path
    if ref in preset_names():
        return None  # the preset, whatever file sits beside it (write ./NAME for the file)
    here = (base or Path()) / ref
    return here if here.is_file() else None  # neither: the preset error says which names there are


# -- reading -------------------------------------------------------------------


def read_json(path: str | Path, *, strict: bool = True, cls: type[C] = ConfigBase) -> C:  # type: ignore[assignment]
    """Read a JSON ds_config file (``extends`` and ``description`` understood)."""
    return _read(Path(path), _parse_json, strict, cls)


def read_toml(path: str | Path, *, strict: bool = True, cls: type[C] = ConfigBase) -> C:  # type: ignore[assignment]
    """Read a TOML config file (``extends`` and ``description`` understood)."""
    return _read(Path(path), _parse_toml, strict, cls)


def read_yaml(path: str | Path, *, strict: bool = True, cls: type[C] = ConfigBase) -> C:  # type: ignore[assignment]
    """Read a YAML ds_config file; needs PyYAML (``pip install 'dsbuild[yaml]'``)."""
    return _read(Path(path), _parse_yaml, strict, cls)


def load(path: str | Path, *, strict: bool = True, cls: type[C] = ConfigBase) -> C:  # type: ignore[assignment]
    """Read a config file by its suffix: ``.json``, ``.toml``, ``.yaml``/``.yml``."""
    path = Path(path)
    return _read(path, parser_for(path, str(path)), strict, cls)


def read_preset(name: str, *, cls: type[C] = ConfigBase) -> C:  # type: ignore[assignment]
    """Packaged preset ``name`` as a config whose ``source`` is ``"preset NAME"``."""
    data, _ = read_dict(preset_path(name))
    return to_config(data, source=f"preset {name}", label=f"preset {name}", cls=cls)


def read_dict(path: str | Path) -> tuple[dict[str, Any], str | None]:
    """The raw ds_config dict of a file (``extends`` merged, reserved keys removed) and its description."""
    path = Path(path)
    return _raw(path, parser_for(path, str(path)))


def to_config(
    data: Mapping[str, Any],
    *,
    strict: bool = True,
    source: str,
    label: str | None = None,
    cls: type[C] = ConfigBase,  # type: ignore[assignment]
) -> C:
    """``from_dict`` for a dict read from ``source``: errors name it; ``source`` of the config is ``label``
    (default ``"file SOURCE"``)."""
    try:
        config = from_dict(data, strict=strict, cls=cls)
    except ConfigError as e:  # the file was read: its values fail the checks
        raise e.with_source(source).failing_checks() from None
    # ``source`` is eq=False, so evolve keeps equality with a config built in code.
    return attrs.evolve(config, source=label if label is not None else f"file {source}")


def _read(path: Path, parse: Parser, strict: bool, cls: type[C]) -> C:
    data, _ = _raw(path, parse)
    return to_config(data, strict=strict, source=str(path), cls=cls)


def _raw(path: Path, parse: Parser) -> tuple[dict[str, Any], str | None]:
    """The merged ds_config dict of the file the user named, and its description."""
    data, description = _read_raw(path, parse, [path.name], [real_path(path)], str(path))
    _reject_wrapped(data, str(path))
    return data, description


def parser_for(path: Path, top: str) -> Parser:
    """The parser of a file by its suffix; a ``ConfigError`` naming ``top`` (the file the user named) for others."""
    parsers: dict[str, Parser] = {".json": _parse_json, ".toml": _parse_toml, ".yaml": _parse_yaml, ".yml": _parse_yaml}
    parse = parsers.get(path.suffix.lower())
    if parse is None:
        what = f"suffix {path.suffix!r}" if path.suffix else "no suffix"
        raise ConfigError(
            Problem("", f"cannot tell the format from {what}", f"use one of {', '.join(SUFFIXES)}"), source=top
        )
    return parse


def _read_raw(
    path: Path, parse: Parser, chain: list[str], seen: list[Path], top: str
) -> tuple[dict[str, Any], str | None]:
    """Parse ``path``, follow its ``extends`` chain and merge; ``chain`` holds the labels for messages."""
    data = parse(read_text(path), path)
    description = data.pop("description", None)
    if description is not None and not isinstance(description, str):
        raise ConfigError(Problem("description", f"got {describe(description)}, expected a string"), source=str(path))
    extends = data.pop("extends", None)
    if extends is None:
        return data, description
    if not isinstance(extends, str) or not extends:
        raise ConfigError(
            Problem("extends", f"got {describe(extends)}, expected a preset name or a relative path"), source=str(path)
        )
    parent = _locate(extends, path, [*chain, extends], top)
    identity = real_path(parent)
    if identity in seen:
        raise ConfigError(Problem("extends", f"cycle: {' -> '.join([*chain, extends])}"), source=top)
    base, _ = _read_raw(parent, parser_for(parent, top), [*chain, extends], [*seen, identity], top)
    return merge(base, data), description


def _locate(target: str, child: Path, chain: list[str], top: str) -> Path:
    """The file an ``extends`` names: a path (relative to ``child``) or a packaged preset."""
    # A target with a path separator or a file suffix is a path; a bare word is a preset name.
    looks_like_path = "/" in target or "\\" in target or Path(target).suffix.lower() in SUFFIXES
    if looks_like_path:
        candidate = child.parent / Path(target).expanduser()
        if os.path.lexists(candidate):  # read_text refuses a directory, FIFO or symlink loop, and says so
            return candidate
        hint = f"no file at {candidate}"
    else:
        names = preset_names()
        if target in names:
            return preset_path(target)
        sibling = child.parent / f"{target}{PRESET_SUFFIX}"
        if sibling.is_file():
            hint = f"did you mean {sibling.name!r}?"
        else:
            suggestion = did_you_mean(target, names)
            listing = f"presets: {', '.join(names)}" if names else "no presets are installed"
            hint = f"{suggestion} {listing}" if suggestion else listing
    raise PresetNotFoundError(Problem("", f"{' -> '.join(chain)}: no preset or file {target!r}", hint), source=top)


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` deep-merged over ``base``: tables merge key by key, any other value replaces."""
    out = dict(base)
    for key, value in override.items():
        old = out.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            out[key] = merge(old, value)
        else:
            out[key] = value
    return out


def read_table(path: str | Path) -> dict[str, Any]:
    """The top-level table of a JSON, TOML or YAML file, parsed by its suffix (no ``extends``, nothing removed)."""
    path = Path(path)
    return parser_for(path, str(path))(read_text(path), path)


def _top_level(data: Any, path: Path, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(
            Problem("", f"the top level is {describe(data)}, expected {what} of ds_config keys"), source=str(path)
        )
    return data


def _parse_json(text: str, path: Path) -> dict[str, Any]:
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise ConfigError(f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}", source=str(path)) from None
    except _DuplicateKey as e:
        # DeepSpeed refuses JSON with a key given twice; json.loads would keep the last one silently.
        raise ConfigError(Problem("", f"key {e.key!r} given twice", "keep one"), source=str(path)) from None
    except RecursionError:
        raise _too_deep(path) from None
    except ValueError as e:  # a number of more digits than Python converts
        raise ConfigError(f"invalid JSON: {_reason(e)}", source=str(path)) from None
    check_nesting(data, str(path))
    return _top_level(data, path, "an object")


def _too_deep(path: Path) -> ConfigError:
    """Nesting so deep that the parser itself ran out of stack: where it happened is not known."""
    return ConfigError(f"nested deeper than {MAX_DEPTH} levels", source=str(path))


def _reason(e: ValueError) -> str:
    # "Exceeds the limit (4300 digits) for integer string conversion: ...; use sys.set_int_max_str_digits()
    # to increase the limit": the advice is for programmers, not for the file's author.
    return str(e).split(";")[0]


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


_TOML_WHERE = re.compile(r"\s*\((?:at line (\d+), column (\d+)|at end of document)\)$")


_TOML_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*"|'[^'\n]*')"""

_TOML_LONG_KEY = re.compile(
    rf"(?:^[ \t]*\[{{0,2}}|[{{,])[ \t]*{_TOML_KEY_PART}(?:[ \t]*\.[ \t]*{_TOML_KEY_PART}){{{MAX_DEPTH},}}",
    re.MULTILINE,
)
"""A key with more dotted parts than ``MAX_DEPTH``, where keys stand: a line's start (a table header's too),
or after ``{`` or ``,`` in an inline table."""


def _key_set_twice(text: str, line: int) -> str | None:
    """The dotted key that line ``line`` of a TOML text sets again (its table's header before it), or ``None``
    where the line is not a plain ``key = value``."""
    lines = text.splitlines()
    if not 1 <= line <= len(lines):
        return None
    key, equals, _ = lines[line - 1].partition("=")
    key = key.strip()
    if not equals or not re.fullmatch(r"[A-Za-z0-9_.-]+", key):
        return None
    table = ""
    for before in reversed(lines[: line - 1]):
        header = re.fullmatch(r"\s*\[\[?\s*([A-Za-z0-9_.-]+)\s*\]\]?\s*(#.*)?", before)
        if header:
            table = header.group(1) + "."
            break
    return table + key


def _parse_toml(text: str, path: Path) -> dict[str, Any]:
    # tomllib spends time and memory with the square of a dotted key's parts (a 100,000-part key takes
    # gigabytes): a key that would nest too deep is refused before it is parsed.
    long_key = _TOML_LONG_KEY.search(text)
    if long_key is not None:
        line = text.count("\n", 0, long_key.start()) + 1
        raise ConfigError(f"nested deeper than {MAX_DEPTH} levels at line {line}", source=str(path))
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise _too_deep(path) from None
    except tomllib.TOMLDecodeError as e:
        # tomllib puts the position only in its message: "... (at line 2, column 3)".
        message = str(e)
        match = _TOML_WHERE.search(message)
        if match is None:
            where = ""
        elif match.group(1) is None:
            where = " at the end of the file"
        else:
            where = f" at line {match.group(1)}, column {match.group(2)}"
        reason = message[: match.start()] if match else message
        if match is not None and match.group(1) is not None and reason.startswith("Cannot overwrite a value"):
            twice = _key_set_twice(text, int(match.group(1)))
            if twice is not None:
                raise ConfigError(
                    Problem(twice, f"set twice (again at line {match.group(1)})", "keep one"), source=str(path)
                ) from None
        raise ConfigError(f"invalid TOML{where}: {reason}", source=str(path)) from None
    except ValueError as e:  # a number of more digits than Python converts
        raise ConfigError(f"invalid TOML: {_reason(e)}", source=str(path)) from None
    check_nesting(data, str(path))
    return data


def _parse_yaml(text: str, path: Path) -> dict[str, Any]:
    try:
        import yaml
    except ImportError:
        raise MissingDependencyError("pyyaml", "reading YAML configs", extra="yaml") from None
    check_size(len(text.encode("utf-8")), YAML_FILES, str(path))
    try:
        data = yaml.load(text, Loader=_counting_loader())  # a SafeLoader: plain data, no Python objects
    except _TooManyAliases:
        raise ConfigError(
            Problem("", f"YAML aliases expand to more than {MAX_ALIAS_VALUES:,} values", "write the values out"),
            source=str(path),
        ) from None
    except _TooDeepAt as e:
        raise ConfigError(f"nested deeper than {MAX_DEPTH} levels at {e.where}", source=str(path)) from None
    except RecursionError:
        raise _too_deep(path) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        reason = e.problem or e.context or "unreadable"
        raise ConfigError(f"invalid YAML{where}: {reason}", source=str(path)) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"invalid YAML: {e}", source=str(path)) from None
    except ValueError as e:  # a timestamp such as 2024-13-01, a number of more digits than Python converts
        raise ConfigError(f"invalid YAML: {_reason(e)}", source=str(path)) from None
    check_nesting(data, str(path))
    data = _top_level(data, path, "a mapping")
    _reject_interpolation(data, path)
    return data


class _TooManyAliases(Exception):
    pass


class _TooDeepAt(Exception):
    def __init__(self, mark: Any) -> None:
        super().__init__(mark)
        self.where = f"line {mark.line + 1}, column {mark.column + 1}"


@cache
def _counting_loader() -> type[Any]:
    """PyYAML's ``SafeLoader``, counting as it composes how many values aliases stand for.

    ``safe_load`` shares one object among the aliases of an anchor, so a "billion laughs" file loads
    small and explodes in whatever walks, copies or writes it; the count stops it while it loads, in
    time linear in the file. (Built on first use: PyYAML is optional.)
    """
    import yaml

    class CountingLoader(yaml.SafeLoader):  # type: ignore[misc]
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.values: dict[int, int] = {}  # id(node) -> values it stands for, itself included
            self.aliased = 0

        # Nesting is stopped in the scanner, which otherwise slows down with the square of the open
        # "[" and "{" (and only later runs the composer out of stack).
        def fetch_flow_collection_start(self, token_class: Any) -> None:
            super().fetch_flow_collection_start(token_class)
            if self.flow_level > MAX_DEPTH:
                raise _TooDeepAt(self.get_mark())

        def add_indent(self, column: int) -> bool:
            added: bool = super().add_indent(column)
            if len(self.indents) > MAX_DEPTH:
                raise _TooDeepAt(self.get_mark())
            return added

        def compose_node(self, parent: Any, index: Any) -> Any:
            alias = self.check_event(yaml.AliasEvent)
            node = super().compose_node(parent, index)
            if alias:
                # An alias to an anchor still being composed (a node holding itself) counts 1; MAX_DEPTH stops it.
                self.aliased += self.values.get(id(node), 1)
                if self.aliased > MAX_ALIAS_VALUES:
                    raise _TooManyAliases
            else:
                children = node.value if isinstance(node.value, list) else []
                items = [n for child in children for n in (child if isinstance(child, tuple) else (child,))]
                self.values[id(node)] = 1 + sum(self.values.get(id(n), 1) for n in items)
            return node

    return CountingLoader


def _reject_interpolation(data: Mapping[str, Any], path: Path) -> None:
    """OmegaConf/Hydra ``${...}`` values would reach DeepSpeed as literal strings: refuse the file, once."""
    found: list[tuple[str, str]] = []

    def walk(value: Any, where: str) -> None:
        if isinstance(value, str) and "${" in value:
            found.append((where, value))
        elif isinstance(value, Mapping):
            for key, item in value.items():
                walk(item, f"{where}.{key}" if where else str(key))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{where}[{i}]")

    walk(data, "")
    if found:
        where, value = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ConfigError(
            Problem(
                where,
                f"OmegaConf interpolation {value!r} is not supported{more}",
                "resolve it first, e.g. OmegaConf.to_container(cfg, resolve=True), and pass the ds_config to Config.from_dict",
            ),
            source=str(path),
        )


def _reject_wrapped(data: Mapping[str, Any], source: str) -> None:
    """A ds_config nested under one key (ROLL's ``deepspeed_zero3:``) gets a pointed message, not "unknown key"."""
    if len(data) != 1:
        return
    ((key, value),) = data.items()
    if not isinstance(value, Mapping):
        return
    try:
        from_dict({key: {}})
    except UnknownKeyError as e:
        if [p.path for p in e.problems] == [key]:
            raise ConfigError(
                Problem(
                    key,
                    "not a ds_config key, and the file's only one: the ds_config seems nested under it",
                    "move its keys to the top level (ROLL's strategy presets nest them like this)",
                ),
                source=source,
            ) from None
    except ConfigError:
        return


# -- writing -------------------------------------------------------------------


def write_json(config: ConfigFields, path: str | Path) -> Path:
    """Write the ds_config as JSON (indent 2, trailing newline), atomically."""
    text = json.dumps(to_dict(config), indent=2, allow_nan=False) + "\n"
    return write_atomic(path, text)


def write_toml(config: ConfigFields, path: str | Path, *, description: str | None = None) -> Path:
    """Write the ds_config as TOML, atomically; ``description`` becomes the file's first key."""
    import tomli_w

    data = to_dict(config)
    if description is not None:
        data = {"description": description, **data}
    try:
        text = tomli_w.dumps(data)
    except (TypeError, ValueError) as e:
        # TOML has no null; a passthrough section holding a JSON null cannot be written.
        raise ConfigError(Problem("", f"cannot be written as TOML: {e}", "write JSON instead")) from None
    return write_atomic(path, text)
