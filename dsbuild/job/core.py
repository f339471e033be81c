"""``Job``: a training run read from a job file and checked, and ``load_job``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from .._util import dotted
from .._util.safe_read import count_records
from ..api import Config
from ..config.walk import auto_paths
from ..errors import ConfigError, Problem
from ..resolve import resolution
from ..resolve.schedule import job_steps
from ..resolve.training import Training
from ..validate import Diagnostic, validate
from .reader import read_job, read_job_dict
from .rl import DPOSpec, GRPOSpec, KTOSpec, RewardSpec, RLOOSpec
from .spec import DataSpec, LaunchSpec, ModelSpec, ReferenceSpec, RewardsSpec, RolloutSpec, StrategySpec
from .tasks import JOB_TASKS

__all__ = ["Job", "demo_job_path", "load_job"]


@attrs.frozen
class Job:
    """A training run: model, data, training arguments, DeepSpeed strategy and launch, all checked.

    Build it with ``load_job(path)`` (or ``Job.from_dict``). ``config`` is the ds_config the
    run uses before resolution; ``resolve()`` fills its ``"auto"`` values from the run.
    """

    model: ModelSpec
    data: DataSpec
    training: Training
    """The run's training arguments: ``[training]``, completed from the config's explicit values and with ``output_dir`` set."""
    strategy: StrategySpec
    launch: LaunchSpec
    config: Config
    """The strategy config completed for the run (see the module docstring); ``"auto"`` where the run fills it."""
    source: str | None = None
    """The job file, or ``None`` for a job built from a table."""
    description: str | None = None
    """The file's one-line ``description``."""
    task: str = "sft"
    """What the job trains: ``"sft"`` (TRL's SFTTrainer's), ``"dpo"`` (TRL's DPOTrainer's: ``reference`` and ``dpo``
    are read), ``"grpo"`` (TRL's GRPOTrainer's: ``reference``, ``rollout``, ``rewards`` and ``grpo``), ``"reward"``
    (TRL's RewardTrainer's: ``reward``), ``"rloo"`` (TRL's RLOOTrainer's: GRPO's with ``rloo`` for ``grpo``) or
    ``"kto"`` (TRL's KTOTrainer's: ``reference`` and ``kto``)."""
    reference: ReferenceSpec | None = None
    """``[reference]`` of a DPO job, or of a GRPO job with ``beta`` > 0 (``None`` there: what the policy starts from)."""
    dpo: DPOSpec | None = None
    """``[dpo]`` of a DPO job."""
    rollout: RolloutSpec | None = None
    """``[rollout]`` of a GRPO job."""
    rewards: RewardsSpec | None = None
    """``[rewards]`` of a GRPO job."""
    grpo: GRPOSpec | None = None
    """``[grpo]`` of a GRPO job."""
    reward: RewardSpec | None = None
    """``[reward]`` of a reward job."""
    rloo: RLOOSpec | None = None
    """``[rloo]`` of an RLOO job."""
    kto: KTOSpec | None = None
    """``[kto]`` of a KTO job."""

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        *,
        base_dir: str | Path | None = None,
        source: str | None = None,
        name: str = "job",
        output_base: str | Path | None = None,
    ) -> Job:
        """A ``Job`` from a job table; relative paths are relative to ``base_dir`` (default: the current directory),
        ``training.output_dir`` too unless ``output_base`` is given (it is then under that folder); ``output_dir`` is
        made absolute.

        Raises one ``ConfigError`` listing every problem (``source`` names the file).
        """
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        outputs = Path(output_base) if output_base is not None else None
        return cls(**read_job(data, base_dir=base, source=source, name=name, output_base=outputs))

    @property
    def output_dir(self) -> Path:
        """Where the run writes (``training.output_dir``)."""
        assert self.training.output_dir is not None  # set by the reader
        return Path(self.training.output_dir)

    def total_steps(self, world_size: int | None = None) -> int | None:
        """Optimizer steps of the run: ``max_steps``, else the epochs over the records counted in the data file.

        The count is that of the file's records (less an ``eval_split`` fraction); tokenizing may
        drop a few that do not fit ``max_length``, so a run over epochs can be a step shorter.
        ``None`` when the data cannot be counted without loading it: not one JSON / JSON Lines
        file, or packed (how many sequences the samples fill is known once tokenized).
        """
        if self.training.max_steps > 0:
            return self.training.max_steps
        path = self.data.path
        if self.data.packing or not isinstance(path, Path) or path.suffix.lower() not in (".json", ".jsonl"):
            return None
        records = count_records(path)
        if records is None:
            return None
        if isinstance(self.data.eval_split, float):
            records -= math.ceil(records * self.data.eval_split)  # what datasets' train_test_split holds out
        world_size = world_size or self.launch.world_size
        return job_steps(self.samples(records, world_size), self.training, self.config, world_size=world_size)

    def samples(self, records: int, world_size: int) -> int:
        """The samples an epoch of ``records`` trains on: the records; a GRPO or RLOO job's completions, whole
        generation batches of them (``Generations.completions``)."""
        sampling = self.grpo or self.rloo
        if sampling is None:
            return records
        training = self.training
        return sampling.completions(records, training.per_device_train_batch_size, world_size,
                                     training.gradient_accumulation_steps)  # fmt: skip

    def _counted_steps(self, world_size: int | None) -> int | None:
        """The step count to pass ``resolve``: none when ``max_steps`` says it (resolve reads it, and says so)."""
        return None if self.training.max_steps > 0 else self.total_steps(world_size)

    def resolve(
        self, *, world_size: int | None = None, hidden_size: int | None = None, total_steps: int | None = None
    ) -> Config:
        """``config`` with every ``"auto"`` filled from the run (as ``Session`` will fill it).

        The world size defaults to ``launch``'s, the hidden size to the model's when it
        can be read without loading it, the step count to ``total_steps()``.
        """
        try:
            steps = total_steps or self._counted_steps(world_size)
        except ConfigError as e:
            raise e.with_source(self.source) if self.source else e from None
        try:
            return self.config.resolve(
                world_size=world_size or self.launch.world_size,
                training=self.training,
                hidden_size=hidden_size or self.model.hidden_size,
                total_steps=steps,
            )
        except ConfigError as e:
            error = e.prefixed("strategy.config")
            raise error.with_source(self.source) if self.source else error from None

    def validate(self, *, world_size: int | None = None) -> list[Diagnostic]:
        """Every problem of the run's config, errors first, paths under ``strategy.config.``.

        The config is resolved against the training arguments and the world size, then checked
        as ``Session`` checks it. The keys that need facts only the run knows (a hub model's hidden size, the
        length of data that cannot be counted) wait for them: they are checked when the run resolves them.
        """
        world = world_size or self.launch.world_size
        try:
            steps = self._counted_steps(world_size)
        except ConfigError as e:
            return [Diagnostic(p.path, "error", p.message, p.hint, "data", p.needs) for p in e.problems]
        counted = steps is not None or self.training.max_steps > 0  # resolve reads max_steps itself
        waiting = [
            fact for fact, known in (("hidden_size", self.model.hidden_size), ("total_steps", counted)) if not known
        ]
        try:
            resolved = resolution.resolve(
                self.config, world_size=world, training=self.training, hidden_size=self.model.hidden_size,
                total_steps=steps, waiting_for=waiting,
            )  # fmt: skip
        except ConfigError as e:
            return [
                Diagnostic(
                    _config_path(p.path, self.strategy.overrides), "error", p.message, p.hint, "resolve", p.needs
                )
                for p in e.problems
            ]
        found = validate(resolved, world_size=world, resolved=True, waiting=auto_paths(resolved))
        found = [attrs.evolve(d, path=_config_path(d.path, self.strategy.overrides)) for d in found]
        return [*self._task_problems(world), *found]

    def task_shapes(self) -> dict[str, Any]:
        """What the job's task changes in ``dsbuild plan``'s facts (its ``JobTask.shapes``): a DPO or reward
        micro-batch is its pairs' chosen and rejected rows, a GRPO, RLOO, DPO or KTO job keeps a reference, ..."""
        return JOB_TASKS[self.task].shapes(self)

    def _task_problems(self, world_size: int) -> list[Diagnostic]:
        """What the task needs of the run at ``world_size`` (its ``JobTask.problems``: a GRPO job's generation batch
        holds whole groups at the world size the run will have, its reward models can be placed as asked)."""
        return JOB_TASKS[self.task].problems(self, world_size)

    def check(self, *, world_size: int | None = None) -> Job:
        """Raise one ``ConfigError`` (``source``: the job file) listing every error of ``validate``; else ``self``."""
        errors = [d for d in self.validate(world_size=world_size) if d.severity == "error"]
        if errors:
            raise ConfigError([Problem(d.path, d.message, d.hint, needs=d.needs) for d in errors], source=self.source)
        return self


