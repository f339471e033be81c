"""``dsbuild.job.trl_keys``: every field of TRL's ``GRPOConfig`` (its training arguments aside) is read by a job's
``[grpo]`` table or refused by its key with what to write instead (issue 42), and docs/rl.md's table says so."""

from __future__ import annotations

import dataclasses
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dsbuild.errors import ConfigError
from dsbuild.job import load_job
from dsbuild.job.rl import DPOSpec, GRPOSpec
from dsbuild.job.spec import job_keys
from dsbuild.job.trl_keys import DPO_NOT_RUN, GRPO_NOT_RUN

ROOT = Path(__file__).resolve().parents[2]

JOB = """
    task = "grpo"
    [model]
    name_or_path = "org/model"
    [data]
    path = "prompts.jsonl"
    format = "prompt"
    [rewards]
    functions = ["my_rewards:length"]
    [training]
    per_device_train_batch_size = 8
    [strategy]
    config = "zero3"
    [grpo]
"""


def _grpo_fields() -> dict[str, Any]:
    """``GRPOConfig``'s fields and defaults, ``TrainingArguments``' left out (read from the installed TRL)."""
    import transformers
    import trl

    training = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    return {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(trl.GRPOConfig)
        if f.name not in training
    }


@pytest.mark.train
def test_every_grpo_config_field_runs_or_says_what_to_write_instead() -> None:
    """Each field is a key of ``GRPOSpec`` or a row of the table (a field of a newer TRL fails here until it is
    one); a row names a field TRL has, runs only at TRL's default and says why and what instead."""
    fields = _grpo_fields()
    missing = sorted(set(fields) - set(job_keys(GRPOSpec)) - set(GRPO_NOT_RUN))
    assert missing == [], f"GRPOConfig fields dsbuild neither reads nor refuses: {missing}"
    assert sorted(set(GRPO_NOT_RUN) - set(fields)) == []
    for key, row in GRPO_NOT_RUN.items():
        assert row.runs == fields[key] and type(row.runs) is type(fields[key]), key
        assert row.why and row.instead, key


def _dpo_fields() -> dict[str, Any]:
    """``DPOConfig``'s fields and defaults, ``TrainingArguments``' left out (read from the installed TRL)."""
    import transformers
    import trl

    training = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    return {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(trl.DPOConfig)
        if f.name not in training
    }


@pytest.mark.train
def test_every_dpo_config_field_runs_or_says_what_to_write_instead() -> None:
    """Each field of ``DPOConfig`` is a key of ``DPOSpec`` or a row of the table (issue 43; a field of a newer TRL
    fails here until it is one); a row names a field TRL has, runs only at TRL's default and says why and what
    instead."""
    fields = _dpo_fields()
    missing = sorted(set(fields) - set(job_keys(DPOSpec)) - set(DPO_NOT_RUN))
    assert missing == [], f"DPOConfig fields dsbuild neither reads nor refuses: {missing}"
    assert sorted(set(DPO_NOT_RUN) - set(fields)) == []
    for key, row in DPO_NOT_RUN.items():
        assert row.runs == fields[key] and type(row.runs) is type(fields[key]), key
        assert row.why and row.instead, key
    for key in job_keys(DPOSpec):  # the keys a job reads are DPOConfig's, with its defaults
        default = fields[key]
        assert getattr(DPOSpec(), key) == (tuple(default) if isinstance(default, list) else default), key


DPO_JOB = """
    task = "dpo"
    [model]
    name_or_path = "org/model"
    [data]
    path = "pairs.jsonl"
    format = "preference"
    [training]
    per_device_train_batch_size = 2
    [strategy]
    config = "zero3"
    [dpo]
"""


def _load_dpo(tmp_path: Path, dpo: str) -> Any:
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(DPO_JOB) + textwrap.dedent(dpo), encoding="utf-8")
    return load_job(path)


@pytest.mark.train
def test_a_pasted_dpo_config_reads_at_trls_defaults(tmp_path: Path) -> None:
    """Every field of a ``DPOConfig()`` written out reads (a config pasted from TRL), and ``loss_type`` takes TRL's
    single string as ``DPOConfig`` does (``"ipo"`` was refused, naming ``ipo`` among the allowed values)."""
    written = "".join(f"{k} = {json.dumps(v)}\n" for k, v in _dpo_fields().items() if v is not None)
    assert _load_dpo(tmp_path, written).dpo == DPOSpec()
    assert _load_dpo(tmp_path, 'loss_type = "ipo"\n').dpo.loss_type == ("ipo",)
    with pytest.raises(ConfigError, match=r"dpo\.loss_type: got 'ipo2', expected one of 'sigmoid', "):
        _load_dpo(tmp_path, 'loss_type = "ipo2"\n')


