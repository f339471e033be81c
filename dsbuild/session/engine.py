"""``EngineSession``: one DeepSpeed engine, with the model built for it, checkpoints that resume exactly, export
(``Session`` adds the loop, ``fit``).

A ``Session`` resolves the config against the run (training arguments, the
model's hidden size, the real world size, the number of optimizer steps) and
checks it *before* any process group or engine exists, so a bad config costs
nothing. The engine itself is built on first use:

- ``fit(data, ...)`` knows the number of optimizer steps from the data and
  ``epochs`` / ``max_steps``, so a schedule with ``total_num_steps = "auto"``
  needs nothing more;
- ``step``, ``evaluate``, ``load_checkpoint``, ``save_*`` and ``.engine`` build
  it with the steps given to the constructor (``total_steps=`` or
  ``training.max_steps``); a config that needs them and has neither raises
  ``UnresolvedAutoError`` naming the key.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..api import Config
from ..errors import ConfigError, Problem, SessionError, UnresolvedAutoError
from ..outputs import history, manifest
from ..outputs.run_folder import RunFolder
from ..resolve.batch import degrees
from ..resolve.training import Training
from . import batches, checkpoints, distributed, export, parallel, weights_only
from .batches import StepOutput, micro_step
from .export import lora_fingerprint, model_fingerprint
from .setup import (
    DEFAULT_SEED,
    as_config,
    hf_model_or_none,
    pretrained_model,
    resolve_checked,
    seed_everything,
    start_engine,
    with_default_monitor,
)

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine
    from typing_extensions import Self

__all__ = ["EngineSession"]


class EngineSession:
    """A ``Session`` without its loop: the engine, the model it trains, its resolved config, one micro-batch
    (``step``), evaluation, checkpoints and export. ``Session`` (``dsbuild.session.session``) adds ``fit``."""

    def __init__(
        self,
        model: Any,
        config: Config | Mapping[str, Any] | str | os.PathLike[str],
        training: Training | Any | None = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        output_dir: str | os.PathLike[str] | None = None,
        *,
        total_steps: int | None = None,
        hidden_size: int | None = None,
        tokenizer: Any = None,
        infer_batch_size: int | None = None,
        keep_last: int | None = None,
        data_fingerprint: str | None = None,
        terminate_on_nan: bool = True,
        checkpoint_digest: str = manifest.DIGEST,
    ) -> None:
        self.training: Training | None = Training.of(training) if training is not None else None
        """The training arguments (a ``Training``), or ``None``."""
        out = output_dir if output_dir is not None else (self.training.output_dir if self.training else None)
        self.output_dir: Path | None = Path(out) if out is not None else None
        """Where ``ds_config.json``, monitor logs, the history, checkpoints and the model go by default."""
        self.tokenizer = tokenizer
        """Saved next to the model by ``save_model`` when given."""
        self.data_fingerprint = data_fingerprint
        """A digest of the training data, recorded in checkpoints (``None``: not compared on resume)."""
        self.terminate_on_nan = terminate_on_nan
        if checkpoint_digest not in manifest.DIGESTS:
            raise SessionError(
                f"checkpoint_digest: got {checkpoint_digest!r}, expected one of {', '.join(map(repr, manifest.DIGESTS))}"
            )
        self.checkpoint_digest = checkpoint_digest
        """What checkpoint files are hashed with in their manifest (``manifest.DIGESTS``)."""
        """``fit`` stops at the first NaN or infinite loss (``NonFiniteLossError``)."""
        self._model = model
        self._optimizer = optimizer
        self._lr_scheduler = lr_scheduler
        self._hidden_size = hidden_size
        self.total_steps = total_steps
        """The run's optimizer steps, when given (else ``fit`` counts them from the data)."""
        report_to = self.training.report_to if self.training is not None else ()
        self._given = with_default_monitor(as_config(config), self.output_dir, report_to)
        self.world_size: int = distributed.world_size()
        """Processes in the run (from the launcher's environment)."""

        # Everything that can be wrong with the config fails here, before a process group exists.
        self._config, self._steps_known = self._resolve(total_steps)
        micro = self._config.train_micro_batch_size_per_gpu
        assert isinstance(micro, int)
        eval_default = self.training.per_device_eval_batch_size if self.training is not None else micro
        self.infer_batch_size: int = infer_batch_size or eval_default
        """Per-device batch size of ``evaluate`` (default ``per_device_eval_batch_size``, else the micro batch)."""
        if keep_last is not None and (not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 1):
            raise ConfigError(Problem("keep_last", f"got {keep_last!r}, expected an integer >= 1"))
        self.keep_last: int | None = (
            keep_last if keep_last is not None else (self.training.save_total_limit if self.training else None)
        )
        """Checkpoints kept by ``save_checkpoint`` (older ones deleted); ``None`` keeps all."""
        if self.training is not None:
            seed_everything(self.training.seed)

        refused = parallel.refusal(model, self.sequence_parallel_size, self.tensor_parallel_size, self._average_tokens)
        if refused is not None:
            raise SessionError(refused)
        distributed.init(self.training.ddp_timeout if self.training is not None else None)
        self._engine: DeepSpeedEngine | None = None
        # Where training is in the data: the epoch, the micro-batches of it consumed, and the torch RNG
        # state its iterator was created from (so a resumed run draws the same shuffle).
        self.position = batches.DataPosition()
        """Where training is in the data (saved in checkpoints, so a resume draws the same batches)."""
        self.last_saved: str | None = None
        """The tag of the checkpoint this session last saved or loaded."""
        self.after_save: Callable[[Path], None] | None = None
        """Called on every process with the checkpoint's folder once ``save_checkpoint`` has saved and verified it
        (Ray's backend hands each process's files to Ray Train here); collective when the callable is."""
        self.stop_on_interrupt = False
        """A first Ctrl-C (SIGINT) during ``fit`` stops it as SIGTERM does, with a checkpoint at the next step
        (``RunStopped``); a second raises ``KeyboardInterrupt`` at once. Off: Ctrl-C is Python's ``KeyboardInterrupt``
        (``dsbuild train`` turns it on)."""
        self.stop_requested: Callable[[], str | None] | None = None
        """Asked on every process at each optimizer step of ``fit``: a reason (``"SIGINT to dsbuild train"``) stops it
        there as a signal does, with a checkpoint (Ray's backend: its driver's request, which no signal carries)."""
        self.save_requested: Callable[[], bool] | None = None
        """Asked on every process after each optimizer step of ``fit``; ``True`` saves a checkpoint now and trains on
        (Ray's backend: a preemption notice from Ray Train); collective when the callable is."""

    # -- construction ------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        name_or_path_or_config: Any,
        config: Config | Mapping[str, Any] | str | os.PathLike[str],
        training: Training | Any | None = None,
        lora: Any = None,
        dtype: Any = None,
        attn_implementation: str | None = None,
        gradient_checkpointing: bool = False,
        tokenizer: Any = None,
        output_dir: str | os.PathLike[str] | None = None,
        **session_kwargs: Any,
    ) -> Self:
        """A session for an HF causal LM: a local path / hub id (its weights) or a ``PretrainedConfig`` (random init).

        Under ZeRO-3 the model is built inside ``zero.Init`` the HF way (never whole
        on one device), with HF's ZeRO-3 switch on only while it is built. ``lora``
        (a peft ``LoraConfig`` or a table of its fields) wraps it afterwards; with
        ``gradient_checkpointing`` (or the training argument of that name) activations are recomputed (non-reentrant).
        ``tokenizer`` is a tokenizer or where to load one; it is saved with the model.
        Other keyword arguments go to ``Session``.
        """
        model, tokenizer = pretrained_model(
            name_or_path_or_config,
            as_config(config),
            Training.of(training) if training is not None else None,
            lora=lora,
            dtype=dtype,
            attn_implementation=attn_implementation,
            gradient_checkpointing=gradient_checkpointing,
            tokenizer=tokenizer,
            hidden_size=session_kwargs.get("hidden_size"),
            total_steps=session_kwargs.get("total_steps"),
        )
        return cls(model, config, training=training, output_dir=output_dir, tokenizer=tokenizer, **session_kwargs)

    def _resolve(self, total_steps: int | None) -> tuple[Config, bool]:
        return resolve_checked(
            self._given,
            world_size=self.world_size,
            training=self.training,
            model=hf_model_or_none(self._model),
            hidden_size=self._hidden_size,
            total_steps=total_steps,
        )

    @distributed.quietly
    def _build_engine(self, total_steps: int | None) -> DeepSpeedEngine:
        if not self._steps_known:
            # The last chance to learn the schedule's length; without it this raises naming the key.
            self._config, self._steps_known = self._resolve(total_steps)
            if not self._steps_known:
                self._resolve_strict()
        if self.output_dir is not None and self.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._config.to_json(RunFolder(self.output_dir).ds_config)
        # The schedule's length, as the HF Trainer takes it: the run's declared steps (total_steps=, else
        # training.max_steps), else what fit counted; fit(max_steps=...) below that only stops early.
        steps = self.total_steps
        if steps is None and self.training is not None and self.training.max_steps > 0:
            steps = self.training.max_steps
        engine = start_engine(
            self._model,
            self._config.to_dict(),
            optimizer=self._optimizer,
            scheduler=self._lr_scheduler,
            training=self.training,
            schedule_steps=steps if steps is not None else total_steps,
            checkpoint_digest=self.checkpoint_digest,
            sp=self.sequence_parallel_size,
        )
        self._engine = engine
        return engine

    def _resolve_strict(self) -> None:
        """Raise the resolver's own error for the missing step count (names the key and ``total_steps=``)."""
        self._given.resolve(
            world_size=self.world_size,
            training=self.training,
            model=hf_model_or_none(self._model),
            hidden_size=self._hidden_size,
        )
        raise UnresolvedAutoError(Problem("", "the run's number of optimizer steps is unknown", needs=("total_steps",)))

    # -- what a session holds -------------------------------------------------------

    @property
    def engine(self) -> DeepSpeedEngine:
        """The ``DeepSpeedEngine`` (built on first use)."""
        return self.engine_for(self.total_steps)

    def engine_for(self, total_steps: int | None) -> DeepSpeedEngine:
        """The engine, built for a run of ``total_steps`` optimizer steps when it does not exist yet."""
        return self._engine if self._engine is not None else self._build_engine(total_steps)

    @property
    def model(self) -> Any:
        """The model being trained, unwrapped (the peft model for LoRA); under ZeRO-3 its weights are partitioned."""
        return self._model

    @property
    def config(self) -> Config:
        """The resolved config the engine runs with.

        Before the engine exists, for a run whose step count ``fit`` will tell, the keys that need the count
        (``scheduler.params.total_num_steps``, a warmup given as a ratio) are still ``"auto"``; they are filled when
        the engine is built.
        """
        return self._config

    @property
    def micro_batch_size(self) -> int:
        value = self._config.train_micro_batch_size_per_gpu
        assert isinstance(value, int)
        return value

    @property
    def gradient_accumulation_steps(self) -> int:
        value = self._config.gradient_accumulation_steps
        assert isinstance(value, int)
        return value

    @property
    def global_step(self) -> int:
        """Optimizer steps taken (restored by ``load_checkpoint``)."""
        return 0 if self._engine is None else int(self._engine.global_steps)

    @property
    def rank(self) -> int:
        return distributed.rank()

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def run_facts(self) -> manifest.RunFacts:
        """What a checkpoint of this run records, and a resume must match (``dsbuild.outputs.manifest.RunFacts``)."""
        zero = self._config.zero_optimization
        stage = zero.stage if zero is not None and isinstance(zero.stage, int) else 0
        return manifest.RunFacts(
            world_size=self.world_size,
            zero_stage=stage,
            micro_batch=self.micro_batch_size,
            gradient_accumulation=self.gradient_accumulation_steps,
            seed=self.training.seed if self.training is not None else None,
            data=self.data_fingerprint,
            model=model_fingerprint(self._model),
            lora=lora_fingerprint(self._model),
        )

    # -- one micro-batch -----------------------------------------------------------

    @property
    def weights_by_tokens(self) -> bool:
        """Whether ``fit`` weights the loss by the step's trained tokens (HF's ``num_items_in_batch``): the model's
        forward takes the count (HF causal LMs, peft models of them) and no ``loss_fn`` replaces it."""
        return batches.accepts_loss_kwargs(self._model)

    def items_in_step(self, micro_batches: Sequence[Any]) -> int | None:
        """The optimizer step's trained tokens, HF's ``num_items_in_batch``: labels other than -100 after the causal
        shift, over ``micro_batches`` (the step's micro-batches on this process) and, with
        ``training.average_tokens_across_devices`` (the default), summed over every process (then collective: every
        process calls it). ``None`` when the batches carry no labels. Pass it to ``step``."""
        counted = [batches.trained_tokens(b) for b in micro_batches]
        if any(c is None for c in counted):
            return None
        total = sum(c for c in counted if c is not None)
        if self._average_tokens and self.world_size > 1:
            # The ranks of a tensor-parallel group train on the same batch: its tokens count once (HF divides so).
            total = int(distributed.all_sum([float(total)], self.engine.device)[0]) // self.tensor_parallel_size
        return total

    @property
    def _loss_scale(self) -> int:
        """The token-weighted loss's multiplier before DeepSpeed's backward (``parallel.loss_scale``)."""
        sp, tp, stage = self.sequence_parallel_size, self.tensor_parallel_size, self.run_facts.zero_stage
        return parallel.loss_scale(self.world_size, sp, tp, stage, average_tokens=self._average_tokens)

    @property
    def _average_tokens(self) -> bool:
        return self.training.average_tokens_across_devices if self.training is not None else True

    def step(
        self, batch: Any, loss_fn: Callable[[Any, Any], Any] | None = None, *, num_items_in_batch: int | None = None
    ) -> StepOutput:
        """One micro-batch: forward, backward, and the engine's step (an optimizer step at a boundary).

        A dict batch goes to ``model(**batch)`` and the output's ``.loss`` (or a scalar
        tensor output) is the loss; else ``loss_fn(model, batch)`` returns it, where
        ``model`` is the engine (call it like the model). Tensors move to the engine's device.

        ``num_items_in_batch``: the optimizer step's trained-token count (``items_in_step``), for the HF Trainer's
        loss: the model sums its token losses and divides by it (a ``loss_fn`` must do the same), the loss is
        multiplied by the number of processes when the count is theirs together (DeepSpeed averages gradients over
        them) and DeepSpeed does not divide it by the accumulation steps. Without it, each micro-batch's mean loss
        is divided by the accumulation steps, as DeepSpeed does by default.
        """
        return self._step(batch, loss_fn, num_items_in_batch, None)

    @distributed.quietly
    def _step(
        self, batch: Any, loss_fn: Callable[[Any, Any], Any] | None, num_items: int | None, boundary: bool | None
    ) -> StepOutput:
        """``step``; ``boundary`` given: this micro-batch ends the optimizer step or not, whatever DeepSpeed's count
        says (the HF Trainer's last, shorter step of an epoch)."""
        return micro_step(
            self.engine,
            batch,
            self._model,
            loss_fn,
            num_items=num_items,
            boundary=boundary,
            scale=self._loss_scale,
        )

    # -- data ------------------------------------------------------------------------------

    def data_loader(
        self, data: Any, batch_size: int, *, shuffle: bool, collate_fn: Callable[[list[Any]], Any] | None = None
    ) -> Any:
        """``data`` itself when it is a DataLoader; else a DataLoader over this rank's share of it. With sequence
        parallelism, the micro-batches of the ranks of this rank's group, each cut to this rank's shard."""
        tp = self.tensor_parallel_size  # a tensor-parallel group's ranks read the same batches
        loader = batches.loader(
            data,
            batch_size,
            world_size=self.world_size // tp,
            rank=self.rank // tp,
            shuffle=shuffle,
            seed=self.training.seed if self.training is not None else DEFAULT_SEED,
            drop_last=bool(self._config.dataloader_drop_last) if shuffle else False,
            collate_fn=collate_fn,
            num_workers=self.training.dataloader_num_workers if self.training is not None else 0,
        )
        sp = self.sequence_parallel_size
        if sp == 1:
            return loader
        return parallel.SequenceShards(loader, sp, self.micro_batch_size, lambda: self.engine.device)

    @property
    def tensor_parallel_size(self) -> int:
        """The run's AutoTP degree (``tensor_parallel.autotp_size``; 1: none; docs/session.md)."""
        return degrees(self._config)[1]

    @property
    def sequence_parallel_size(self) -> int:
        """The run's Ulysses sequence-parallel degree (1: none; docs/session.md)."""
        return degrees(self._config)[0]

    def write_events(self, prefix: str, record: Mapping[str, Any]) -> None:
        """Metrics to DeepSpeed's monitors (CSV, TensorBoard, W&B, Comet: whatever the config enables)."""
        monitor = getattr(self._engine, "monitor", None)
        if monitor is None or not monitor.enabled:
            return
        step = int(record["step"])
        events = [
            (f"{prefix}/{k}", float(v), step)
            for k, v in record.items()
            if k not in ("step", "epoch") and isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
        monitor.write_events(events)

    # -- the history -----------------------------------------------------------------------

    @property
    def history_path(self) -> Path | None:
        """``output_dir/history.jsonl``, or ``None`` without an output directory."""
        return self.output_dir / history.HISTORY if self.output_dir is not None else None

    # -- evaluation ----------------------------------------------------------------------

    @distributed.quietly
    def evaluate(
        self,
        data: Any,
        *,
        batch_size: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        loss_fn: Callable[[Any, Any], Any] | None = None,
    ) -> dict[str, float]:
        """Mean loss over ``data`` without gradients, in batches of ``infer_batch_size``; collective.

        Returns ``{"eval_loss": ..., "eval_samples": ...}`` (weighted by samples, over all processes), also
        appended to ``history.jsonl`` with the step.
        """
        engine = self.engine
        # Sequence parallelism: DeepSpeed's attention is built for the micro-batch size, so evaluation batches are no larger.
        size = self.micro_batch_size if self.sequence_parallel_size > 1 else batch_size or self.infer_batch_size
        loader = self.data_loader(data, size, shuffle=False, collate_fn=collate_fn)
        total, count = batches.evaluation_sums(engine, loader, self._model, loss_fn)
        total, count = distributed.all_sum([total, count], engine.device)
        # A tensor-parallel group's ranks evaluate the same batches: each batch counts once.
        total, count = total / self.tensor_parallel_size, count / self.tensor_parallel_size
        metrics = {"eval_loss": total / max(count, 1.0), "eval_samples": count}
        self.write_events("Eval", {"step": engine.global_steps, "loss": metrics["eval_loss"]})
        if self.is_main_process and self.history_path is not None:
            history.append(self.history_path, [{"step": int(engine.global_steps), **metrics}])
        return metrics

    # -- checkpoints -----------------------------------------------------------------------

    def _checkpoint_dir(self, path: str | os.PathLike[str] | None) -> Path:
        if path is not None:
            return Path(path)
        if self.output_dir is None:
            raise SessionError("no checkpoint directory: pass a path, or output_dir= to the Session")
        return RunFolder(self.output_dir).checkpoints

    @distributed.quietly
    def save_checkpoint(self, path: str | os.PathLike[str] | None = None, tag: str | None = None) -> str:
        """Collective: save engine, optimizer, scheduler, data position and RNG states, verified; return the tag.

        Every process writes its files (DeepSpeed's, hashed as they are written, and its own
        position and RNG states as JSON); then rank 0 writes the manifest (sizes, digests: XXH3-128 by default,
        ``checkpoint_digest``; versions, the run's facts) and only then points ``latest`` at it, so a crash or a
        full disk mid-save leaves the previous checkpoint the one that loads. Then all but
        the ``keep_last`` newest checkpoints are deleted.
        """
        engine = self.engine
        tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
        checkpoints.save(
            engine,
            self._checkpoint_dir(path),
            tag,
            position=self._position(engine),
            facts=self.run_facts,
            frozen_excluded=export.is_peft(self._model),
            keep_last=self.keep_last,
        )
        self.last_saved = tag
        if self.after_save is not None:
            self.after_save(self._checkpoint_dir(path) / tag)
        return tag

    def _position(self, engine: Any) -> dict[str, Any]:
        """This process's place in training: steps, data position, and its RNG states (all JSON)."""
        return {
            "global_step": int(engine.global_steps),
            "micro_steps": int(engine.micro_steps),
            "epoch": self.position.epoch,
            "batch_in_epoch": self.position.batch_in_epoch,
            "epoch_rng": weights_only.encode_tensor(self.position.epoch_rng),
            "rng": weights_only.rng_state(),
        }

    @distributed.quietly
    def load_checkpoint(self, path: str | os.PathLike[str] | None = None, tag: str | None = None) -> dict[str, Any]:
        """Collective: restore a verified checkpoint; the next ``fit``/``step`` continues it exactly.

        Without ``tag``, the newest checkpoint that verifies: one with a file missing,
        truncated or altered (against its manifest) is skipped for the next older one, and
        a warning says so. A checkpoint saved by a run with other facts (world size, ZeRO
        stage, batch sizes, data, seed, model, LoRA) is refused with what changed. Files
        are read with torch's weights-only unpickler: a checkpoint cannot run code. Load
        into a fresh session, before training (DeepSpeed cannot load ZeRO-3 states into an
        engine that has stepped). Returns the position: ``tag``, ``global_step``, ``epoch``,
        ``batch_in_epoch`` (where ``fit`` is in its data), ``micro_batches`` (the micro-batches this process
        stepped: where a loop of your own that calls ``step`` once per micro-batch continues in its data), and
        ``skipped`` (the damaged checkpoints passed over).
        """
        engine = self.engine
        name, state, skipped = checkpoints.load(
            engine,
            self._checkpoint_dir(path),
            tag,
            facts=self.run_facts,
            module_strict=not export.is_peft(self._model),
        )
        engine.micro_steps = int(state["micro_steps"])  # DeepSpeed restores global_steps, not micro_steps
        self.position = batches.DataPosition(
            int(state.get("epoch", 0)),
            int(state.get("batch_in_epoch", 0)),
            weights_only.decode_tensor(state.get("epoch_rng")),
        )
        if state.get("rng") is not None:  # none for a rank the saved run did not have (another world size)
            weights_only.set_rng_state(state["rng"])
        self.last_saved = name
        if path is None and self.is_main_process and self.history_path is not None:
            history.cut_after(self.history_path, int(state["global_step"]))
        return {
            "tag": name,
            "global_step": int(state["global_step"]),
            "epoch": self.position.epoch,
            "batch_in_epoch": self.position.batch_in_epoch,
            "micro_batches": engine.micro_steps,
            "skipped": skipped,
        }

    # -- export ------------------------------------------------------------------------------

    @distributed.quietly
    def save_model(self, path: str | os.PathLike[str] | None = None, merge_lora: bool = False) -> Path:
        """Collective: rank 0 writes the trained model to ``path`` in HF format (safetensors).

        Under ZeRO-3 the 16-bit weights are gathered first. A LoRA model writes its
        adapters (loadable with ``PeftModel.from_pretrained``), or with
        ``merge_lora=True`` the full model with the adapters merged. The tokenizer
        is saved alongside when the session has one. Default path: ``output_dir/model``.
        """
        if path is None:
            if self.output_dir is None:
                raise SessionError("no model directory: pass a path, or output_dir= to the Session")
            path = RunFolder(self.output_dir).model
        export.save_hf(self.engine, self._model, Path(path), merge_lora=merge_lora, tokenizer=self.tokenizer)
        return Path(path)
