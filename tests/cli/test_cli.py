"""The ``dsbuild`` command: output, exit codes (0 ok, 1 config errors, 2 unusable input or usage) and messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dsbuild
from dsbuild import Config
from dsbuild._util.compat import tomllib
from dsbuild.cli import main
from dsbuild.env.extras import missing
from dsbuild.io.presets import preset_names

REPO = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``main(argv)`` in-process: exit code, stdout, stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def good(tmp_path: Path) -> Path:
    """A valid JSON ds_config."""
    return _write(tmp_path / "good.json", json.dumps(Config.zero(2).bf16().batch(micro=2).to_dict()))


@pytest.fixture
def removed(tmp_path: Path) -> Path:
    """A well-formed config with a section DeepSpeed removed (``amp``) and a typo."""
    return _write(
        tmp_path / "removed.json",
        '{\n  "train_micro_batch_size_per_gpu": 1,\n  "amp": {"enabled": true},\n  "gradient_clipp1ng": 1.0\n}\n',
    )


@pytest.fixture
def bad_json(tmp_path: Path) -> Path:
    """A trailing comma on line 2."""
    return _write(tmp_path / "bad.json", '{\n  "train_batch_size": 8,\n}\n')


# -- presets ---------------------------------------------------------------------


def test_presets_prints_each_name_and_description(capsys: pytest.CaptureFixture[str]) -> None:
    """One line per preset, names aligned."""
    code, out, err = run(capsys, "presets")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == preset_names()
    width = max(len(n) for n in preset_names())
    for line, (name, description) in zip(lines, dsbuild.presets().items(), strict=True):
        assert line == f"{name:<{width}}  {description}"


# -- show ------------------------------------------------------------------------


def test_show_preset_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    """The default format is JSON, the same dict as ``Config.preset(...).to_dict()``."""
    code, out, err = run(capsys, "show", "zero3_offload")
    assert code == 0 and err == ""
    assert json.loads(out) == Config.preset("zero3_offload").to_dict()


def test_show_file_as_toml(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A file (extends merged) printed as TOML reads back as the same config."""
    path = _write(tmp_path / "mine.toml", 'extends = "zero2"\ntrain_micro_batch_size_per_gpu = 4\n')
    code, out, _ = run(capsys, "show", str(path), "--format", "toml")
    assert code == 0
    assert Config.from_dict(tomllib.loads(out)) == Config.preset("zero2").batch(micro=4)


@pytest.mark.procs
@pytest.mark.train
def test_show_and_doctor_take_a_job_file(capsys: pytest.CaptureFixture[str]) -> None:
    """A job file is shown as its run's config, and doctor checks against it (cli.md: CONFIG_OR_JOB)."""
    job = Path(__file__).resolve().parents[2] / "examples" / "job_lora_zero3.toml"
    code, out, err = run(capsys, "show", str(job))
    assert code == 0 and err == ""
    assert json.loads(out) == dsbuild.load_job(job).config.to_dict()
    code, out, err = run(capsys, "doctor", str(job))
    assert "unknown key" not in out + err and "needed by" in out


def test_show_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A path that is not there: exit 2, one line on stderr, nothing on stdout."""
    path = tmp_path / "nope.json"
    code, out, err = run(capsys, "show", str(path))
    assert (code, out) == (2, "")
    assert err == f"dsbuild: error: {path}: no such file\n"


def test_show_invalid_json_gives_the_line(capsys: pytest.CaptureFixture[str], bad_json: Path) -> None:
    """The parser's position reaches the user."""
    code, _, err = run(capsys, "show", str(bad_json))
    assert code == 2
    assert err == (
        f"dsbuild: error: {bad_json}: invalid JSON at line 3, column 1: Expecting property name enclosed in double quotes\n"
    )


