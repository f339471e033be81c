"""The JSON Schema of a ds_config: valid draft 2020-12, complete, and in step with the reader.

The corpus of real configs is checked in ``tests/integration/test_corpus.py`` (it reads the corpus),
and builder-made configs in ``tests/property/test_schema_properties.py`` (Hypothesis).
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

import dsbuild
from dsbuild import Config, ConfigError
from dsbuild._util.compat import tomllib
from dsbuild._util.docstrings import attribute_docs, one_line
from dsbuild.config import (
    PASSTHROUGH_KEYS,
    PASSTHROUGH_SCHEMAS,
    ConfigFields,
    Optimizer,
    Scheduler,
    ZeroOptimization,
    section_classes,
)
from dsbuild.config.fields import key_of, spec_of
from dsbuild.config.optim import OPTIMIZER_PARAMS, SCHEDULER_PARAMS
from dsbuild.io.convert import LEGACY_OFFLOAD_KEYS, REMOVED_KEYS, RENAMED_KEYS
from dsbuild.io.presets import preset_path
from dsbuild.io.schema import DIALECT, json_schema

SCHEMA = json_schema()
VALIDATOR = Draft202012Validator(SCHEMA)


def pointer_of(document: Any) -> str | None:
    """The JSON pointer of the error an editor would show first (``None``: the document is valid)."""
    error = best_match(VALIDATOR.iter_errors(document))
    return None if error is None else "".join(f"/{part}" for part in error.absolute_path)


def section_at(path: str) -> dict[str, Any]:
    """The object schema of the section at the dotted ``path`` (``$ref`` followed)."""
    node = SCHEMA
    for key in path.split(".") if path else []:
        node = node["properties"][key]
        node = next((o for o in node.get("anyOf", [node]) if "$ref" in o), node)
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def params_sections() -> dict[str, type]:
    """The typed params classes, by a type name that selects them."""
    found = {f"optimizer.params:{name}": cls for name, cls in OPTIMIZER_PARAMS.items()}
    found.update({f"scheduler.params:{name}": cls for name, cls in SCHEDULER_PARAMS.items()})
    return found


def nested(path: str, leaf: dict[str, Any]) -> dict[str, Any]:
    """A ds_config with ``leaf`` as the table at the dotted ``path``; ``optimizer.params:adam`` also sets the type."""
    where, _, type_name = path.partition(":")
    parts = where.split(".") if where else []
    if type_name:
        return {parts[0]: {"type": type_name, "params": leaf}}
    if parts and parts[0] in ("optimizer", "scheduler"):
        leaf = {"type": "adamw" if parts[0] == "optimizer" else "WarmupLR", **leaf}
    for key in reversed(parts):
        leaf = {key: leaf}
    return leaf


def reads(document: dict[str, Any]) -> bool:
    """Whether dsbuild's reader takes ``document`` (strictly)."""
    try:
        Config.from_dict(document)
    except ConfigError:
        return False
    return True


SECTIONS: dict[str, type] = {**section_classes(), **PASSTHROUGH_SCHEMAS, **params_sections()}
"""Every section class by where it sits (``optimizer.params:adam``: the params ``type = "adam"`` selects)."""


def test_the_schema_is_valid_draft_2020_12() -> None:
    """Editors and validators load it: it is a valid draft 2020-12 schema and says so."""
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == DIALECT


@pytest.mark.parametrize("path", list(SECTIONS), ids=lambda p: p or "top")
def test_every_key_of_every_section_is_described(path: str) -> None:
    """Each section's keys are exactly its fields (plus legacy spellings), each with its docstring as description."""
    cls = SECTIONS[path]
    where, _, type_name = path.partition(":")
    if type_name:  # typed params: the definition the type name selects
        cases = section_at(where.split(".")[0])["allOf"]
        assert {"$ref": f"#/$defs/{cls.__name__}"} in [case["then"]["properties"]["params"] for case in cases]
        schema = SCHEMA["$defs"][cls.__name__]
    else:
        schema = section_at(path)
    assert schema["additionalProperties"] is False
    keys = {key_of(a): a for a in attrs.fields(cls) if "dsbuild" in a.metadata or cls in (Optimizer, Scheduler)}
    legacy = set(RENAMED_KEYS.get(cls, {})) | (set(LEGACY_OFFLOAD_KEYS) if cls is ZeroOptimization else set())
    top = (set(PASSTHROUGH_KEYS) | set(REMOVED_KEYS) | {"description", "extends"}) if cls is ConfigFields else set()
    assert set(schema["properties"]) == set(keys) | legacy | top
    docs = attribute_docs(cls)
    for key, a in keys.items():
        assert schema["properties"][key]["description"] == str(one_line(docs[a.name])).replace("``", "`")


def test_every_packaged_preset_fits_the_schema() -> None:
    """What dsbuild writes for each packaged preset is a config the schema accepts."""
    for name in dsbuild.presets():
        assert pointer_of(Config.preset(name).to_dict()) is None, name


def test_every_preset_file_fits_the_schema_as_written() -> None:
    """A TOML preset as an editor sees it (``extends``, ``description`` and all, loaded with tomllib) is accepted."""
    for name in dsbuild.presets():
        document = tomllib.loads(preset_path(name).read_text(encoding="utf-8"))
        assert pointer_of(document) is None, name