def test_the_dpo_fields_a_job_does_not_run_are_refused_by_key_together(tmp_path: Path) -> None:
    """Each other value is named by its dotted key with what to write instead, in one error."""
    with pytest.raises(ConfigError) as info:
        _load_dpo(tmp_path, """
            use_weighting = true
            pad_to_multiple_of = 8
            activation_offloading = true
            dataset_num_proc = 4
            trust_remote_code = true
        """)  # fmt: skip
    found = {p.path: str(p) for p in info.value.problems}
    assert sorted(found) == sorted(f"dpo.{k}" for k in ("use_weighting", "pad_to_multiple_of", "activation_offloading",
                                                         "dataset_num_proc", "trust_remote_code"))  # fmt: skip
    assert "gradient_checkpointing = true" in found["dpo.activation_offloading"]


def _load(tmp_path: Path, grpo: str) -> Any:
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "p"}\n')
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(JOB) + textwrap.dedent(grpo), encoding="utf-8")
    return load_job(path)


def test_a_pasted_grpo_config_reads_at_trls_defaults(tmp_path: Path) -> None:
    """TRL's defaults of the fields a job does not run read (a config pasted from TRL), and ``scale_rewards`` takes
    TRL's ``true`` / ``false``."""
    job = _load(tmp_path, """
        use_vllm = false
        vllm_mode = "colocate"
        vllm_server_port = 8000
        vllm_server_timeout = 240
        log_completions = false
        entropy_coef = 0.0
        pad_to_multiple_of = "auto"
        num_iterations = 1
        scale_rewards = false
        shuffle_dataset = false
        sapo_temperature_neg = 1.5
    """)  # fmt: skip
    assert (job.grpo.scale_rewards, job.grpo.shuffle_dataset, job.grpo.sapo_temperature_neg) == ("none", False, 1.5)
    assert _load(tmp_path, "scale_rewards = true\n").grpo.scale_rewards == "group"


def test_the_fields_a_job_does_not_run_are_refused_by_key_together(tmp_path: Path) -> None:
    """Each is named by its dotted key with what to write instead, every one in one error (``dsbuild validate``: exit
    1); a training argument in ``[grpo]`` points to ``[training]``."""
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, """
            use_vllm = true
            vllm_mode = "server"
            reward_weights = [1.0, 0.5]
            generation_kwargs = { temperature = 0.7, max_new_tokens = 64, num_beams = 2 }
            log_unique_prompts = true
            learning_rate = 1e-5
            scale_rewards = "groups"
        """)  # fmt: skip
    found = {p.path: str(p) for p in info.value.problems}
    assert info.value.fails_checks
    assert sorted(found) == sorted(f"grpo.{k}" for k in ("use_vllm", "vllm_mode", "reward_weights", "generation_kwargs",
                                                          "log_unique_prompts", "learning_rate",
                                                          "scale_rewards"))  # fmt: skip
    assert 'backend = "function"' in found["grpo.use_vllm"] and "weight_sink" in found["grpo.use_vllm"]
    assert "set [rewards] weights = [1.0, 0.5]" in found["grpo.reward_weights"]
    kwargs = found["grpo.generation_kwargs"]
    assert "grpo.temperature = 0.7, grpo.max_completion_length = 64" in kwargs and "num_beams" in kwargs
    assert "set training.learning_rate" in found["grpo.learning_rate"]


def test_validate_exits_1_naming_each_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``dsbuild validate`` of a job with TRL fields it does not run: exit 1, each by its key."""
    from dsbuild.cli import main

    (tmp_path / "prompts.jsonl").write_text('{"prompt": "p"}\n')
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(JOB) + "use_vllm = true\nentropy_coef = 0.1\n", encoding="utf-8")
    assert main(["validate", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "grpo.use_vllm: dsbuild train does not start vLLM" in out + err and "grpo.entropy_coef:" in out + err


def _docs_rows(config: str = "GRPOConfig") -> dict[str, tuple[str, str]]:
    text = (ROOT / "docs" / "rl.md").read_text(encoding="utf-8")
    section = text.split(f"## {config}'s fields in a job", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3 and not cells[0].startswith(f"`{config}`"):
            for key in re.findall(r"`(\w+)`", cells[0]):
                rows[key] = (cells[1], cells[2])
    return rows


@pytest.mark.train
def test_the_docs_table_has_a_row_for_every_field() -> None:
    """docs/rl.md's table names every field once, as the code reads or refuses it."""
    rows = _docs_rows()
    assert sorted(rows) == sorted(_grpo_fields())
    for key, (cell, why) in rows.items():
        row = GRPO_NOT_RUN.get(key)
        if row is None:
            assert cell == "run as TRL runs them", key
        else:
            assert cell.endswith(" only") and why.startswith(row.why), key


@pytest.mark.train
def test_the_docs_dpo_table_has_a_row_for_every_field() -> None:
    """docs/rl.md's DPOConfig table names every field once, as the code reads or refuses it."""
    rows = _docs_rows("DPOConfig")
    assert sorted(rows) == sorted(_dpo_fields())
    for key, (cell, why) in rows.items():
        row = DPO_NOT_RUN.get(key)
        if row is None:
            assert cell == "run as TRL runs them", key
        else:
            assert cell.endswith(" only") and why.startswith(row.why), key
