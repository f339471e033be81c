"""``Session``: the engine (``EngineSession``) and the loop that trains it, ``fit``, read top to bottom."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..errors import RunStopped, SessionError
from ..outputs.history import History
from ..outputs.run_folder import RunFolder
from ..resolve.schedule import Schedule, run_steps
from . import distributed, loop
from .batches import StepOutput, counts
from .engine import EngineSession
from .parallel import SequenceShards

__all__ = ["Session", "SessionError", "StepOutput"]


class Session(EngineSession):
    """A DeepSpeed training session: the engine, the model it trains, its resolved config.

    ``model`` is an ``nn.Module``, an HF ``PreTrainedModel`` or a peft model;
    ``config`` a ``Config``, a ds_config dict, a config file or a preset name;
    ``training`` a ``Training`` or HF ``TrainingArguments``; ``output_dir`` where
    ``ds_config.json``, monitor logs, ``history.jsonl``, checkpoints and the model
    go (default ``training.output_dir``). Only parameters that require grad reach
    the optimizer. The config is resolved and checked here, before any process
    group exists; the engine is built on first use (see ``dsbuild.session.engine``'s docstring).

    ``total_steps``: the run's optimizer steps when ``fit`` will not count them;
    ``hidden_size``: the model's, for a model without an HF ``config``;
    ``tokenizer``: saved with the model; ``infer_batch_size``: the per-device
    batch of ``evaluate``; ``keep_last``: checkpoints kept (default
    ``training.save_total_limit``); ``data_fingerprint``: a digest of the training
    data, recorded in checkpoints so a resume on other data is refused;
    ``terminate_on_nan``: stop ``fit`` at the first NaN or infinite loss (default);
    ``checkpoint_digest``: what checkpoint files are hashed with in their manifest,
    ``"xxh3_128"`` (default: finds damage as SHA-256 does, many times faster) or ``"sha256"``.
    """

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
    ) -> list[dict[str, Any]]:
        """Train until ``max_steps`` optimizer steps (or ``epochs`` over ``train_data``); return this call's history.

        ``train_data`` is a DataLoader, or a Dataset (then each rank reads its share
        through a ``DistributedSampler`` in micro batches of the resolved size).
        The run's length comes from ``max_steps``, else ``epochs``, else the
        constructor's ``total_steps`` / ``training.max_steps``, else
        ``training.num_train_epochs`` (1 epoch without training arguments).

        ``eval_every`` / ``save_every`` count optimizer steps; the end of training is evaluated too, unless its last
        step just was (the HF Trainer's rule). With an output directory,
        checkpoints go to ``output_dir/checkpoints`` as ``training.save_strategy`` says
        (every ``save_steps``, or at each epoch's end), and once more at the end of
        training unless the strategy is ``"no"``, as the HF Trainer does. Metrics (loss,
        lr, grad norm, samples/s, tokens/s) go to DeepSpeed's monitors every
        ``training.logging_steps``, to ``output_dir/history.jsonl`` as they come (so a
        killed run keeps them), and to the returned list (one dict per optimizer step,
        plus one per evaluation). A NaN or infinite loss stops training at that step
        with ``NonFiniteLossError`` (``terminate_on_nan=False`` lets it go on). A call
        after ``load_checkpoint`` continues where the checkpoint left off.
        ``collate_fn`` turns a list of samples into a batch; ``loss_fn(model, batch)``
        returns the loss for a model whose forward does not take the batch itself.
        """
        loader = self.data_loader(train_data, self.micro_batch_size, shuffle=True, collate_fn=collate_fn)
        batches, accumulation = len(loader), self.gradient_accumulation_steps
        if batches == 0:
            raise SessionError("train_data is empty (no micro-batch for this process)")
        steps = run_steps(
            batches,
            accumulation,
            epochs=epochs,
            max_steps=max_steps,
            total_steps=self.total_steps,
            training=self.training,
        )
        engine = self.engine_for(steps)
        plan = Schedule.of(
            self.training,
            steps,
            eval_every=eval_every,
            save_every=save_every,
            evaluating=eval_data is not None,
            saving=self.output_dir is not None,
        )
        by_tokens = loss_fn is None and self.weights_by_tokens
        if self.sequence_parallel_size > 1 and not by_tokens:
            raise SessionError(
                "sequence parallelism trains with the token-weighted loss (each rank's shard weighs by its trained "
                "tokens): it needs a model whose forward takes num_items_in_batch (an HF causal LM) and no loss_fn"
            )

        def evaluated() -> dict[str, Any]:
            kept.flush()
            return {"step": self.global_step, **self.evaluate(eval_data, collate_fn=collate_fn, loss_fn=loss_fn)}

        records: list[dict[str, Any]] = []
        last: dict[str, Any] | None = None  # the latest optimizer step's record
        kept = History(self.history_path if self.is_main_process else None)
        progress = loop.Progress(steps, engine.global_steps, main=self.is_main_process)
        # SIGTERM / SIGUSR1 (and a first Ctrl-C, with stop_on_interrupt): an agreed checkpoint at the next step, then
        # RunStopped.
        stop = loop.StopSignals(interrupt=self.stop_on_interrupt)
        started = time.perf_counter()
        try:
            while engine.global_steps < steps:
                iterator = self.position.iterator(loader)
                left = batches - self.position.batch_in_epoch
                while left > 0 and engine.global_steps < steps:
                    # One optimizer step per group of micro-batches, as the HF Trainer does (an epoch's last group
                    # may be shorter).
                    group = [next(iterator) for _ in range(min(accumulation, left))]
                    left -= len(group)
                    last, signalled = self._optimizer_step(group, loader, loss_fn, by_tokens, stop, started)
                    step = last["step"]
                    records.append(last)
                    if not kept.add(last) and self.terminate_on_nan:
                        kept.flush()
                        raise loop.non_finite(last, kept.last_finite, self.output_dir)
                    if plan.logs(step):
                        self.write_events("Train", last)
                        kept.flush()
                        progress.logged(last)
                    progress.update(last)
                    if plan.evaluates(step):
                        records.append(evaluated())
                    if plan.saves(step):
                        kept.flush()
                        self.save_checkpoint()
                    if signalled is not None:
                        kept.flush()
                        raise self._stopped(signalled, step)
                    if self.save_requested is not None and self.save_requested():
                        kept.flush()
                        if self.last_saved != f"global_step{step}":
                            self.save_checkpoint()
                    started = time.perf_counter()
                if left == 0:  # the epoch's end
                    self.position.next_epoch()
                    if plan.log_epochs and last is not None:
                        self.write_events("Train", last)
                        progress.logged(last)
                    if plan.eval_epochs:
                        records.append(evaluated())
                    if plan.save_epochs:
                        kept.flush()
                        self.save_checkpoint()
        finally:
            stop.restore()
            progress.close()
            kept.flush()
        evaluated_last = any(r.get("step") == engine.global_steps and "eval_loss" in r for r in records)
        if plan.eval_at_end and last is not None and not evaluated_last:
            records.append(evaluated())  # as the HF Trainer: the end of training is evaluated, once
        if plan.log_epochs and last is not None and self.position.batch_in_epoch:
            self.write_events("Train", last)  # the last epoch ended with the run, before its end was seen
            progress.logged(last)
        if plan.save_at_end and self.last_saved != f"global_step{engine.global_steps}":
            self.save_checkpoint()  # the end of training is always saved, as the HF Trainer does
        return records

    def _optimizer_step(
        self,
        group: list[Any],
        loader: Any,
        loss_fn: Callable[[Any, Any], Any] | None,
        by_tokens: bool,
        stop: loop.StopSignals,
        started: float,
    ) -> tuple[dict[str, Any], tuple[int, str] | None]:
        """One optimizer step over ``group``, this process's micro-batches of it: the step's record (its numbers
        summed over every process) and, when a process was told to stop, which (its rank) and by what."""
        # The group's trained tokens, over every process, weight its loss (HF's num_items_in_batch).
        num_items = self.items_in_step(group) if by_tokens else None
        window = [0.0, 0.0, 0.0]  # loss, samples, tokens of the step on this process
        for i, batch in enumerate(group):
            samples, tokens = counts(batch)
            if isinstance(loader, SequenceShards):  # a group's shards are one micro-batch: count it once
                samples = loader.samples if loader.first else 0
            out = self._step(batch, loss_fn, num_items, i == len(group) - 1)
            self.position.batch_in_epoch += 1
            window = [window[0] + out.loss, window[1] + samples, window[2] + tokens]
        # One collective per step sums the step's numbers and which process was signalled, by what (loop.stop_code).
        noted = [0.0] * self.world_size
        asked = self.stop_requested() if self.stop_requested is not None else None
        noted[self.rank] = float(loop.stop_code(stop.check() or asked))
        loss_sum, samples_sum, tokens_sum, *codes = distributed.all_sum([*window, *noted], self.engine.device)
        signalled = next(((rank, loop.stop_name(int(c))) for rank, c in enumerate(codes) if c), None)
        # A tensor-parallel group's ranks train on the same batch: its numbers count once.
        tp = self.tensor_parallel_size
        loss_sum, samples_sum, tokens_sum = loss_sum / tp, samples_sum / tp, tokens_sum / tp
        # The HF Trainer's logged loss: the token-weighted step loss, or the mean of the micro-batch means.
        shares = 1 if num_items is not None and self._average_tokens else self.world_size // tp
        elapsed = max(time.perf_counter() - started, 1e-9)
        record = {
            "step": out.global_step,
            "epoch": self.position.epoch + self.position.batch_in_epoch / len(loader),
            "loss": loss_sum / (shares if num_items is not None else shares * len(group)),
            "lr": out.lr,
            "grad_norm": out.grad_norm,
            "samples_per_sec": samples_sum / elapsed,
            "tokens_per_sec": tokens_sum / elapsed,
        }
        return record, signalled

    def _stopped(self, signalled: tuple[int, str], step: int) -> RunStopped:
        """The agreed stop: every process saves the checkpoint of ``step`` (verified, with its manifest), then stops.
        ``signalled``: the first process that was told to stop, and by what."""
        rank, received = signalled
        who = f"rank {rank}" + (" (this process)" if rank == self.rank else "")
        if received == loop.LAUNCHER_LOST:
            why = f"the end of {who}'s launcher (torchrun's agent)"
        elif " to " in received:  # asked through stop_requested: it says to whom
            why = received
        else:
            why = f"{received} to {who}"
        if self.output_dir is None:
            return RunStopped(f"stopped at step {step} by {why}: no output directory, so no checkpoint was saved", None)
        tag = f"global_step{step}"
        if self.last_saved != tag:
            self.save_checkpoint()
        where = RunFolder(self.output_dir).checkpoint(tag)
        return RunStopped(
            f"stopped at step {step} by {why}; checkpoint {where} saved and verified: dsbuild train --resume continues",
            str(where),
        )