def test_show_unknown_key_suggests(capsys: pytest.CaptureFixture[str], removed: Path) -> None:
    """show reads strictly: a typo is an error with "did you mean", exit 1 (a read config failing its checks, as
    ``validate`` exits), not 2 (unreadable)."""
    code, out, err = run(capsys, "show", str(removed))
    assert (code, out) == (1, "")
    assert err == f"dsbuild: error: {removed}: gradient_clipp1ng: unknown key (did you mean 'gradient_clipping'?)\n"


def test_show_unknown_preset_suggests(capsys: pytest.CaptureFixture[str]) -> None:
    """A bare word is a preset name; a near miss gets "did you mean"."""
    code, _, err = run(capsys, "show", "zero3_ofload")
    assert code == 2
    assert err.startswith("dsbuild: error: no preset 'zero3_ofload' (did you mean 'zero3_offload'? presets: hf_zero2, ")


# -- export ----------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_export_by_suffix(capsys: pytest.CaptureFixture[str], tmp_path: Path, suffix: str) -> None:
    """The output format follows OUT's suffix, and the file loads back equal."""
    out_path = tmp_path / f"ds{suffix}"
    code, out, err = run(capsys, "export", "hf_zero3", "-o", str(out_path))
    assert (code, err) == (0, "")
    assert out == f"wrote {out_path}\n"
    assert Config.load(out_path) == Config.preset("hf_zero3")


def test_export_format_flag_overrides_the_suffix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, good: Path
) -> None:
    """``--format json`` writes JSON to any name."""
    out_path = tmp_path / "ds_config.txt"
    code, _, _ = run(capsys, "export", str(good), "-o", str(out_path), "--format", "json")
    assert code == 0
    assert json.loads(out_path.read_text()) == json.loads(good.read_text())


def test_export_unknown_output_suffix_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Without --format, ``out.txt`` says nothing about the format: exit 2, nothing written."""
    out_path = tmp_path / "out.txt"
    code, _, err = run(capsys, "export", "zero3", "-o", str(out_path))
    assert code == 2
    assert err == (
        f"dsbuild: error: {out_path}: cannot tell the output format from its suffix: "
        "use --format json|toml or a .json/.toml name\n"
    )
    assert not out_path.exists()


def test_export_into_a_missing_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An OSError on the output path is one message naming it, exit 2."""
    out_path = tmp_path / "nosuch" / "ds.json"
    code, _, err = run(capsys, "export", "zero3", "-o", str(out_path))
    assert code == 2
    assert err == (
        f"dsbuild: error: {out_path}: the folder {str(out_path.parent)!r} does not exist (create it first); "
        "nothing was written\n"
    )


def test_export_check_refuses_a_config_with_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``--check`` turns validation errors into exit 1 and writes nothing."""
    src = _write(tmp_path / "amp.json", '{"amp": {"enabled": true}, "train_batch_size": 8}')
    out_path = tmp_path / "out.json"
    code, _, err = run(capsys, "export", str(src), "-o", str(out_path), "--check")
    assert code == 1
    assert err.splitlines()[0].startswith(f"dsbuild: error: {src}: amp: removed from DeepSpeed")
    assert err.splitlines()[-1] == "dsbuild: error: not written: 1 error"
    assert not out_path.exists()
    code, _, _ = run(capsys, "export", str(src), "-o", str(out_path))
    assert code == 0 and out_path.exists()


def test_export_check_a_value_the_reader_refuses_exits_1_as_validate_says(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, bad_json: Path
) -> None:
    """``--check`` on a value from_dict refuses: exit 1 with validate's wording, nothing written; unreadable stays 2."""
    src = _write(tmp_path / "stage.json", '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 7}}')
    _, validated, _ = run(capsys, "validate", str(src))
    listed = validated.splitlines()[2].strip()
    assert listed.startswith("zero_optimization.stage: ")
    out_path = tmp_path / "out.json"
    code, out, err = run(capsys, "export", str(src), "-o", str(out_path), "--check")
    assert (code, out) == (1, "")
    assert err.splitlines() == [f"dsbuild: error: {src}: {listed}", "dsbuild: error: not written: 1 error"]
    assert not out_path.exists()
    code, _, err = run(capsys, "export", "zero3", "--set", "zero_optimization.stage=9", "-o", str(out_path), "--check")
    assert code == 1 and err.splitlines()[0].startswith("dsbuild: error: zero3: zero_optimization.stage: got 9")
    code, _, err = run(capsys, "export", str(bad_json), "-o", str(out_path), "--check")
    assert code == 2 and err.startswith(f"dsbuild: error: {bad_json}: invalid JSON")
    assert not out_path.exists()


