"""dsbuild.io.presets and the packaged presets/*.toml: each loads, validates, and says what it is."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest

import dsbuild
from dsbuild import Config, ConfigError, PresetNotFoundError
from dsbuild._util.compat import tomllib
from dsbuild.io.presets import preset_names, preset_path, presets, presets_dir

load_preset = Config.preset

REPO = Path(__file__).resolve().parents[2]

EXPECTED = {
    "zero0": 0,
    "zero1": 1,
    "zero2": 2,
    "zero2_offload": 2,
    "zero3": 3,
    "zero3_offload": 3,
    "zero3_nvme": 3,
    "hf_zero2": 2,
    "hf_zero3": 3,
    "hf_zero3_offload": 3,
}
"""Every preset we promise, with its ZeRO stage."""

HF = sorted(n for n in EXPECTED if n.startswith("hf_"))
PLAIN = sorted(n for n in EXPECTED if not n.startswith("hf_"))


def _get(d: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        d = d[part]
    return d


def test_presets_lists_every_preset_sorted_with_a_one_line_description() -> None:
    """``dsbuild.presets()`` is the public listing: names in order, one line each."""
    found = dsbuild.presets()
    assert list(found) == sorted(EXPECTED)
    for name, description in found.items():
        assert description and "\n" not in description, name
        assert description == description.strip(), name


def test_presets_come_from_the_checkout_when_not_packaged() -> None:
    """An editable install reads the top-level presets/ directory (the wheel has dsbuild/presets/)."""
    directory = presets_dir()
    assert directory is not None
    assert directory in (REPO / "presets", Path(dsbuild.__file__).parent / "presets")
    assert preset_path("zero3") == directory / "zero3.toml"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_description_is_the_first_key(name: str) -> None:
    """A reader opening the file sees what it is first."""
    lines = [line for line in preset_path(name).read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0].startswith("description = "), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_loads_validates_and_round_trips(name: str) -> None:
    """Every preset, given a batch size (a job or .batch() adds it), is a config DeepSpeed accepts as far as
    validate() can tell, and reads back unchanged."""
    cfg = load_preset(name)
    assert cfg.source == f"preset {name}"
    assert Config.preset(name) == cfg
    assert cfg.zero_optimization is not None and cfg.zero_optimization.stage == EXPECTED[name]
    errors = [d for d in cfg.batch(micro=1).validate() if d.severity == "error"]
    assert errors == [], name
    assert Config.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sizes_are_integers(name: str) -> None:
    """DeepSpeed >= 0.15 rejects float bucket sizes: every number under zero_optimization is an int."""
    zero = load_preset(name).to_dict()["zero_optimization"]
    for key, value in zero.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert isinstance(value, int), key


@pytest.mark.parametrize("name", PLAIN)
def test_plain_presets_leave_batch_optimizer_and_precision_to_the_user(name: str) -> None:
    """The ZeRO presets are building blocks: the run's own choices come from the builder or ``extends``."""
    d = load_preset(name).to_dict()
    assert set(d) <= {"zero_optimization", "aio"}, name


