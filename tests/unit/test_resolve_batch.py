"""resolve(): the batch triangle, the arguments resolve takes, and the Training they are read into."""

from __future__ import annotations

import enum
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest
from _resolve_helpers import BATCH, HF_ALL_AUTO, error, lines, run

from dsbuild import ConfigError, InvalidValueError, UnknownKeyError, UnresolvedAutoError
from dsbuild.resolve.training import Training

# -- the batch triangle ----------------------------------------------------------------

TRIANGLES: list[tuple[dict[str, Any], int, tuple[int, int, int]]] = [
    ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 8, (64, 4, 2)),
    ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4}, 8, (64, 4, 2)),
    ({"train_batch_size": 64, "gradient_accumulation_steps": 2}, 8, (64, 4, 2)),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 8, (64, 4, 2)),
    ({"train_batch_size": 64}, 8, (64, 8, 1)),  # DeepSpeed: accumulation 1, micro = total / world size
    ({"train_micro_batch_size_per_gpu": 4}, 8, (32, 4, 1)),  # DeepSpeed: accumulation 1
    ({"train_batch_size": 12}, 1, (12, 12, 1)),
    (
        {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
        8,
        (64, 4, 2),
    ),
    (
        {"train_batch_size": 64, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2},
        8,
        (64, 4, 2),
    ),
    (
        {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto"},
        8,
        (64, 4, 2),
    ),
    ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": "auto"}, 8, (64, 8, 1)),
]


@pytest.mark.parametrize(("given", "world_size", "expected"), TRIANGLES)
def test_batch_triangle_derives_and_writes_all_three(
    given: dict[str, Any], world_size: int, expected: tuple[int, int, int]
) -> None:
    """Any two give the third; one alone follows DeepSpeed's _set_batch_related_parameters; "auto" is derived."""
    out = run(given, world_size=world_size)
    assert (
        out["train_batch_size"],
        out["train_micro_batch_size_per_gpu"],
        out["gradient_accumulation_steps"],
    ) == expected


NOT_SET = (
    "train_micro_batch_size_per_gpu: not set; DeepSpeed needs train_batch_size or train_micro_batch_size_per_gpu"
    ' (set it to a number, or to "auto" and give the training arguments)'
)

NOT_A_MULTIPLE = (
    " (use a multiple of {}, or set train_micro_batch_size_per_gpu and gradient_accumulation_steps instead)"
)
"""The hint of a train_batch_size that the other sizes do not divide (the same words as validate's: dsbuild.resolve.batch)."""

BAD_TRIANGLES: list[tuple[dict[str, Any], int, str]] = [
    (
        {"train_batch_size": 60, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
        8,
        "train_batch_size: 60 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x world size 8 = 64"
        " (set train_batch_size 64, or leave it out and let DeepSpeed derive it)",
    ),
    (
        {"train_batch_size": 60, "train_micro_batch_size_per_gpu": 4},
        8,
        "train_batch_size: 60 is not a multiple of train_micro_batch_size_per_gpu 4 x world size 8 = 32"
        + NOT_A_MULTIPLE.format(32),
    ),
    (
        {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4},
        8,
        "train_batch_size: 16 is not a multiple of train_micro_batch_size_per_gpu 4 x world size 8 = 32"
        + NOT_A_MULTIPLE.format(32),
    ),
    (
        {"train_batch_size": 60, "gradient_accumulation_steps": 4},
        8,
        "train_batch_size: 60 is not a multiple of gradient_accumulation_steps 4 x world size 8 = 32"
        + NOT_A_MULTIPLE.format(32),
    ),
    ({"train_batch_size": 12}, 8, "train_batch_size: 12 is not a multiple of world size 8" + NOT_A_MULTIPLE.format(8)),
    ({"gradient_accumulation_steps": 4}, 8, NOT_SET),
    ({}, 1, NOT_SET),
]


@pytest.mark.parametrize(("given", "world_size", "expected"), BAD_TRIANGLES)
def test_batch_triangle_that_does_not_divide_shows_the_numbers(
    given: dict[str, Any], world_size: int, expected: str
) -> None:
    assert lines(error(given, InvalidValueError, world_size=world_size)) == [expected]


def test_one_known_batch_size_and_an_auto_accumulation_is_left_unresolved() -> None:
    """DeepSpeed's default accumulation of 1 applies to an unset key, never to an "auto" one."""
    err = error({"train_batch_size": 64, "gradient_accumulation_steps": "auto"}, UnresolvedAutoError, world_size=8)
    assert [p.path for p in err.problems] == ["gradient_accumulation_steps"]


# -- arguments -------------------------------------------------------------------------------


class SchedulerType(str, enum.Enum):
    """Like transformers' SchedulerType: a string enum."""

    LINEAR = "linear"
    COSINE = "cosine"


def test_training_may_be_any_object_with_the_hf_names() -> None:
    """A TrainingArguments stand-in: its attributes are read, missing ones take Training's defaults."""
    args = NS(learning_rate=1e-3, per_device_train_batch_size=2, bf16=True, lr_scheduler_type=SchedulerType.LINEAR)
    out = run(HF_ALL_AUTO, training=args, hidden_size=8, total_steps=10)
    assert out["optimizer"]["params"] == {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    assert (out["train_micro_batch_size_per_gpu"], out["gradient_accumulation_steps"]) == (2, 1)
    assert (out["fp16"]["enabled"], out["bf16"]["enabled"]) == (False, True)
    assert out["gradient_clipping"] == 1.0


def test_a_bad_training_object_names_its_fields() -> None:
    err = error(BATCH, InvalidValueError, training=NS(learning_rate=-1, per_device_train_batch_size=0))
    assert lines(err) == [
        "training.learning_rate: got -1, expected a number >= 0",
        "training.per_device_train_batch_size: got 0, expected an integer > 0",
    ]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"world_size": 0}, ["world_size: got 0, expected an integer > 0"]),
        ({"world_size": True}, ["world_size: got true, expected an integer > 0"]),
        ({"world_size": None}, ["world_size: got None, expected an integer > 0"]),
        (
            {"hidden_size": 0, "total_steps": -1},
            ["hidden_size: got 0, expected an integer > 0", "total_steps: got -1, expected an integer >= 0"],
        ),
        ({"total_steps": 10.0}, ["total_steps: got 10.0, expected an integer >= 0"]),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], expected: list[str]) -> None:
    assert lines(error(BATCH, InvalidValueError, **kwargs)) == expected


