"""dsbuild.io.config_files and dsbuild._util.safe_read: reading and writing config files, ``extends``, and every way a file can be unusable."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import socket
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from dsbuild import AUTO, Config, ConfigError, MissingDependencyError, PresetNotFoundError, UnknownKeyError
from dsbuild._util.safe_read import CONFIG_FILES, DATA_FILES, MAX_DEPTH, SizeLimit, count_records, read_text
from dsbuild.io import config_files as io
from dsbuild.io.config_files import merge, read_dict, read_table, write_json, write_toml
from dsbuild.io.presets import preset_names

# The readers build the class they are given; the public API gives Config.
load, read_json, read_toml, read_yaml = (
    functools.partial(f, cls=Config) for f in (io.load, io.read_json, io.read_toml, io.read_yaml)
)


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


def _write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _error(call: object, *args: object, cls: type[ConfigError] = ConfigError) -> ConfigError:
    with pytest.raises(cls) as info:
        call(*args)  # type: ignore[operator]
    return info.value


def _presets_listing() -> str:
    return ", ".join(preset_names())


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


# -- extends -------------------------------------------------------------------


def test_merge_tables_key_by_key_and_replaces_the_rest() -> None:
    """Tables merge recursively; scalars, lists, and a table over a non-table replace."""
    base = {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "b": [1, 2], "c": 1, "d": {"k": 1}}
    over = {"a": {"y": {"q": 3}, "z": 4}, "b": [3], "c": {"t": 1}, "d": 5}
    assert merge(base, over) == {"a": {"x": 1, "y": {"p": 1, "q": 3}, "z": 4}, "b": [3], "c": {"t": 1}, "d": 5}
    assert base["a"] == {"x": 1, "y": {"p": 1, "q": 2}}  # inputs untouched


def test_extends_a_preset_and_overrides_keys(tmp_path: Path) -> None:
    """A user file adds to and overrides a packaged preset."""
    path = _write(
        tmp_path / "mine.toml",
        'description = "mine"\nextends = "zero3"\ntrain_micro_batch_size_per_gpu = 2\n\n'
        "[zero_optimization]\noverlap_comm = false\n",
    )
    cfg = load(path)
    expected = Config.preset("zero3").batch(micro=2).zero_options(overlap_comm=False)
    assert cfg == expected
    assert cfg.source == f"file {path}"
    data, description = read_dict(path)
    assert description == "mine"
    assert "extends" not in data and "description" not in data


def test_extends_a_relative_path_in_another_directory(tmp_path: Path) -> None:
    """A path target is relative to the file that names it, at every level."""
    (tmp_path / "base").mkdir()
    _write(tmp_path / "base" / "root.toml", "[zero_optimization]\nstage = 2\nreduce_bucket_size = 100\n")
    _write(tmp_path / "base" / "mid.json", '{"extends": "root.toml", "zero_optimization": {"reduce_bucket_size": 200}}')
    path = _write(tmp_path / "mine.toml", 'extends = "base/mid.json"\ngradient_clipping = 0.5\n')
    assert load(path) == Config.zero(2).zero_options(reduce_bucket_size=200).clip_grad(0.5)


def test_extends_table_over_scalar_replaces(tmp_path: Path) -> None:
    """DeepSpeed's old ``"zero_optimization": true`` in the parent is replaced by a child table."""
    _write(tmp_path / "base.json", '{"zero_optimization": true}')
    path = _write(tmp_path / "mine.toml", 'extends = "base.json"\n[zero_optimization]\nstage = 3\n')
    assert read_dict(path)[0] == {"zero_optimization": {"stage": 3}}


def test_extends_parent_description_is_not_inherited(tmp_path: Path) -> None:
    """The description describes the file that has it."""
    _write(tmp_path / "base.toml", 'description = "base"\n')
    path = _write(tmp_path / "mine.toml", 'extends = "base.toml"\n')
    assert read_dict(path) == ({}, None)


