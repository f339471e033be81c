"""dsbuild.io.config_files: writing and reading each format, and the errors of a file that is no usable config."""

from __future__ import annotations

import functools
import json
import os
import stat
import sys
from pathlib import Path

import pytest
from _io_helpers import _error, _write, load, read_json, read_toml, read_yaml

from dsbuild import AUTO, Config, ConfigError, MissingDependencyError, UnknownKeyError
from dsbuild.io.config_files import read_dict, write_json, write_toml


def _config() -> Config:
    return (
        Config.zero(3)
        .offload_cpu()
        .bf16()
        .adamw(lr=2e-5, weight_decay=0.01)
        .warmup_decay_lr(warmup_steps=AUTO, total_steps=1000)
        .batch(micro=2, grad_accum=8)
        .clip_grad(1.0)
        .comm_dtype("fp32")
    )


# -- round trips ---------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_round_trip_through_a_file_gives_an_equal_config(tmp_path: Path, suffix: str) -> None:
    """What we write, we read back unchanged, and the config says which file it came from."""
    cfg = _config()
    path = tmp_path / f"ds{suffix}"
    written = cfg.to_json(path) if suffix == ".json" else cfg.to_toml(path)
    assert written == path
    loaded = Config.load(path)
    assert loaded == cfg
    assert loaded.source == f"file {path}"


def test_json_is_indented_by_two_and_ends_with_a_newline(tmp_path: Path) -> None:
    """The JSON file is the ds_config dict, readable in a diff."""
    path = write_json(Config.zero(2).batch(micro=4), tmp_path / "ds.json")
    assert path.read_text() == (
        '{\n  "train_micro_batch_size_per_gpu": 4,\n  "zero_optimization": {\n    "stage": 2\n  }\n}\n'
    )


def test_auto_is_written_as_the_string_auto(tmp_path: Path) -> None:
    """``AUTO`` survives JSON and TOML as ``"auto"``."""
    cfg = Config.batch(micro=AUTO, grad_accum=AUTO)
    assert json.loads(write_json(cfg, tmp_path / "a.json").read_text())["gradient_accumulation_steps"] == "auto"
    assert 'gradient_accumulation_steps = "auto"' in write_toml(cfg, tmp_path / "a.toml").read_text()
    assert read_toml(tmp_path / "a.toml") == cfg


def test_write_toml_puts_the_description_first_and_reading_drops_it(tmp_path: Path) -> None:
    """A written preset-style file carries its description; the config never does."""
    path = write_toml(Config.zero(1), tmp_path / "mine.toml", description="my ZeRO-1")
    assert path.read_text().startswith('description = "my ZeRO-1"\n')
    assert read_dict(path) == ({"zero_optimization": {"stage": 1}}, "my ZeRO-1")
    assert Config.load(path) == Config.zero(1)


def test_write_replaces_an_existing_file(tmp_path: Path) -> None:
    """Writing over a config replaces it whole."""
    path = _write(tmp_path / "ds.json", '{"old": true, "lots": "' + "x" * 1000 + '"}')
    write_json(Config.zero(1), path)
    assert json.loads(path.read_text()) == {"zero_optimization": {"stage": 1}}


def test_atomic_write_leaves_no_temp_file(tmp_path: Path) -> None:
    """Only the target appears in the directory: the temp file was renamed over it."""
    write_json(_config(), tmp_path / "ds.json")
    write_toml(_config(), tmp_path / "ds.toml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.json", "ds.toml"]


def test_failed_write_leaves_no_temp_file_and_names_the_target(tmp_path: Path) -> None:
    """A rename that fails (the target is a directory) cleans up and reports the path the user gave."""
    target = tmp_path / "out.json"
    target.mkdir()
    with pytest.raises(OSError) as info:
        write_json(_config(), target)
    assert info.value.filename == str(target)
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
    assert list(target.iterdir()) == []