# -- validate --------------------------------------------------------------------


def test_validate_clean_files_exit_0(capsys: pytest.CaptureFixture[str], good: Path, tmp_path: Path) -> None:
    """Clean files: "ok" each, a summary, exit 0."""
    mine = _write(tmp_path / "mine.toml", 'extends = "zero3"\ntrain_micro_batch_size_per_gpu = 2\n')
    code, out, err = run(capsys, "validate", str(good), str(mine))
    assert (code, err) == (0, "")
    assert out == f"{good}: ok\n{mine}: ok\n2 configs checked, 0 errors, 0 warnings\n"


def test_validate_presets_by_name_for_the_hf_trainer(capsys: pytest.CaptureFixture[str]) -> None:
    """Preset names work too; with ``--target hf`` the Trainer's "auto" values are fine."""
    code, out, _ = run(capsys, "validate", "--target", "hf", "hf_zero2", "hf_zero3", "hf_zero3_offload")
    assert code == 0
    assert out == "hf_zero2: ok\nhf_zero3: ok\nhf_zero3_offload: ok\n3 configs checked, 0 errors, 0 warnings\n"
    code, out, _ = run(capsys, "validate", "hf_zero3")  # its "auto" values say it is for the HF Trainer
    assert (code, out) == (0, "hf_zero3: ok\n1 config checked, 0 errors, 0 warnings\n")
    code, out, _ = run(capsys, "validate", "--target", "deepspeed", "hf_zero3")  # as written, DeepSpeed fails on it
    assert code == 1 and 'train_batch_size: "auto" must be resolved first: DeepSpeed fails on it' in out


def test_validate_removed_section_exits_1(capsys: pytest.CaptureFixture[str], removed: Path) -> None:
    """``amp`` is an error, and so is the typo DeepSpeed would ignore silently (non-strict by default)."""
    code, out, err = run(capsys, "validate", str(removed))
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert lines[0] == f"{removed}: 2 errors, 0 warnings"
    assert lines[1] == " errors:"
    assert lines[2].startswith("  amp: removed from DeepSpeed")
    assert "use bf16, fp16 or torch_autocast" in lines[2]
    assert lines[3].startswith("  gradient_clipp1ng: unknown key: DeepSpeed ignores it, so this setting is not applied")
    assert "did you mean 'gradient_clipping'?" in lines[3]
    assert lines[-1] == "1 config checked, 2 errors, 0 warnings"