def _config_path(path: str, overrides: Mapping[str, Any] | None = None) -> str:
    """Where a config key came from in the job: ``strategy.overrides.KEY`` if the overrides set it (or a value
    above it), else ``strategy.config.KEY``."""
    if not path:
        return "strategy.config"
    return f"strategy.overrides.{path}" if dotted.sets(overrides or {}, path) else f"strategy.config.{path}"


def load_job(path: str | Path | None, overrides: Mapping[str, Any] | None = None) -> Job:
    """Read and check a job file; ``overrides`` maps dotted keys to values (``{"training.max_steps": 10}``), each
    read as if the file said it.

    Every relative path in the job (``[model]``, ``[data]``, ``strategy.config`` and ``training.output_dir``) is
    relative to the job file's folder, wherever the command runs. ``None`` is the packaged demo job, whose outputs go
    under the current directory (``out/demo``). Every problem is reported at once in one ``ConfigError`` naming the
    file.
    """
    demo = path is None
    path = demo_job_path() if path is None else Path(path)
    data = read_job_dict(path)
    for key, value in (overrides or {}).items():
        dotted.put(data, key, value)
    outputs = Path.cwd() if demo else None
    return Job.from_dict(data, base_dir=path.parent, source=str(path), name=path.stem, output_base=outputs)


def demo_job_path() -> Path:
    """The packaged demo job (``dsbuild train`` without a job file; ``load_job(None)``)."""
    return Path(__file__).resolve().parent.parent / "demo" / "demo.toml"
