"""``dsbuild.rl.rewards``: GRPO's reward calls as TRL 1.16's ``GRPOTrainer._calculate_rewards`` makes them (issue 42).

The accepted answers are held to TRL's own method, run on a stand-in trainer (the attributes it reads, a real
``TrainerState`` and TRL's own daemon event loop): the same float32 numbers for lists of floats, ints, bools and
``None``, numpy arrays and tensors, from sync and async functions. The refusals and the concurrency of the async
functions are dsbuild's own, said in each test.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.train  # torch, numpy and TRL's own code

PROMPTS, COMPLETIONS, IDS = ["p", "p", "q"], ["a", "bb", "ccc"], [[3], [4, 5], [6, 7, 8]]


def _answers() -> dict[str, Any]:
    import numpy as np
    import torch

    return {
        "floats": [0.5, -1.25, 1e-3],
        "ints": [1, 2, -3],
        "bools": [True, False, True],
        "none": [None, 2.0, None],
        "numpy": np.array([0.1, 0.2, 0.3]),
        "numpy float16": np.array([1.1, 2.2, 3.3], dtype=np.float16),
        "numpy bools": np.array([True, False, False]),
        "numpy objects": np.array([1.5, None, 2], dtype=object),
        "tensor": torch.tensor([0.7, 0.8, 0.9], dtype=torch.float64),
        "tensor ints": torch.tensor([1, 0, 7]),
        "tuple": (1.0, 2, None),
        "numpy scalars": [np.float64(0.1), np.int32(4), np.bool_(True)],
    }


def _trl(functions: list[Any]) -> list[list[float]]:
    """TRL's ``_calculate_rewards`` on a stand-in trainer: its rewards per completion and function."""
    import torch
    from accelerate import PartialState
    from transformers import TrainerState
    from trl import GRPOTrainer
    from trl.trainer.utils import shutdown_event_loop_in_daemon, start_event_loop_in_daemon

    PartialState()  # accelerate's gather on one process
    thread, loop, ready = start_event_loop_in_daemon()
    ready.wait()
    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(device=torch.device("cpu"), is_main_process=True),
        args=SimpleNamespace(report_to=[]), state=TrainerState(), environments=None,
        reward_funcs=functions, reward_processing_classes=[None] * len(functions),
        reward_func_names=[f"f{i}" for i in range(len(functions))], async_loop=loop,
        _log_completion_extra=lambda *a: None, _log_metric=lambda *a: None,
    )  # fmt: skip
    try:
        inputs = [{"prompt": p, "n": i} for i, p in enumerate(PROMPTS)]
        out = GRPOTrainer._calculate_rewards(trainer, inputs, PROMPTS, COMPLETIONS, IDS)  # type: ignore[arg-type]
    finally:
        shutdown_event_loop_in_daemon(thread, loop)
    return out.tolist()  # type: ignore[no-any-return]


def _ours(functions: list[Any]) -> tuple[list[list[float]], Any]:
    from transformers import TrainerState

    from dsbuild.rl.rewards import EventLoop, score

    arguments = {"prompts": PROMPTS, "completions": COMPLETIONS, "completion_ids": IDS, "n": [0, 1, 2],
                 "trainer_state": TrainerState(), "log_extra": lambda *a: None, "log_metric": lambda *a: None}  # fmt: skip
    loop = EventLoop()
    try:
        return score([(f"m:f{i}", f) for i, f in enumerate(functions)], arguments, len(PROMPTS), loop)
    finally:
        loop.close()


def _sync(answer: Any) -> Any:
    def reward(**_: Any) -> Any:
        return answer

    return reward


def _async(answer: Any) -> Any:
    async def reward(**_: Any) -> Any:
        await asyncio.sleep(0)
        return answer

    return reward


@pytest.mark.parametrize("kind", sorted(_answers()))
def test_each_answer_trl_takes_gives_trls_numbers(kind: str) -> None:
    """Each kind of answer, from a sync function and from an async one, gives the float32 rewards TRL's own
    ``_calculate_rewards`` gives (NaN where ``None``)."""
    answer = _answers()[kind]
    functions = [_sync(answer), _async(answer)]
    rows, failure = _ours(functions)
    assert failure is None
    expected = _trl(functions)
    assert [[r if not math.isnan(r) else "nan" for r in row] for row in rows] == [
        [r if not math.isnan(r) else "nan" for r in row] for row in expected
    ]


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ("abc", "returned str for 3 completions"),
        (1.0, "returned float for 3 completions"),
        ({0: 1.0, 1: 1.0, 2: 1.0}, "returned dict for 3 completions"),
        ([1.0, 2.0], "returned 2 rewards for 3 completions"),
        ([1.0, "high", 2.0], "returned 'high' for completion 1"),
        ([1.0, [2.0], 3.0], "returned [2.0] for completion 1"),
        ([1.0, math.nan, 3.0], "returned nan for completion 1 (a finite number, or None: not scored)"),
        ([1.0, 2.0, -math.inf], "returned -inf for completion 2"),
        ([1 + 2j, 1.0, 1.0], "returned (1+2j) for completion 0"),
    ],
)
def test_what_cannot_be_a_reward_is_named_with_the_function(answer: Any, said: str) -> None:
    """A text, a number, a mapping, the wrong count, a value that is no number, and (dsbuild's rule: TRL would read
    them as "not scored" or train on them) a NaN or an infinity: the function by its ``module:function`` and what it
    returned, from a sync function and from an async one."""
    for function in (_sync(answer), _async(answer)):
        _, failure = _ours([_sync([1.0, 1.0, 1.0]), function])
        assert failure is not None and failure[0] == "m:f1" and failure[1].startswith(said), failure


