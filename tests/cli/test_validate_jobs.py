"""``dsbuild validate JOB`` checks what would otherwise fail at launch: ``[model.config]`` against the transformers
config class (names and types), ``name_or_path`` / ``tokenizer`` (a directory, or a hub id in the local cache),
``device_mapping`` (bounded before any list is made) and every record of the job's data."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dsbuild.cli import main
from dsbuild.errors import ConfigError
from dsbuild.job import MAX_DEVICES, parse_device_mapping

pytestmark = pytest.mark.train  # the training extra; tests/conftest.py skips it without


JOB = """\
[model]
{model}

[data]
path = "train.jsonl"
format = "text"

[training]
max_steps = 2

[strategy]
config = "zero2"
"""

CONFIG = """\
tokenizer = "byte"
[model.config]
model_type = "llama"
hidden_size = 64
num_hidden_layers = 2
"""


def validate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, model: str, data: str = '{"text": "hello"}\n'
) -> tuple[int, str]:
    (tmp_path / "train.jsonl").write_text(data, encoding="utf-8")
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(model=model), encoding="utf-8")
    code = main(["validate", str(job)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out


def test_a_valid_model_config_passes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A [model.config] whose names and types are LlamaConfig's passes."""
    code, out = validate(capsys, tmp_path, CONFIG)
    assert code == 0, out


