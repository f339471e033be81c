"""The generation batch of the RL tasks that sample completions (GRPO, RLOO): what TRL's ``GRPOConfig`` and
``RLOOConfig`` fill from the batch sizes alike (``Generations``, the base of ``GRPOSpec`` and ``RLOOSpec``) and what
they refuse in it before anything starts (``check_grpo_batch``). Stdlib only."""

from __future__ import annotations

from ..errors import Problem

__all__ = ["Generations", "check_grpo_batch"]


class Generations:
    """What GRPO's and RLOO's specs compute alike from their generation keys (both TRL trainers fill and read them
    the same way)."""

    steps_per_generation: int | None
    generation_batch_size: int | None
    num_generations: int
    num_iterations: int
    epsilon: float
    epsilon_high: float | None

    def generation_steps(self, per_device: int, world_size: int, accumulation: int) -> int:
        """Micro-batch steps one generation batch feeds (TRL's ``steps_per_generation`` as ``GRPOConfig`` fills it):
        ``steps_per_generation``, else ``generation_batch_size`` over the global batch (``per_device ×
        world_size``), else the accumulation steps."""
        if self.steps_per_generation is not None:
            return self.steps_per_generation
        if self.generation_batch_size is not None:
            return max(self.generation_batch_size // (per_device * world_size), 1)
        return accumulation

    def completions(self, prompts: int, per_device: int, world_size: int, accumulation: int) -> int:
        """The completions an epoch of ``prompts`` trains on, as TRL's ``RepeatSampler`` yields them: whole
        generation batches (``per_device × world_size × generation_steps`` completions, ``num_generations`` per
        prompt) of distinct prompts, the last incomplete one dropped, each trained on ``num_iterations`` times."""
        generation_batch = per_device * world_size * self.generation_steps(per_device, world_size, accumulation)
        per_batch = max(generation_batch // self.num_generations, 1)
        return (prompts // per_batch) * generation_batch * self.num_iterations

    @property
    def epsilon_low(self) -> float:
        """The lower clipping ε (``epsilon``), as ``GRPOTrainer`` names it."""
        return self.epsilon

    @property
    def upper_epsilon(self) -> float:
        """The upper clipping ε: ``epsilon_high``, else ``epsilon`` (``GRPOTrainer.__init__``)."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


def check_grpo_batch(
    per_device_train_batch_size: int,
    gradient_accumulation_steps: int,
    world_size: int,
    num_generations: int,
    *,
    steps_per_generation: int | None = None,
    generation_batch_size: int | None = None,
    table: str = "grpo",
) -> list[Problem]:
    """What TRL's ``GRPOConfig.__post_init__`` refuses in a run's generation batch, before anything starts.

    The generation batch is ``generation_batch_size``, else ``per_device_train_batch_size × world_size ×
    steps_per_generation`` (``steps_per_generation`` defaulting to ``gradient_accumulation_steps``); it must be a
    multiple of the global batch (``per_device_train_batch_size × world_size``) and hold whole groups of
    ``num_generations`` completions, and a group needs two completions. TRL's messages, each under the dotted key to
    change (in ``table``: ``RLOOConfig`` refuses the same), with the values that would do."""
    problems: list[Problem] = []
    global_batch = per_device_train_batch_size * world_size
    if generation_batch_size is not None and steps_per_generation is not None:
        message = "'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time"
        return [Problem(f"{table}.generation_batch_size", message, "keep one", kind="rule")]
    if generation_batch_size is None:
        steps = gradient_accumulation_steps if steps_per_generation is None else steps_per_generation
        generation_batch_size = global_batch * steps
        how = f"{per_device_train_batch_size} per device × {world_size} processes × {steps} steps per generation"
    else:
        how = "generation_batch_size"
        if generation_batch_size % global_batch != 0:
            message = (
                f"generation_batch_size ({generation_batch_size}) must be divisible by the global batch size "
                f"({global_batch})."
            )
            hint = f"the global batch is {per_device_train_batch_size} per device × {world_size} processes"
            problems.append(Problem(f"{table}.generation_batch_size", message, hint, kind="rule"))
    if num_generations >= 1 and generation_batch_size % num_generations != 0:
        message = (
            f"generation_batch_size ({generation_batch_size}) must be divisible by num_generations ({num_generations})."
        )
        fits = [g for g in range(2, generation_batch_size + 1) if generation_batch_size % g == 0][:6]
        choices = f"num_generations in {', '.join(map(str, fits))}" if fits else "a larger batch"
        hint = f"the generation batch is {how} = {generation_batch_size}: choose {choices}, or change the batch"
        problems.append(Problem(f"{table}.num_generations", message, hint, kind="rule"))
    if num_generations < 2:
        message = (
            f"{table.upper()} requires at least 2 generations per prompt to calculate the advantages. You provided "
            f"{num_generations}, which is less than the minimum required."
        )
        problems.append(Problem(f"{table}.num_generations", message, kind="rule"))
    return problems
