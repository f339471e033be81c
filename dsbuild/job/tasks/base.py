"""``JobTask``: what a job file says of one task, and what the reader, ``validate`` and ``plan`` need to know of it.

A task's module (``dsbuild/job/tasks/dpo.py``, ...) makes one ``JobTask``; the reader (``dsbuild.job.reader``) reads
every task's tables, data and checks from it, and never names a task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from ..collect import Collector
from ..rl import DPOSpec, GRPOSpec, KTOSpec, RewardSpec, RLOOSpec
from ..spec import DataSpec, LaunchSpec, ReferenceSpec, RewardsSpec, RolloutSpec

if TYPE_CHECKING:
    from ...resolve.training import Training
    from ...validate import Diagnostic

__all__ = ["TABLE_SPECS", "JobTask", "Reading"]

TABLE_SPECS: Final[dict[str, type]] = {
    "reference": ReferenceSpec, "rollout": RolloutSpec, "rewards": RewardsSpec,
    "dpo": DPOSpec, "grpo": GRPOSpec, "reward": RewardSpec, "rloo": RLOOSpec, "kto": KTOSpec,
}  # fmt: skip
"""The spec class of each table a task adds to a job (a task's own, named after it, and those tasks share)."""


@attrs.frozen
class Reading:
    """What a task's own checks see when the job is read: the collector (``problem``), the task's tables as read
    (``None`` for one with problems or left out), and the training arguments and launch when they were read."""

    c: Collector
    tables: Mapping[str, Any]
    training: Training | None
    launch: LaunchSpec | None


def _no_checks(reading: Reading) -> None:
    """No checks of the task's own."""


def _no_problems(job: Any, world_size: int) -> list[Diagnostic]:
    return []


def _no_shapes(job: Any) -> dict[str, Any]:
    return {}


@attrs.frozen
class JobTask:
    """One task as a job file states it (``task = NAME``): its tables, the data it reads, its checks, what ``dsbuild
    plan`` counts for it. Its run is ``dsbuild.run.tasks``'s module of the same name."""

    name: str
    """The job's ``task``."""
    label: str = ""
    """How messages name it: ``"DPO"`` (``"a DPO job"``)."""
    config: str = ""
    """TRL's config class of its options: ``"DPOConfig"``."""
    tables: tuple[str, ...] = ()
    """The tables it reads (``TABLE_SPECS``), its own (named after it) last."""
    optional: tuple[str, ...] = ()
    """Of ``tables``, those read only when given (``None`` when left out)."""
    required: Mapping[str, str] = attrs.field(factory=dict)
    """Of ``tables``, those a job must give, with what it is told when it does not (``{job}``: ``job``)."""
    format: str | None = None
    """The ``[data]`` format it reads; ``None``: every format no task claims (SFT)."""
    records: str = ""
    """What its records are, in messages: ``"pairs"``."""
    fields: str = ""
    """The fields of a record of its format, in messages: ``"prompt / chosen / rejected"``."""
    records_are: str = ""
    """How a message says another job's data is its kind: ``"pairs are"``, ``"unpaired data is"``."""
    data_keys: frozenset[str] | None = None
    """The ``[data]`` keys it reads; ``None``: every key."""
    length: str | None = None
    """Where its lengths are set instead of ``data.max_length``: ``"[dpo] max_length and truncation_mode"``."""
    evaluates: bool = True
    """Whether it evaluates (``data.eval_path``)."""
    reader: str | None = None
    """``"module:function"`` of ``dsbuild.data`` that reads and tokenizes its records, ``function(job, tokenizer)``
    giving its training samples, its evaluation samples (or ``None``) and a note of what was cut
    (``dsbuild.data.load``); ``None``: the SFT data path."""
    checks: Callable[[Reading], None] = _no_checks
    """Its own checks of the tables read together, each a problem of the collector."""
    problems: Callable[[Any, int], list[Diagnostic]] = _no_problems
    """``problems(job, world_size)``: what ``Job.validate`` adds at the run's world size."""
    shapes: Callable[[Any], dict[str, Any]] = _no_shapes
    """``shapes(job)``: what it changes in ``dsbuild plan``'s facts (``Job.task_shapes``)."""

    @property
    def job(self) -> str:
        """``"a DPO job"``, ``"an RLOO job"``."""
        return f"{_article(self.label)} {self.label} job"

    def own(self, job: Any) -> Any:
        """The job's table of this task's own options (``job.dpo``), or ``None`` (SFT has none)."""
        return getattr(job, self.name) if self.name in self.tables else None

    def read_tables(self, c: Collector, data: Mapping[str, Any]) -> dict[str, Any]:
        """Its tables read by the collector (``optional`` ones ``None`` when left out, ``required`` ones a problem)."""
        tables: dict[str, Any] = {}
        for name in self.tables:
            if name not in data and (name in self.optional or name in self.required):
                if name in self.required:
                    c.problem(name, self.required[name].format(job=self.job))
                tables[name] = None
                continue
            tables[name] = c.collect(TABLE_SPECS[name], c.table(data, name, name), name)
        return tables

    def check_data(self, c: Collector, data: DataSpec, table: Mapping[str, Any], claims: Mapping[str, str]) -> None:
        """Its ``[data]``: the format it reads (``claims``: each format a task claims, with the hint that names who
        reads it), local files where it reads them, and the keys it does not read."""
        if self.format is not None and data.format != self.format:
            wanted = f'{self.job} reads {self.records}: format = "{self.format}" ({self.fields})'
            c.problem("data.format", f"got {data.format!r} for task = {self.name!r}", wanted)
        elif self.format is None and data.format in claims:
            c.problem("data.format", f"got {data.format!r} for task = {self.name!r}", claims[data.format])
        if self.data_keys is None:
            return
        for key in ("path", "eval_path"):
            where = getattr(data, key)
            if key in self.data_keys and where is not None and not (isinstance(where, Path) and where.is_file()):
                c.problem(f"data.{key}", f"{where}: {self.job} reads a local JSON or JSON Lines file of {self.records}")
        for key in sorted(set(table) - self.data_keys):
            hint = f"{self.length}, as TRL's {self.config}" if key == "max_length" and self.length else None
            why = f'not read for task = "{self.name}"' + ("" if self.evaluates or "eval" not in key
                                                           else f" ({self.job} does not evaluate)")  # fmt: skip
            c.problem(f"data.{key}", why, hint)


def _article(label: str) -> str:
    """``"an"`` before a vowel's sound (RLOO: "ar"), else ``"a"``."""
    return "an" if label[:1].lower() in "aeiou" or label[:1] in "FHLMNRSX" else "a"


def claims(tasks: Mapping[str, JobTask]) -> dict[str, str]:
    """Each ``[data]`` format a task claims, with the hint that says who reads it: ``"pairs are read by a DPO or
    reward job: task = "dpo" or "reward""``."""
    found: dict[str, list[JobTask]] = {}
    for task in tasks.values():
        if task.format is not None:
            found.setdefault(task.format, []).append(task)
    hints = {}
    for fmt, readers in found.items():
        labels = " or ".join(t.label for t in readers)
        names = " or ".join(f'"{t.name}"' for t in readers)
        hints[fmt] = f"{readers[0].records_are} read by {_article(readers[0].label)} {labels} job: task = {names}"
    return hints