def test_a_coroutine_from_a_function_that_is_not_async_is_refused() -> None:
    """A sync function returning a coroutine (TRL: "'coroutine' object is not iterable") is named, and the coroutine
    closed (no "never awaited" warning)."""

    async def inner() -> list[float]:
        return [1.0, 1.0, 1.0]

    def reward(**_: Any) -> Any:
        return inner()

    _, failure = _ours([reward])
    assert failure == ("m:f0", "returned coroutine (an async def function is awaited; a function that is not must "
                       "return the rewards)")  # fmt: skip


def test_async_functions_are_gathered_concurrently() -> None:
    """Two async functions that each wait for the other to start both finish: they run together on one loop (TRL's
    ``asyncio.gather``), not one after the other; a sync function between them runs first, as in TRL."""
    started: dict[str, asyncio.Event] = {}
    order: list[str] = []

    def waiting(me: str, other: str) -> Any:
        async def reward(completions: list[str], **_: Any) -> list[float]:
            started.setdefault(me, asyncio.Event()).set()
            order.append(me)
            await asyncio.wait_for(started.setdefault(other, asyncio.Event()).wait(), timeout=10)
            return [float(len(c)) for c in completions]

        return reward

    def plain(**_: Any) -> list[float]:
        order.append("sync")
        return [0.0, 0.0, 0.0]

    rows, failure = _ours([waiting("a", "b"), plain, waiting("b", "a")])
    assert failure is None and rows == [[1.0, 0.0, 1.0], [2.0, 0.0, 2.0], [3.0, 0.0, 3.0]]
    assert order == ["sync", "a", "b"]


def test_an_async_function_that_raises_is_named() -> None:
    """An async function's exception is named like a sync one's."""

    async def reward(**_: Any) -> list[float]:
        raise KeyError("answer")

    assert _ours([reward])[1] == ("m:f0", "raised KeyError: 'answer'")


def test_async_callables_are_told_apart_as_trl_does() -> None:
    """``is_async_callable`` agrees with TRL's on functions, partials and callable objects."""
    from trl.trainer.utils import is_async_callable as trls

    from dsbuild.rl.rewards import is_async_callable

    async def a(**_: Any) -> None: ...

    def s(**_: Any) -> None: ...

    class AsyncCall:
        async def __call__(self, **_: Any) -> None: ...

    class SyncCall:
        def __call__(self, **_: Any) -> None: ...

    for f in (a, s, functools.partial(a, x=1), functools.partial(functools.partial(s)), AsyncCall(), SyncCall()):
        assert is_async_callable(f) == trls(f), f


def test_a_completion_no_function_scores_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    """Every function returning ``None`` for a completion: TRL's warning, with that completion's fields."""
    with caplog.at_level(logging.WARNING, logger="dsbuild"):
        rows, failure = _ours([_sync([1.0, None, 2.0]), _async([3.0, None, None])])
    assert failure is None and math.isnan(rows[1][0]) and math.isnan(rows[1][1]) and rows[2][0] == 2.0
    said = [r.getMessage() for r in caplog.records if "All reward functions returned None" in r.getMessage()]
    assert said and "'prompt': 'p'" in said[0] and "'completion': 'bb'" in said[0] and "'n': 1" in said[0]


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        (
            "def f(completions):\n    return []",
            "does not take TRL's keyword arguments prompts, completion_ids, trainer_state, log_extra, log_metric",
        ),
        (
            "def f(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, /, **kw):\n    return []",
            "needs prompts, completions, completion_ids, trainer_state, log_extra, log_metric, which TRL does not pass by "
            "position only",
        ),
        ("def f(completions, **kwargs):\n    return []", None),
        ("async def f(completions, answer, **kwargs):\n    return []", None),
        (
            "def f(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, answer):\n    return []",
            None,
        ),
    ],
)
def test_a_reward_functions_signature_is_held_to_trls_call(source: str, problem: str | None) -> None:
    """The signature takes TRL's keyword arguments (or ``**kwargs``); a required argument of another name is a field
    of the records; ``async def`` is fine."""
    from dsbuild.job.functions import reward_signature_problem

    space: dict[str, Any] = {}
    exec(source, space)
    assert reward_signature_problem(space["f"]) == problem
    if problem is None and "answer" in source:
        assert reward_signature_problem(space["f"], ["answer"]) is None
        assert reward_signature_problem(space["f"], ["target"]) is not None
