"""Real ds_configs from public projects: dsbuild reads each, DeepSpeed reads our rewrite exactly as the original,
and the JSON Schema (``dsbuild schema``) flags nothing in them but the keys DeepSpeed ignores.

The corpus (``shared/corpus`` next to the repository, see its INDEX.md) holds JSON ds_configs and
YAML files. A YAML file that is one ds_config under a single top-level key (ROLL's
``deepspeed_zero*.yaml``) is unwrapped and tested too; launcher and job YAMLs are not ds_configs.

The differential: ``DeepSpeedConfig(dict)`` (DeepSpeed's own parser; standalone on CPU, world
size 1) parses the original and ``to_dict(from_dict(original, strict=False))``; every attribute
it sets must be equal, or both must raise the same exception type. HF-style configs keep
``"auto"`` in batch keys, which DeepSpeed cannot use (a bare TypeError), so they are compared a
second time with the same concrete batch sizes put into both.
"""

from __future__ import annotations

import copy
import enum
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from dsbuild import Config, ConfigError
from dsbuild.io.convert import to_dict
from dsbuild.io.schema import json_schema

from_dict = Config.from_dict

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus"
if not CORPUS.is_dir():
    pytest.skip(f"no config corpus at {CORPUS} (it sits next to the repository checkout)", allow_module_level=True)

import yaml  # noqa: E402

NOT_DS_CONFIGS = {
    "ROLL/deepspeed_config.yaml": "a Hydra job config (defaults, actor_train, ...) that pulls in the ds presets",
    "ROLL/rlvr_lora_zero3.yaml": "a Hydra RLVR pipeline config that pulls in the ds presets",
    "accelerate/deepspeed.yaml": "an accelerate launcher config that points at a ds_config file",
    "trl/zero1.yaml": "an accelerate launcher config (deepspeed_config: zero_stage ...)",
    "trl/zero3.yaml": "an accelerate launcher config (deepspeed_config: zero_stage ...)",
}
"""Corpus files that are not ds_configs, and what they are instead."""

IGNORED_BY_DEEPSPEED = {
    "DeepSpeedExamples/imagenet__config__ds_fp16_z1_config.json": {"cuda_visible_devices"},
    "LLaMA-Factory/ds_z2_autotp_config.json": {"_comment"},
    "LLaMA-Factory/ds_z3_fp8_config.json": {"monitor_config", "comms_config"},
}
"""Keys in corpus files that DeepSpeed silently ignores: strict reading refuses them, non-strict keeps them."""


def _corpus_files() -> list[Path]:
    return sorted(p for p in CORPUS.rglob("*") if p.suffix in (".json", ".yaml", ".yml"))


def _name(path: Path) -> str:
    return path.relative_to(CORPUS).as_posix()


def _has_interpolation(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, dict):
        return any(_has_interpolation(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_interpolation(v) for v in value)
    return False


def load_ds_config(path: Path) -> dict[str, Any]:
    """The ds_config a corpus file holds: JSON as is; YAML unwrapped from its single top-level key."""
    if path.suffix == ".json":
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict) and len(document) == 1, f"{_name(path)}: not one key wrapping a ds_config"
    (inner,) = document.values()
    # OmegaConf ${...} interpolations would need resolving first; the ds_config presets have none.
    assert not _has_interpolation(inner)
    assert isinstance(inner, dict)
    return inner


DS_CONFIGS = [p for p in _corpus_files() if _name(p) not in NOT_DS_CONFIGS]
IDS = [_name(p) for p in DS_CONFIGS]


def test_every_corpus_file_is_tested_or_excluded_for_a_reason() -> None:
    """New corpus files are noticed: each is a ds_config read here, or listed in NOT_DS_CONFIGS."""
    names = {_name(p) for p in _corpus_files()}
    assert set(NOT_DS_CONFIGS) <= names
    assert len(DS_CONFIGS) >= 30
    assert set(IGNORED_BY_DEEPSPEED) <= set(IDS)


@pytest.mark.parametrize("path", DS_CONFIGS, ids=IDS)
def test_corpus_config_loads(path: Path) -> None:
    """Each ds_config reads (strictly unless it carries keys DeepSpeed ignores) and round-trips unchanged."""
    original = load_ds_config(path)
    ignored = IGNORED_BY_DEEPSPEED.get(_name(path), set())
    if ignored:
        with pytest.raises(ConfigError) as e:
            Config.from_dict(original)
        assert {p.path for p in e.value.problems} == ignored
    config = Config.from_dict(original, strict=not ignored)
    assert set(config.ignored) == ignored
    assert Config.from_dict(config.to_dict()) == config
    assert json.loads(json.dumps(config.to_dict())) == config.to_dict()


@pytest.mark.parametrize("path", DS_CONFIGS, ids=IDS)
def test_corpus_config_fits_the_json_schema(path: Path) -> None:
    """An editor with the schema flags each real config's keys DeepSpeed ignores (but ``_`` comments), nothing else."""
    validator = Draft202012Validator(json_schema())
    original = load_ds_config(path)
    unknown = {k for k in IGNORED_BY_DEEPSPEED.get(_name(path), set()) if not k.startswith("_")}
    known = {k: v for k, v in original.items() if k not in unknown}
    assert [e.message for e in validator.iter_errors(known)] == []
    assert validator.is_valid(original) == (not unknown)


