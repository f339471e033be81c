"""``dsbuild import trl`` and ``dsbuild export --for trl``: TRL's shipped Accelerate configs import into jobs that
validate, every key of the files is carried or named, bad input is one line naming the file and the key (exit 2, or 1
for a job that fails its checks, nothing written), ``-o`` keeps an existing file without ``--force``, and a job
exported for TRL and imported again is the same job (SFT, DPO, GRPO)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from dsbuild.cli import main
from dsbuild.job import load_job

pytestmark = pytest.mark.train  # TRL's parser imports torch and transformers

SHIPPED = Path(__import__("trl").__file__).parent / "accelerate_configs"


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def _base(tmp: Path) -> dict[str, Any]:
    """A local model folder (its config.json: the hidden size is read without loading) and a messages file."""
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    llama = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 384}  # fmt: skip
    (model / "config.json").write_text(json.dumps(llama))
    record = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (tmp / "chat.jsonl").write_text(json.dumps(record) + "\n")
    return {"model_name_or_path": str(model), "dataset_name": "chat.jsonl"}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_trls_shipped_configs_import_into_a_job_that_validates(
    stage: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """zero1/2/3.yaml with an SFT config: exit 0, the job reads back at that stage and 8 processes, and every key of
    the Accelerate config is carried or listed."""
    monkeypatch.chdir(tmp_path)
    trl = _write(tmp_path / "sft.yaml", {**_base(tmp_path), "learning_rate": "2e-5", "push_to_hub": True})
    shipped = SHIPPED / f"zero{stage}.yaml"
    argv = ["import", "trl", str(trl), "--accelerate", str(shipped), "--format", "messages", "-o", "job.toml"]
    assert main(argv) == 0
    said = capsys.readouterr().out
    job = load_job(tmp_path / "job.toml")
    assert job.config.zero_optimization is not None and job.config.zero_optimization.stage == stage
    assert (job.launch.nproc_per_node, job.training.learning_rate, job.training.bf16) == (8, 2e-5, True)
    assert "push_to_hub = True: an HF TrainingArguments argument dsbuild does not take" in said
    settings = yaml.safe_load(shipped.read_text())
    for key in settings:
        if key not in ("deepspeed_config", "num_processes", "num_machines", "distributed_type"):
            assert f": {key} = " in said, key  # no effect or not carried; the others are carried
    assert "wrote job.toml (task sft;" in said


def test_an_existing_job_is_kept_without_force(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """-o over an existing file: exit 2 and the file unchanged; --force writes it."""
    monkeypatch.chdir(tmp_path)
    trl = _write(tmp_path / "sft.yaml", _base(tmp_path))
    (tmp_path / "job.toml").write_text("# mine\n")
    argv = ["import", "trl", str(trl), "--format", "messages", "-o", "job.toml"]
    assert main(argv) == 2
    assert "job.toml: exists; give --force to write over it (nothing was written)" in capsys.readouterr().err
    assert (tmp_path / "job.toml").read_text() == "# mine\n"
    assert main([*argv, "--force"]) == 0
    assert load_job(tmp_path / "job.toml").data.format == "messages"


@pytest.mark.parametrize(
    ("extra", "code", "said"),
    [
        ({"learning_rate": "abc"}, 1, "sft.yaml: learning_rate: invalid float value: 'abc' (TRL's parser refuses it)"),
        ({"reward_funcs": ["nope"]}, 1, "sft.yaml: reward_funcs: 'nope': not one of TRL's nor an import path"),
        ({"env": [1]}, 1, "sft.yaml: env: expected a table"),
        ({"gradient_accumulation_steps": 4}, 1, "job.toml: strategy.config.gradient_accumulation_steps: 1 disagrees"),
    ],
)
def test_bad_input_is_one_line_naming_the_file_and_key(
    extra: dict[str, Any], code: int, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A value TRL's parser refuses, a reward TRL cannot load, a bad env, a job that fails its checks (zero1.yaml's
    gradient_accumulation_steps 1 against the trainer's 4, which the HF Trainer refuses too): no traceback, nothing
    written."""
    monkeypatch.chdir(tmp_path)
    task = ["--task", "grpo"] if "reward_funcs" in extra else ["--format", "messages"]
    trl = _write(tmp_path / "sft.yaml", {**_base(tmp_path), **extra})
    argv = ["import", "trl", str(trl), *task, "--accelerate", str(SHIPPED / "zero1.yaml"), "-o", "job.toml"]
    assert main(argv) == code
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert not (tmp_path / "job.toml").exists()


