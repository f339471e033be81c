"""``Session``: one DeepSpeed engine, with the model built for it, a loop, checkpoints that resume exactly, export.

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

import math
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ..api import Config
from ..config import CsvMonitor
from ..errors import ConfigError, DsbuildError, Problem, UnresolvedAutoError
from ..training import Training
from ..validate import check
from . import building, checkpoints, distributed, export

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

__all__ = ["Session", "SessionError", "StepOutput"]

_PROBE_STEPS = 1_000_000
"""Stand-in step count used only to check a config whose schedule waits for ``fit`` to count the steps."""
_DEFAULT_SEED = 42
"""HF's default seed; every rank builds the same random initial weights from it."""


class SessionError(DsbuildError, RuntimeError):
    """A ``Session`` was used in a way it cannot work (no loss returned, no output directory to save to, ...)."""


@attrs.frozen
class StepOutput:
    """What one ``Session.step`` (one micro-batch) did."""

    loss: float
    """This micro-batch's loss on this process (not averaged over processes or accumulation)."""
    boundary: bool
    """True when this micro-batch completed a gradient-accumulation cycle and the optimizer stepped."""
    lr: float | None
    """Learning rate of the optimizer step this micro-batch belongs to (of the first parameter group)."""
    grad_norm: float | None
    """Global gradient norm of the optimizer step, at a boundary when DeepSpeed computed one; else ``None``."""
    global_step: int
    """Optimizer steps taken so far (after this micro-batch)."""


def _as_config(config: Config | Mapping[str, Any] | str | os.PathLike[str]) -> Config:
    """A ``Config`` from one, a ds_config dict, a config file, or a preset name."""
    if isinstance(config, Config):
        return config
    if isinstance(config, Mapping):
        return Config.from_dict(config)
    if isinstance(config, (str, os.PathLike)):
        if Path(config).is_file():
            return Config.load(Path(config))
        return Config.preset(str(config))
    raise ConfigError(
        Problem("config", f"got {type(config).__name__}, expected a Config, a ds_config dict, a path or a preset name")
    )


def _with_default_monitor(config: Config, output_dir: Path | None) -> Config:
    """Turn DeepSpeed's CSV monitor on under ``output_dir`` when the user configured no monitor at all."""
    if output_dir is None or any(
        getattr(config, name) is not None for name in ("tensorboard", "csv_monitor", "wandb", "comet")
    ):
        return config
    monitor = CsvMonitor(enabled=True, output_path=str(output_dir / "logs"), job_name="train")
    return attrs.evolve(config, csv_monitor=monitor)


def _resolve(
    given: Config,
    *,
    world_size: int,
    training: Training | None,
    model: Any,
    hidden_size: int | None,
    total_steps: int | None,
) -> tuple[Config, bool]:
    """The resolved, checked config and whether the run's step count was known.

    Without a step count, a config whose schedule needs one is checked with a
    stand-in count and resolved for real once ``fit`` counts the steps.
    """
    kwargs: dict[str, Any] = {
        "world_size": world_size,
        "training": training,
        "model": model,
        "hidden_size": hidden_size,
    }
    known = True
    try:
        resolved = given.resolve(total_steps=total_steps, **kwargs)
    except UnresolvedAutoError as error:
        if total_steps is not None or (training is not None and training.max_steps > 0):
            raise
        try:
            resolved = given.resolve(total_steps=_PROBE_STEPS, **kwargs)
        except ConfigError:
            raise error from None
        known = False
    check(resolved, world_size=world_size, resolved=True)
    return resolved, known


def _hf_model_or_none(model: Any) -> Any:
    """What ``resolve`` reads the hidden size from: the model when it has a ``config``."""
    return model if getattr(model, "config", None) is not None else None


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds the accelerator's generators