# -- Training ---------------------------------------------------------------------------------


def test_training_defaults_are_hfs() -> None:
    t = Training()
    assert (t.learning_rate, t.weight_decay, t.adam_beta1, t.adam_beta2, t.adam_epsilon) == (
        5e-5,
        0.0,
        0.9,
        0.999,
        1e-8,
    )
    assert (t.per_device_train_batch_size, t.per_device_eval_batch_size, t.gradient_accumulation_steps) == (8, 8, 1)
    assert (t.max_grad_norm, t.warmup_steps, t.warmup_ratio, t.num_train_epochs, t.max_steps) == (1.0, 0, 0.0, 3.0, -1)
    assert (t.lr_scheduler_type, t.bf16, t.fp16, t.seed) == ("linear", False, False, 42)
    assert (t.logging_steps, t.save_steps, t.save_total_limit, t.output_dir, t.save_on_each_node) == (
        500,
        500,
        None,
        None,
        False,
    )


def test_training_reports_every_problem_at_once() -> None:
    bad: dict[str, Any] = {
        "learning_rate": -1,
        "per_device_train_batch_size": 0,
        "gradient_accumulation_steps": 1.5,
        "adam_beta2": 1.0,
        "warmup_steps": -2,
        "lr_scheduler_type": "cosin",
        "bf16": True,
        "fp16": True,
        "logging_steps": 2.5,
        "save_total_limit": -1,
        "seed": None,
        "max_grad_norm": "1",
    }
    with pytest.raises(InvalidValueError) as info:
        Training(**bad)
    assert lines(info.value) == [
        "training.learning_rate: got -1, expected a number >= 0",
        "training.per_device_train_batch_size: got 0, expected an integer > 0",
        "training.gradient_accumulation_steps: got 1.5, expected an integer > 0",
        "training.max_grad_norm: got '1', expected a number >= 0",
        "training.warmup_steps: got -2, expected a number >= 0",
        "training.lr_scheduler_type: got 'cosin', expected one of 'linear', 'cosine', 'cosine_with_restarts',"
        " 'polynomial', 'constant', 'constant_with_warmup', 'inverse_sqrt', 'reduce_lr_on_plateau',"
        " 'cosine_with_min_lr', 'cosine_warmup_with_min_lr', 'warmup_stable_decay', 'greedy'",
        "training.seed: got None, expected an integer >= 0",
        "training.save_total_limit: got -1, expected an integer >= 0",
        "training.adam_beta2: got 1.0, expected a number >= 0 and < 1",
        "training.logging_steps: got 2.5, expected a whole number above 1 (or a fraction below 1)",
        "training.bf16: true together with fp16; at most one of fp16 and bf16 can be true",
    ]


