"""The one exception tree of dsbuild.

Every error names the dotted key path of each problem, the value, what was
expected and, where we can tell, what to do. Several problems found together
are reported together, one per line.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

import attrs

__all__ = [
    "CheckpointError",
    "ConfigError",
    "ConflictError",
    "DsbuildError",
    "FunctionError",
    "InvalidValueError",
    "MissingDependencyError",
    "NonFiniteLossError",
    "OutputDirError",
    "PresetNotFoundError",
    "Problem",
    "SessionError",
    "UnknownKeyError",
    "UnresolvedAutoError",
    "error_of",
    "needs_hint",
]

Kind = Literal["invalid-value", "unknown-key", "conflict", "unresolved-auto", "rule"]
"""What sort of problem: it decides the class of the error that reports it (``error_of``); ``"rule"`` is a
validation rule's finding about values that are each fine alone."""


@attrs.frozen
class Problem:
    """One thing wrong with a config, at one dotted key path."""

    path: str
    """Dotted key path, e.g. ``zero_optimization.offload_optimizer.device``; ``""`` for the whole file."""
    message: str
    """What is wrong, e.g. ``got 'gpu', expected one of 'cpu', 'nvme', 'none'``."""
    hint: str | None = None
    """What to do about it, when we can tell."""
    kind: Kind = attrs.field(default="invalid-value", eq=False)
    """What sort of problem it is (not part of equality: two problems that read the same are the same)."""
    needs: tuple[str, ...] = attrs.field(default=(), eq=False)
    """The ``resolve()`` arguments that would give what is missing (``("training",)``, ``("model", "hidden_size")``):
    the hint when there is no other, said as arguments by the library (``needs_hint``) and as options by the CLI."""

    @classmethod
    def unknown_key(cls, path: str, hint: str | None = None) -> Problem:
        """A key the section does not take (``hint``: "did you mean ...?" or what to do instead)."""
        return cls(path, "unknown key", hint, kind="unknown-key")

    def prefixed(self, prefix: str) -> Problem:
        """The same problem one level further down: ``prefix.path``."""
        if not prefix:
            return self
        path = f"{prefix}.{self.path}" if self.path and not self.path.startswith("[") else f"{prefix}{self.path}"
        return attrs.evolve(self, path=path)

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        hint = self.hint or needs_hint(self.needs)
        return f"{text} ({hint})" if hint else text


ARGUMENTS: Final = {
    "training": "training=...",
    "total_steps": "total_steps=...",
    "model": "model=",
    "hidden_size": "hidden_size=",
}
"""How the library's hints name ``resolve()``'s arguments (``Problem.needs``)."""


def needs_hint(needs: tuple[str, ...]) -> str | None:
    """``"pass model= or hidden_size="``: the hint for what ``needs`` names; ``None`` for nothing."""
    return "pass " + " or ".join(ARGUMENTS[name] for name in needs) if needs else None


class DsbuildError(Exception):
    """Base of every error dsbuild raises on purpose."""


class ConfigError(DsbuildError, ValueError):
    """A config (or job, or argument) is wrong; ``problems`` lists every problem found."""

    _CHECKS = False
    """What ``fails_checks`` is unless the raiser says (a conflict with the training arguments always fails them)."""

    def __init__(
        self, problems: str | Problem | Iterable[Problem], *, source: str | None = None, checks: bool | None = None
    ) -> None:
        self._checks = self._CHECKS if checks is None else checks
        if isinstance(problems, str):
            problems = [Problem("", problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [str(p) for p in self.problems]
        where = f"{self.source}: " if self.source else ""
        if len(lines) == 1:
            return where + lines[0]
        head = f"{where}{len(lines)} problems:"
        return "\n".join([head, *(f"  {line}" for line in lines)])

    @property
    def fails_checks(self) -> bool:
        """Whether the input was read and its values fail dsbuild's checks (exit 1), rather than input that cannot be
        read or a command used wrongly (exit 2): set by the readers of a config's and a job's values."""
        return self._checks

    def failing_checks(self) -> ConfigError:
        """The same error, marked as values that fail their checks (``fails_checks``)."""
        return type(self)(self.problems, source=self.source, checks=True)

    def prefixed(self, prefix: str) -> ConfigError:
        """The same error with every path under ``prefix`` (used while errors bubble up)."""
        return type(self)([p.prefixed(prefix) for p in self.problems], source=self.source, checks=self._checks)

    def with_source(self, source: str) -> ConfigError:
        """The same error, naming the file it came from."""
        return type(self)(self.problems, source=source, checks=self._checks)


class UnknownKeyError(ConfigError):
    """A key DeepSpeed does not know (with a "did you mean" where one is close)."""


class InvalidValueError(ConfigError):
    """A value of the wrong type or out of range."""


class ConflictError(ConfigError):
    """Explicit config values that disagree with the training arguments."""

    _CHECKS = True


class UnresolvedAutoError(ConfigError):
    """An ``"auto"`` value left after resolution: nothing given could fill it."""


class PresetNotFoundError(ConfigError, LookupError):
    """A preset name (or ``extends`` target) that does not exist."""


class SessionError(DsbuildError, RuntimeError):
    """A ``Session`` was used in a way it cannot work (no loss returned, no output directory to save to, ...)."""


class CheckpointError(SessionError):
    """A checkpoint cannot be saved or loaded as it is: the message names the file and what is still intact."""


class NonFiniteLossError(SessionError):
    """The loss became NaN or infinite: the run stopped at that step (the message gives the last good checkpoint)."""


class FunctionError(SessionError):
    """A function the job names (a GRPO reward or rollout function) raised, or returned what cannot be used: the run
    stopped before that step (the message names the function and the last good checkpoint)."""


class RunStopped(SessionError):
    """A signal (SIGTERM, SIGUSR1: preemption, a time limit, ``kill``) stopped the run at the next optimizer step,
    after every process saved a verified checkpoint there; ``dsbuild train --resume`` continues it."""

    EXIT_CODE = 75
    """What ``dsbuild train`` exits with (``EX_TEMPFAIL``: try again), so a script or Slurm can tell it apart."""

    def __init__(self, message: str, checkpoint: str | None) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint


class OutputDirError(DsbuildError):
    """A run's output folder cannot be used as asked: it holds an earlier run, or another run holds its lock."""


class MissingDependencyError(DsbuildError, ImportError):
    """An optional package is needed for this; the message gives the ``pip install`` that fixes it."""

    def __init__(self, package: str, purpose: str, extra: str | None = None) -> None:
        install = f"pip install {package}" if extra is None else f"pip install 'dsbuild[{extra}]'"
        what = f"the '{package}' package" if "," not in package else f"these packages: {package}"
        super().__init__(f"{purpose} needs {what}: {install}")
        self.package = package


_CLASS_OF_KIND: dict[str, type[ConfigError]] = {
    "invalid-value": InvalidValueError,
    "unknown-key": UnknownKeyError,
    "conflict": ConflictError,
    "unresolved-auto": UnresolvedAutoError,
    "rule": ConfigError,
}


def error_of(problems: Iterable[Problem], *, source: str | None = None) -> ConfigError:
    """One error for ``problems``: the class of their kind when they share one, else ``ConfigError``."""
    problems = tuple(problems)
    kinds = {p.kind for p in problems}
    cls = _CLASS_OF_KIND[kinds.pop()] if len(kinds) == 1 else ConfigError
    return cls(problems, source=source)
