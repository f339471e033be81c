"""Config files: JSON, TOML and (optionally) YAML in, JSON and TOML out.

Reading collects nothing silently: a missing, empty, non-UTF-8 or malformed
file is a ``ConfigError`` that names the file and, where the parser knows it,
the line and column. A file may carry two reserved top-level keys besides the
ds_config: ``description`` (one line, dropped) and ``extends`` (a preset name
or a path relative to the file), whose target is loaded first and deep-merged
under the file. Writing is atomic: a reader never sees half a file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs

from .atomic import write_atomic
from .compat import tomllib
from .config import ConfigBase, ConfigFields
from .config.fields import describe
from .convert import from_dict, to_dict
from .errors import ConfigError, MissingDependencyError, PresetNotFoundError, Problem, UnknownKeyError
from .presets import PRESET_SUFFIX, preset_names, preset_path
from .suggest import did_you_mean

__all__ = [
    "SUFFIXES",
    "count_records",
    "load",
    "merge",
    "parser_for",
    "read_dict",
    "read_json",
    "read_preset",
    "read_text",
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
    except ConfigError as e:
        raise e.with_source(source) from None
    # ``source`` is eq=False, so evolve keeps equality with a config built in code.
    return attrs.evolve(config, source=label if label is not None else f"file {source}")


def _read(path: Path, parse: Parser, strict: bool, cls: type[C]) -> C:
    data, _ = _raw(path, parse)
    return to_config(data, strict=strict, source=str(path), cls=cls)


def _raw(path: Path, parse: Parser) -> tuple[dict[str, Any], str | None]:
    """The merged ds_config dict of the file the user named, and its description."""
    data, description = _read_raw(path, parse, [path.name], [_identity(path)], str(path))
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


def _identity(path: Path) -> Path:
    """A path for cycle detection: the same file reached two ways compares equal."""
    try:
        return path.resolve()
    except OSError:  # pragma: no cover - resolve() fails only on exotic file systems
        return path.absolute()


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
    identity = _identity(parent)
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
        if candidate.is_file():
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


def read_text(path: Path) -> str:
    """The file's text, with every way of not having one turned into a ``ConfigError``."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError("no such file", source=str(path)) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, expected a file", source=str(path)) from None
    except PermissionError:
        raise ConfigError("cannot read the file: permission denied", source=str(path)) from None
    except OSError as e:
        raise ConfigError(f"cannot read the file: {e.strerror or e}", source=str(path)) from None
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


def count_records(path: str | Path) -> int | None:
    """How many records a JSON array or JSON Lines data file holds (non-blank lines); ``None`` if it cannot tell."""
    try:
        text = read_text(Path(path))
    except ConfigError:
        return None
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return None
        return len(data) if isinstance(data, list) else None
    return sum(1 for line in text.splitlines() if line.strip())


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
    return _top_level(data, path, "an object")


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


def _parse_toml(text: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
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
        raise ConfigError(f"invalid TOML{where}: {reason}", source=str(path)) from None


def _parse_yaml(text: str, path: Path) -> dict[str, Any]:
    try:
        import yaml
    except ImportError:
        raise MissingDependencyError("pyyaml", "reading YAML configs", extra="yaml") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        reason = e.problem or e.context or "unreadable"
        raise ConfigError(f"invalid YAML{where}: {reason}", source=str(path)) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"invalid YAML: {e}", source=str(path)) from None
    data = _top_level(data, path, "a mapping")
    _reject_interpolation(data, path)
    return data


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
