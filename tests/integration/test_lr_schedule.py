"""The learning rate of every optimizer step is the HF Trainer's: without a scheduler in the config, ``Session`` runs
the Trainer's own (``get_scheduler(lr_scheduler_type, warmup, steps)``, as ``Trainer.create_scheduler`` does),
so warmup starts at step 1 (not a step late, as DeepSpeed's WarmupLR would) and ``warmup_steps = 0`` trains at
the full rate from the first step."""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from typing import Any

import pytest
import torch
import transformers
from _session_common import Regression

from dsbuild import Config, Session, Training

pytestmark = [pytest.mark.train, pytest.mark.engine]  # the training extra; tests/conftest.py skips it without

STEPS = 5


def hf_rates(kind: str, warmup: int, total: int, lr: float) -> list[float]:
    """The rate each of the first STEPS optimizer steps applies under the HF Trainer's scheduler."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = transformers.get_scheduler(kind, optimizer, num_warmup_steps=warmup, num_training_steps=total)
    rates = []
    for _ in range(STEPS):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def loss_fn(engine: Any, batch: Any) -> Any:
    x, y = batch
    return torch.nn.functional.mse_loss(engine(x), y)


@pytest.mark.parametrize(("kind", "warmup"), [("linear", 2), ("cosine", 2), ("linear", 0), ("constant_with_warmup", 3)])
def test_the_first_steps_run_at_the_hf_trainers_rates(kind: str, warmup: int) -> None:
    """fit's logged rate of steps 1-5 equals HF's scheduler for warmup + linear / cosine, and warmup 0."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    training = Training(
        learning_rate=3e-3, lr_scheduler_type=kind, warmup_steps=warmup, max_steps=10, per_device_train_batch_size=2
    )
    s = Session(model, Config.zero(0).adamw(lr=3e-3).batch(micro=2, grad_accum=1), training=training)
    x = torch.randn(20, 4)
    data = [(x[i : i + 2], x[i : i + 2].sum(dim=1, keepdim=True)) for i in range(0, 20, 2)]
    history = s.fit(data, loss_fn=loss_fn)  # training.max_steps = 10: the schedule's length
    assert len(history) == 10
    assert [r["lr"] for r in history[:STEPS]] == pytest.approx(hf_rates(kind, warmup, 10, 3e-3), rel=1e-9, abs=1e-15)


def test_an_odd_epoch_takes_the_hf_trainers_steps_and_rates(tmp_path: Any) -> None:
    """5 micro-batches an epoch with accumulation 2 over 2 epochs: as many optimizer steps as the real HF Trainer
    takes on the same data (an epoch's last step takes the one micro-batch left), at the same rates."""
    x = torch.randn(10, 4)
    rows = [{"x": x[i], "y": x[i].sum().reshape(1)} for i in range(10)]
    args = dict(
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        learning_rate=3e-3,
        warmup_steps=1,
        lr_scheduler_type="linear",
    )
    hf = transformers.Trainer(
        model=Regression(),
        args=transformers.TrainingArguments(
            output_dir=str(tmp_path / "hf"),
            report_to=[],
            use_cpu=True,
            logging_steps=1,
            save_strategy="no",
            remove_unused_columns=False,
            **args,
        ),
        train_dataset=rows,
    )
    hf.train()
    hf_lrs = [h["learning_rate"] for h in hf.state.log_history if "learning_rate" in h]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    s = Session(model, Config.zero(0).adamw(lr=3e-3).batch(micro=2, grad_accum=2), training=Training(**args))
    data = [(x[i : i + 1], x[i : i + 1].sum(dim=1, keepdim=True)) for i in range(10)]
    history = s.fit(
        data, loss_fn=loss_fn, collate_fn=lambda b: (torch.cat([p[0] for p in b]), torch.cat([p[1] for p in b]))
    )
    assert hf.state.global_step == len(history) == 6  # ceil(5 / 2) = 3 steps an epoch
    assert [r["lr"] for r in history] == pytest.approx(hf_lrs, rel=1e-9, abs=1e-15)