def test_validate_strict_makes_unknown_keys_errors_with_suggestion(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--strict``: a typo is an error carrying "did you mean"; exit 1 (the file itself is readable)."""
    path = _write(tmp_path / "typo.toml", "train_micro_batch_size_per_gpu = 1\ngradient_clipp1ng = 1.0\n")
    code, out, _ = run(capsys, "validate", "--strict", str(path))
    assert code == 1
    assert "  gradient_clipp1ng: unknown key (did you mean 'gradient_clipping'?)\n" in out
    code, out, _ = run(capsys, "validate", "--no-strict", str(path))
    assert code == 1
    assert "gradient_clipp1ng: unknown key: DeepSpeed ignores it, so this setting is not applied" in out


def test_validate_bad_value_is_an_error_not_unreadable(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A value from_dict rejects is a config error (exit 1), listed like the others, with nothing on stderr."""
    path = _write(tmp_path / "stage.json", '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 7}}')
    code, out, err = run(capsys, "validate", str(path))
    assert (code, err) == (1, "")
    assert out.splitlines()[:2] == [f"{path}: 1 error, 0 warnings", " errors:"]
    assert out.splitlines()[2].startswith("  zero_optimization.stage: ")


def test_validate_unreadable_inputs_exit_2_and_the_rest_is_still_checked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, bad_json: Path, removed: Path
) -> None:
    """A missing file and bad JSON are reported on stderr; the other files are still validated."""
    missing = tmp_path / "missing.json"
    code, out, err = run(capsys, "validate", str(missing), str(bad_json), str(removed))
    assert code == 2
    assert err.splitlines() == [
        f"dsbuild: error: {missing}: no such file",
        f"dsbuild: error: {bad_json}: invalid JSON at line 3, column 1: Expecting property name enclosed in double quotes",
    ]
    assert f"{missing}: unreadable\n{bad_json}: unreadable\n{removed}: 2 errors, 0 warnings\n" in out
    assert out.splitlines()[-1] == "3 configs checked, 2 errors, 0 warnings, 2 unreadable"


def test_validate_world_size_is_checked(capsys: pytest.CaptureFixture[str], good: Path) -> None:
    """--world-size takes a positive integer; anything else is a usage error."""
    assert run(capsys, "validate", "--world-size", "8", str(good))[0] == 0
    code, out, err = run(capsys, "validate", "--world-size", "0", str(good))
    assert (code, out) == (2, "")
    assert "argument --world-size: expected a positive integer, got '0'" in err


# -- validate --deepspeed ----------------------------------------------------------

DS_LINE = "  deepspeed: DeepSpeedConfig refuses it: "


