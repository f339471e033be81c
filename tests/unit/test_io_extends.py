"""dsbuild.io.config_files: ``extends`` (a preset or a relative path), the merge, and a broken chain's errors."""

from __future__ import annotations

from pathlib import Path

from _io_helpers import _error, _write, load

from dsbuild import Config, ConfigError, PresetNotFoundError
from dsbuild.io.config_files import merge, read_dict
from dsbuild.io.presets import preset_names


def _presets_listing() -> str:
    return ", ".join(preset_names())


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
