"""The HF TrainingArguments names users bring, taking effect in a real run: ``report_to`` turns DeepSpeed's
monitors on (TensorBoard read back from its event file), ``eval_strategy``/``eval_steps`` and
``logging_strategy``/``logging_first_step`` schedule ``fit``, ``gradient_checkpointing`` and
``dataloader_num_workers`` reach the model and the loader."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from _session_common import TokenData, tiny_llama

from dsbuild import Config, Training
from dsbuild.session import Session

pytestmark = [pytest.mark.train, pytest.mark.engine]  # the training extra; tests/conftest.py skips it without


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the TensorBoard event files under ``folder``, by tag: (step, value) in order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(folder.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events.parent))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            found.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return found


def test_report_to_tensorboard_writes_event_files_dsbuild_reads_back(tmp_path: Path) -> None:
    """report_to = ["tensorboard"]: DeepSpeed's TensorBoard monitor writes under output_dir/logs, at the steps
    logging_steps and logging_first_step say; eval_strategy = "steps" evaluates every eval_steps."""
    training = Training(
        output_dir=str(tmp_path / "run"),
        report_to=["tensorboard"],
        logging_steps=3,
        logging_first_step=True,
        eval_strategy="steps",
        eval_steps=2,
        per_device_train_batch_size=2,
        max_steps=6,
        learning_rate=1e-2,
        save_strategy="no",
        dataloader_num_workers=1,
        gradient_checkpointing=True,
    )
    s = Session.from_pretrained(tiny_llama(), Config.zero(1).adamw(lr="auto").batch(micro="auto"), training=training)
    assert s.config.tensorboard is not None and s.config.tensorboard.enabled
    assert s.config.csv_monitor is None  # report_to names the monitors; the CSV default is not added
    assert s.model.is_gradient_checkpointing
    records = s.fit(TokenData(16), eval_data=TokenData(4, seed=3))
    evaluations = [r["step"] for r in records if "eval_loss" in r]
    assert evaluations == [2, 4, 6]
    found = scalars(tmp_path / "run" / "logs")
    assert [step for step, _ in found["Train/loss"]] == [1, 3, 6]
    losses = {r["step"]: r["loss"] for r in records if "loss" in r}
    assert [round(v, 4) for _, v in found["Train/loss"]] == [round(losses[s], 4) for s in (1, 3, 6)]
    assert s.data_loader(TokenData(4), 2, shuffle=True).num_workers == 1


def test_logging_and_evaluation_by_epoch(tmp_path: Path) -> None:
    """logging_strategy and eval_strategy "epoch": one record logged and one evaluation per epoch."""
    training = Training(
        output_dir=str(tmp_path / "run"),
        report_to="tensorboard",
        logging_strategy="epoch",
        eval_strategy="epoch",
        per_device_train_batch_size=4,
        num_train_epochs=2,
        save_strategy="no",
    )
    s = Session.from_pretrained(tiny_llama(), Config.zero(0).adamw(lr=1e-2).batch(micro="auto"), training=training)
    records = s.fit(TokenData(8), eval_data=TokenData(4, seed=3))
    assert [r["step"] for r in records if "eval_loss" in r] == [2, 4]
    assert [step for step, _ in scalars(tmp_path / "run" / "logs")["Train/loss"]] == [2, 4]