def test_zero3_gathers_16bit_weights_on_save() -> None:
    """Without it a ZeRO-3 model saves as empty tensors."""
    for name in ("zero3", "zero3_offload", "zero3_nvme", "hf_zero3", "hf_zero3_offload"):
        assert load_preset(name).to_dict()["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True


def test_offload_presets_offload_where_they_say() -> None:
    """The offload presets put optimizer states (and at stage 3 parameters) where their names promise."""
    cpu = {"device": "cpu", "pin_memory": True}
    assert load_preset("zero2_offload").to_dict()["zero_optimization"]["offload_optimizer"] == cpu
    assert "offload_param" not in load_preset("zero2_offload").to_dict()["zero_optimization"]
    for name in ("zero3_offload", "hf_zero3_offload"):
        zero = load_preset(name).to_dict()["zero_optimization"]
        assert zero["offload_optimizer"] == cpu and zero["offload_param"] == cpu, name
    nvme = load_preset("zero3_nvme").to_dict()
    for key in ("offload_optimizer", "offload_param"):
        assert nvme["zero_optimization"][key]["device"] == "nvme"
        assert nvme["zero_optimization"][key]["nvme_path"] == "/local_nvme"
    assert set(nvme["aio"]) >= {"block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events"}


def test_extending_presets_match_their_parent_plus_changes() -> None:
    """zero3_offload is zero3 with both offloads; the HF ZeRO-3 offload is HF ZeRO-3 with them."""
    assert load_preset("zero3_offload") == load_preset("zero3").offload_cpu()
    assert load_preset("hf_zero3_offload") == load_preset("hf_zero3").offload_cpu()
    assert load_preset("zero2_offload") == load_preset("zero2").offload_cpu()


HF_AUTO_KEYS = [
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "fp16.enabled",
    "bf16.enabled",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr",
    "scheduler.params.warmup_max_lr",
    "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps",
]
HF_ZERO3_AUTO_KEYS = [
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
]


@pytest.mark.parametrize("name", HF)
def test_hf_presets_leave_the_trainer_arguments_auto(name: str) -> None:
    """The HF presets say "auto" wherever the Trainer fills a value from TrainingArguments."""
    d = load_preset(name).to_dict()
    keys = HF_AUTO_KEYS + (HF_ZERO3_AUTO_KEYS if EXPECTED[name] == 3 else [])
    for key in keys:
        assert _get(d, key) == "auto", f"{name}: {key}"
    assert d["optimizer"]["type"] == "AdamW"
    assert d["scheduler"]["type"] == "WarmupDecayLR"


@pytest.mark.parametrize("name", HF)
def test_hf_presets_resolve_completely_under_the_hf_trainer_and_deepspeed_accepts_them(name: str) -> None:
    """The real HF Trainer resolution fills every "auto", and DeepSpeed's own parser takes the result."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    hf = pytest.importorskip("transformers.integrations.deepspeed")
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    args = types.SimpleNamespace(
        world_size=1,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        max_grad_norm=1.0,
        learning_rate=2e-5,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        weight_decay=0.01,
        save_on_each_node=False,
        fp16=False,
        fp16_full_eval=False,
        bf16=True,
        bf16_full_eval=False,
        warmup_steps=10,
        warmup_ratio=0.0,
        get_warmup_steps=lambda steps: 10,
    )
    model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=64))
    config = hf.HfTrainerDeepSpeedConfig(load_preset(name).to_dict())
    config.trainer_config_process(args)
    config.trainer_config_finalize(args, model, 100)
    resolved = config.config

    def autos(value: Any, path: str = "") -> list[str]:
        if value == "auto":
            return [path]
        if isinstance(value, dict):
            return [p for k, v in value.items() for p in autos(v, f"{path}.{k}" if path else k)]
        return []

    assert autos(resolved) == []
    assert resolved["train_batch_size"] == 8
    if EXPECTED[name] == 3:
        assert resolved["zero_optimization"]["stage3_param_persistence_threshold"] == 640
    parsed = ds_config.DeepSpeedConfig(resolved)
    assert parsed.train_batch_size == 8 and parsed.bfloat16_config.enabled
    assert parsed.zero_optimization_stage == EXPECTED[name]
    assert math.isclose(parsed.gradient_clipping, 1.0)


@pytest.mark.parametrize("name", PLAIN)
def test_plain_presets_are_accepted_by_deepspeed(name: str) -> None:
    """With a batch size added, DeepSpeed's own parser takes each ZeRO preset."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    parsed = ds_config.DeepSpeedConfig(load_preset(name).batch(micro=2).to_dict())
    assert parsed.zero_optimization_stage == EXPECTED[name]
    assert parsed.train_batch_size == 2


# -- lookups that fail -----------------------------------------------------------


def test_unknown_preset_suggests_and_lists() -> None:
    """A misspelt name gets "did you mean" and the list of names."""
    listing = ", ".join(sorted(EXPECTED))
    with pytest.raises(PresetNotFoundError) as info:
        load_preset("zero3_ofload")
    assert str(info.value) == f"no preset 'zero3_ofload' (did you mean 'zero3_offload'? presets: {listing})"
    assert isinstance(info.value, ConfigError) and isinstance(info.value, LookupError)
    with pytest.raises(PresetNotFoundError) as info:
        Config.preset("nothing_like_it")
    assert str(info.value) == f"no preset 'nothing_like_it' (presets: {listing})"


def test_preset_names_are_not_paths() -> None:
    """A name with a path in it does not reach outside the presets directory."""
    with pytest.raises(PresetNotFoundError):
        preset_path("../presets/zero3")
    with pytest.raises(PresetNotFoundError):
        preset_path("zero3.toml")


def test_presets_and_preset_names_agree() -> None:
    """The listing and the lookups see the same files."""
    assert list(presets()) == preset_names()
    for name in preset_names():
        assert preset_path(name).is_file()


def test_every_preset_file_parses_as_plain_toml() -> None:
    """Presets are plain TOML any tool can read, with only the two reserved keys added."""
    directory = presets_dir()
    assert directory is not None
    for path in directory.glob("*.toml"):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        assert isinstance(data["description"], str)
        assert set(data.get("extends", "")) <= set("abcdefghijklmnopqrstuvwxyz0123456789_")


# -- packaging -----------------------------------------------------------------


@pytest.mark.procs
def test_wheel_ships_the_presets(tmp_path: Path) -> None:
    """pyproject's force-include puts presets/*.toml at dsbuild/presets/ in the wheel."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    offline = ("NewConnectionError", "No matching distribution", "Could not find a version")
    if result.returncode != 0 and any(text in result.stderr for text in offline):
        pytest.skip("building the wheel needs hatchling from the package index")
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("dsbuild-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in EXPECTED:
        assert f"dsbuild/presets/{name}.toml" in names
    assert "dsbuild/io/config_files.py" in names and "dsbuild/cli/__init__.py" in names
