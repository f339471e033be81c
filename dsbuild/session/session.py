"""``Session``: a DeepSpeed engine (``Engine``) and what a run does with it — the loop ``fit``, one micro-batch at a
time (``step``), evaluation, checkpoints that resume exactly, export. ``fit`` reads top to bottom; what it records
of each step is ``loop.Recorder``'s, one optimizer step ``loop.optimizer_step``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..api import Config
from ..errors import RunStopped, SessionError
from ..outputs import history, manifest
from ..outputs.history import History
from ..outputs.run_folder import RunFolder
from ..resolve.schedule import Schedule, run_steps
from ..resolve.training import Training
from . import batches, distributed, loop, parallel
from .batches import StepOutput, counts
from .capabilities import Capabilities
from .engine import Engine
from .offload import at_home
from .persist import Persist
from .reference import BuiltFrom
from .setup import (
    DEFAULT_SEED,
    as_config,
    checked_digest,
    checked_keep_last,
    pretrained_model,
    seed_everything,
    with_default_monitor,
)

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine
    from typing_extensions import Self

__all__ = ["Session", "SessionError", "StepOutput"]


class Session(Persist, Capabilities):
    """A DeepSpeed training session: the engine (``Engine``), the model it trains, its resolved config, and what a run
    does with them. ``model``: an ``nn.Module``, an HF ``PreTrainedModel`` or a peft model; ``config``: a ``Config``,
    a ds_config dict, a config file or a preset name; ``training``: a ``Training`` or HF ``TrainingArguments``; the
    rest as docs/session.md says. The config is resolved and checked here, before any process group exists."""

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
        out = output_dir if output_dir is not None else (self.training.output_dir if self.training else None)
        self.output_dir: Path | None = Path(out) if out is not None else None
        self.tokenizer, self.data_fingerprint, self.terminate_on_nan = tokenizer, data_fingerprint, terminate_on_nan
        self.checkpoint_digest, self.total_steps = checked_digest(checkpoint_digest), total_steps
        report_to = self.training.report_to if self.training is not None else ()
        given = with_default_monitor(as_config(config), self.output_dir, report_to)
        # Everything that can be wrong with the config fails here, before a process group exists.
        self._engine = Engine(
            model, given, training=self.training, optimizer=optimizer, lr_scheduler=lr_scheduler,
            hidden_size=hidden_size, total_steps=total_steps, checkpoint_digest=checkpoint_digest,
            output_dir=self.output_dir,
        )  # fmt: skip
        self.world_size: int = self._engine.world_size
        eval_default = self.training.per_device_eval_batch_size if self.training is not None else None
        self.infer_batch_size: int = infer_batch_size or eval_default or self.micro_batch_size
        self.keep_last = checked_keep_last(keep_last, self.training)
        if self.training is not None:
            seed_everything(self.training.seed)
        refused = parallel.refusal(
            model, self.sequence_parallel_size, self.tensor_parallel_size, self._engine.average_tokens
        )
        if refused is not None:
            raise SessionError(refused)
        distributed.init(self.training.ddp_timeout if self.training is not None else None)
        self.position = batches.DataPosition()
        """Where training is in the data (saved in checkpoints, so a resume draws the same batches)."""
        self.last_saved: str | None = None
        """The tag of the checkpoint this session last saved or loaded."""
        self.hooks = loop.Hooks()
        """What a launcher adds to ``fit``: a call after each save, a save or a stop asked for, Ctrl-C's meaning."""
        self.built_from: BuiltFrom | None = None
        """What ``from_pretrained`` built the model from (a reference model is built the same way)."""

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
        model_class: str = "AutoModelForCausalLM",
        model_kwargs: Mapping[str, Any] | None = None,
        **session_kwargs: Any,
    ) -> Self:
        """A session for an HF causal LM (or ``model_class`` with ``model_kwargs``: a reward model's): a path / hub id
        (its weights) or a ``PretrainedConfig`` (random init), built inside ``zero.Init`` under ZeRO-3, ``lora`` (peft's
        ``LoraConfig`` or its fields) applied after; other keyword arguments go to ``Session`` (docs/session.md)."""
        model, tokenizer = pretrained_model(
            name_or_path_or_config, as_config(config), Training.of(training) if training is not None else None,
            lora=lora, dtype=dtype, attn_implementation=attn_implementation,
            gradient_checkpointing=gradient_checkpointing, tokenizer=tokenizer, model_class=model_class,
            hidden_size=session_kwargs.get("hidden_size"), total_steps=session_kwargs.get("total_steps"),
            model_kwargs=model_kwargs or {},
        )  # fmt: skip
        session = cls(model, config, training=training, output_dir=output_dir, tokenizer=tokenizer, **session_kwargs)
        seed = session.training.seed if session.training is not None else DEFAULT_SEED
        session.built_from = BuiltFrom(name_or_path_or_config, dtype, attn_implementation, seed)
        return session

    # -- what a session holds ------------------------------------------------------------------------------------------

    @property
    def engine(self) -> DeepSpeedEngine:
        """The ``DeepSpeedEngine`` (built on first use)."""
        return self.engine_for(self.total_steps)

    def engine_for(self, total_steps: int | None) -> DeepSpeedEngine:
        """The engine, built for a run of ``total_steps`` optimizer steps when it does not exist yet."""
        return self._engine.built(total_steps, self.total_steps)

    @property
    def model(self) -> Any:
        """The model being trained, unwrapped (the peft model for LoRA); under ZeRO-3 its weights are partitioned."""
        return self._engine.model

    @property
    def config(self) -> Config:
        """The resolved config the engine runs with. Before the engine exists, for a run whose step count ``fit`` will
        tell, the keys that need the count (``scheduler.params.total_num_steps``, a warmup given as a ratio) are still
        ``"auto"``; they are filled when the engine is built."""
        return self._engine.config

    @property
    def micro_batch_size(self) -> int:
        return self._engine.micro_batch_size

    @property
    def gradient_accumulation_steps(self) -> int:
        return self._engine.gradient_accumulation_steps

    @property
    def tensor_parallel_size(self) -> int:
        """The run's AutoTP degree (``tensor_parallel.autotp_size``; 1: none; docs/session.md)."""
        return self._engine.tensor_parallel_size

    @property
    def sequence_parallel_size(self) -> int:
        """The run's Ulysses sequence-parallel degree (1: none; docs/session.md)."""
        return self._engine.sequence_parallel_size

    @property
    def global_step(self) -> int:
        """Optimizer steps taken (restored by ``load_checkpoint``)."""
        return 0 if self._engine.deepspeed is None else int(self._engine.deepspeed.global_steps)

    @property
    def rank(self) -> int:
        return distributed.rank()

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def run_facts(self) -> manifest.RunFacts:
        """What a checkpoint of this run records, and a resume must match (``dsbuild.outputs.manifest.RunFacts``)."""
        return self._engine.run_facts(seed=self.training.seed if self.training else None, data=self.data_fingerprint)

    # -- one micro-batch at a time ---------------------------------------------------------------------------------

    @property
    def weights_by_tokens(self) -> bool:
        """Whether ``fit`` weights the loss by the step's trained tokens (HF's ``num_items_in_batch``): the model's
        forward takes the count (HF causal LMs, peft models of them) and no ``loss_fn`` replaces it."""
        return self._engine.weights_by_tokens

    def items_in_step(self, micro_batches: Sequence[Any]) -> int | None:
        """The optimizer step's trained tokens (HF's ``num_items_in_batch``) over ``micro_batches``, this process's,
        and, with ``training.average_tokens_across_devices`` (the default), every process's (then collective);
        ``None`` without labels. Pass it to ``step``."""
        self.engine  # noqa: B018 - built: the sum over the processes runs on its device
        return self._engine.items_in_step(micro_batches)

    @at_home
    @distributed.quietly
    def step(
        self, batch: Any, loss_fn: Callable[[Any, Any], Any] | None = None, *, num_items_in_batch: int | None = None
    ) -> StepOutput:
        """One micro-batch: forward, backward, and the engine's step (an optimizer step at a boundary).

        A dict batch goes to ``model(**batch)``; else ``loss_fn(model, batch)`` returns the loss. With
        ``num_items_in_batch`` (``items_in_step``) the loss is the HF Trainer's, summed over the step's trained tokens
        and divided by the count; without it, DeepSpeed's mean over the accumulation steps (docs/session.md)."""
        self.engine  # noqa: B018 - built on first use
        return self._engine.micro_step(batch, loss_fn, num_items_in_batch, None)

    def data_loader(
        self, data: Any, batch_size: int, *, shuffle: bool, collate_fn: Callable[[list[Any]], Any] | None = None
    ) -> Any:
        """``data`` itself when it is a DataLoader; else a DataLoader over this rank's share of it. The ranks of a
        tensor- or sequence-parallel group read the same micro-batches (one data-parallel replica's: the run steps
        through the data as the same run without them does); with sequence parallelism each rank takes its shard."""
        group = self.tensor_parallel_size * self.sequence_parallel_size  # consecutive ranks, as DeepSpeed groups them
        loader = batches.loader(
            data, batch_size, world_size=self.world_size // group, rank=self.rank // group, shuffle=shuffle,
            seed=self.training.seed if self.training is not None else DEFAULT_SEED,
            drop_last=bool(self.config.dataloader_drop_last) if shuffle else False, collate_fn=collate_fn,
            num_workers=self.training.dataloader_num_workers if self.training is not None else 0,
        )  # fmt: skip
        sp = self.sequence_parallel_size
        if sp == 1:
            return loader
        return parallel.SequenceShards(loader, sp, self.micro_batch_size, lambda: self.engine.device)

    def write_events(self, prefix: str, record: Mapping[str, Any]) -> None:
        """Metrics to DeepSpeed's monitors (CSV, TensorBoard, W&B, Comet: whatever the config enables)."""
        monitor = getattr(self._engine.deepspeed, "monitor", None)
        if monitor is None or not monitor.enabled:
            return
        numbers = ((k, v) for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
        step = int(record["step"])
        monitor.write_events([(f"{prefix}/{k}", float(v), step) for k, v in numbers if k not in ("step", "epoch")])

    # -- the loop ----------------------------------------------------------------------------------------------------

    @at_home
    @distributed.quietly
    def fit(
        self,
        train_data: Any,
        epochs: float | None = None,
        max_steps: int | None = None,
        eval_data: Any = None,
        eval_every: int | None = None,
        save_every: int | None = None,
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        loss_fn: Callable[[Any, Any], Any] | None = None,
        rollout: Callable[[list[Any]], list[Any]] | None = None,
    ) -> list[dict[str, Any]]:
        """Train ``max_steps`` optimizer steps (or ``epochs`` of ``train_data``), logging, evaluating and saving as the HF
        Trainer would, a NaN loss stopping it, on from a loaded checkpoint; the call's history (docs/session.md)."""
        loader = self.data_loader(train_data, self.micro_batch_size, shuffle=True, collate_fn=collate_fn)
        batches_per_epoch, accumulation = len(loader), self.gradient_accumulation_steps
        if batches_per_epoch == 0:
            raise SessionError("train_data is empty (no micro-batch for this process)")
        steps = run_steps(batches_per_epoch, accumulation, epochs=epochs, max_steps=max_steps,
                          total_steps=self.total_steps, training=self.training)  # fmt: skip
        engine = self.engine_for(steps)
        plan = Schedule.of(self.training, steps, eval_every=eval_every, save_every=save_every,
                           evaluating=eval_data is not None, saving=self.output_dir is not None)  # fmt: skip
        by_tokens = token_weighted(self, loss_fn)
        record = Recorder(self, steps, engine.global_steps)

        def evaluate() -> None:
            record.flush()
            record.evaluation(self.evaluate(eval_data, collate_fn=collate_fn, loss_fn=loss_fn))

        with loop.StopSignals(interrupt=self.hooks.stop_on_interrupt) as stop, record:
            while engine.global_steps < steps:
                iterator, left = self.position.iterator(loader), batches_per_epoch - self.position.batch_in_epoch
                while left > 0 and engine.global_steps < steps:
                    # One optimizer step per group of micro-batches, as the HF Trainer (an epoch's last may be shorter).
                    left -= (n := min(accumulation, left))
                    group = (rollout or list)([next(iterator) for _ in range(n)])  # a rollout makes GRPO's batches
                    done, signalled = optimizer_step(self, group, loader, loss_fn, by_tokens, stop, record, rollout)
                    record.step(done, logs=plan.logs(done["step"]))
                    if plan.evaluates(done["step"]):
                        evaluate()
                    if plan.saves(done["step"]) or (self.hooks.save_requested and self.hooks.save_requested()):
                        self._save_now(record)
                    if signalled is not None:
                        record.flush()
                        raise stopped(self, signalled, done["step"])
                if left == 0:  # the epoch's end
                    self.position.next_epoch()
                    record.epoch_ended(logs=plan.log_epochs)
                    if plan.eval_epochs:
                        evaluate()
                    if plan.save_epochs:
                        self._save_now(record)
        if plan.eval_at_end and record.trained and not record.evaluated(engine.global_steps):
            evaluate()  # as the HF Trainer: the end of training is evaluated, once
        record.run_ended(logs=plan.log_epochs and self.position.batch_in_epoch > 0)
        if plan.save_at_end:
            self._save_now(record)  # the end of training is always saved, as the HF Trainer does
        return record.ended()

    def _save_now(self, record: Recorder) -> None:
        """A checkpoint of the step the run is at, unless this session just saved or loaded it."""
        record.flush()
        if self.last_saved != f"global_step{self.global_step}":
            self.save_checkpoint()

    # -- evaluation, checkpoints, export -------------------------------------------------------------------------------

    @at_home
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

        Returns ``eval_loss`` (weighted by samples, over all processes), ``eval_samples``, ``eval_num_tokens`` and each
        number ``loss_fn`` returns beside its loss as ``eval_NAME`` (TRL's ``eval_rewards/chosen``, ...), appended to
        ``history.jsonl`` with the step. Under sequence parallelism the batches are the micro-batch size
        (DeepSpeed's attention is built for it)."""
        engine = self.engine
        size = self.micro_batch_size if self.sequence_parallel_size > 1 else batch_size or self.infer_batch_size
        loader = self.data_loader(data, size, shuffle=False, collate_fn=collate_fn)
        metrics = batches.evaluation(engine, loader, self, loss_fn)
        self.write_events("Eval", {"step": engine.global_steps, "loss": metrics["eval_loss"]})
        if self.is_main_process and self.history_path is not None:
            history.append(self.history_path, [{"step": int(engine.global_steps), **metrics}])
        return metrics


# -- the pieces of fit ---------------------------------------------------------------------------------------------


class Recorder:
    """What ``fit`` keeps of each optimizer step and evaluation: the records it returns, ``history.jsonl`` (rank 0,
    flushed before anything that may stop the run), DeepSpeed's monitors and the progress display. A NaN or infinite
    loss stops the run (``NonFiniteLossError``) unless the session says to train on."""

    def __init__(self, session: Session, steps: int, done: int) -> None:
        self.session = session
        self.records: list[dict[str, Any]] = []
        self.last: dict[str, Any] | None = None
        """The latest optimizer step's record."""
        self.kept = History(session.history_path if session.is_main_process else None)
        self.progress = loop.Progress(steps, done, main=session.is_main_process)
        self.started = time.perf_counter()
        """When the step being trained started (for samples/s and tokens/s)."""

    @property
    def trained(self) -> bool:
        """Whether this ``fit`` trained a step."""
        return self.last is not None

    def step(self, record: dict[str, Any], *, logs: bool) -> None:
        self.last = record
        self.records.append(record)
        if not self.kept.add(record) and self.session.terminate_on_nan:
            self.kept.flush()
            raise loop.non_finite(record, self.kept.last_finite, self.session.output_dir)
        if logs:
            self.session.write_events("Train", record)
            self.kept.flush()
            self.progress.logged(record)
        self.progress.update(record)
        self.started = time.perf_counter()

    def evaluation(self, metrics: Mapping[str, Any]) -> None:
        self.records.append({"step": self.session.global_step, **metrics})

    def evaluated(self, step: int) -> bool:
        return any(r.get("step") == step and "eval_loss" in r for r in self.records)

    def epoch_ended(self, *, logs: bool) -> None:
        """An epoch's end: logged, by epoch (``logging_strategy = "epoch"``)."""
        if logs and self.last is not None:
            self.session.write_events("Train", self.last)
            self.progress.logged(self.last)

    def run_ended(self, *, logs: bool) -> None:
        """The run's end inside an epoch, which that epoch's end logs by epoch."""
        self.epoch_ended(logs=logs)

    def flush(self) -> None:
        self.kept.flush()

    def ended(self) -> list[dict[str, Any]]:
        """The end of ``fit``: a checkpoint still being written in the background counts first (``finish_saving``);
        the records."""
        self.session.finish_saving(waiting=None)
        return self.records

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.close()
        self.kept.flush()


def token_weighted(session: Session, loss_fn: Any) -> bool:
    """Whether ``fit`` weights the loss by the step's trained tokens (HF's ``num_items_in_batch``); sequence
    parallelism refuses to train otherwise."""
    by_tokens = loss_fn is None and session.weights_by_tokens
    if session.sequence_parallel_size > 1 and not by_tokens:
        raise SessionError(
            "sequence parallelism trains with the token-weighted loss (each rank's shard weighs by its trained "
            "tokens): it needs a model whose forward takes num_items_in_batch (an HF causal LM) and no loss_fn"
        )
    return by_tokens


def optimizer_step(
    session: Session,
    group: list[Any],
    loader: Any,
    loss_fn: Any,
    by_tokens: bool,
    stop: loop.StopSignals,
    record: Recorder,
    rollout: Any = None,
) -> tuple[dict[str, Any], tuple[int, str] | None]:
    """One optimizer step over ``group``, this process's micro-batches of it: the step's record (its numbers summed
    over every process) and, when a process was told to stop, which (its rank) and by what. Collective. Without a
    ``rollout`` (which logs its own), the record carries TRL's ``num_tokens``: the tokens trained on so far."""
    engine = session.engine
    # The group's trained tokens, over every process, weight its loss (HF's num_items_in_batch).
    num_items = session.items_in_step(group) if by_tokens else None
    window = [0.0, 0.0, 0.0, 0.0]  # loss, samples, tokens of the step on this process; the tokens TRL counts
    metrics: dict[str, list[float]] = {}  # a loss_fn's other numbers, each summed with its micro-batches
    out = None
    # The HF Trainer fetches a step's micro-batches before its first forward: in the step that ends an epoch each
    # sees Accelerate's end of the data, and TRL's gather_for_metrics leaves out the filler ranks in all of them.
    gathered = batches.gathered(loader, session.position.batch_in_epoch + len(group) - 1)
    for i, batch in enumerate(group):
        samples, tokens = counts(batch)
        if isinstance(loader, parallel.SequenceShards):  # a group's shards are one micro-batch: count it once
            samples = loader.samples if loader.first else 0
        session.position.gathered = gathered
        counted = tokens if session.position.gathered else 0
        try:
            out = session._engine.micro_step(batch, loss_fn, num_items, i == len(group) - 1, len(group))
        finally:
            session.position.gathered = True
        session.position.batch_in_epoch += 1
        window = [window[0] + out.loss, window[1] + samples, window[2] + tokens, window[3] + counted]
        batches.add_metrics(metrics, out.metrics)
    assert out is not None
    # One collective per step sums the step's numbers and which process was signalled, by what (stop_code).
    noted = [0.0] * session.world_size
    asked = session.hooks.stop_requested() if session.hooks.stop_requested is not None else None
    noted[session.rank] = float(loop.stop_code(stop.check() or asked))
    names = sorted(metrics)  # every process's loss_fn returns the same names for a micro-batch
    # A checkpoint written in the background (async_save) counts at the first step every process has written it.
    writing = [float(session.saving.written())] if session.saving is not None else []
    summed = distributed.all_sum([*window, *(v for n in names for v in metrics[n]), *noted, *writing], engine.device)
    loss_sum, samples_sum, tokens_sum, counted_sum = summed[:4]
    means = batches.metric_means(names, summed[4 : 4 + 2 * len(names)])  # over the micro-batches that logged each
    codes = summed[4 + 2 * len(names) : 4 + 2 * len(names) + session.world_size]
    if writing and summed[-1] == session.world_size:
        session.finish_saving()
    signalled = next(((rank, loop.stop_name(int(c))) for rank, c in enumerate(codes) if c), None)
    # A tensor-parallel group's ranks train on the same batch: its numbers count once.
    tp = session.tensor_parallel_size
    loss_sum, samples_sum, tokens_sum = loss_sum / tp, samples_sum / tp, tokens_sum / tp
    session.position.tokens += round(counted_sum) // tp
    # The HF Trainer's logged loss: the token-weighted step loss, or the mean of the micro-batch means.
    shares = 1 if num_items is not None and session._engine.average_tokens else session.world_size // tp
    elapsed = max(time.perf_counter() - record.started, 1e-9)
    return {
        "step": out.global_step,
        "epoch": session.position.epoch + session.position.batch_in_epoch / len(loader),
        "loss": loss_sum / (shares if num_items is not None else shares * len(group)),
        "lr": out.lr,
        "grad_norm": out.grad_norm,
        "samples_per_sec": samples_sum / elapsed,
        "tokens_per_sec": tokens_sum / elapsed,
        **({"num_tokens": float(session.position.tokens)} if rollout is None else {}),
        **means,  # TRL's metrics: each micro-batch's, averaged over the step's micro-batches and processes
    }, signalled


def stopped(session: Session, signalled: tuple[int, str], step: int) -> RunStopped:
    """The agreed stop: every process saves the checkpoint of ``step`` (verified, with its manifest), then stops.
    ``signalled``: the first process that was told to stop, and by what."""
    why = loop.stop_reason(*signalled, session.rank)
    if session.output_dir is None:
        return RunStopped(f"stopped at step {step} by {why}: no output directory, so no checkpoint was saved", None)
    tag = f"global_step{step}"
    if session.last_saved != tag:
        session.save_checkpoint()
    session.finish_saving(waiting=None)  # a checkpoint written in the background (async_save) counts before the stop
    where = RunFolder(session.output_dir).checkpoint(tag)
    return RunStopped(
        f"stopped at step {step} by {why}; checkpoint {where} saved and verified: dsbuild train --resume continues",
        str(where),
    )
