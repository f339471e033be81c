"""``fit`` logs, evaluates and saves at the optimizer steps the real HF Trainer does, for the same training
arguments: steps and fractions of the run, epochs, ``logging_first_step``, and the end of training."""

from __future__ import annotations

import logging
import os
import re

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from _session_common import Regression

from dsbuild import Config, Session, Training

pytestmark = [pytest.mark.train, pytest.mark.engine]

ROWS = 10  # 5 optimizer steps an epoch at 2 samples a step


def _rows() -> list[dict[str, Any]]:
    x = torch.randn(ROWS, 4, generator=torch.Generator().manual_seed(0))
    return [{"x": x[i], "y": x[i].sum().reshape(1)} for i in range(ROWS)]


def _hf(args: dict[str, Any], out: Path) -> tuple[list[int], list[int], list[int]]:
    """The steps the HF Trainer logged a loss at, evaluated at, and saved a checkpoint at."""
    trainer = transformers.Trainer(
        model=Regression(),
        args=transformers.TrainingArguments(
            output_dir=str(out), report_to=[], use_cpu=True, remove_unused_columns=False, label_names=["y"], **args
        ),
        train_dataset=_rows(),
        eval_dataset=_rows()[:4],
    )
    trainer.train()
    history = trainer.state.log_history
    saved = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    return (
        [h["step"] for h in history if "loss" in h],
        [h["step"] for h in history if "eval_loss" in h],
        saved,
    )


def _ours(args: dict[str, Any], out: Path, caplog: pytest.LogCaptureFixture) -> tuple[list[int], list[int], list[int]]:
    """The same three for ``Session.fit``: its log lines (what a log file shows), its evaluations, its checkpoints."""
    session = Session(
        Regression(), Config.zero(0).adamw(lr=1e-3).batch(micro=2, grad_accum=1), Training(**args), output_dir=out
    )
    with caplog.at_level(logging.INFO, logger="dsbuild"):
        records = session.fit(_rows(), eval_data=_rows()[:4], collate_fn=_collate)
    logged = [int(m.group(1)) for r in caplog.records if (m := re.match(r"step (\d+)/", r.getMessage()))]
    saved = sorted(int(p.name.removeprefix("global_step")) for p in (out / "checkpoints").glob("global_step*"))
    return logged, [r["step"] for r in records if "eval_loss" in r], saved


def _collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"x": torch.stack([r["x"] for r in rows]), "y": torch.stack([r["y"] for r in rows])}


CASES = {
    "steps, the end between two": dict(
        max_steps=7, logging_steps=2, eval_strategy="steps", eval_steps=3, save_strategy="steps", save_steps=4
    ),
    "fractions of the run, the first step": dict(
        max_steps=8, logging_steps=0.25, logging_first_step=True, eval_strategy="steps", eval_steps=0.5, save_steps=0.5
    ),
    "evaluation by logging_steps": dict(max_steps=6, logging_steps=4, eval_strategy="steps", save_strategy="no"),
    "epochs": dict(num_train_epochs=2, logging_strategy="epoch", eval_strategy="epoch", save_strategy="epoch"),
    "epochs, stopped in the second": dict(
        max_steps=7, logging_strategy="epoch", eval_strategy="epoch", save_strategy="epoch"
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fit_logs_evaluates_and_saves_where_the_hf_trainer_does(
    case: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """For each set of training arguments, the steps logged, evaluated and saved are the HF Trainer's."""
    args = {"per_device_train_batch_size": 2, "per_device_eval_batch_size": 2, "learning_rate": 1e-3, **CASES[case]}
    hf = _hf(args, tmp_path / "hf")
    ours = _ours(args, tmp_path / "ours", caplog)
    assert ours == hf, f"logged, evaluated, saved: dsbuild {ours}, HF {hf}"
