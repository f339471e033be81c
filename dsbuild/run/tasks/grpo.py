"""``task = "grpo"``: prompts whose completions are sampled (the policy's ``generate``, or the job's rollout
function), scored by the job's reward models and functions and trained on as TRL's ``GRPOTrainer`` does
(``dsbuild.rl.rollouts``), with a reference beside the policy when ``beta`` > 0."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...job import Job

if TYPE_CHECKING:
    from ...job.rl import GRPOSpec, RLOOSpec
    from ...rl.rollouts import GRPOSteps
    from . import Parts

__all__ = ["TASK", "Named", "job_functions"]

Named = tuple[str, Callable[..., Any]]
"""A function a job names, with the name it is reported by (``module:function``)."""


def job_functions(job: Job) -> dict[str, list[Named]]:
    """A GRPO or RLOO job's functions by table key: ``"rewards"`` (each reward function), ``"rollout"`` and
    ``"weight_sink"`` (none or one each), imported from the job file's folder first (``job.functions.load_function``:
    a job file that names a function runs that code). One ``ConfigError`` naming every one that cannot be found."""
    from ...errors import ConfigError
    from ...job.functions import load_function

    assert job.rewards is not None and job.rollout is not None
    base = Path(job.source).resolve().parent if job.source else None
    wanted = [("rewards", ref, f"rewards.functions[{i}]") for i, ref in enumerate(job.rewards.functions)]
    for name in ("function", "weight_sink"):
        ref = getattr(job.rollout, name)
        wanted += [("rollout" if name == "function" else name, ref, f"rollout.{name}")] if ref else []
    found: dict[str, list[Named]] = {"rewards": [], "rollout": [], "weight_sink": []}
    problems: list[Any] = []
    for table, ref, key in wanted:
        try:
            found[table].append((ref, load_function(ref, base_dir=base, key=key)))
        except ConfigError as e:
            problems.extend(e.problems)
    if problems:
        raise ConfigError(problems, checks=True)
    return found


class GRPO:
    def check(self, job: Job) -> None:
        """Each function the job names found before any process starts."""
        job_functions(job)

    def model(self, job: Job, pad: int) -> dict[str, Any]:
        """A causal LM, as the job's ``[model]`` says."""
        return {}

    def collate(self, job: Job, pad: int, default: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        """The records as they are: the rollout makes the tensors (``dsbuild.rl.rollouts``)."""
        return list

    def spec(self, job: Job) -> GRPOSpec | RLOOSpec | None:
        """The table of the task's options: ``[grpo]`` (``RLOO``: ``[rloo]``)."""
        return job.grpo

    def steps(self) -> type[GRPOSteps]:
        """What trains on the generation batches: ``GRPOSteps`` (``RLOO``: ``RLOOSteps``)."""
        from ...rl.rollouts import GRPOSteps

        return GRPOSteps

    def parts(self, job: Job, ready: Any, say: Callable[[str], None]) -> Parts:
        """The data loader (TRL's prompt order, this process's share: ``GenerationSampler``) and the steps
        (``GRPOSteps``: the rollout of each optimizer step and the loss of each micro-batch), the reward models and
        (``beta`` > 0) the reference built beside the policy."""
        from torch.utils.data import DataLoader

        from ...rl.reward_models import reward_model
        from ...rl.rollouts import GenerationSampler
        from . import Parts

        spec = self.spec(job)
        assert spec is not None and job.rewards is not None
        session = ready.session
        functions = job_functions(job)
        reference = None
        if spec.beta != 0.0:
            where = job.reference
            reference = session.reference(where.path if where else None, offload=bool(where and where.offload),
                                          disable_dropout=False)  # fmt: skip
        sampler = GenerationSampler(len(ready.train), spec, per_device=session.micro_batch_size,
                                    accumulation=session.gradient_accumulation_steps, world_size=session.world_size,
                                    rank=session.rank, seed=job.training.seed)  # fmt: skip
        loader: DataLoader[Any] = DataLoader(ready.train, batch_size=sampler.batch_size,
                                             sampler=sampler, collate_fn=list)  # fmt: skip
        # The reward models first: under ZeRO-3 their forward is collective, and no function can have failed before.
        rewards = job.rewards
        models = [reward_model(session, path, offload=rewards.offload_models, stage=rewards.zero_stage)
                  for path in rewards.models]  # fmt: skip
        steps = self.steps()(session, spec, [*models, *functions["rewards"]], weights=job.rewards.weights,
                          reference=reference, rollout=next(iter(functions["rollout"]), None),
                          weight_sink=next(iter(functions["weight_sink"]), None))  # fmt: skip
        return Parts(ready, loader, steps.loss_fn, steps)


TASK = GRPO()