def test_extends_missing_target_shows_the_chain(tmp_path: Path) -> None:
    """A missing target at the end of a chain: PresetNotFoundError showing how we got there."""
    _write(tmp_path / "base.toml", 'extends = "nosuch"\n')
    path = _write(tmp_path / "mine.toml", 'extends = "base.toml"\n')
    err = _error(load, path, cls=PresetNotFoundError)
    assert isinstance(err, ConfigError)
    assert err.source == str(path)
    assert (
        str(err)
        == f"{path}: mine.toml -> base.toml -> nosuch: no preset or file 'nosuch' (presets: {_presets_listing()})"
    )


def test_extends_misspelt_preset_suggests(tmp_path: Path) -> None:
    """A near miss gets "did you mean"."""
    path = _write(tmp_path / "mine.toml", 'extends = "zero3_ofload"\n')
    err = _error(load, path, cls=PresetNotFoundError)
    assert str(err) == (
        f"{path}: mine.toml -> zero3_ofload: no preset or file 'zero3_ofload' "
        f"(did you mean 'zero3_offload'? presets: {_presets_listing()})"
    )


def test_extends_bare_name_of_a_sibling_file_suggests_the_suffix(tmp_path: Path) -> None:
    """``extends = "base"`` next to base.toml: a bare word is a preset name, so point at the file."""
    _write(tmp_path / "base.toml", "")
    path = _write(tmp_path / "mine.toml", 'extends = "base"\n')
    err = _error(load, path, cls=PresetNotFoundError)
    assert str(err) == f"{path}: mine.toml -> base: no preset or file 'base' (did you mean 'base.toml'?)"


def test_extends_missing_path(tmp_path: Path) -> None:
    """A path target that is not there says where it looked."""
    path = _write(tmp_path / "mine.toml", 'extends = "sub/base.toml"\n')
    err = _error(load, path, cls=PresetNotFoundError)
    assert str(err) == (
        f"{path}: mine.toml -> sub/base.toml: no preset or file 'sub/base.toml' (no file at {tmp_path / 'sub' / 'base.toml'})"
    )


def test_extends_cycle_shows_the_chain(tmp_path: Path) -> None:
    """a -> b -> a would recurse forever: an error naming the loop."""
    _write(tmp_path / "a.toml", 'extends = "b.toml"\n')
    _write(tmp_path / "b.toml", 'extends = "a.toml"\n')
    err = _error(load, tmp_path / "a.toml")
    assert type(err) is ConfigError
    assert str(err) == f"{tmp_path / 'a.toml'}: extends: cycle: a.toml -> b.toml -> a.toml"


def test_extends_itself_is_a_cycle(tmp_path: Path) -> None:
    """The shortest loop, spelt differently (./a.toml), is still caught."""
    path = _write(tmp_path / "a.toml", 'extends = "./a.toml"\n')
    assert str(_error(load, path)) == f"{path}: extends: cycle: a.toml -> ./a.toml"


def test_extends_must_be_a_string(tmp_path: Path) -> None:
    """A list of parents is not supported."""
    path = _write(tmp_path / "a.toml", 'extends = ["zero3"]\n')
    assert (
        str(_error(load, path)) == f"{path}: extends: got a list ['zero3'], expected a preset name or a relative path"
    )


def test_error_in_a_parent_names_the_parent(tmp_path: Path) -> None:
    """Broken TOML in the parent is reported in the parent, where it must be fixed."""
    base = _write(tmp_path / "base.toml", "stage = = 3\n")
    path = _write(tmp_path / "mine.toml", 'extends = "base.toml"\n')
    err = _error(load, path)
    assert err.source == str(base)
    assert str(err).startswith(f"{base}: invalid TOML at line 1, column 9: ")