@pytest.fixture
def with_deepspeed(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed installed (else the test is skipped; not imported here: the CLI does), on the CPU as the CLI picks it."""
    if missing("torch", "deepspeed"):
        pytest.skip("needs DeepSpeed")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # what the CLI sets; set here so it does not outlive the test


@pytest.mark.usefixtures("with_deepspeed")
def test_validate_deepspeed_adds_deepspeeds_own_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    """A config dsbuild lets through (no batch size yet) but DeepSpeed's parser refuses gets DeepSpeed's line, exit 1."""
    _, out, _ = run(capsys, "validate", "zero3")
    assert DS_LINE not in out
    code, out, err = run(capsys, "validate", "--deepspeed", "zero3")
    assert (code, err) == (1, "")
    assert (
        f"{DS_LINE}AssertionError: Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided\n"
        in out
    )


@pytest.mark.usefixtures("with_deepspeed")
def test_validate_deepspeed_lists_dsbuilds_rules_and_deepspeeds_together(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Under --strict the file dsbuild refuses is asked of DeepSpeed as written: both findings in one list."""
    path = _write(tmp_path / "compile.json", '{"train_micro_batch_size_per_gpu": 1, "compile": {"disable": false}}')
    code, out, _ = run(capsys, "validate", "--strict", "--deepspeed", str(path))
    assert code == 1
    assert "  compile.disable: unknown key" in out
    assert f"{DS_LINE}ValidationError: compile.disable: Extra inputs are not permitted\n" in out


@pytest.mark.usefixtures("with_deepspeed")
def test_validate_deepspeed_is_quiet_on_a_good_config(capsys: pytest.CaptureFixture[str], good: Path) -> None:
    """A config both accept: "ok", no DeepSpeed line, exit 0."""
    code, out, err = run(capsys, "validate", "--deepspeed", str(good))
    assert (code, err) == (0, "")
    assert out == f"{good}: ok\n1 config checked, 0 errors, 0 warnings\n"


@pytest.mark.usefixtures("with_deepspeed")
def test_validate_deepspeed_honours_the_world_size(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """DeepSpeed is asked at --world-size: train 8 with micro 4 is fine for 2 processes, refused for 3."""
    path = _write(tmp_path / "b.json", '{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4}')
    code, out, _ = run(capsys, "validate", "--deepspeed", "--world-size", "2", str(path))
    assert (code, out.splitlines()[0]) == (0, f"{path}: ok")
    code, out, _ = run(capsys, "validate", "--deepspeed", "--world-size", "3", str(path))
    assert code == 1
    assert f"{DS_LINE}AssertionError: Gradient accumulation steps: 0 has to be greater than 0\n" in out


@pytest.mark.usefixtures("with_deepspeed")
def test_validate_deepspeed_judges_auto_as_deepspeed_does(capsys: pytest.CaptureFixture[str]) -> None:
    """An HF-style preset's "auto" values reach DeepSpeed as written: its TypeError is an error (exit 1)."""
    code, out, _ = run(capsys, "validate", "--deepspeed", "hf_zero3")
    assert code == 1
    assert f"{DS_LINE}TypeError: " in out


def test_validate_deepspeed_for_the_hf_trainer_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """--target hf leaves "auto" for the Trainer, so DeepSpeed cannot be asked about it as written: exit 2."""
    code, out, err = run(capsys, "validate", "--deepspeed", "--target", "hf", "hf_zero3")
    assert (code, out) == (2, "")
    assert err.startswith("dsbuild: error: --deepspeed asks DeepSpeed about the config as written")


@pytest.mark.train
def test_validate_deepspeed_without_deepspeed_names_the_install(
    capsys: pytest.CaptureFixture[str], good: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without DeepSpeed installed, --deepspeed is a usage error naming the extra that brings it."""
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # find_spec: not installed
    code, out, err = run(capsys, "validate", "--deepspeed", str(good))
    assert (code, out) == (2, "")
    assert (
        err
        == "dsbuild: error: dsbuild validate --deepspeed needs the 'deepspeed' package: pip install 'dsbuild[train]'\n"
    )


# -- usage -----------------------------------------------------------------------


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse's own errors (unknown command, missing argument) and no command at all."""
    code, _, err = run(capsys, "frobnicate")
    assert code == 2 and "invalid choice: 'frobnicate'" in err
    code, _, err = run(capsys, "validate")
    assert code == 2 and "the following arguments are required: FILE" in err
    code, _, err = run(capsys, "export", "zero3")
    assert code == 2 and "the following arguments are required: -o/--output" in err
    code, _, err = run(capsys)
    assert code == 2 and err.endswith("dsbuild: error: a command is required (see dsbuild --help)\n")


def test_help_and_version_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` lists the commands; ``--version`` prints it."""
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("presets", "show", "export", "validate"):
        assert command in out
    code, out, _ = run(capsys, "--version")
    assert (code, out) == (0, f"dsbuild {dsbuild.__version__}\n")


# -- the real thing, in a subprocess -----------------------------------------------


def _dsbuild(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dsbuild", *argv], capture_output=True, text=True, cwd=cwd, timeout=60, check=False
    )


@pytest.mark.procs
def test_subprocess_show_preset(tmp_path: Path) -> None:
    """``python -m dsbuild`` works end to end."""
    result = _dsbuild("show", "zero3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["zero_optimization"]["stage"] == 3


@pytest.mark.procs
def test_subprocess_bad_input_has_no_traceback(tmp_path: Path, bad_json: Path) -> None:
    """Bad input is a message and exit 2 from the real process, never a traceback."""
    result = _dsbuild("validate", bad_json.name, "missing.toml", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        "dsbuild: error: bad.json: invalid JSON at line 3, column 1: Expecting property name enclosed in double quotes",
        "dsbuild: error: missing.toml: no such file",
    ]


@pytest.mark.procs
def test_subprocess_validate_exit_1_and_no_heavy_imports(tmp_path: Path, removed: Path) -> None:
    """A removed section exits 1; the CLI never imports torch or deepspeed for config work."""
    code = (
        f"import sys, runpy; sys.argv = ['dsbuild', 'validate', {str(removed)!r}]\n"
        "try:\n    runpy.run_module('dsbuild', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    heavy = [m for m in ('torch', 'deepspeed', 'transformers', 'peft') if m in sys.modules]\n"
        "    print('HEAVY', heavy); raise\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "HEAVY []" in result.stdout
    assert "amp: removed from DeepSpeed" in result.stdout


@pytest.mark.procs
def test_subprocess_validate_deepspeed_prints_only_the_report(tmp_path: Path, good: Path) -> None:
    """In a fresh process (DeepSpeed imported there, no accelerator chosen), DeepSpeed adds no noise to the report."""
    if missing("torch", "deepspeed"):
        pytest.skip("needs DeepSpeed")
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    result = subprocess.run(
        [sys.executable, "-m", "dsbuild", "validate", "--deepspeed", good.name, "zero3"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr == ""
    assert result.stdout.startswith(f"{good.name}: ok\nzero3: ")
    assert f"{DS_LINE}AssertionError: " in result.stdout
    report = ("  ", " errors:", " warnings:", "zero3: ", "2 configs checked, ")
    assert [line for line in result.stdout.splitlines()[1:] if not line.startswith(report)] == []


def test_a_bare_word_is_a_preset_even_next_to_a_file_of_that_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dsbuild show zero3`` means the preset, whatever sits in the current directory."""
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "zero3", "not a config")
    code, out, _ = run(capsys, "show", "zero3")
    assert code == 0 and json.loads(out) == Config.preset("zero3").to_dict()
    _write(tmp_path / "mine", "{}")
    code, _, err = run(capsys, "show", "mine")
    assert code == 2
    assert err == "dsbuild: error: mine: cannot tell the format from no suffix (use one of .json, .toml, .yaml, .yml)\n"


@pytest.mark.parametrize("command", ["validate", "explain", "export"])
def test_the_commands_agree_on_a_value_that_fails_its_checks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    """A job read fine whose --set value fails its check is exit 1 for every command (DESIGN.md: 1 fails checks, 2
    unreadable or bad usage); explain once exited 2 where validate exited 1."""
    demo = Path(__file__).resolve().parents[2] / "dsbuild" / "demo" / "demo.toml"
    extra = ["-o", str(tmp_path / "out.json")] if command == "export" else []
    code, out, err = run(capsys, command, str(demo), *extra, "--set", "training.learning_rate=fast")
    assert code == 1, err
    assert "training.learning_rate: got 'fast', expected a number >= 0" in out + err
    assert not (tmp_path / "out.json").exists()


@pytest.mark.usefixtures("with_deepspeed")
def test_validate_deepspeed_asks_about_the_file_as_written(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A misspelt key dsbuild reads leniently still reaches DeepSpeed, which refuses the file: its line shows (it
    once got the dict with the key removed, and said nothing)."""
    path = _write(
        tmp_path / "typo.json",
        '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "stage3_max_live_paramters": 10}}',
    )
    code, out, _ = run(capsys, "validate", "--deepspeed", str(path))
    assert code == 1
    assert "  zero_optimization.stage3_max_live_paramters: unknown key" in out
    assert (
        f"{DS_LINE}ValidationError: zero_optimization.stage3_max_live_paramters: Extra inputs are not permitted\n"
        in out
    )


def test_explain_exits_1_for_a_batch_that_does_not_divide_at_the_world_size(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """train 8 with micro 4 at 3 processes fails its checks: explain exits 1, as validate does."""
    path = _write(tmp_path / "b.json", '{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4}')
    assert run(capsys, "validate", "--world-size", "3", str(path))[0] == 1
    assert run(capsys, "explain", "--world-size", "3", str(path))[0] == 1
