"""The HF TrainingArguments names a fine-tuning script sets: taken by ``Training`` (and so by a job's [training]),
or refused as an HF name dsbuild does not take, with what to do instead; never a bare "unknown key"."""

from __future__ import annotations

import dataclasses

import attrs
import pytest

from dsbuild import ConfigError, Training
from dsbuild.env.tested import TESTED
from dsbuild.resolve.training import HF_NAMES_NOT_TAKEN, NOT_TAKEN, REPORT_TO


def test_every_hf_name_is_taken_or_named_as_not_taken() -> None:
    """Each field of the installed transformers' TrainingArguments is a Training field or in HF_NAMES_NOT_TAKEN
    (so an upgrade that adds one fails here with its name), and NOT_TAKEN's hints are for HF names."""
    transformers = pytest.importorskip("transformers")
    hf = {f.name for f in dataclasses.fields(transformers.TrainingArguments) if f.init}
    ours = {a.name for a in attrs.fields(Training) if "training" in a.metadata}
    assert sorted(hf - ours - HF_NAMES_NOT_TAKEN) == []
    older = HF_NAMES_NOT_TAKEN - hf  # HF 4 names, still pasted; with an older transformers, names it lacks too
    assert {"logging_dir", "overwrite_output_dir"} <= older
    if transformers.__version__ == TESTED["transformers"]:
        assert sorted(older) == ["logging_dir", "overwrite_output_dir"]
    assert set(NOT_TAKEN) <= HF_NAMES_NOT_TAKEN
    assert ours - hf == {"warmup_ratio", "async_save"}  # HF 4's spelling, still read; torch DCP's asynchronous save


def test_names_people_paste_are_read() -> None:
    """report_to (one name or several), the eval and logging strategies, gradient checkpointing, loader workers."""
    t = Training.from_dict(
        {
            "report_to": "tensorboard",
            "eval_strategy": "steps",
            "eval_steps": 50,
            "logging_strategy": "epoch",
            "logging_first_step": True,
            "save_strategy": "epoch",
            "gradient_checkpointing": True,
            "dataloader_num_workers": 2,
        }
    )
    assert (t.report_to, t.eval_strategy, t.eval_steps, t.logging_strategy) == (("tensorboard",), "steps", 50, "epoch")
    assert t.logging_first_step and t.gradient_checkpointing and t.dataloader_num_workers == 2
    assert Training.from_dict({"report_to": ["wandb", "csv"]}).report_to == ("wandb", "csv")
    assert set(REPORT_TO) == {"tensorboard", "wandb", "comet_ml", "csv", "none"}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"optim": "adamw_torch"}, "training.optim: an HF TrainingArguments argument dsbuild does not take (set the"),
        ({"push_to_hub": True}, "training.push_to_hub: an HF TrainingArguments argument dsbuild does not take"),
        (
            {"ddp_backend": "gloo"},
            "training.ddp_backend: an HF TrainingArguments argument dsbuild does not take (remove",
        ),
        ({"report_to": ["mlflow"]}, "training.report_to: 'mlflow' is not one of DeepSpeed's monitors"),
        ({"report_to": "all"}, "training.report_to: 'all' is not one of DeepSpeed's monitors"),
        ({"eval_strategy": "sometimes"}, "training.eval_strategy: got 'sometimes', expected one of 'no', 'steps'"),
        ({"evaluation_strategy": "no"}, "training.evaluation_strategy: unknown key (did you mean 'eval_strategy'?)"),
    ],
)
def test_names_dsbuild_does_not_take_say_so(table: dict[str, object], message: str) -> None:
    """An HF name dsbuild does not take is said to be one, with what to do; an HF 4 spelling gets its HF 5 name."""
    with pytest.raises(ConfigError) as e:
        Training.from_dict(table)
    assert str(e.value).startswith(message)


def test_training_arguments_keep_what_deepspeed_can_report_to() -> None:
    """From a TrainingArguments, report_to keeps DeepSpeed's monitors among its integrations, and HF's None
    (gradient_checkpointing not set) is the default."""
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(
        output_dir="/tmp/x", report_to=["tensorboard", "mlflow"], eval_strategy="steps"
    )
    t = Training.of(args)
    assert (t.report_to, t.eval_strategy, t.gradient_checkpointing) == (("tensorboard",), "steps", False)