def _to_device(batch: Any, device: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(_to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def _loss_of(output: Any) -> Any:
    """The loss in a model's output: ``.loss``, ``["loss"]``, or the output itself when it is a scalar tensor."""
    if isinstance(output, torch.Tensor):
        loss = output
    elif getattr(output, "loss", None) is not None:
        loss = output.loss
    elif isinstance(output, Mapping) and output.get("loss") is not None:
        loss = output["loss"]
    else:
        raise SessionError(
            f"the model returned {type(output).__name__} without a loss: put labels in the batch, or pass loss_fn=(model, batch) -> loss"
        )
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise SessionError(
            f"the loss must be a scalar tensor, got {type(loss).__name__} of shape {getattr(loss, 'shape', None)}"
        )
    return loss


def _counts(batch: Any) -> tuple[int, int]:
    """(samples, tokens) in a batch: tokens are the attention mask's ones, else the input ids; 0 when unknown."""
    first = batch
    while isinstance(first, (Mapping, list, tuple)) and len(first):
        first = next(iter(first.values())) if isinstance(first, Mapping) else first[0]
    samples = int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() > 0 else 0
    tokens = 0
    if isinstance(batch, Mapping):
        if isinstance(batch.get("attention_mask"), torch.Tensor):
            tokens = int(batch["attention_mask"].sum())
        elif isinstance(batch.get("input_ids"), torch.Tensor):
            tokens = int(batch["input_ids"].numel())
    return samples, tokens


def _float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out


class Session:
    """A DeepSpeed training session: the engine, the model it trains, its resolved config.

    ``model`` is an ``nn.Module``, an HF ``PreTrainedModel`` or a peft model;
    ``config`` a ``Config``, a ds_config dict, a config file or a preset name;
    ``training`` a ``Training`` or HF ``TrainingArguments``. Only parameters that
    require grad reach the optimizer. See the module docstring for when the
    engine is built; the config is resolved and checked in the constructor,
    before any process group exists.
    """

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
    ) -> None:
        self.training: Training | None = Training.of(training) if training is not None else None
        """The training arguments (a ``Training``), or ``None``."""
        out = output_dir if output_dir is not None else (self.training.output_dir if self.training else None)
        self.output_dir: Path | None = Path(out) if out is not None else None
        """Where ``ds_config.json``, monitor logs, checkpoints and the model go by default."""
        self.tokenizer = tokenizer
        """Saved next to the model by ``save_model`` when given."""
        self._model = model
        self._optimizer = optimizer
        self._lr_scheduler = lr_scheduler
        self._hidden_size = hidden_size
        self._total_steps = total_steps
        self._given = _with_default_monitor(_as_config(config), self.output_dir)
        self.world_size: int = distributed.world_size()
        """Processes in the run (from the launcher's environment)."""

        # Everything that can be wrong with the config fails here, before a process group exists.
        self._config, self._steps_known = self._resolve(total_steps)
        micro = self._config.train_micro_batch_size_per_gpu
        assert isinstance(micro, int)
        eval_default = self.training.per_device_eval_batch_size if self.training is not None else micro
        self.infer_batch_size: int = infer_batch_size or eval_default
        """Per-device batch size of ``evaluate`` (default ``per_device_eval_batch_size``, else the micro batch)."""
        self.keep_last: int | None = (
            keep_last
            if keep_last is not None
            else (self.training.save_total_limit if self.training is not None else None)
        )
        """Checkpoints kept by ``save_checkpoint`` (older ones deleted); ``None`` keeps all."""
        if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
            raise ConfigError(Problem("keep_last", f"got {keep_last!r}, expected an integer >= 1"))
        if self.training is not None:
            _seed(self.training.seed)

        distributed.init()
        self._engine: DeepSpeedEngine | None = None
        # Where training is in the data: the epoch, the micro-batches of it consumed, and the torch RNG
        # state its iterator was created from (so a resumed run draws the same shuffle).
        self._epoch = 0
        self._batch_in_epoch = 0
        self._epoch_rng: torch.Tensor | None = None

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
    ) -> Session:
        """A session for an HF causal LM: a local path / hub id (its weights) or a ``PretrainedConfig`` (random init).

        Under ZeRO-3 the model is built inside ``zero.Init`` the HF way (never whole
        on one device), with HF's ZeRO-3 switch on only while it is built. ``lora``
        (a peft ``LoraConfig`` or a table of its fields) wraps it afterwards; with
        ``gradient_checkpointing`` activations are recomputed (non-reentrant).
        ``tokenizer`` is a tokenizer or where to load one; it is saved with the model.
        Other keyword arguments go to ``Session``.
        """
        training_args = Training.of(training) if training is not None else None
        pretrained = building.pretrained_config(name_or_path_or_config)
        # Resolved and checked against the model's config before any process group or weight exists.
        probe, _ = _resolve(
            _as_config(config),
            world_size=distributed.world_size(),
            training=training_args,
            model=pretrained,
            hidden_size=session_kwargs.get("hidden_size"),
            total_steps=session_kwargs.get("total_steps"),
        )
        # Same seed on every rank: the same random init everywhere (ZeRO-3 also broadcasts rank 0's).
        _seed(training_args.seed if training_args is not None else _DEFAULT_SEED)
        distributed.init()  # zero.Init partitions over the process group
        model = building.build_model(
            name_or_path_or_config, probe.to_dict(), dtype=dtype, attn_implementation=attn_implementation
        )
        if gradient_checkpointing:
            building.enable_gradient_checkpointing(model, lora=lora is not None)
        if lora is not None:
            model = building.apply_lora(model, lora)
        if isinstance(tokenizer, (str, os.PathLike)):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        return cls(model, config, training=training, output_dir=output_dir, tokenizer=tokenizer, **session_kwargs)

    def _resolve(self, total_steps: int | None) -> tuple[Config, bool]:
        return _resolve(
            self._given,
            world_size=self.world_size,
            training=self.training,
            model=_hf_model_or_none(self._model),
            hidden_size=self._hidden_size,
            total_steps=total_steps,
        )

    def _build_engine(self, total_steps: int | None) -> DeepSpeedEngine:
        import deepspeed

        if not self._steps_known:
            # The last chance to learn the schedule's length; without it this raises naming the key.
            self._config, self._steps_known = self._resolve(total_steps)
            if not self._steps_known:
                self._resolve_strict()
        ds_config = self._config.to_dict()
        if self.output_dir is not None and self.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._config.to_json(self.output_dir / "ds_config.json")
        params = [p for p in self._model.parameters() if p.requires_grad]
        if not params:
            raise SessionError("the model has no trainable parameters (requires_grad is False everywhere)")
        engine, _, _, _ = deepspeed.initialize(
            model=self._model,
            model_parameters=params if self._optimizer is None else None,
            optimizer=self._optimizer,
            lr_scheduler=self._lr_scheduler,
            config=ds_config,
        )
        self._engine = engine
        return engine

    def _resolve_strict(self) -> None:
        """Raise the resolver's own error for the missing step count (names the key and ``total_steps=``)."""
        self._given.resolve(
            world_size=self.world_size,
            training=self.training,
            model=_hf_model_or_none(self._model),
            hidden_size=self._hidden_size,
        )
        raise UnresolvedAutoError(Problem("", "the run's number of optimizer steps is unknown", "pass total_steps="))

    # -- what a session holds -------------------------------------------------------

    @property
    def engine(self) -> DeepSpeedEngine:
        """The ``DeepSpeedEngine`` (built on first use)."""
        if self._engine is None:
            return self._build_engine(self._total_steps)
        return self._engine

    @property
    def model(self) -> Any:
        """The model being trained, unwrapped (the peft model for LoRA); under ZeRO-3 its weights are partitioned."""
        return self._model

    @property
    def config(self) -> Config:
        """The resolved config the engine runs with.

        Before the engine exists, for a run whose step count ``fit`` will tell, the
        step-count keys still hold a stand-in; they are filled when the engine is built.
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

    # -- one micro-batch -----------------------------------------------------------

    def _forward_loss(self, engine: Any, batch: Any, loss_fn: Callable[[Any, Any], Any] | None) -> Any:
        if loss_fn is not None:
            return _loss_of(loss_fn(engine, batch))
        if isinstance(batch, Mapping):
            return _loss_of(engine(**batch))
        if isinstance(batch, (list, tuple)):
            return _loss_of(engine(*batch))
        return _loss_of(engine(batch))

    def step(self, batch: Any, loss_fn: Callable[[Any, Any], Any] | None = None) -> StepOutput:
        """One micro-batch: forward, backward, and the engine's step (an optimizer step at a boundary).

        A dict batch goes to ``model(**batch)`` and the output's ``.loss`` (or a scalar
        tensor output) is the loss; else ``loss_fn(model, batch)`` returns it, where
        ``model`` is the engine (call it like the model). Tensors move to the engine's device.
        """
        engine = self.engine
        if not engine.module.training:
            engine.train()
        batch = _to_device(batch, engine.device)
        boundary = bool(engine.is_gradient_accumulation_boundary())
        loss = self._forward_loss(engine, batch, loss_fn)
        engine.backward(loss)
        lrs = engine.get_lr()
        lr = _float(lrs[0]) if lrs else None  # the lr this optimizer step applies (the scheduler moves it after)
        engine.step()
        grad_norm = _float(engine.get_global_grad_norm()) if boundary else None
        return StepOutput(
            loss=float(loss.detach().float()),
            boundary=boundary,
            lr=lr,
            grad_norm=grad_norm,
            global_step=int(engine.global_steps),
        )

    # -- data ------------------------------------------------------------------------

    def _loader(
        self, data: Any, batch_size: int, *, shuffle: bool, collate_fn: Callable[[list[Any]], Any] | None
    ) -> Any:
        """``data`` itself when it is a DataLoader; else a DataLoader over this rank's share of a Dataset."""
        if isinstance(data, DataLoader):
            return data
        if not isinstance(data, (Dataset, Sequence)):
            raise SessionError(f"expected a DataLoader, a Dataset or a sequence of samples, got {type(data).__name__}")
        seed = self.training.seed if self.training is not None else _DEFAULT_SEED
        sampler: DistributedSampler[Any] = DistributedSampler(
            data,  # type: ignore[arg-type]
            num_replicas=self.world_size,
            rank=self.rank,
            shuffle=shuffle,
            seed=seed,
        )
        drop_last = bool(self._config.dataloader_drop_last) if shuffle else False
        return DataLoader(data, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn, drop_last=drop_last)  # type: ignore[arg-type]

    def _epoch_iterator(self, loader: Any, epoch: int, skip: int) -> Any:
        """An iterator over one epoch, past its first ``skip`` micro-batches, drawing the shuffle a resumed run needs."""
        set_epoch = getattr(getattr(loader, "sampler", None), "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)  # a DistributedSampler shuffles per epoch
        if skip and self._epoch_rng is not None:
            # Resuming mid-epoch: the iterator takes its seed from torch's RNG, so create it from the
            # state the interrupted run created it from, then continue with the restored state.
            now = torch.get_rng_state()
            torch.set_rng_state(self._epoch_rng)
            iterator = iter(loader)
            torch.set_rng_state(now)
        else:
            self._epoch_rng = torch.get_rng_state()
            iterator = iter(loader)
        for _ in range(skip):
            next(iterator, None)
        return iterator

    # -- the loop ----------------------------------------------------------------------

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
        """Train until ``max_steps`` optimizer steps (or ``epochs`` over ``train_data``); return the history.

        ``train_data`` is a DataLoader, or a Dataset (then each rank reads its share
        through a ``DistributedSampler`` in micro batches of the resolved size).
        The run's length comes from ``max_steps``, else ``epochs``, else the
        constructor's ``total_steps`` / ``training.max_steps``, else
        ``training.num_train_epochs`` (1 epoch without training arguments).
        ``eval_every`` / ``save_every`` count optimizer steps (``save_every`` defaults to
        ``training.save_steps`` when an output directory is set; checkpoints go to
        ``output_dir/checkpoints``). Metrics (loss, lr, grad norm, samples/s,
        tokens/s) go to DeepSpeed's monitors every ``training.logging_steps`` and to
        the returned history (one dict per optimizer step, plus one per evaluation).
        A call after ``load_checkpoint`` continues where the checkpoint left off.
        """
        from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

        loader = self._loader(train_data, self.micro_batch_size, shuffle=True, collate_fn=collate_fn)
        batches = len(loader)
        if batches == 0:
            raise SessionError("train_data is empty (no micro-batch for this process)")
        per_epoch = max(batches // self.gradient_accumulation_steps, 1)
        target = self._target_steps(per_epoch, epochs, max_steps)
        engine = self._engine if self._engine is not None else self._build_engine(target)

        save_every = self._every(save_every, "save_steps", target) if self.output_dir is not None else save_every
        if save_every and self.output_dir is None:
            raise SessionError("save_every needs an output directory: pass output_dir= to the Session")
        log_every = self._every(None, "logging_steps", target) or 1

        history: list[dict[str, Any]] = []
        bar = tqdm(
            total=target,
            initial=min(engine.global_steps, target),
            desc="train",
            unit="step",
            disable=not self.is_main_process,
            dynamic_ncols=True,
        )
        window = [0.0, 0.0, 0.0, 0.0]  # loss sum, micro-batches, samples, tokens since the last optimizer step
        started = time.perf_counter()
        try:
            while engine.global_steps < target:
                iterator = self._epoch_iterator(loader, self._epoch, self._batch_in_epoch)
                for batch in iterator:
                    samples, tokens = _counts(batch)
                    out = self.step(batch, loss_fn=loss_fn)
                    self._batch_in_epoch += 1
                    window = [window[0] + out.loss, window[1] + 1, window[2] + samples, window[3] + tokens]
                    if not out.boundary:
                        continue
                    loss_sum, micro, samples_sum, tokens_sum = distributed.all_sum(window, engine.device)
                    elapsed = max(time.perf_counter() - started, 1e-9)
                    record = {
                        "step": out.global_step,
                        "epoch": self._epoch + self._batch_in_epoch / batches,
                        "loss": loss_sum / max(micro, 1),
                        "lr": out.lr,
                        "grad_norm": out.grad_norm,
                        "samples_per_sec": samples_sum / elapsed,
                        "tokens_per_sec": tokens_sum / elapsed,
                    }
                    history.append(record)
                    if out.global_step % log_every == 0:
                        self._write_events("Train", record)
                    bar.update(1)
                    bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{out.lr or 0:.2e}")
                    window = [0.0, 0.0, 0.0, 0.0]
                    if eval_data is not None and eval_every and out.global_step % eval_every == 0:
                        history.append(
                            {
                                "step": out.global_step,
                                **self.evaluate(eval_data, collate_fn=collate_fn, loss_fn=loss_fn),
                            }
                        )
                    if save_every and out.global_step % save_every == 0:
                        self.save_checkpoint()
                    started = time.perf_counter()
                    if engine.global_steps >= target:
                        break
                else:
                    self._epoch += 1
                    self._batch_in_epoch = 0
        finally:
            bar.close()
        if eval_data is not None and not eval_every:
            history.append(
                {"step": engine.global_steps, **self.evaluate(eval_data, collate_fn=collate_fn, loss_fn=loss_fn)}
            )
        return history

    def _target_steps(self, per_epoch: int, epochs: float | None, max_steps: int | None) -> int:
        if max_steps is not None:
            return int(max_steps)
        if epochs is not None:
            return max(math.ceil(epochs * per_epoch), 1)
        if self._total_steps is not None:
            return int(self._total_steps)
        if self.training is not None and self.training.max_steps > 0:
            return int(self.training.max_steps)
        train_epochs = self.training.num_train_epochs if self.training is not None else 1
        return max(math.ceil(train_epochs * per_epoch), 1)

    def _every(self, given: int | None, name: str, target: int) -> int | None:
        """An interval in optimizer steps: ``given``, else the training argument (below 1: a fraction of the run)."""
        if given is not None or self.training is None:
            return given
        value = float(getattr(self.training, name))
        return max(math.ceil(value * target), 1) if value < 1 else int(value)

    def _write_events(self, prefix: str, record: Mapping[str, Any]) -> None:
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

    # -- evaluation ----------------------------------------------------------------------

    def evaluate(
        self,
        data: Any,
        *,
        batch_size: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        loss_fn: Callable[[Any, Any], Any] | None = None,
    ) -> dict[str, float]:
        """Mean loss over ``data`` without gradients, in batches of ``infer_batch_size``; collective.

        Returns ``{"eval_loss": ..., "eval_samples": ...}`` (weighted by samples, over all processes).
        """
        engine = self.engine
        loader = self._loader(data, batch_size or self.infer_batch_size, shuffle=False, collate_fn=collate_fn)
        was_training = engine.module.training
        engine.eval()
        total, count = 0.0, 0.0
        try:
            with torch.no_grad():
                for batch in loader:
                    batch = _to_device(batch, engine.device)
                    loss = self._forward_loss(engine, batch, loss_fn)
                    n = _counts(batch)[0] or 1
                    total += float(loss.float()) * n
                    count += n
        finally:
            if was_training:
                engine.train()
        total, count = distributed.all_sum([total, count], engine.device)
        metrics = {"eval_loss": total / max(count, 1.0), "eval_samples": count}
        self._write_events("Eval", {"step": engine.global_steps, "loss": metrics["eval_loss"]})
        return metrics

    # -- checkpoints -----------------------------------------------------------------------

    def _checkpoint_dir(self, path: str | os.PathLike[str] | None) -> Path:
        if path is not None:
            return Path(path)
        if self.output_dir is None:
            raise SessionError("no checkpoint directory: pass a path, or output_dir= to the Session")
        return self.output_dir / "checkpoints"

    def save_checkpoint(self, path: str | os.PathLike[str] | None = None, tag: str | None = None) -> str:
        """Collective: save engine, optimizer, scheduler, data position and RNG states; return the tag.

        ``latest`` is pointed at the new checkpoint only after every process has
        written all of its files, and atomically, so a crash mid-save leaves the
        previous checkpoint the one that loads. Then all but the ``keep_last``
        newest checkpoints are deleted.
        """
        engine = self.engine
        save_dir = self._checkpoint_dir(path)
        tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
        state = {
            "global_step": int(engine.global_steps),
            "micro_steps": int(engine.micro_steps),
            "epoch": self._epoch,
            "batch_in_epoch": self._batch_in_epoch,
            "epoch_rng": self._epoch_rng,
            "world_size": self.world_size,
        }
        engine.save_checkpoint(
            str(save_dir),
            tag=tag,
            client_state={"dsbuild": state},
            save_latest=False,  # written below, once the checkpoint is complete
            exclude_frozen_parameters=export.is_peft(self._model),  # LoRA: the frozen base is not training state
        )
        checkpoints.save_rng(save_dir, tag, self.rank)
        if self.is_main_process:
            checkpoints.write_marker(save_dir, tag, {k: v for k, v in state.items() if k != "epoch_rng"})
        distributed.barrier()  # every rank's files are on disk
        if self.is_main_process:
            checkpoints.write_latest(save_dir, tag)
            if self.keep_last:
                checkpoints.prune(save_dir, self.keep_last)
        distributed.barrier()
        return tag

    def load_checkpoint(self, path: str | os.PathLike[str] | None = None, tag: str | None = None) -> dict[str, Any]:
        """Collective: restore a checkpoint (``latest`` when no tag); the next ``fit``/``step`` continues it exactly.

        Load into a fresh session, before training: under ZeRO-3 DeepSpeed cannot
        load into an engine that has already stepped. Returns the saved position
        (``global_step``, ``epoch``, ``batch_in_epoch``, ...).
        """
        engine = self.engine
        load_dir = self._checkpoint_dir(path)
        tag = tag if tag is not None else checkpoints.read_latest(load_dir)
        if tag is None:
            raise SessionError(f"no checkpoint to load in {load_dir}: it has no 'latest' file (pass tag=)")
        load_path, client_state = engine.load_checkpoint(
            str(load_dir), tag=tag, load_module_strict=not export.is_peft(self._model)
        )
        if load_path is None:
            raise SessionError(f"DeepSpeed could not load checkpoint {tag!r} from {load_dir}")
        state = dict((client_state or {}).get("dsbuild") or {})
        if "micro_steps" in state:
            engine.micro_steps = int(state["micro_steps"])  # DeepSpeed restores global_steps, not micro_steps
        self._epoch = int(state.get("epoch", 0))
        self._batch_in_epoch = int(state.get("batch_in_epoch", 0))
        self._epoch_rng = state.get("epoch_rng")
        checkpoints.load_rng(load_dir, tag, self.rank)
        return state

    # -- export ------------------------------------------------------------------------------

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
            path = self.output_dir / "model"
        export.save_hf(self.engine, self._model, Path(path), merge_lora=merge_lora, tokenizer=self.tokenizer)
        return Path(path)