@pytest.mark.parametrize(
    ("document", "pointer", "read"),
    [
        ({"zero_optimization": {"overlap_com": True}}, "/zero_optimization", False),
        ({"gradient_clipp1ng": 1.0}, "", False),
        ({"zero_optimization": {"stage": 4}}, "/zero_optimization/stage", False),
        (
            {"zero_optimization": {"offload_optimizer": {"device": "gpu"}}},
            "/zero_optimization/offload_optimizer/device",
            False,
        ),
        ({"optimizer": {"type": "AdamW", "params": {"betas": [1.5, 0.9]}}}, "/optimizer/params/betas/0", False),
        ({"optimizer": {"type": "LAMB", "params": {"max_grad_norm": -1}}}, "/optimizer/params/max_grad_norm", False),
        (
            {"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}},
            "/scheduler/params/warmup_type",
            False,
        ),
        ({"optimizer": {"params": {"lr": 1e-3}}}, "/optimizer", False),
        ({"train_batch_size": 8.5}, "/train_batch_size", False),
        ({"train_batch_size": "8"}, "/train_batch_size", True),
        ({"bf16": {"enabled": "yes"}}, "/bf16/enabled", False),
        ({"fp16": True}, "/fp16", False),
        ({"fp16": {"enabled": None}}, "/fp16/enabled", False),
        ({"checkpoint": {"tag_validation": "Wran"}}, "/checkpoint/tag_validation", False),
        (
            {"zero_optimization": {"leaf_module": {"classes": "MixtralSparseMoeBlock"}}},
            "/zero_optimization/leaf_module/classes",
            False,
        ),
        ({"amp": {"enabled": True}}, "/amp", True),
    ],
)
def test_mistakes_are_flagged_where_they_are(document: dict[str, Any], pointer: str, read: bool) -> None:
    """Typos, values out of range or choice, and wrong types are refused, the error pointing at the key (or its table).

    The reader refuses them too, but for ``"8"`` (read as 8, with a warning: the schema is for editing, numbers
    only) and ``amp`` (carried, so that ``validate`` reports it with the same reason).
    """
    assert pointer_of(document) == pointer
    assert reads(document) is read


@pytest.mark.parametrize(
    "document",
    [
        {"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"}},
        {"zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8, "stage3_prefetch_bucket_size": 1.0e9}},
        {"checkpoint": {"tag_validation": "IGNORE"}, "communication_data_type": "FP32"},
        {"optimizer": {"type": "ADAMW", "params": {"lr": 1e-5, "betas": ["auto", 0.999]}}},
        {"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": True}}},
        {"scheduler": {"type": "CosineAnnealingLR", "params": {"T_max": 100}}},
        {"bfloat16": {"enabled": True}, "zero_optimization": {"stage3_gather_fp16_weights_on_model_save": True}},
        {"zero_optimization": {"stage": 2, "cpu_offload": True}},
        {"zero_optimization": {"offload_optimizer": None, "overlap_comm": None}, "steps_per_print": None},
        {"expert_parallel": {"enabled": True, "expert_w3": None}, "datastates_ckpt": {"anything": [1, 2]}},
        {"_comment": "DeepSpeed ignores this", "train_batch_size": 8},
        {"description": "mine", "extends": "zero3", "zero_optimization": {"stage": 3}},
    ],
)
def test_what_the_reader_takes_the_schema_takes(document: dict[str, Any]) -> None:
    """ "auto", 5e8 for an integer, any case where DeepSpeed ignores it, legacy keys, null where DeepSpeed reads it."""
    assert pointer_of(document) is None


def test_legacy_keys_are_deprecated_and_name_the_modern_key() -> None:
    """A legacy spelling is accepted, struck through in editors, and its description says what replaces it."""
    legacy = [(path, old, new) for cls, renames in RENAMED_KEYS.items() for old, new in renames.items()
              for path in [next(p for p, c in section_classes().items() if c is cls)]]  # fmt: skip
    legacy += [("zero_optimization", old, new) for old, new in LEGACY_OFFLOAD_KEYS.items()]
    for path, old, new in legacy:
        entry = section_at(path)["properties"][old]
        assert entry["deprecated"] is True
        assert f"`{new}`" in entry["description"]


def test_removed_sections_are_refused_with_their_reason() -> None:
    """A section DeepSpeed removed is an error in the editor, whose hover says what to do instead."""
    for key, reason in REMOVED_KEYS.items():
        assert pointer_of({key: {}}) == f"/{key}"
        assert reason[1:] in SCHEMA["properties"][key]["description"]


@pytest.mark.parametrize("path", list(SECTIONS), ids=lambda p: p or "top")
def test_null_and_auto_are_taken_where_the_reader_takes_them(path: str) -> None:
    """For every field, the schema accepts ``null`` and ``"auto"`` exactly when dsbuild's reader does."""
    cls = SECTIONS[path]
    for a in attrs.fields(cls):
        if "dsbuild" not in a.metadata:
            continue
        for value in (None, "auto"):
            document = nested(path, {key_of(a): value})
            assert (pointer_of(document) is None) == reads(document), (path, key_of(a), value, spec_of(a))