def test_model_config_values_are_checked_against_the_config_class(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """hidden_size = "big" and a misspelt field are errors naming the key, before transformers sees them."""
    code, out = validate(capsys, tmp_path, CONFIG.replace("64", '"big"') + "num_hiden_layers = 2\n")
    assert code == 1
    assert "model.config.hidden_size: got 'big', expected an integer (LlamaConfig's default is 4096)" in out
    assert "model.config.num_hiden_layers: not a LlamaConfig field (did you mean 'num_hidden_layers'?)" in out


def test_a_missing_model_directory_names_the_key(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A path that does not exist is "no such directory" under model.name_or_path, not the hub's repo-id error."""
    code, out = validate(capsys, tmp_path, 'name_or_path = "./models/llama"')
    assert code == 1
    assert "model.name_or_path: ./models/llama: no such directory" in out
    assert "Repo id" not in out


def test_a_hub_id_not_in_the_cache_is_an_error_before_launch(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """validate does not reach the hub: a hub id must be in the local cache, and the error says so."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    code, out = validate(capsys, tmp_path, 'name_or_path = "some-org/some-model"\ntokenizer = "some-org/other"')
    assert code == 1
    assert "model.name_or_path: 'some-org/some-model' is not a local directory, nor in the Hugging Face cache" in out
    assert "model.tokenizer: 'some-org/other' is not a local directory" in out


def test_a_local_model_directory_passes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An existing directory is taken as the model (relative to the job file)."""
    (tmp_path / "model").mkdir()
    code, out = validate(capsys, tmp_path, 'name_or_path = "model"')
    assert code == 0, out


def test_bad_data_records_are_named_by_validate_as_train_would(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """validate reads the job's data as train does before launch: each bad record named by file and line."""
    pytest.importorskip("datasets")
    code, out = validate(capsys, tmp_path, CONFIG, data='{"text": "a"}\n{"txt": "b"}\n{"text": 3}\n')
    data = tmp_path / "train.jsonl"
    assert code == 1
    assert f"data.path: {data}: line 2: field 'text': expected a string, it is missing or null" in out
    assert f"data.path: {data}: line 3: field 'text': expected a string, got int" in out


def test_data_with_nothing_left_to_train_on_fails_validate_as_it_would_fail_train(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With the byte tokenizer at hand validate loads the data as train does: a split leaving nothing is an error."""
    pytest.importorskip("datasets")
    records = "".join(f'{{"text": "hello {i}"}}\n' for i in range(3))
    job = JOB.replace('format = "text"', 'format = "text"\neval_split = 0.99')
    (tmp_path / "train.jsonl").write_text(records, encoding="utf-8")
    (tmp_path / "job.toml").write_text(job.format(model=CONFIG), encoding="utf-8")
    code = main(["validate", str(tmp_path / "job.toml")])
    out = capsys.readouterr().out
    assert code == 1 and "data.eval_split: 0.99 of 3 records leaves none to train on" in out, out


@pytest.mark.parametrize("text", ["0-99999999999", "list(range(0,100000000))", "0-1," + "9" * 5000])
def test_device_mapping_is_bounded_before_it_is_listed(text: str) -> None:
    """A mapping naming billions of devices (or a number of thousands of digits) is refused at once."""
    start = time.monotonic()
    with pytest.raises(ConfigError):
        parse_device_mapping(text)
    assert time.monotonic() - start < 5
    assert len(parse_device_mapping(f"0-{MAX_DEVICES - 1}")) == MAX_DEVICES


@pytest.mark.procs
@pytest.mark.engine
@pytest.mark.slow
def test_nproc_per_node_overrides_the_device_mapping(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--nproc-per-node 1 with a two-device mapping trains on one process, saying the option overrides the mapping
    (as docs/jobs.md promises), instead of refusing the job."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text("".join('{"text": "1+1=2"}\n' for _ in range(8)), encoding="utf-8")
    job = tmp_path / "job.toml"
    text = JOB.format(model=CONFIG).replace("max_steps = 2", "max_steps = 1\nper_device_train_batch_size = 2")
    job.write_text(text + '\n[launch]\ndevice_mapping = "0-1"\n', encoding="utf-8")
    code = main(["train", str(job), "--nproc-per-node", "1"])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert "--nproc-per-node 1 overrides launch.device_mapping (2 devices)" in err


def test_samples_cut_at_max_length_are_a_warning_with_the_length_that_keeps_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Samples longer than max_length lose their end (the EOS the model learns to stop from): validate says how many
    and which max_length keeps them all, before launch; the job still passes (exit 0)."""
    data = '{"text": "short"}\n' + '{"text": "' + "long " * 30 + '"}\n'
    (tmp_path / "train.jsonl").write_text(data, encoding="utf-8")
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(model=CONFIG).replace('format = "text"', 'format = "text"\nmax_length = 64'))
    code = main(["validate", str(job)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    line = next(line for line in out.splitlines() if "data.max_length" in line)
    assert "1 of 2 training samples are cut at max_length 64 and lose their end" in line
    assert "max_length = 150 keeps them all" in line  # 149 bytes and the EOS (the byte tokenizer, as TRL calls it,
    # drops the space before "</s>")


def test_the_library_check_is_the_command_s(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``dsbuild.validate_job(load_job(path))`` finds what ``dsbuild validate JOB`` prints: a bad model config value
    and a bad data record, which ``Job.validate`` (the config alone) does not see."""
    import dsbuild

    model = CONFIG.replace("hidden_size = 64", 'hidden_size = "wide"')
    code, out = validate(capsys, tmp_path, model, data='{"text": "hello"}\n{"txt": 1}\n')
    assert code == 1
    job = dsbuild.load_job(tmp_path / "job.toml")
    found = dsbuild.validate_job(job)
    errors = [d for d in found if d.severity == "error"]
    assert {d.path for d in errors} == {"model.config.hidden_size", "data.path"}, found
    for d in errors:
        assert d.message.splitlines()[0] in out
    assert [d for d in job.validate() if d.severity == "error"] == []


def test_sequence_parallelism_is_checked_against_the_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Before launch, sequence_parallel_size 2 is held to the model: eager attention and 3 heads are errors naming
    the key; a config its class refuses as a whole (an odd rotary dimension) is an error too, never a traceback."""
    sp = "[launch]\nnproc_per_node = 2\n[strategy.overrides]\nsequence_parallel_size = 2\n"
    job = tmp_path / "job.toml"
    (tmp_path / "train.jsonl").write_text('{"text": "hello"}\n', encoding="utf-8")
    job.write_text(
        JOB.format(model=CONFIG.replace('tokenizer = "byte"', 'tokenizer = "byte"\nattn_implementation = "eager"')) + sp
    )
    assert main(["validate", str(job)]) == 1
    out = capsys.readouterr().out
    assert "strategy.overrides.sequence_parallel_size: the model's attention is 'eager'" in out
    job.write_text(
        JOB.format(
            model=CONFIG.replace(
                "hidden_size = 64", "hidden_size = 66\nnum_attention_heads = 3\nnum_key_value_heads = 3"
            )
        )
        + sp
    )
    assert main(["validate", str(job)]) == 1
    assert "the model's 3 attention heads do not divide by sequence_parallel_size 2" in capsys.readouterr().out
    job.write_text(JOB.format(model=CONFIG.replace("hidden_size = 64", "hidden_size = 63\nnum_attention_heads = 3")))
    assert main(["validate", str(job)]) == 1
    out, err = capsys.readouterr()
    assert "model.config: LlamaConfig refuses it: " in out and "Traceback" not in out + err


def test_parallel_degrees_are_checked_before_launch(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """AutoTP 4 on 2 processes is an error naming the key (once a ZeroDivisionError); padding-free data with
    sequence parallelism is refused with the reason; a model whose 3 key/value heads and degree 2 neither divide
    the other is refused as DeepSpeed's Ulysses would."""
    (tmp_path / "train.jsonl").write_text('{"text": "hello"}\n', encoding="utf-8")
    job = tmp_path / "job.toml"
    job.write_text(
        JOB.format(model=CONFIG)
        + "[launch]\nnproc_per_node = 2\n[strategy.overrides]\ntensor_parallel = {autotp_size = 4}\n"
    )
    assert main(["validate", str(job)]) == 1
    out, err = capsys.readouterr()
    assert "tensor_parallel.autotp_size: 4 does not divide the world size 2" in out and "Traceback" not in out + err
    sp = "[launch]\nnproc_per_node = 2\n[strategy.overrides]\nsequence_parallel_size = 2\n"
    job.write_text(JOB.format(model=CONFIG).replace('format = "text"', 'format = "text"\npadding_free = true') + sp)
    assert main(["validate", str(job)]) == 1
    assert "data.padding_free: with sequence parallelism" in capsys.readouterr().out
    three = CONFIG.replace("hidden_size = 64", "hidden_size = 96\nnum_attention_heads = 6\nnum_key_value_heads = 3")
    job.write_text(JOB.format(model=three) + sp)
    assert main(["validate", str(job)]) == 1
    assert "the model's 3 key/value heads and sequence_parallel_size 2: neither divides" in capsys.readouterr().out
    one = CONFIG.replace("hidden_size = 64", "hidden_size = 64\nnum_attention_heads = 4\nnum_key_value_heads = 1")
    job.write_text(JOB.format(model=one) + sp)
    assert main(["validate", str(job)]) == 0, capsys.readouterr().out  # 1 key/value head: DeepSpeed repeats it
    capsys.readouterr()


def test_the_lora_rank_is_named_as_written(tmp_path: Path) -> None:
    """[model.lora] rank = 0 is reported as model.lora.rank, the key the file has (not r)."""
    from dsbuild import ConfigError, load_job

    (tmp_path / "train.jsonl").write_text('{"text": "hello"}\n', encoding="utf-8")
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(model=CONFIG + "[model.lora]\nrank = 0\n"))
    with pytest.raises(ConfigError) as caught:
        load_job(job)
    assert [p.path for p in caught.value.problems] == ["model.lora.rank"]


def test_tokenized_ids_outside_the_vocabulary_are_refused_by_validate_and_train(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Tokenized records whose ids or labels reach past the model's vocabulary (its [model.config] vocab_size), a
    completion_mask of another length, a negative label other than -100: validate and train both refuse them, naming
    the record and the field, before any process starts (the run would end in an index error at its first step)."""
    records = [
        '{"input_ids": [1, 2, 1000000000, 5]}',
        '{"input_ids": [5, 6], "labels": [6, 384]}',
        '{"input_ids": [5, 6], "completion_mask": [1]}',
        '{"input_ids": [5, 6], "labels": [-3, 6]}',
        '{"input_ids": [5, 383], "labels": [-100, 383]}',
    ]
    model = CONFIG + "vocab_size = 384\n"
    (tmp_path / "train.jsonl").write_text("\n".join(records) + "\n", encoding="utf-8")
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(model=model).replace('format = "text"', 'format = "tokenized"'), encoding="utf-8")
    data = tmp_path / "train.jsonl"
    expected = [
        f"{data}: line 1: input_ids[2]: got 1000000000, expected a token id >= 0 and below the model's vocab_size 384",
        f"{data}: line 2: labels[1]: got 384, expected a token id >= 0 and below the model's vocab_size 384 or -100",
        f"{data}: line 3: field 'completion_mask': 1 values for 2 input_ids",
        f"{data}: line 4: labels[0]: got -3, expected a token id >= 0 and below the model's vocab_size 384 or -100",
    ]
    assert main(["validate", str(job)]) == 1
    out, _ = capsys.readouterr()
    assert [line.strip() for line in out.splitlines() if "line " in line] == [f"data.path: {e}" for e in expected]
    assert main(["train", str(job)]) == 1
    _, err = capsys.readouterr()
    assert [line for line in err.splitlines() if "line " in line] == [
        f"dsbuild: error: {job}: data.path: {e}" for e in expected
    ]
