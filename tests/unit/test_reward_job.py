"""``task = "reward"``'s job side (issue 44): ``[reward]`` reads TRL 1.16's ``RewardConfig`` names and defaults,
every field of ``RewardConfig`` either runs or is refused by its dotted key with what to write instead, ``dsbuild
validate`` names each mistake of a reward job by its key (exit 1, no traceback), and ``dsbuild plan`` counts a
micro-batch of pairs as its chosen and rejected rows."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dsbuild.cli import main
from dsbuild.errors import ConfigError
from dsbuild.job import load_job
from dsbuild.job.rl import RewardSpec
from dsbuild.job.spec import job_keys
from dsbuild.job.trl_keys import REWARD_NOT_RUN

JOB = """
    task = "reward"
    [model]
    name_or_path = "org/model"
    [data]
    path = "pairs.jsonl"
    format = "preference"
    [training]
    per_device_train_batch_size = 2
    [strategy]
    config = "zero3"
"""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "p", "chosen": " a", "rejected": " b", "margin": 1}\n')
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _problems(tmp_path: Path, text: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_job(_write(tmp_path, text))
    return {p.path: str(p) for p in info.value.problems}


def test_a_reward_job_reads_rewardconfigs_names_and_defaults(tmp_path: Path) -> None:
    """``[reward]`` left out is TRL's defaults (max_length 1024, no centring, dropout off); given, its values; the plan
    counts 2 rows a pair, each up to ``reward.max_length`` tokens."""
    job = load_job(_write(tmp_path, JOB))
    assert job.task == "reward" and job.reward == RewardSpec() and job.dpo is None and job.reference is None
    assert (job.reward.max_length, job.reward.center_rewards_coefficient, job.reward.disable_dropout) == (
        1024, None, True)  # fmt: skip
    set_ = load_job(
        _write(tmp_path, JOB + "    [reward]\n    max_length = 64\n    center_rewards_coefficient = 0.01\n")
    )
    assert set_.reward == RewardSpec(max_length=64, center_rewards_coefficient=0.01)
    assert set_.task_shapes() == {"seq_len": 64, "micro_batch": 4, "scorer": True}


def _reward_fields() -> dict[str, Any]:
    """``RewardConfig``'s fields and defaults, ``TrainingArguments``' left out (read from the installed TRL)."""
    import transformers
    import trl

    training = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    return {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(trl.RewardConfig)
        if f.name not in training
    }


@pytest.mark.train
def test_every_reward_config_field_runs_or_says_what_to_write_instead(tmp_path: Path) -> None:
    """Each field of ``RewardConfig`` is a key of ``RewardSpec`` (with TRL's default) or a row of the table that runs
    only at TRL's default and says why and what instead (a field of a newer TRL fails here until it is one); a
    ``RewardConfig()`` written out as a ``[reward]`` table reads as the defaults."""
    fields = _reward_fields()
    assert sorted(set(fields) - set(job_keys(RewardSpec)) - set(REWARD_NOT_RUN)) == []
    assert sorted(set(REWARD_NOT_RUN) - set(fields)) == [] and not set(REWARD_NOT_RUN) & set(job_keys(RewardSpec))
    for key, row in REWARD_NOT_RUN.items():
        assert row.runs == fields[key] and type(row.runs) is type(fields[key]), key
        assert row.why and row.instead, key
    for key in job_keys(RewardSpec):
        assert getattr(RewardSpec(), key) == fields[key], key
    written = "".join(f"    {k} = {json.dumps(v)}\n" for k, v in fields.items() if v is not None)
    assert load_job(_write(tmp_path, JOB + "    [reward]\n" + written)).reward == RewardSpec()
    assert RewardSpec.from_trl(trl_config := {"max_length": 8, "learning_rate": 1.0}).max_length == 8, trl_config


def test_every_mistake_of_a_reward_job_is_named_by_its_key_at_once(tmp_path: Path) -> None:
    """Bad values, unknown keys (with the likeliest meant one), RewardConfig keys dsbuild train does not run, the
    [data] keys a reward job does not read and DPO's table in a reward job: one error, each under its dotted key."""
    text = JOB.replace('format = "preference"', 'format = "preference"\n    max_length = 64') + """
    [dpo]
    beta = 0.1
    [reward]
    max_length = 0
    center_rewards_coefficient = "a lot"
    disable_dropot = false
    pad_to_multiple_of = 8
    eos_token = "<|end|>"
    chat_template_path = "template.jinja"
    learning_rate = 1e-4
    """  # fmt: skip
    found = _problems(tmp_path, text)
    assert sorted(found) == [
        "data.max_length", "dpo", "reward.center_rewards_coefficient", "reward.chat_template_path",
        "reward.disable_dropot", "reward.eos_token", "reward.learning_rate", "reward.max_length",
        "reward.pad_to_multiple_of",
    ], found  # fmt: skip
    assert "[reward] max_length, as TRL's RewardConfig" in found["data.max_length"]
    assert "task = 'dpo'; this job's task is 'reward'" in found["dpo"]
    assert "did you mean 'disable_dropout'" in found["reward.disable_dropot"]
    assert "set training.learning_rate" in found["reward.learning_rate"]
    assert "data.chat_template" in found["reward.chat_template_path"]
    assert found["reward.max_length"].startswith("reward.max_length: got 0")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('format = "preference"', 'format = "text"'), "data.format: got 'text' for task = 'reward'"),
        (('path = "pairs.jsonl"', 'path = "org/pairs"'), "data.path: org/pairs: a reward job reads a local"),
        (('task = "reward"', 'task = "sft"'), "data.format: got 'preference' for task = 'sft'"),
    ],
)
def test_a_reward_job_reads_local_preference_pairs(tmp_path: Path, change: tuple[str, str], expected: str) -> None:
    """A reward job reads pairs (format "preference", a local file), and pairs are read only by a pair task."""
    found = _problems(tmp_path, JOB.replace(*change))
    assert any(p.startswith(expected) for p in found.values()), found


def test_dsbuild_validate_names_the_reward_keys(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``dsbuild validate`` on a reward job with bad ``[reward]`` keys exits 1 naming each dotted key, without a
    traceback; the example job validates clean."""
    job = _write(tmp_path, JOB + "    [reward]\n    max_length = -1\n    dataset_num_proc = 4\n")
    code = main(["validate", str(job)])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in out + err
    assert "reward.max_length" in out + err and "reward.dataset_num_proc" in out + err
    assert main(["validate", str(Path(__file__).parents[2] / "examples" / "job_reward.toml")]) == 0


@pytest.mark.train
def test_a_reward_job_exports_as_trls_reward_config(tmp_path: Path) -> None:
    """``dsbuild export --for trl`` of a reward job writes ``[reward]``'s keys, which build TRL's ``RewardConfig``
    with the same values (``trl reward --config``)."""
    import trl

    from dsbuild.job.trl_export import trl_config

    job = load_job(_write(tmp_path, JOB + "    [reward]\n    max_length = 64\n    center_rewards_coefficient = 0.01\n"))
    config, _ = trl_config(job)
    mine = {key: config[key] for key in job_keys(RewardSpec)}
    assert mine == {"max_length": 64, "center_rewards_coefficient": 0.01, "disable_dropout": True}
    built = trl.RewardConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, **mine)
    assert RewardSpec.from_trl(built) == job.reward