def test_training_from_dict() -> None:
    """A job's [training] table: names checked with "did you mean", numbers as files spell them."""
    t = Training.from_dict({"learning_rate": "2e-5", "per_device_train_batch_size": 4.0, "bf16": True})
    assert (t.learning_rate, t.per_device_train_batch_size, t.bf16) == (2e-5, 4, True)
    assert Training.from_dict(t.to_dict()) == t
    with pytest.raises(UnknownKeyError) as unknown:
        Training.from_dict({"learning_rat": 1e-4, "gradient_acumulation_steps": 2})
    assert lines(unknown.value) == [
        "training.learning_rat: unknown key (did you mean 'learning_rate'?)",
        "training.gradient_acumulation_steps: unknown key (did you mean 'gradient_accumulation_steps'?)",
    ]
    with pytest.raises(ConfigError) as both:
        Training.from_dict({"lr": 1e-4, "seed": -1})
    assert type(both.value) is ConfigError
    assert lines(both.value) == ["training.lr: unknown key", "training.seed: got -1, expected an integer >= 0"]
    with pytest.raises(InvalidValueError, match="training: got 3, expected a table"):
        Training.from_dict(3)  # type: ignore[arg-type]


def test_training_of_reads_attributes() -> None:
    t = Training.of(NS(learning_rate=1e-3, lr_scheduler_type=SchedulerType.COSINE, output_dir="out", report_to="none"))
    assert (t.learning_rate, t.lr_scheduler_type, t.output_dir, t.seed) == (1e-3, "cosine", "out", 42)
    assert Training.of(t) is t


def test_training_output_dir_takes_a_path() -> None:
    assert Training(output_dir=Path("runs") / "a").output_dir == str(Path("runs") / "a")
    with pytest.raises(InvalidValueError, match=r"^training.output_dir: got 3, expected a string$"):
        Training(output_dir=3)  # type: ignore[arg-type]


def test_training_get_warmup_steps() -> None:
    """HF's TrainingArguments.get_warmup_steps, with HF 4's warmup_ratio when warmup_steps is 0."""
    assert Training(warmup_steps=10).get_warmup_steps(1000) == 10
    assert Training(warmup_steps=0.1).get_warmup_steps(1000) == 100
    assert Training(warmup_ratio=0.2).get_warmup_steps(1000) == 200
    assert Training().get_warmup_steps(1000) == 0


def test_micro_batches_of_an_epoch_under_sequence_and_tensor_parallelism() -> None:
    """What Session.fit's loader gives each rank: AutoTP and sequence-parallel groups read one share (world / tp or
    world / sp replicas); a sequence-parallel rank takes its shard of each micro-batch."""
    from dsbuild.resolve.schedule import micro_batches

    assert micro_batches(100, 4, 2, drop_last=False) == 13  # ceil(25 / 2)
    assert micro_batches(100, 4, 2, drop_last=False, tensor_parallel=2) == 25  # 50 samples each
    assert micro_batches(100, 4, 2, drop_last=False, sequence_parallel=2) == 25  # 2 replicas of 50, as 2 processes
