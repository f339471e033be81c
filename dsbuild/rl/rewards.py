"""GRPO's reward calls as TRL 1.16's ``GRPOTrainer._calculate_rewards`` makes them: each function called with TRL's
keyword arguments, the synchronous ones in order, then the ``async def`` ones gathered concurrently (``asyncio.gather``)
on an event loop that runs in a daemon thread for the whole run (TRL's ``start_event_loop_in_daemon``), and each
function's answer made into one float32 column as TRL makes it: ``None`` is NaN (not scored), then
``torch.tensor(answer, dtype=torch.float32)`` — lists of floats, ints or bools (1.0 / 0.0), numpy arrays and tensors
give TRL's numbers. A completion no function scored is warned about as TRL does.

What TRL would take and dsbuild refuses, naming the function and what it returned: a NaN or an infinite reward (TRL
reads a NaN as "not scored": a function's bug would silently drop its completion; ``None`` says it on purpose; an
infinite reward makes the step's loss NaN), a mapping (TRL would take its keys) and a set (no order). What TRL refuses
(a text, a number, a coroutine from a synchronous function, the wrong number of rewards, a value that is no number)
dsbuild refuses too, in one line instead of a traceback.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import inspect
import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import torch

from ..job.functions import REWARD_KEYWORDS

__all__ = ["EventLoop", "Failure", "RewardFunction", "is_async_callable", "reward_column", "score"]

logger = logging.getLogger("dsbuild")

RewardFunction = tuple[str, Callable[..., Any]]
"""A reward function and the name it is reported by (``module:function``)."""

Failure = tuple[str, str]
"""The function that failed (``module:function``) and what it did (``"raised ..."``, ``"returned ..."``)."""


def is_async_callable(function: Any) -> bool:
    """Whether calling ``function`` returns a coroutine, as TRL's ``is_async_callable`` decides: a ``partial``
    unwrapped, then an ``async def`` function or a callable object whose ``__call__`` is one."""
    while isinstance(function, functools.partial):
        function = function.func
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(function.__call__)


class EventLoop:
    """An asyncio event loop in a daemon thread, started at the first ``run`` and stopped at exit (TRL's
    ``start_event_loop_in_daemon`` / ``shutdown_event_loop_in_daemon``): the async reward functions of every step
    run on the same loop, so a client a function keeps between calls stays bound to its loop."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None

    def run(self, coroutine: Any) -> Any:
        """``coroutine``'s result, run on the loop's thread (this thread waits)."""
        if self.loop is None:
            self._start()
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def _start(self) -> None:
        loop, ready = asyncio.new_event_loop(), threading.Event()

        def forever() -> None:
            asyncio.set_event_loop(loop)
            ready.set()
            loop.run_forever()

        self.thread = threading.Thread(target=forever, name="dsbuild-rewards", daemon=True)
        self.thread.start()
        ready.wait()
        self.loop = loop
        atexit.register(self.close)

    def close(self) -> None:
        """Stop the loop and wait for its thread (5 s at most, as TRL)."""
        if self.loop is None or self.thread is None:
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop = self.thread = None


def _shown(value: Any) -> str:
    """A returned value in a message: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def reward_column(out: Any, completions: int) -> list[float] | str:
    """One function's answer as TRL reads it (``None`` → NaN, then ``torch.tensor(..., dtype=torch.float32)``), as
    Python floats, or what is wrong with it (``"returned ..."``)."""
    if inspect.iscoroutine(out):
        out.close()  # never awaited: close it so Python does not warn about it
        return "returned coroutine (an async def function is awaited; a function that is not must return the rewards)"
    if isinstance(out, (str, bytes, Mapping, AbstractSet)) or not isinstance(out, Iterable):
        return f"returned {type(out).__name__} for {completions} completions (a list of one reward per completion)"
    given = list(out)
    values = [math.nan if r is None else r for r in given]  # TRL: None is "not scored"
    if len(values) != completions:
        return f"returned {len(values)} rewards for {completions} completions (one reward per completion)"
    try:
        column = torch.tensor(values, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        column = None
    if column is None or column.shape != (completions,):
        for i, value in enumerate(values):
            try:
                one = torch.tensor([value], dtype=torch.float32)
            except (TypeError, ValueError, RuntimeError):
                one = None
            if one is None or one.shape != (1,):
                return f"returned {_shown(value)} for completion {i} (a number, a bool, or None: not scored)"
        return f"returned {type(out).__name__} of shape {tuple(column.shape) if column is not None else '?'}"
    for i, (value, reward) in enumerate(zip(given, column.tolist(), strict=True)):
        if value is not None and not math.isfinite(reward):
            return f"returned {_shown(value)} for completion {i} (a finite number, or None: not scored)"
    return [float(r) for r in column.tolist()]


def score(
    functions: Sequence[RewardFunction],
    arguments: Mapping[str, Any],
    completions: int,
    loop: EventLoop,
    raised: list[BaseException] | None = None,
) -> tuple[list[list[float]], Failure | None]:
    """Each completion's row of rewards (one per function; NaN: not scored), or the first function that failed and
    how: the synchronous functions called in order, then the async ones gathered together (TRL's order);
    ``arguments`` are TRL's keyword arguments. What a function raised is also appended to ``raised``, so the error
    that stops the run can be raised from it (its traceback: the user's file and line)."""
    columns: dict[int, list[float]] = {}
    waiting = []
    for j, (name, function) in enumerate(functions):
        if is_async_callable(function):
            waiting.append(j)
            continue
        try:
            out = function(**arguments)
        except Exception as e:
            if raised is not None:
                raised.append(e)
            return _rows(columns, len(functions), completions), (name, f"raised {type(e).__name__}: {e}")
        column = reward_column(out, completions)
        if isinstance(column, str):
            return _rows(columns, len(functions), completions), (name, column)
        columns[j] = column
    if waiting:

        async def call(j: int) -> list[float] | str:
            try:
                return reward_column(await functions[j][1](**arguments), completions)
            except Exception as e:
                if raised is not None:
                    raised.append(e)
                return f"raised {type(e).__name__}: {e}"

        async def together() -> list[list[float] | str]:
            return list(await asyncio.gather(*(call(j) for j in waiting)))

        for j, column in zip(waiting, loop.run(together()), strict=True):
            if isinstance(column, str):
                return _rows(columns, len(functions), completions), (functions[j][0], column)
            columns[j] = column
    rows = _rows(columns, len(functions), completions)
    _warn_unscored(rows, arguments)
    return rows, None


def _rows(columns: Mapping[int, list[float]], functions: int, completions: int) -> list[list[float]]:
    return [[columns[j][i] if j in columns else math.nan for j in range(functions)] for i in range(completions)]


def _warn_unscored(rows: list[list[float]], arguments: Mapping[str, Any]) -> None:
    """TRL's warning when every function returned ``None`` for a completion: the first such completion's arguments."""
    unscored = next((i for i, row in enumerate(rows) if all(math.isnan(r) for r in row)), None)
    if unscored is None:
        return
    shown = {k: v[unscored] for k, v in arguments.items() if k not in REWARD_KEYWORDS}
    shown["prompt"], shown["completion"] = arguments["prompts"][unscored], arguments["completions"][unscored]
    logger.warning(
        "All reward functions returned None for the following kwargs:\n%s\n"
        "Please ensure that at least one reward function returns a valid reward.",
        shown,
    )
