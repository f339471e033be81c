"""A run's step arithmetic and its ``Schedule`` (when ``fit`` logs, evaluates and saves), torch-free: the HF
Trainer's rules on the training arguments (held against the real HF Trainer in tests/integration/test_schedule.py)."""

from __future__ import annotations

import pytest

from dsbuild import Training
from dsbuild.errors import SessionError
from dsbuild.resolve.schedule import Schedule, run_steps


def test_the_hf_defaults_log_and_save_every_500_steps_and_never_evaluate_by_steps() -> None:
    """Without arguments set: logging_steps = save_steps = 500, eval_strategy "no" (the end only, given data)."""
    plan = Schedule.of(Training(), 1200, evaluating=True, saving=True)
    assert [s for s in range(1, 1201) if plan.logs(s)] == [500, 1000]
    assert [s for s in range(1, 1201) if plan.saves(s)] == [500, 1000]
    assert not any(plan.evaluates(s) for s in range(1, 1201))
    assert plan.eval_at_end and plan.save_at_end and not plan.eval_epochs and not plan.save_epochs


def test_intervals_below_one_are_fractions_of_the_run_rounded_up() -> None:
    """logging_steps = 0.1 of 25 steps is every 3 (ceil 2.5); eval_steps falls back to logging_steps."""
    plan = Schedule.of(Training(logging_steps=0.1, eval_strategy="steps", save_steps=0.5), 25, evaluating=True)
    assert plan.log_every == plan.eval_every == 3
    assert plan.save_every is None and not plan.save_at_end  # no output directory: nothing is saved


def test_fits_own_intervals_win_and_need_an_output_directory_to_save() -> None:
    """fit(eval_every=, save_every=) override the arguments; save_every without output_dir is refused."""
    training = Training(eval_strategy="steps", eval_steps=10, save_steps=10)
    plan = Schedule.of(training, 40, eval_every=4, save_every=8, evaluating=True, saving=True)
    assert (plan.eval_every, plan.save_every) == (4, 8)
    with pytest.raises(SessionError, match="save_every needs an output directory"):
        Schedule.of(training, 40, save_every=8)


def test_epoch_strategies_act_at_epoch_ends_and_first_step_logging() -> None:
    """logging/eval/save "epoch" act at each epoch's end, not by steps; logging_first_step logs step 1."""
    training = Training(logging_strategy="epoch", eval_strategy="epoch", save_strategy="epoch", logging_first_step=True)
    plan = Schedule.of(training, 10, evaluating=True, saving=True)
    assert plan.log_epochs and plan.eval_epochs and plan.save_epochs and plan.save_at_end
    assert [s for s in range(1, 11) if plan.logs(s) or plan.evaluates(s) or plan.saves(s)] == [1]


def test_the_run_length_is_max_steps_else_epochs_else_the_arguments() -> None:
    """fit's max_steps, then its epochs, then the session's total_steps, then the training arguments (HF's count)."""
    assert run_steps(10, 2, epochs=None, max_steps=7, total_steps=99, training=None) == 7
    assert run_steps(10, 3, epochs=2, max_steps=None, total_steps=99, training=None) == 8  # 2 x ceil(10 / 3)
    assert run_steps(10, 2, epochs=None, max_steps=None, total_steps=99, training=None) == 99
    assert run_steps(10, 2, epochs=None, max_steps=None, total_steps=None, training=Training(num_train_epochs=3)) == 15
    assert run_steps(10, 2, epochs=None, max_steps=None, total_steps=None, training=None) == 5