def test_write_into_a_missing_directory_names_the_target(tmp_path: Path) -> None:
    """The OSError names the file asked for, not the temp file beside it."""
    target = tmp_path / "nosuch" / "ds.json"
    with pytest.raises(FileNotFoundError) as info:
        write_json(_config(), target)
    assert info.value.filename == str(target)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_written_file_permissions_follow_the_umask(tmp_path: Path) -> None:
    """A config is as readable as any file the user creates (not owner-only like a mkstemp file)."""
    old = os.umask(0o022)
    try:
        path = write_json(_config(), tmp_path / "ds.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_toml_cannot_hold_null(tmp_path: Path) -> None:
    """A passthrough section with a JSON null cannot be TOML: a ConfigError, and nothing written."""
    cfg = Config.from_dict({"expert_parallel": {"expert_w3": None}})
    err = _error(write_toml, cfg, tmp_path / "x.toml")
    assert str(err).startswith("cannot be written as TOML: ")
    assert "(write JSON instead)" in str(err)
    assert list(tmp_path.iterdir()) == []


# -- reading: formats ----------------------------------------------------------


def test_load_chooses_the_reader_by_suffix_case_insensitively(tmp_path: Path) -> None:
    """``.JSON`` is JSON; ``.yml`` and ``.yaml`` are YAML."""
    _write(tmp_path / "a.JSON", '{"zero_optimization": {"stage": 2}}')
    _write(tmp_path / "b.yml", "zero_optimization:\n  stage: 2\n")
    _write(tmp_path / "c.yaml", "zero_optimization:\n  stage: 2\n")
    assert load(tmp_path / "a.JSON") == load(tmp_path / "b.yml") == load(tmp_path / "c.yaml") == Config.zero(2)


def test_unknown_suffix_names_the_file_and_the_supported_suffixes(tmp_path: Path) -> None:
    """``ds.cfg`` is refused before anything is read."""
    path = tmp_path / "ds.cfg"
    err = _error(load, path)
    assert err.source == str(path)
    assert str(err) == f"{path}: cannot tell the format from suffix '.cfg' (use one of .json, .toml, .yaml, .yml)"
    err = _error(load, tmp_path / "noext")
    assert (
        str(err)
        == f"{tmp_path / 'noext'}: cannot tell the format from no suffix (use one of .json, .toml, .yaml, .yml)"
    )


def test_readers_ignore_the_suffix(tmp_path: Path) -> None:
    """``read_json`` reads JSON whatever the file is called."""
    path = _write(tmp_path / "ds.conf", '{"zero_optimization": {"stage": 1}}')
    assert read_json(path) == Config.zero(1)


def test_yaml_scientific_floats_become_integers(tmp_path: Path) -> None:
    """ROLL writes bucket sizes as ``1.0e+9`` (a YAML float) and ``5e8`` (a YAML string): both are ints."""
    path = _write(
        tmp_path / "ds.yaml",
        "zero_optimization:\n  stage: 2\n  allgather_bucket_size: 1.0e+9\n  reduce_bucket_size: 5e8\n",
    )
    cfg = read_yaml(path)
    assert cfg.to_dict()["zero_optimization"] == {
        "stage": 2,
        "allgather_bucket_size": 1_000_000_000,
        "reduce_bucket_size": 500_000_000,
    }


def test_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    """Windows editors write a UTF-8 BOM, which json and tomllib would reject."""
    path = _write(tmp_path / "ds.json", b'\xef\xbb\xbf{"zero_optimization": {"stage": 1}}')
    assert load(path) == Config.zero(1)


# -- reading: unusable files ---------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    """The error names the file and says it is not there."""
    path = tmp_path / "ds.json"
    err = _error(load, path)
    assert err.source == str(path)
    assert str(err) == f"{path}: no such file"


def test_directory_instead_of_file(tmp_path: Path) -> None:
    """A directory named like a config is not one."""
    path = tmp_path / "ds.json"
    path.mkdir()
    assert str(_error(load, path)) == f"{path}: is a directory, expected a file"


@pytest.mark.parametrize("text", ["", "  \n\n\t"])
@pytest.mark.parametrize("suffix", [".json", ".toml", ".yaml"])
def test_empty_file(tmp_path: Path, suffix: str, text: str) -> None:
    """An empty file is a mistake, even where the format would read it as an empty table."""
    path = _write(tmp_path / f"ds{suffix}", text)
    assert str(_error(load, path)) == f"{path}: the file is empty"


def test_not_utf8_gives_the_line(tmp_path: Path) -> None:
    """A Latin-1 byte is reported with its line."""
    path = _write(tmp_path / "ds.json", b'{\n  "a": 1,\n  "b": "caf\xe9"\n}')
    err = _error(load, path)
    assert str(err) == f"{path}: not UTF-8 text: byte 0xe9 at line 3 (save the file as UTF-8)"


def test_invalid_json_gives_line_and_column(tmp_path: Path) -> None:
    """A trailing comma is found where it is."""
    path = _write(tmp_path / "ds.json", '{\n  "train_batch_size": 8,\n}\n')
    err = _error(load, path)
    assert err.source == str(path)
    assert str(err) == f"{path}: invalid JSON at line 3, column 1: Expecting property name enclosed in double quotes"


def test_json_duplicate_key_is_refused_as_deepspeed_does(tmp_path: Path) -> None:
    """json.loads keeps the last of two equal keys silently; DeepSpeed refuses the file, so do we."""
    path = _write(tmp_path / "ds.json", '{"zero_optimization": {"stage": 1, "stage": 3}}')
    assert str(_error(load, path)) == f"{path}: key 'stage' given twice (keep one)"


def test_json_top_level_must_be_an_object(tmp_path: Path) -> None:
    """A list at the top is not a ds_config."""
    path = _write(tmp_path / "ds.json", "[1, 2]")
    assert str(_error(load, path)) == f"{path}: the top level is a list [1, 2], expected an object of ds_config keys"


def test_invalid_toml_gives_line_and_column(tmp_path: Path) -> None:
    """tomllib's position, only in its message, is turned into ours."""
    path = _write(tmp_path / "ds.toml", "[zero_optimization]\nstage 3\n")
    err = _error(load, path)
    assert err.source == str(path)
    assert str(err) == f"{path}: invalid TOML at line 2, column 7: Expected '=' after a key in a key/value pair"


def test_a_key_set_twice_in_toml_is_named(tmp_path: Path) -> None:
    """tomllib says only "Cannot overwrite a value" and where; the error names the dotted key and the line."""
    path = _write(tmp_path / "ds.toml", "[zero_optimization]\nstage = 2\n# again\nstage = 3\n")
    assert str(_error(load, path)) == f"{path}: zero_optimization.stage: set twice (again at line 4) (keep one)"
    top = _write(tmp_path / "top.toml", "train_batch_size = 8\ntrain_batch_size = 16\n")
    assert str(_error(load, top)) == f"{top}: train_batch_size: set twice (again at line 2) (keep one)"


def test_invalid_toml_at_the_end(tmp_path: Path) -> None:
    """A value cut off at the end of the file."""
    path = _write(tmp_path / "ds.toml", "train_batch_size = ")
    assert str(_error(load, path)) == f"{path}: invalid TOML at the end of the file: Invalid value"


def test_invalid_yaml_gives_line_and_column(tmp_path: Path) -> None:
    """PyYAML's marks are zero-based; ours count from one."""
    pytest.importorskip("yaml")
    path = _write(tmp_path / "ds.yaml", "a: [1\nb: 2\n")
    assert str(_error(load, path)) == f"{path}: invalid YAML at line 2, column 2: expected ',' or ']', but got ':'"


def test_yaml_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    """A bare YAML scalar is not a ds_config."""
    pytest.importorskip("yaml")
    path = _write(tmp_path / "ds.yaml", "just text\n")
    assert str(_error(load, path)) == f"{path}: the top level is 'just text', expected a mapping of ds_config keys"


def test_yaml_without_pyyaml_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """YAML is optional: a missing PyYAML is a MissingDependencyError with the pip command."""
    path = _write(tmp_path / "ds.yaml", "zero_optimization:\n  stage: 1\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # makes `import yaml` raise ImportError
    with pytest.raises(MissingDependencyError) as info:
        load(path)
    assert str(info.value) == "reading YAML configs needs the 'pyyaml' package: pip install 'dsbuild[yaml]'"


def test_roll_wrapped_yaml_gets_a_pointed_error() -> None:
    """ROLL's presets nest the ds_config under one key: say so rather than "unknown key"."""
    pytest.importorskip("yaml")
    path = Path("/work/shared/corpus/ROLL/deepspeed_zero3.yaml")
    if not path.exists():
        pytest.skip("corpus not available")
    for strict in (True, False):
        err = _error(functools.partial(load, path, strict=strict))
        assert type(err) is ConfigError
        assert str(err) == (
            f"{path}: deepspeed_zero3: not a ds_config key, and the file's only one: the ds_config seems nested "
            "under it (move its keys to the top level (ROLL's strategy presets nest them like this))"
        )


def test_omegaconf_interpolation_is_refused_once(tmp_path: Path) -> None:
    """``${...}`` would reach DeepSpeed as a literal string: one error naming the first and counting the rest."""
    pytest.importorskip("yaml")
    path = _write(tmp_path / "ds.yaml", "a:\n  b: ${x}\n  c: [1, '${y}']\nd: ok\n")
    err = _error(load, path)
    assert str(err) == (
        f"{path}: a.b: OmegaConf interpolation '${{x}}' is not supported (and 1 more) "
        "(resolve it first, e.g. OmegaConf.to_container(cfg, resolve=True), and pass the ds_config to Config.from_dict)"
    )


def test_conversion_errors_name_the_file(tmp_path: Path) -> None:
    """from_dict's problems come back with the file as their source, all of them."""
    path = _write(tmp_path / "ds.json", '{"zero_optimization": {"stage": 7}, "gradient_clipp1ng": 1.0}')
    err = _error(load, path)
    assert err.source == str(path)
    assert str(err).startswith(f"{path}: 2 problems:\n")
    assert sorted(p.path for p in err.problems) == ["gradient_clipp1ng", "zero_optimization.stage"]


def test_unknown_key_keeps_its_class_and_suggestion(tmp_path: Path) -> None:
    """A typo is an UnknownKeyError with "did you mean", naming the file."""
    path = _write(tmp_path / "ds.toml", "gradient_clipp1ng = 1.0\n")
    err = _error(load, path, cls=UnknownKeyError)
    assert str(err) == f"{path}: gradient_clipp1ng: unknown key (did you mean 'gradient_clipping'?)"


def test_non_strict_keeps_unknown_keys_for_validate(tmp_path: Path) -> None:
    """``strict=False`` reads past a typo; validate() then reports it (an error: DeepSpeed would ignore it)."""
    path = _write(tmp_path / "ds.toml", "train_micro_batch_size_per_gpu = 1\ngradient_clipp1ng = 1.0\n")
    cfg = load(path, strict=False)
    assert cfg == Config.batch(micro=1)
    assert ("gradient_clipp1ng", "error") in [(d.path, d.severity) for d in cfg.validate()]


def test_description_must_be_a_string(tmp_path: Path) -> None:
    """The reserved key has one meaning."""
    path = _write(tmp_path / "ds.toml", "description = 3\n")
    assert str(_error(load, path)) == f"{path}: description: got 3, expected a string"


def test_description_is_dropped_in_json_too(tmp_path: Path) -> None:
    """The reserved keys mean the same in every format."""
    path = _write(tmp_path / "ds.json", '{"description": "mine", "zero_optimization": {"stage": 1}}')
    assert read_dict(path) == ({"zero_optimization": {"stage": 1}}, "mine")
    assert load(path) == Config.zero(1)