def test_conversion_error_after_merge_names_the_child(tmp_path: Path) -> None:
    """A bad merged value is reported against the file the user loaded."""
    _write(tmp_path / "base.toml", "[zero_optimization]\nstage = 3\n")
    path = _write(tmp_path / "mine.toml", 'extends = "base.toml"\n[zero_optimization]\nstage = 9\n')
    err = _error(load, path)
    assert err.source == str(path)
    assert [p.path for p in err.problems] == ["zero_optimization.stage"]


# -- reading: files that are not safe to read ----------------------------------------

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX special files")


@contextlib.contextmanager
def _within(seconds: float) -> Iterator[None]:
    """Fail the test, rather than hang it, when the block takes longer than ``seconds``."""

    def timeout(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, timeout)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@posix_only
def test_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    """A named pipe no one writes to would block a plain open() forever; it is refused at once."""
    path = tmp_path / "ds.json"
    os.mkfifo(path)
    with _within(10):
        assert str(_error(load, path)) == f"{path}: is a named pipe (FIFO), expected a regular file"


@posix_only
def test_symlink_to_a_device_is_refused_before_reading(tmp_path: Path) -> None:
    """A .json link to /dev/zero would be read forever; the device is refused before it is opened."""
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    path = tmp_path / "ds.json"
    path.symlink_to("/dev/zero")
    with _within(10):
        assert str(_error(load, path)) == f"{path}: is a character device, expected a regular file"


@posix_only
def test_unix_socket_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A socket named like a config is not one."""
    monkeypatch.chdir(tmp_path)  # a relative name: socket paths are limited to about 100 bytes
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("ds.toml")
        assert str(_error(load, Path("ds.toml"))) == "ds.toml: is a socket, expected a regular file"


@posix_only
@pytest.mark.parametrize("links", [["ds.json"], ["ds.json", "other.json"]])
def test_symlink_loop_is_refused(tmp_path: Path, links: list[str]) -> None:
    """A link that never reaches a file (to itself, or through another) is named as a loop."""
    for name, target in zip(links, links[1:] + links[:1], strict=True):
        (tmp_path / name).symlink_to(target)
    path = tmp_path / "ds.json"
    assert str(_error(load, path)) == f"{path}: is a symlink loop, expected a regular file"


@posix_only
def test_extends_target_that_is_not_a_regular_file_names_the_target(tmp_path: Path) -> None:
    """``extends`` goes through the same reader: a FIFO parent is refused, and the parent is named."""
    parent = tmp_path / "base.json"
    os.mkfifo(parent)
    path = _write(tmp_path / "mine.toml", 'extends = "base.json"\n')
    with _within(10):
        assert str(_error(load, path)) == f"{parent}: is a named pipe (FIFO), expected a regular file"


def test_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    """A config file larger than CONFIG_FILES is refused by its size, before it is read."""
    path = tmp_path / "ds.json"
    with path.open("wb") as f:
        f.truncate(20 * 2**20)  # sparse: no disk used
    assert CONFIG_FILES.size == 2**20
    assert str(_error(load, path)) == f"{path}: the file is 20 MiB; config files over 1 MiB are refused"


def test_read_text_takes_the_limit_of_the_kind_of_file(tmp_path: Path) -> None:
    """Data files have a larger limit of their own, given to the one reader as a keyword."""
    path = _write(tmp_path / "data.jsonl", "x" * 101)
    err = _error(functools.partial(read_text, limit=SizeLimit(100, "data files")), path)
    assert str(err) == f"{path}: the file is 101 bytes; data files over 100 bytes are refused"
    assert read_text(path, limit=DATA_FILES) == "x" * 101
    assert DATA_FILES.size > CONFIG_FILES.size


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="Linux /proc")
def test_a_file_that_reads_longer_than_its_size_is_cut_at_the_limit() -> None:
    """A file whose size says 0 but that keeps giving bytes (/proc, a growing log) is read to the limit, no further."""
    path = Path("/proc/self/maps")
    err = _error(functools.partial(read_text, limit=SizeLimit(100, "config files")), path)
    assert (
        str(err) == f"{path}: the file grew past 100 bytes while it was read; config files over 100 bytes are refused"
    )


_NESTED = {
    ".json": lambda n: '{"a": ' * n + "1" + "}" * n,
    ".toml": lambda n: "a = " + "{a = " * (n - 1) + "1" + "}" * (n - 1),
    ".yaml": lambda n: "a: " + "{a: " * (n - 1) + "1" + "}" * (n - 1),
}
"""Tables ``n`` levels deep in all, the top one included, each under key ``a``."""


@pytest.mark.parametrize("suffix", [".json", ".toml", ".yaml"])
def test_nesting_deeper_than_the_limit_names_the_key(tmp_path: Path, suffix: str) -> None:
    """Tables 65 levels deep are refused at the dotted key of the 65th; 64 levels are read."""
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    path = _write(tmp_path / f"ds{suffix}", _NESTED[suffix](MAX_DEPTH + 1))
    assert str(_error(load, path)) == f"{path}: {'.'.join(['a'] * MAX_DEPTH)}: nested deeper than 64 levels"
    path = _write(tmp_path / f"ds{suffix}", _NESTED[suffix](MAX_DEPTH))
    assert "nested deeper" not in str(_error(load, path))  # read; refused only as a ds_config


@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        (".json", "[" * 100_000),
        (".json", '{"a": ' * 100_000),
        (".toml", "a = " + "[" * 100_000),
        (".toml", "a = " + "{b = " * 100_000),
        (".toml", ".".join(["a"] * 100_000) + " = 1"),
        (".yaml", "a: " + "[" * 60_000),  # under YAML_FILES
        (".yaml", "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 100))),
    ],
)
def test_nesting_past_any_stack_is_a_config_error(tmp_path: Path, suffix: str, text: str) -> None:
    """Nesting too deep for the parser's recursion is reported as nesting, never as a RecursionError."""
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    path = _write(tmp_path / f"ds{suffix}", text)
    err = _error(load, path)
    assert err.source == str(path)
    where = r"( at line \d+(, column \d+)?)?"
    assert re.fullmatch(rf"(.*: )?nested deeper than 64 levels{where}", str(err).split(": ", 1)[1])