def test_the_yaml_presets_are_read() -> None:
    """ROLL's YAML presets are among the configs read, with their 1.0e+9 floats as integers."""
    names = [n for n in IDS if n.endswith(".yaml")]
    assert len(names) == 5
    zero2 = Config.from_dict(load_ds_config(CORPUS / "ROLL/deepspeed_zero2.yaml"))
    assert zero2.to_dict()["zero_optimization"]["allgather_bucket_size"] == 1_000_000_000


# -- the differential with DeepSpeed's own parser ---------------------------------------------


@pytest.fixture(scope="module")
def deepspeed_config() -> Any:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    return DeepSpeedConfig


def _snapshot(value: Any) -> Any:
    """What DeepSpeed parsed, as plain data: pydantic models dumped, enums by value, objects by their attributes."""
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        # Deprecated fields are removed from the model once moved to their replacement, so they appear only
        # when the legacy key was NOT given; the replacement field holds the value either way.
        deprecated = {
            name
            for name, info in type(value).model_fields.items()
            if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("deprecated")
        }
        dumped = {k: v for k, v in value.model_dump().items() if k not in deprecated}
        return (type(value).__name__, _snapshot(dumped))
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_snapshot(v) for v in value]
    if isinstance(value, enum.Enum):
        return ("enum", value.value)
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if hasattr(value, "__dict__"):
        return (type(value).__name__, _snapshot(vars(value)))
    return repr(value)


def parse(deepspeed_config: Any, d: dict[str, Any]) -> Any:
    """DeepSpeed's reading of ``d``: every attribute of DeepSpeedConfig, or the type of what it raised."""
    try:
        parsed = deepspeed_config(copy.deepcopy(d))
    except Exception as e:  # the exception type is what we compare
        return ("raised", type(e).__name__)
    return _snapshot({k: v for k, v in vars(parsed).items() if k != "_param_dict"})


def raised(parsed: Any) -> bool:
    return isinstance(parsed, tuple) and parsed[0] == "raised"


def with_batch_sizes(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` with "auto" batch keys made concrete (micro 2, accumulation 4, total their product) as the HF Trainer would."""
    d = copy.deepcopy(d)
    if d.get("train_micro_batch_size_per_gpu") == "auto":
        d["train_micro_batch_size_per_gpu"] = 2
    if d.get("gradient_accumulation_steps") == "auto":
        d["gradient_accumulation_steps"] = 4
    if d.get("train_batch_size") == "auto":
        micro, accum = d.get("train_micro_batch_size_per_gpu"), d.get("gradient_accumulation_steps")
        if isinstance(micro, int) and isinstance(accum, int):
            d["train_batch_size"] = micro * accum
        else:
            del d["train_batch_size"]  # derived by DeepSpeed from the other two
    return d


@pytest.mark.parametrize("path", DS_CONFIGS, ids=IDS)
def test_deepspeed_reads_the_rewrite_as_the_original(deepspeed_config: Any, path: Path) -> None:
    """DeepSpeedConfig parses to_dict(from_dict(original)) exactly as the original: same attributes or same error."""
    original = load_ds_config(path)
    rewritten = to_dict(from_dict(original, strict=False))
    assert parse(deepspeed_config, rewritten) == parse(deepspeed_config, original)

    # With concrete batch sizes DeepSpeed gets past the batch keys and every other setting is compared.
    expected = parse(deepspeed_config, with_batch_sizes(original))
    assert not raised(expected), f"DeepSpeed refuses {_name(path)} even with batch sizes: {expected}"
    assert parse(deepspeed_config, with_batch_sizes(rewritten)) == expected


def test_auto_batch_size_is_a_type_error_for_deepspeed(deepspeed_config: Any) -> None:
    """Why batch sizes are substituted above: "auto" in a batch key makes DeepSpeed raise a bare TypeError."""
    assert parse(deepspeed_config, {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 1}) == (
        "raised",
        "TypeError",
    )


LEGACY = {
    "zero_optimization true": {"zero_optimization": True, "allgather_size": 1e8},
    "zero_optimization false": {"zero_optimization": False},
    "cpu_offload": {"zero_optimization": {"stage": 2, "cpu_offload": True}},
    "cpu_offload_param": {"zero_optimization": {"stage": 3, "cpu_offload": True, "cpu_offload_param": True}},
    "bfloat16": {"bfloat16": {"enabled": True}},
    "stage3_gather_fp16_weights_on_model_save": {
        "zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": True}
    },
    "un-prefixed stage-3 names": {
        "zero_optimization": {
            "stage": 3,
            "prefetch_bucket_size": 1000,
            "param_persistence_threshold": 2000,
            "model_persistence_threshold": 3000,
            "max_live_parameters": 4000,
            "max_reuse_distance": 5000,
            "gather_16bit_weights_on_model_save": True,
            "module_granularity_threshold": 6,
            "use_all_reduce_for_fetch_params": True,
            "allgather_sequential": True,
        }
    },
    "tensor_parallel aliases": {"tensor_parallel": {"autotp_size": 1, "tensor_parallel": {"tp_size": 1}}},
    "floats for integers": {"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8}},
}


@pytest.mark.parametrize("original", LEGACY.values(), ids=list(LEGACY))
def test_deepspeed_reads_modern_keys_as_the_legacy_ones(deepspeed_config: Any, original: dict[str, Any]) -> None:
    """Legacy spellings are written back in the modern form, and DeepSpeed reads both the same way."""
    original = {"train_micro_batch_size_per_gpu": 1, **original}
    rewritten = to_dict(from_dict(original))
    expected = parse(deepspeed_config, original)
    assert not raised(expected), expected
    assert parse(deepspeed_config, rewritten) == expected
