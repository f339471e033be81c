"""``Engine``: one DeepSpeed engine and what it trains — the model and the config resolved for the run — built on first
use; one micro-batch through it, the loss's scale, a step's trained tokens. A ``Session`` holds one.

The config is resolved against the run (training arguments, the model's hidden size, the real world size, the number
of optimizer steps) and checked when the ``Engine`` is made, *before* any process group or engine exists, so a bad
config costs nothing. The DeepSpeed engine itself is built on first use, for a run of a known number of optimizer
steps (``fit`` counts them from the data; ``step``, ``evaluate`` and the rest take the steps given to the session); a
config that needs them and has none raises ``UnresolvedAutoError`` naming the key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..api import Config
from ..errors import Problem, UnresolvedAutoError
from ..outputs import manifest
from ..outputs.run_folder import RunFolder
from ..resolve.batch import degrees
from ..resolve.training import Training
from . import batches, distributed, parallel
from .batches import StepOutput, micro_step
from .export import lora_fingerprint, model_fingerprint
from .setup import hf_model_or_none, resolve_checked, start_engine

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

__all__ = ["Engine"]


class Engine:
    """A DeepSpeed engine for ``model`` and ``config`` (the config as given; ``config`` here is it resolved)."""

    def __init__(
        self,
        model: Any,
        given: Config,
        *,
        training: Training | None,
        optimizer: Any,
        lr_scheduler: Any,
        hidden_size: int | None,
        total_steps: int | None,
        checkpoint_digest: str,
        output_dir: Path | None,
    ) -> None:
        self.model = model
        """The model trained, unwrapped (the peft model for LoRA); under ZeRO-3 its weights are partitioned."""
        self.given = given
        self.training = training
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.hidden_size = hidden_size
        self.checkpoint_digest = checkpoint_digest
        self.output_dir = output_dir
        self.world_size: int = distributed.world_size()
        """Processes in the run (from the launcher's environment)."""
        self.config, self.steps_known = self.resolve(total_steps)
        """The resolved config (see ``Session.config``), and whether it knows the run's steps."""
        self.deepspeed: DeepSpeedEngine | None = None
        """The DeepSpeed engine, once built."""

    def resolve(self, total_steps: int | None) -> tuple[Config, bool]:
        return resolve_checked(
            self.given,
            world_size=self.world_size,
            training=self.training,
            model=hf_model_or_none(self.model),
            hidden_size=self.hidden_size,
            total_steps=total_steps,
        )

    def built(self, total_steps: int | None, declared: int | None) -> DeepSpeedEngine:
        """The DeepSpeed engine, built for a run of ``total_steps`` optimizer steps when it does not exist yet.

        The schedule's length is the HF Trainer's: the run's ``declared`` steps (the session's ``total_steps``),
        else ``training.max_steps``, else ``total_steps`` (what ``fit`` counted); ``fit(max_steps=...)`` below that
        only stops early."""
        if self.deepspeed is not None:
            return self.deepspeed
        if not self.steps_known:
            # The last chance to learn the schedule's length; without it this raises naming the key.
            self.config, self.steps_known = self.resolve(total_steps)
            if not self.steps_known:
                self._unknown_steps()
        if self.output_dir is not None and distributed.rank() == 0:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self.config.to_json(RunFolder(self.output_dir).ds_config)
        steps = declared
        if steps is None and self.training is not None and self.training.max_steps > 0:
            steps = self.training.max_steps
        self.deepspeed = start_engine(
            self.model,
            self.config.to_dict(),
            optimizer=self.optimizer,
            scheduler=self.lr_scheduler,
            training=self.training,
            schedule_steps=steps if steps is not None else total_steps,
            checkpoint_digest=self.checkpoint_digest,
            sp=self.sequence_parallel_size,
        )
        if self.training is not None and self.training.async_save:
            from .async_save import announce

            announce(self.deepspeed, self.config, self.zero_stage)  # the copy a checkpoint takes in CPU memory
        return self.deepspeed

    def _unknown_steps(self) -> None:
        """Raise the resolver's own error for the missing step count (names the key and ``total_steps=``)."""
        self.given.resolve(
            world_size=self.world_size,
            training=self.training,
            model=hf_model_or_none(self.model),
            hidden_size=self.hidden_size,
        )
        raise UnresolvedAutoError(Problem("", "the run's number of optimizer steps is unknown", needs=("total_steps",)))

    # -- what the config says ------------------------------------------------------------------------------------

    @property
    def micro_batch_size(self) -> int:
        value = self.config.train_micro_batch_size_per_gpu
        assert isinstance(value, int)
        return value

    @property
    def gradient_accumulation_steps(self) -> int:
        value = self.config.gradient_accumulation_steps
        assert isinstance(value, int)
        return value

    @property
    def zero_stage(self) -> int:
        zero = self.config.zero_optimization
        return zero.stage if zero is not None and isinstance(zero.stage, int) else 0

    @property
    def tensor_parallel_size(self) -> int:
        return degrees(self.config)[1]

    @property
    def sequence_parallel_size(self) -> int:
        return degrees(self.config)[0]

    def run_facts(self, *, seed: int | None, data: str | None) -> manifest.RunFacts:
        """What a checkpoint of this run records, and a resume must match."""
        return manifest.RunFacts(
            world_size=self.world_size,
            zero_stage=self.zero_stage,
            micro_batch=self.micro_batch_size,
            gradient_accumulation=self.gradient_accumulation_steps,
            seed=seed,
            data=data,
            model=model_fingerprint(self.model),
            lora=lora_fingerprint(self.model),
        )

    # -- one micro-batch -------------------------------------------------------------------------------------------

    @property
    def average_tokens(self) -> bool:
        return self.training.average_tokens_across_devices if self.training is not None else True

    @property
    def weights_by_tokens(self) -> bool:
        """Whether the model's forward takes HF's ``num_items_in_batch`` (HF causal LMs, peft models of them)."""
        return batches.accepts_loss_kwargs(self.model)

    @property
    def loss_scale(self) -> int:
        """The token-weighted loss's multiplier before DeepSpeed's backward (``parallel.loss_scale``)."""
        sp, tp, stage = self.sequence_parallel_size, self.tensor_parallel_size, self.zero_stage
        return parallel.loss_scale(self.world_size, sp, tp, stage, average_tokens=self.average_tokens)

    def items_in_step(self, micro_batches: Sequence[Any]) -> int | None:
        """``Session.items_in_step``; collective when the count is the processes' together."""
        counted = [batches.trained_tokens(b) for b in micro_batches]
        if any(c is None for c in counted):
            return None
        total = sum(c for c in counted if c is not None)
        if self.average_tokens and self.world_size > 1:
            assert self.deepspeed is not None
            # The ranks of a tensor-parallel group train on the same batch: its tokens count once (HF divides so).
            total = int(distributed.all_sum([float(total)], self.deepspeed.device)[0]) // self.tensor_parallel_size
        return total

    def micro_step(
        self,
        batch: Any,
        loss_fn: Callable[[Any, Any], Any] | None,
        num_items: int | None,
        boundary: bool | None,
        group: int | None = None,
    ) -> StepOutput:
        """One micro-batch: forward, backward, DeepSpeed's step (``boundary``, ``group``: see ``batches.micro_step``)."""
        assert self.deepspeed is not None
        return micro_step(self.deepspeed, batch, self.model, loss_fn, num_items=num_items, boundary=boundary,
                          scale=self.loss_scale, group=group)  # fmt: skip