def _billion_laughs() -> str:
    lines = ['lol0: &lol0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):
        lines.append(f"lol{i}: &lol{i} [{', '.join([f'*lol{i - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    """The 9-level "billion laughs" document is refused while it loads, well under a second."""
    pytest.importorskip("yaml")
    path = _write(tmp_path / "ds.yaml", _billion_laughs())
    start = time.monotonic()
    err = _error(load, path)
    assert time.monotonic() - start < 1.0
    assert str(err) == f"{path}: YAML aliases expand to more than 1,000,000 values (write the values out)"


def test_yaml_merge_key_bomb_is_refused(tmp_path: Path) -> None:
    """Merge keys (``<<``) that merge the mapping before nine times, nine times over, are counted like aliases."""
    pytest.importorskip("yaml")
    lines = ["m0: &m0 {a: 1, b: 2}"]
    lines += [f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 9)}], k{i}: 1}}" for i in range(1, 10)]
    path = _write(tmp_path / "ds.yaml", "\n".join(lines))
    assert (
        str(_error(load, path)) == f"{path}: YAML aliases expand to more than 1,000,000 values (write the values out)"
    )


def test_yaml_value_holding_itself_is_refused_as_nesting(tmp_path: Path) -> None:
    """``&a [*a]`` loads as a list inside itself: infinitely deep, so refused by the depth limit."""
    pytest.importorskip("yaml")
    path = _write(tmp_path / "ds.yaml", "a: &a [*a]\n")
    assert str(_error(load, path)) == f"{path}: a{'[0]' * (MAX_DEPTH - 1)}: nested deeper than 64 levels"


def test_yaml_aliases_within_the_budget_are_read(tmp_path: Path) -> None:
    """An anchor used a few times, as people use them, is fine."""
    pytest.importorskip("yaml")
    text = (
        "optimizer: {type: AdamW, params: {lr: &lr 0.001}}\nscheduler: {type: WarmupLR, params: {warmup_max_lr: *lr}}\n"
    )
    path = _write(tmp_path / "ds.yaml", text)
    assert load(path).to_dict()["scheduler"]["params"]["warmup_max_lr"] == 0.001


def test_large_yaml_is_refused_by_its_own_limit(tmp_path: Path) -> None:
    """PyYAML reads slowly, so YAML has a smaller limit than JSON and TOML."""
    pytest.importorskip("yaml")
    path = _write(tmp_path / "ds.yaml", ("# " + "x" * 1022 + "\n") * 200 + "train_batch_size: 8\n")
    assert str(_error(load, path)) == f"{path}: the file is 200.2 KiB; YAML files over 64 KiB are refused"


@pytest.mark.parametrize(
    ("suffix", "text", "reason"),
    [
        (".json", '{"a": ' + "9" * 5000 + "}", "invalid JSON"),
        (".toml", "a = " + "9" * 5000, "invalid TOML"),
        (".yaml", "a: " + "9" * 5000, "invalid YAML"),
    ],
)
def test_number_of_thousands_of_digits_is_a_config_error(tmp_path: Path, suffix: str, text: str, reason: str) -> None:
    """Python refuses to convert integers of over 4300 digits; that is the file's fault, said as such."""
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    path = _write(tmp_path / f"ds{suffix}", text)
    assert str(_error(load, path)) == (
        f"{path}: {reason}: Exceeds the limit (4300 digits) for integer string conversion: value has 5000 digits"
    )


def test_lone_surrogate_key_is_an_unknown_key_naming_the_file(tmp_path: Path) -> None:
    """A JSON key "\\ud800" is kept as written and reported as any unknown key is."""
    path = _write(tmp_path / "ds.json", '{"\\ud800": 1}')
    err = _error(load, path)
    assert err.source == str(path)
    assert [p.path for p in err.problems] == ["\ud800"]


@posix_only
def test_count_records_of_a_device_cannot_tell(tmp_path: Path) -> None:
    """Counting records reads through the same reader: a device or a FIFO is not read (a FIFO would wait for a
    writer forever), and counts as unknown."""
    assert count_records(Path(os.devnull)) is None
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    with _within(5):
        assert count_records(fifo) is None
        with pytest.raises(ConfigError, match="is a named pipe"):
            read_text(fifo, limit=DATA_FILES)


def test_count_records_of_deeply_nested_json_is_none(tmp_path: Path) -> None:
    """A JSON array nested past Python's stack is not counted, and does not crash the count."""
    path = _write(tmp_path / "data.json", "[" * 100_000 + "]" * 100_000)
    assert count_records(path) is None


@pytest.mark.parametrize(("suffix", "text"), [(".json", "1"), (".json", "null"), (".yaml", "!"), (".yaml", "just")])
def test_scalar_at_the_top_is_refused_after_the_nesting_check(tmp_path: Path, suffix: str, text: str) -> None:
    """The depth check takes any parsed value: a scalar document reaches the "top level" message."""
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    path = _write(tmp_path / f"ds{suffix}", text)
    assert "the top level is" in str(_error(load, path))


def test_read_table_parses_by_suffix_with_the_same_limits(tmp_path: Path) -> None:
    """The raw table of any file the user names (a job, training arguments) goes through the same checks."""
    path = _write(tmp_path / "t.toml", "[training]\nlearning_rate = 1e-5\n")
    assert read_table(path) == {"training": {"learning_rate": 1e-5}}
    deep = _write(tmp_path / "deep.json", _NESTED[".json"](MAX_DEPTH + 1))
    assert str(_error(read_table, deep)).endswith(": nested deeper than 64 levels")