def test_unreadable_input_and_a_missing_format_are_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Invalid YAML names the file and line; an SFT config without --format says to give it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("learning_rate: [\n")
    assert main(["import", "trl", "bad.yaml", "-o", "job.toml"]) == 2
    assert "bad.yaml: invalid YAML at line 2" in capsys.readouterr().err
    _write(tmp_path / "sft.yaml", {**_base(tmp_path), "dataset_name": "trl-lib/Capybara"})
    assert main(["import", "trl", "sft.yaml", "--task", "sft", "-o", "job.toml"]) == 2
    assert "give --format text, messages" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("record", "fmt"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "messages"),
        ({"prompt": "a", "completion": "b"}, "prompt_completion"),
        ({"input_ids": [1, 2, 3]}, "tokenized"),
        ({"text": "a"}, "text"),
    ],
)
def test_a_local_json_lines_files_format_is_told_as_trl_tells_it(
    record: dict[str, Any], fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --format, the first record of a local JSON Lines file says the format, by the columns TRL asks."""
    monkeypatch.chdir(tmp_path)
    base = _base(tmp_path)
    (tmp_path / "chat.jsonl").write_text(json.dumps(record) + "\n")
    _write(tmp_path / "sft.yaml", base)
    assert main(["import", "trl", "sft.yaml", "--task", "sft", "-o", "job.toml"]) == 0
    assert load_job(tmp_path / "job.toml").data.format == fmt


def test_without_deepspeed_the_job_trains_at_stage_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Accelerate config (or one without DeepSpeed): ZeRO-0 with the batch keys "auto", so the trainer's
    accumulation of 4 is the run's; 4 processes of a MULTI_GPU config are the job's."""
    monkeypatch.chdir(tmp_path)
    trl = _write(tmp_path / "sft.yaml", {**_base(tmp_path), "gradient_accumulation_steps": 4, "bf16": False})
    multi = _write(
        tmp_path / "multi.yaml", {"distributed_type": "MULTI_GPU", "num_processes": 4, "mixed_precision": "no"}
    )
    for accelerate in ([], ["--accelerate", str(multi)]):
        assert main(["import", "trl", str(trl), *accelerate, "--format", "messages", "-o", "job.toml", "--force"]) == 0
        job = load_job(tmp_path / "job.toml")
        resolved = job.resolve().to_dict()
        assert resolved["gradient_accumulation_steps"] == 4 and resolved["zero_optimization"]["stage"] == 0
        assert job.launch.world_size == (4 if accelerate else 1)


def test_a_ds_config_given_names_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """A ds_config in the trainer's deepspeed key is read; a precision Accelerate refuses against a --deepspeed file
    is named by that file (exit 1)."""
    monkeypatch.chdir(tmp_path)
    inline = {
        "zero_optimization": {"stage": 1},
        "gradient_accumulation_steps": "auto",
        "train_micro_batch_size_per_gpu": "auto",
    }
    trl = _write(tmp_path / "sft.yaml", {**_base(tmp_path), "deepspeed": inline})
    assert main(["import", "trl", str(trl), "--format", "messages", "-o", "job.toml"]) == 0
    assert load_job(tmp_path / "job.toml").resolve().to_dict()["zero_optimization"]["stage"] == 1
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}))
    trl = _write(tmp_path / "fp16.yaml", {**_base(tmp_path), "fp16": True})
    assert main(["import", "trl", str(trl), "--deepspeed", "ds.json", "--format", "messages", "-o", "b.toml"]) == 1
    assert "ds.json: bf16.enabled: mixed precision fp16 with bf16 enabled" in capsys.readouterr().err


