"""A job's model and tokenizer: checked before launch, and what ``Session`` builds them from.

``[model.config]`` is checked against the transformers config class of its ``model_type``: every
field a name of the class (a misspelling is an error) holding a value of the type of the class's
default (``hidden_size = "big"`` is an error). ``name_or_path`` and ``tokenizer`` must be a local
directory or a hub id: a path that does not exist is an error naming the key, not the hub's "Repo id
must be in the form". Before launch, dsbuild does not reach the hub: ``dsbuild validate`` (and any
run with ``HF_HUB_OFFLINE=1``) wants a hub id in the local Hugging Face cache; ``dsbuild train``
otherwise lets transformers download it.

A ``[model.config]`` table its class accepted is remembered, with the vocabulary size it gives, under
``~/.cache/dsbuild/model-config/`` (``$XDG_CACHE_HOME``), keyed by the table and by what judged it: this check's
source, dsbuild's, transformers' and huggingface_hub's versions. The launcher of a run in other processes then
checks the same table again without importing transformers' models and torch (about 3 s); a table with problems
is never remembered, and any trouble with the cache is a check as before.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._util.atomic import write_atomic
from .._util.cache import user_cache
from .._util.suggest import did_you_mean
from ..config.fields import describe
from ..errors import ConfigError, Problem
from ..job import BYTE_TOKENIZER, ModelSpec

__all__ = ["build_tokenizer", "config_checked", "model_problems", "model_source", "vocab_size"]

logger = logging.getLogger("dsbuild")

_KINDS: dict[type, tuple[type, ...]] = {bool: (bool,), int: (int,), float: (int, float), str: (str,), list: (list,)}
_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list"}


def model_problems(spec: ModelSpec, *, hub: bool) -> list[Problem]:
    """Every problem of the job's ``[model]`` that transformers would hit at launch (transformers is imported).

    ``hub``: whether a hub id may be fetched at launch; when not, it must be in the local cache.
    """
    problems: list[Problem] = []
    if spec.config is not None:
        problems += _checked(spec)[0]
    offline = not hub or _offline()
    if spec.name_or_path is not None:
        problems += _where(spec.name_or_path, "model.name_or_path", "config.json", offline)
    if spec.tokenizer is not None and spec.tokenizer != BYTE_TOKENIZER:
        problems += _where(spec.tokenizer, "model.tokenizer", "tokenizer_config.json", offline)
    return problems


def model_source(spec: ModelSpec) -> Any:
    """What ``Session.from_pretrained`` builds from: a ``PretrainedConfig`` for ``[model.config]``, else the path / id.

    Raises ``ConfigError`` with every problem ``model_problems`` finds in the config.
    """
    if spec.config is None:
        assert spec.name_or_path is not None
        return spec.name_or_path
    problems = _config_problems(spec.config)
    if problems:
        raise ConfigError(problems)
    cls = _config_class(str(spec.config["model_type"]))
    assert cls is not None
    fields = {k: v for k, v in spec.config.items() if k != "model_type"}
    try:
        return cls(**fields)
    except Exception as e:  # TypeError, ValueError, huggingface_hub's strict-dataclass validation errors, ...
        reason = " ".join(str(e).split())
        raise ConfigError(Problem("model.config", f"{cls.__name__} refuses it: {reason}")) from None


def vocab_size(spec: ModelSpec) -> int | None:
    """The model's vocabulary size as its config says, without loading weights (``[model.config]``, its class's
    default where the table leaves it out; a local model's ``config.json``), or ``None`` where that cannot be read
    here (a hub id not in the local cache, a config the class refuses)."""
    if spec.config is not None:
        problems, found = _checked(spec)
        return None if problems else found
    try:
        source = model_source(spec)
        if isinstance(source, str):
            if not Path(source).is_dir():  # a hub id: not fetched for a check
                return None
            from ..session.building import pretrained_config

            source = pretrained_config(source)
    except (ConfigError, OSError, ValueError):
        return None
    return _vocab_of(source)


def config_checked(spec: ModelSpec) -> None:
    """Raise ``ConfigError`` with every problem of the job's ``[model.config]`` (nothing for a job without one), as
    ``model_source`` would, from the cache when the table was accepted before."""
    if spec.config is not None:
        problems = _checked(spec)[0]
        if problems:
            raise ConfigError(problems)


def _vocab_of(source: Any) -> int | None:
    if source is None:
        return None
    found = getattr(source, "vocab_size", None)
    if not isinstance(found, int):
        text = getattr(source, "get_text_config", None)
        found = getattr(text(), "vocab_size", None) if callable(text) else None
    return found if isinstance(found, int) and found > 0 else None


def build_tokenizer(spec: ModelSpec) -> Any:
    """The job's tokenizer: ByT5's byte-level one for ``"byte"``, else ``AutoTokenizer`` from the path / id."""
    if spec.tokenizer == BYTE_TOKENIZER:
        from transformers import ByT5Tokenizer

        return ByT5Tokenizer()
    from transformers import AutoTokenizer

    where = spec.tokenizer or spec.name_or_path
    try:
        return AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError) as e:
        path = "model.tokenizer" if spec.tokenizer else "model.name_or_path"
        raise ConfigError(Problem(path, f"cannot load a tokenizer from {where!r}: {e}".splitlines()[0])) from None


def _config_class(model_type: str) -> Any:
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None


def _config_problems(config: Mapping[str, Any]) -> list[Problem]:
    """Names and types of ``[model.config]`` against the config class of its ``model_type``.

    A name that is not the class's but close to one is a typo (transformers would keep it as a
    stray attribute); others pass (legacy names such as ``rope_theta`` are still read).
    """
    from transformers import CONFIG_MAPPING

    model_type = str(config["model_type"])
    cls = _config_class(model_type)
    if cls is None:
        hint = did_you_mean(model_type, list(CONFIG_MAPPING.keys()))
        return [Problem("model.config.model_type", f"unknown model type {model_type!r}", hint)]
    defaults = cls().to_dict()
    known = set(inspect.signature(cls.__init__).parameters) | set(defaults) | set(cls.attribute_map)
    problems = []
    for key, value in config.items():
        if key == "model_type":
            continue
        if key not in known:
            suggestion = did_you_mean(key, known)
            if suggestion is not None:
                problems.append(Problem(f"model.config.{key}", f"not a {cls.__name__} field", suggestion))
            continue
        default = defaults.get(cls.attribute_map.get(key, key))
        kind = type(default)
        if kind in _KINDS and not (isinstance(value, _KINDS[kind]) and (kind is bool or not isinstance(value, bool))):
            problems.append(
                Problem(
                    f"model.config.{key}",
                    f"got {describe(value)}, expected {_WORDS[kind]} ({cls.__name__}'s default is {default!r})",
                )
            )
    return problems


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _where(value: str, key: str, marker: str, offline: bool) -> list[Problem]:
    """Problems of a model or tokenizer location: a local directory, or a hub id (cached, when ``offline``)."""
    path = Path(value).expanduser()
    if path.exists():
        return [] if path.is_dir() else [Problem(key, f"{value}: not a directory")]
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]  # exported, not in __all__

    looks_like_path = value.startswith((".", "/", "~")) or value.count("/") > 1 or os.sep in value.replace("/", "")
    try:
        validate_repo_id(value)
    except HFValidationError:
        looks_like_path = True
    if looks_like_path:
        return [Problem(key, f"{value}: no such directory", "give an existing model directory, or a hub id org/name")]
    cached = try_to_load_from_cache(value, marker)
    if isinstance(cached, str) or not offline:
        return []
    return [
        Problem(
            key,
            f"{value!r} is not a local directory, nor in the Hugging Face cache ({constants.HF_HUB_CACHE}); "
            "the hub is not reached before launch",
            f"download it first with: hf download {value}; or give a local directory",
        )
    ]


# -- a [model.config] table accepted once, remembered -----------------------------------------------------------------

_MEMO_BYTES = 4096


def _checked(spec: ModelSpec) -> tuple[list[Problem], int | None]:
    """Every problem of ``[model.config]`` (its names and types, then the config class's own checks: transformers
    validates some fields together), and the vocabulary size it gives when there is none; from the cache when the
    table was accepted before."""
    assert spec.config is not None
    key = _memo_key(spec.config)
    path = user_cache("model-config") / f"{key}.json" if key else None
    if path is not None:
        remembered = _recall(path)
        if remembered is not None:
            return [], remembered[0]
    problems = _config_problems(spec.config)
    if problems:
        return problems, None
    try:
        source = model_source(spec)
    except ConfigError as e:
        return list(e.problems), None
    found = _vocab_of(source)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps({"vocab_size": found}), durable=False)
        except OSError as e:
            logger.debug("accepted model config not remembered: %s", e)
    return [], found


def _memo_key(config: Mapping[str, Any]) -> str | None:
    """A digest of the table and of what judged it, or ``None`` where the table has no JSON form (a TOML date)."""
    from ..env.versions import installed
    from ..version import VERSION

    try:
        table = json.dumps(dict(config), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return None
    judges = [VERSION, installed("transformers") or "", installed("huggingface_hub") or ""]
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(json.dumps([judges, table]).encode())
    return digest.hexdigest()[:32]


def _recall(path: Path) -> tuple[int | None] | None:
    """The remembered vocabulary size (in a 1-tuple: ``None`` is a size not known), or ``None`` where there is no
    sound entry."""
    try:
        seen = path.stat()
        if not stat.S_ISREG(seen.st_mode) or seen.st_size > _MEMO_BYTES:  # a FIFO would never answer
            return None
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or "vocab_size" not in found:
        return None
    size = found["vocab_size"]
    if size is None or (isinstance(size, int) and not isinstance(size, bool) and size > 0):
        return (size,)
    return None
