"""``--set KEY=VALUE``: a dotted key and a value in TOML syntax, applied to a table (a job, or a config file's)."""

from __future__ import annotations

import re
from typing import Any

from ..errors import ConfigError
from .compat import tomllib

__all__ = ["parse_set"]


_BARE_WORD = re.compile(r"[A-Za-z0-9_./:@+-]+")
"""A value the shell leaves unquoted (``out/run1``, ``llama``): a string, though TOML would want quotes."""


def parse_set(text: str) -> tuple[str, Any]:
    """``--set`` text ``section.key=value`` as ``(dotted key, value)``.

    The value is TOML (``2e-5``, ``true``, ``"text"``, ``[1, 2]``); a bare word the shell leaves
    unquoted (``out/run1``) is a string. Anything else that is not TOML is refused with TOML's
    error, and so is a value on more than one line (TOML would read the rest as other keys).
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not all(part.strip() for part in key.split(".")):
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. training.learning_rate=2e-5")
    raw = raw.strip()
    if any(ord(c) < 32 or ord(c) == 127 for c in raw):
        raise ConfigError(f"--set {key}=...: the value holds a line break or control character; give one line")
    try:
        value: Any = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError as e:
        if not _BARE_WORD.fullmatch(raw):
            shown = raw if len(raw) <= 60 else raw[:57] + "..."
            raise ConfigError(
                f"--set {key}={shown!r}: not a TOML value ({e}); quote a string: {key}='\"...\"'"
            ) from None
        value = raw
    except RecursionError:  # [[[[...: deeper than the parser's stack (files refuse far less: files.MAX_DEPTH)
        raise ConfigError(f"--set {key}=...: the value is nested too deep to read") from None
    except ValueError as e:  # a number of more digits than Python converts
        raise ConfigError(f"--set {key}=...: {str(e).split(';')[0]}") from None
    return key, value