def test_without_trl_the_install_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """TRL's parser is the reader: without TRL, one line says to install it (exit 2)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "trl.scripts.sft", None)
    trl = _write(tmp_path / "sft.yaml", _base(tmp_path))
    assert main(["import", "trl", str(trl), "--task", "sft", "-o", "job.toml"]) == 2
    assert "reading a TRL config needs the 'trl' package: pip install trl" in capsys.readouterr().err


def test_relative_paths_are_where_trl_would_read_and_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL reads the model and data and writes output_dir from where it runs; a job reads them from its own folder:
    a job written into another folder holds them as TRL would find them."""
    monkeypatch.chdir(tmp_path)
    _base(tmp_path)
    (tmp_path / "jobs").mkdir()
    trl = _write(
        tmp_path / "sft.yaml", {"model_name_or_path": "model", "dataset_name": "chat.jsonl", "output_dir": "out"}
    )
    assert main(["import", "trl", str(trl), "--format", "messages", "-o", "jobs/job.toml"]) == 0
    job = load_job(tmp_path / "jobs" / "job.toml")
    assert job.model.name_or_path == str(tmp_path / "model")
    assert job.data.path == tmp_path / "chat.jsonl" and job.training.output_dir == str(tmp_path / "out")


def _same_job(a: Any, b: Any) -> None:
    """Two jobs that run the same: model, data, training arguments, task tables, launch, resolved ds_config."""
    assert a.task == b.task
    assert a.model == b.model
    assert attrs.evolve(a.data, path=Path(a.data.path)) == attrs.evolve(b.data, path=Path(b.data.path))
    skip = {"given", "output_dir"}
    for field in attrs.fields(type(a.training)):
        if field.name not in skip:
            assert getattr(a.training, field.name) == getattr(b.training, field.name), field.name
    assert (a.dpo, a.grpo, a.rewards, a.reference) == (b.dpo, b.grpo, b.rewards, b.reference)
    assert a.launch.world_size == b.launch.world_size
    assert _precision_off_dropped(a.resolve().to_dict()) == _precision_off_dropped(b.resolve().to_dict())


def _precision_off_dropped(config: dict[str, Any]) -> dict[str, Any]:
    """A ds_config without ``fp16`` / ``bf16`` sections that only say ``enabled = false`` (DeepSpeed's default;
    Accelerate's plugin writes both)."""
    return {k: v for k, v in config.items() if not (k in ("fp16", "bf16") and v == {"enabled": False})}


_TASKS = {
    "sft": ({"format": "messages", "max_length": 256, "packing": True},
            {"learning_rate": 1e-4, "gradient_accumulation_steps": 2, "bf16": True, "max_steps": 5}),
    "dpo": ({"format": "preference"}, {"max_steps": 5, "per_device_train_batch_size": 2}),
    "grpo": ({"format": "prompt"}, {"max_steps": 5, "per_device_train_batch_size": 4}),
}  # fmt: skip


@pytest.mark.parametrize("task", sorted(_TASKS))
@pytest.mark.parametrize("stage", [0, 3])
def test_a_job_exported_for_trl_imports_back_the_same(
    task: str, stage: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """export --for trl, then import trl of what it wrote (the TRL config with its Accelerate config): the same job."""
    import tomli_w

    monkeypatch.chdir(tmp_path)
    base = _base(tmp_path)
    data, training = _TASKS[task]
    records = {"dpo": {"prompt": "a", "chosen": "b", "rejected": "c"}, "grpo": {"prompt": "a"}}
    if task in records:
        (tmp_path / "chat.jsonl").write_text(json.dumps(records[task]) + "\n")
    (tmp_path / "my_rewards.py").write_text(
        "def length(completions, **kwargs):\n    return [len(c) for c in completions]\n"
    )
    job: dict[str, Any] = {
        "model": {"name_or_path": base["model_name_or_path"], "dtype": "bfloat16", "lora": {"r": 4, "alpha": 8}},
        "data": {"path": "chat.jsonl", **data},
        "training": training,
        "strategy": {"config": {"zero_optimization": {"stage": stage}, "bf16": {"enabled": "auto"}}},
        "launch": {"nproc_per_node": 2},
    }
    if task != "sft":
        job["task"] = task
        job[task] = {"beta": 0.2} if task == "dpo" else {"num_generations": 4, "beta": 0.0, "temperature": 0.7}
    if task == "grpo":
        job["rewards"] = {"functions": ["my_rewards:length"], "weights": [0.5]}
    (tmp_path / "job.toml").write_text(tomli_w.dumps(job))
    assert main(["export", "job.toml", "--for", "trl", "-o", "trl.yaml"]) == 0
    fmt = ["--format", "messages"] if task == "sft" else []
    argv = ["import", "trl", "trl.yaml", "--accelerate", "trl.accelerate.yaml", *fmt, "-o", "back.toml"]
    assert main(argv) == 0
    _same_job(load_job(tmp_path / "job.toml"), load_job(tmp_path / "back.toml"))
