"""The JSON Schema against dsbuild itself: what the builder writes fits it, and it takes nothing the reader refuses."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from strategies import configs, ds_like_dicts, mutated_ds_dicts

from dsbuild import Config, ConfigError
from dsbuild.io.schema import json_schema

VALIDATOR = Draft202012Validator(json_schema())


@given(configs())
def test_every_built_config_fits_the_schema(config: Config) -> None:
    """An editor never flags a ds_config dsbuild wrote: to_dict() of any builder chain is valid."""
    errors = [f"/{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(config.to_dict())]
    assert not errors


@given(st.one_of(mutated_ds_dicts(), ds_like_dicts()))
def test_the_schema_takes_nothing_the_reader_refuses(document: dict[str, Any]) -> None:
    """The schema is never more lenient than the reader: a document it accepts reads, with no key ignored but comments.

    (It is stricter in places — ``"3"`` for 3, removed sections — which is fine for an editor.)
    """
    if not _is_json(document) or not VALIDATOR.is_valid(document):
        return
    try:
        config = Config.from_dict(document, strict=False)
    except ConfigError as e:
        raise AssertionError(f"the schema accepts what the reader refuses: {e}") from None
    assert all(key.startswith("_") for key in config.ignored)


def _is_json(document: dict[str, Any]) -> bool:
    """Whether ``document`` could come from a JSON or TOML file (no NaN or infinity)."""
    try:
        json.dumps(document, allow_nan=False)
    except ValueError:
        return False
    return True
