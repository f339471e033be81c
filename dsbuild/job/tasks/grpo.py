"""``task = "grpo"``: prompts, completions sampled and rewarded, as TRL's ``GRPOTrainer``: ``[reference]`` (read
when given: ``beta = 0`` builds none), ``[rollout]``, ``[rewards]`` and ``[grpo]`` (``GRPOSpec``). RLOO's tables
are these with ``[rloo]`` for ``[grpo]`` (``prompt_task``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ...errors import ConfigError, Problem
from ..rl import RLOOSpec, check_grpo_batch
from .base import JobTask, Reading

if TYPE_CHECKING:
    from ...resolve.training import Training
    from ...validate import Diagnostic
    from ..rl import GRPOSpec

__all__ = ["PROMPT_DATA_KEYS", "TASK", "grpo_batch_problems", "prompt_task"]

PROMPT_DATA_KEYS = frozenset({"path", "format", "chat_template"})
"""The ``[data]`` keys a GRPO or RLOO job reads (the completions' length is its own table's, as TRL's configs)."""

_REWARD_KEYS: Final = {"zero_optimization.stage": "rewards.zero_stage",
                        "zero_optimization.offload_param": "rewards.offload_models"}  # fmt: skip
"""The ``[rewards]`` key behind each key ``for_inference`` refuses for a job's reward models."""


def grpo_batch_problems(grpo: GRPOSpec | RLOOSpec, training: Training, world_size: int) -> list[Problem]:
    """TRL's checks of the generation batch (``check_grpo_batch``) at ``world_size`` processes: what the reader checks
    at the job's own world size and ``Job.validate`` at the run's (``--nproc-per-node``, ``--nnodes``, Slurm's and
    Ray's counts), before anything starts. ``grpo``: a GRPO or RLOO job's spec (its table names the keys)."""
    table = "rloo" if isinstance(grpo, RLOOSpec) else "grpo"
    return list(check_grpo_batch(training.per_device_train_batch_size, training.gradient_accumulation_steps,
                                 world_size, grpo.num_generations, steps_per_generation=grpo.steps_per_generation,
                                 generation_batch_size=grpo.generation_batch_size, table=table))  # fmt: skip


def prompt_task(name: str, label: str, config: str) -> JobTask:
    """A task of prompts sampled and rewarded (GRPO, RLOO), its own table named ``name``."""

    def checks(reading: Reading) -> None:
        """The generation batch's checks at the job's world size (``grpo_batch_problems``); a reference with
        ``beta = 0`` is never used."""
        spec, launch, training = reading.tables.get(name), reading.launch, reading.training
        if spec is None or launch is None or training is None:
            return
        reading.c.problems.extend(grpo_batch_problems(spec, training, launch.world_size))
        if reading.tables.get("reference") is not None and spec.beta == 0.0:
            reading.c.problem("reference", f"not used with {name}.beta = 0 (no KL term: TRL builds no reference)",
                              f"set {name}.beta > 0, or leave [reference] out")  # fmt: skip

    def problems(job: Any, world_size: int) -> list[Diagnostic]:
        """The generation batch holds whole groups at the world size the run will have (the reader checked the
        job's own ``[launch]``; an override may change it), and the reward models can be placed as asked."""
        from ...validate import Diagnostic

        found = [Diagnostic(p.path, "error", p.message, p.hint, "world size")
                 for p in grpo_batch_problems(getattr(job, name), job.training, world_size)]  # fmt: skip
        rewards = job.rewards
        if rewards is not None and rewards.models and (rewards.offload_models or rewards.zero_stage is not None):
            try:  # its refusals: a stage an engine without an optimizer cannot have, offloading below stage 3
                job.config.for_inference(rewards.offload_models, stage=rewards.zero_stage)
            except ConfigError as e:
                found += [Diagnostic(_REWARD_KEYS.get(p.path, f"strategy.config.{p.path}"), "error", p.message, p.hint)
                          for p in e.problems]  # fmt: skip
        return found

    def shapes(job: Any) -> dict[str, Any]:
        """A reference with a KL term (``beta`` > 0); the reward models, frozen, at their stage."""
        kept: dict[str, Any] = {"reference": getattr(job, name).beta != 0.0}
        rewards = job.rewards
        if rewards is not None and rewards.models:
            kept.update(reward_models=tuple(rewards.models), reward_stage=rewards.zero_stage,
                        reward_offload=rewards.offload_models)  # fmt: skip
        return kept

    missing = 'missing: {job} needs [rewards] functions = ["module:function", ...]'
    return JobTask(name, label=label, config=config, tables=("reference", "rollout", "rewards", name),
                   optional=("reference",), required={"rewards": missing}, format="prompt", records="prompts",
                   fields="a prompt per record", records_are="prompts are", data_keys=PROMPT_DATA_KEYS,
                   length=f"[{name}] max_completion_length", evaluates=False, reader="prompts:load_job_prompts",
                   checks=checks, problems=problems, shapes=shapes)  # fmt: skip


TASK = prompt_task("grpo", "GRPO", "GRPOConfig")
