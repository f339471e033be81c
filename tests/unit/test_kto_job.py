"""``task = "kto"``'s job side (issue 44): ``[kto]`` reads TRL 1.16's ``KTOConfig`` names and defaults, every field
of ``KTOConfig`` either runs or is refused by its dotted key with what to write instead, ``dsbuild validate`` names
each mistake of a KTO job by its key (exit 1, no traceback), and ``dsbuild plan`` counts its reference."""

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
from dsbuild.job.rl import KTOSpec
from dsbuild.job.spec import job_keys
from dsbuild.job.trl_keys import KTO_NOT_RUN

JOB = """
    task = "kto"
    [model]
    name_or_path = "org/model"
    [data]
    path = "records.jsonl"
    format = "unpaired"
    [training]
    per_device_train_batch_size = 2
    [strategy]
    config = "zero3"
"""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "records.jsonl").write_text('{"prompt": "p", "completion": " a", "label": true}\n')
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _problems(tmp_path: Path, text: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_job(_write(tmp_path, text))
    return {p.path: str(p) for p in info.value.problems}


def test_a_kto_job_reads_ktoconfigs_names_and_defaults(tmp_path: Path) -> None:
    """``[kto]`` left out is TRL's defaults (beta 0.1, loss kto, weights 1, max_length 1024, dropout off) with the
    policy's starting weights as reference; given, its values; the plan counts a reference and kto.max_length."""
    job = load_job(_write(tmp_path, JOB))
    assert job.task == "kto" and job.kto == KTOSpec() and job.dpo is None and job.reference is not None
    assert (job.kto.beta, job.kto.loss_type, job.kto.desirable_weight, job.kto.max_length) == (0.1, "kto", 1.0, 1024)
    text = JOB + '    [kto]\n    beta = 0.5\n    loss_type = "apo_zero_unpaired"\n    undesirable_weight = 1.3\n'
    given = load_job(_write(tmp_path, text + "    max_length = 64\n"))
    assert given.kto == KTOSpec(beta=0.5, loss_type="apo_zero_unpaired", undesirable_weight=1.3, max_length=64)
    assert given.task_shapes() == {"seq_len": 64, "reference": True}


def _kto_fields() -> dict[str, Any]:
    """``KTOConfig``'s fields and defaults, ``TrainingArguments``' left out (read from the installed TRL)."""
    import transformers
    import trl

    training = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    return {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(trl.KTOConfig)
        if f.name not in training
    }


@pytest.mark.train
def test_every_kto_config_field_runs_or_says_what_to_write_instead(tmp_path: Path) -> None:
    """Each field of ``KTOConfig`` is a key of ``KTOSpec`` (with TRL's default) or a row of the table that runs only
    at TRL's default and says why and what instead (a field of a newer TRL fails here until it is one); a
    ``KTOConfig()`` written out as a ``[kto]`` table reads as the defaults, and ``to_trl`` builds TRL's config."""
    import trl

    fields = _kto_fields()
    assert sorted(set(fields) - set(job_keys(KTOSpec)) - set(KTO_NOT_RUN)) == []
    assert sorted(set(KTO_NOT_RUN) - set(fields)) == [] and not set(KTO_NOT_RUN) & set(job_keys(KTOSpec))
    for key, row in KTO_NOT_RUN.items():
        assert row.runs == fields[key] and type(row.runs) is type(fields[key]), key
        assert row.why and row.instead, key
    for key in job_keys(KTOSpec):
        assert getattr(KTOSpec(), key) == fields[key], key
    written = "".join(f"    {k} = {json.dumps(v)}\n" for k, v in fields.items() if v is not None)
    assert load_job(_write(tmp_path, JOB + "    [kto]\n" + written)).kto == KTOSpec()
    spec = KTOSpec(beta=0.3, loss_type="apo_zero_unpaired", desirable_weight=1.5, max_length=None)
    built = trl.KTOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, **spec.to_trl())
    assert KTOSpec.from_trl(built) == spec


def test_every_mistake_of_a_kto_job_is_named_by_its_key_at_once(tmp_path: Path) -> None:
    """Bad values, unknown keys (with the likeliest meant one), KTOConfig keys dsbuild train does not run, the [data]
    keys a KTO job does not read and DPO's table in a KTO job: one error, each under its dotted key."""
    text = JOB.replace('format = "unpaired"', 'format = "unpaired"\n    max_length = 64') + """
    [dpo]
    beta = 0.1
    [kto]
    beta = 0
    loss_type = "sigmoid"
    desirable_weigth = 2.0
    undesirable_weight = "more"
    precompute_ref_log_probs = true
    sync_ref_model = true
    dataset_num_proc = 4
    learning_rate = 1e-4
    """  # fmt: skip
    found = _problems(tmp_path, text)
    assert sorted(found) == [
        "data.max_length", "dpo", "kto.beta", "kto.dataset_num_proc", "kto.desirable_weigth",
        "kto.learning_rate", "kto.loss_type", "kto.precompute_ref_log_probs", "kto.sync_ref_model",
        "kto.undesirable_weight",
    ], found  # fmt: skip
    assert "[kto] max_length, as TRL's KTOConfig" in found["data.max_length"]
    assert "task = 'dpo'; this job's task is 'kto'" in found["dpo"]
    assert "did you mean 'desirable_weight'" in found["kto.desirable_weigth"]
    assert "set training.learning_rate" in found["kto.learning_rate"]
    assert "apo_zero_unpaired" in found["kto.loss_type"]
    assert found["kto.beta"].startswith("kto.beta: got 0")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('format = "unpaired"', 'format = "text"'), "data.format: got 'text' for task = 'kto'"),
        (('format = "unpaired"', 'format = "preference"'), "data.format: got 'preference' for task = 'kto'"),
        (('path = "records.jsonl"', 'path = "org/records"'), "data.path: org/records: a KTO job reads a local"),
        (('task = "kto"', 'task = "sft"'), "data.format: got 'unpaired' for task = 'sft'"),
        (("per_device_train_batch_size = 2", "per_device_train_batch_size = 1"),
         "training.per_device_train_batch_size: got 1: KTO's KL estimate"),
    ],
)  # fmt: skip
def test_a_kto_job_reads_local_unpaired_records(tmp_path: Path, change: tuple[str, str], expected: str) -> None:
    """A KTO job reads labelled completions (format "unpaired", a local file), unpaired records are read only by a
    KTO job, and KTO's KL estimate needs two or more rows a micro-batch."""
    found = _problems(tmp_path, JOB.replace(*change))
    assert any(p.startswith(expected) for p in found.values()), found


def test_one_row_a_micro_batch_is_kto_without_a_kl_only(tmp_path: Path) -> None:
    """``apo_zero_unpaired`` estimates no KL, so one row a micro-batch is fine there (as TRL)."""
    text = JOB.replace("per_device_train_batch_size = 2", "per_device_train_batch_size = 1")
    assert load_job(_write(tmp_path, text + '    [kto]\n    loss_type = "apo_zero_unpaired"\n')).kto is not None


def test_dsbuild_validate_names_the_kto_keys(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``dsbuild validate`` on a KTO job with bad ``[kto]`` keys exits 1 naming each dotted key, without a
    traceback."""
    job = _write(tmp_path, JOB + "    [kto]\n    max_length = -1\n    pad_to_multiple_of = 8\n")
    code = main(["validate", str(job)])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in out + err
    assert "kto.max_length" in out + err and "kto.pad_to_multiple_of" in out + err
