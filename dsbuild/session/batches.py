"""Batches: moving them to the device, finding the loss in a model's output, counting samples and tokens."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..errors import SessionError

__all__ = [
    "DataPosition",
    "Shards",
    "accepts_loss_kwargs",
    "as_float",
    "counts",
    "loader",
    "loss_of",
    "to_device",
    "trained_tokens",
]


def loader(
    data: Any,
    batch_size: int,
    *,
    world_size: int,
    rank: int,
    shuffle: bool,
    seed: int,
    drop_last: bool,
    collate_fn: Callable[[list[Any]], Any] | None,
    num_workers: int = 0,
) -> Any:
    """``data`` itself when it is a DataLoader; else a DataLoader over this rank's share of a Dataset or sequence, as
    the HF Trainer's loader under Accelerate deals it (``Shards``): training's (``shuffle``) shuffled per epoch,
    evaluation's in order."""
    if isinstance(data, DataLoader):
        return data
    if not isinstance(data, (Dataset, Sequence)):
        raise SessionError(f"expected a DataLoader, a Dataset or a sequence of samples, got {type(data).__name__}")
    samples = len(data)  # type: ignore[arg-type]  # a map-style Dataset has a length
    shards = Shards(samples, batch_size, world_size=world_size, rank=rank, seed=seed, drop_last=drop_last,
                    shuffle=shuffle)  # fmt: skip
    return DataLoader(
        data,  # type: ignore[arg-type]
        batch_sampler=shards,
        collate_fn=collate_fn,
        num_workers=num_workers,
    )


class Shards(Sampler[list[int]]):
    """This rank's micro-batches of an epoch, as the HF Trainer's data loader under Accelerate gives them: the epoch's
    order (``randperm`` seeded with ``seed + epoch``, Accelerate's ``SeedableRandomSampler``; without ``shuffle`` the
    samples in order, a ``SequentialSampler``'s: KTO's chunks) cut into micro-batches,
    the k-th to rank ``k mod world_size`` (``BatchSamplerShard``). Without ``drop_last`` the last round is filled
    with the epoch's first samples so every rank gets as many full micro-batches (``even_batches``); with it only
    the rounds of full micro-batches are kept. One process reads the order in micro-batches, the last one short."""

    def __init__(
        self,
        samples: int,
        batch_size: int,
        *,
        world_size: int,
        rank: int,
        seed: int = 0,
        drop_last: bool = False,
        shuffle: bool = True,
    ):
        self.samples, self.batch_size, self.world_size, self.rank = samples, batch_size, world_size, rank
        self.seed, self.drop_last, self.shuffle = seed, drop_last, shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def epoch_batches(self) -> list[list[int]]:
        """Every rank's micro-batches of the epoch, in order (the k-th is rank ``k mod world_size``'s)."""
        order = list(range(self.samples))
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.samples, generator=generator).tolist()
        size, ranks = self.batch_size, self.world_size
        if self.drop_last:
            full = len(order) // size
            order = order[: (full - full % ranks) * size]
        elif ranks > 1 and order:
            rounds = -(-len(order) // (size * ranks))
            first = order[: size * ranks]
            fill = rounds * size * ranks - len(order)
            order += (first * -(-fill // len(first)))[:fill]
        return [order[i : i + size] for i in range(0, len(order), size)]

    def __iter__(self) -> Any:
        return iter(self.epoch_batches()[self.rank :: self.world_size])

    def gathered(self, index: int) -> bool:
        """Whether this rank's micro-batch ``index`` of the epoch counts in what TRL's trainers gather for their
        metrics (Accelerate's ``gather_for_metrics``): at the epoch's last micro-batch, ``samples`` leaving
        ``r = samples mod (batch_size x world_size)`` with ``0 < r < world_size``, only the ranks below ``r``."""
        left = self.samples % (self.batch_size * self.world_size)
        last = index == len(self) - 1
        return not (last and not self.drop_last and 0 < left < self.world_size and self.rank >= left)

    def kept(self, index: int, size: int) -> int:
        """How many of this rank's micro-batch ``index`` (``size`` samples) the HF Trainer's evaluation counts: all,
        but at the epoch's last, where Accelerate's ``gather_for_metrics`` keeps the first ``samples mod (batch_size x
        world_size)`` of the ranks' micro-batches laid end to end in rank order (the filler left out)."""
        left = self.samples % (self.batch_size * self.world_size)
        if self.drop_last or index != len(self) - 1 or left == 0:
            return size
        return max(0, min(size, left - self.rank * self.batch_size))

    def __len__(self) -> int:
        batches = self.samples // self.batch_size if self.drop_last else -(-self.samples // self.batch_size)
        return batches // self.world_size if self.drop_last else -(-batches // self.world_size)


@attrs.define
class DataPosition:
    """Where training is in the data: the epoch, the micro-batches of it consumed, and the torch RNG state its
    iterator was created from (so a resumed run draws the same shuffle)."""

    epoch: int = 0
    batch_in_epoch: int = 0
    epoch_rng: torch.Tensor | None = None
    rollout: dict[str, Any] | None = None
    """A ``fit`` rollout's own state, JSON (GRPO: the generation batch the next steps still train on), saved and
    restored with the position."""
    tokens: int = 0
    """The tokens trained on so far, every process's (the batches' attention masks, as TRL's trainers count their
    ``num_tokens``), saved and restored with the position."""
    gathered: bool = True
    """Whether the micro-batch ``fit`` trains now counts in what TRL's trainers gather for their metrics
    (``Shards.gathered``: not on a filler rank of an uneven epoch end, in every micro-batch of the step that ends the
    epoch, as the HF Trainer fetches a step's micro-batches before the first forward); a task's ``loss_fn`` weighs its
    gathered numbers by it. Not saved: ``fit`` sets it for each micro-batch, and it is true outside one."""

    def iterator(self, loader: Any) -> Any:
        """An iterator over the current epoch, past the micro-batches already consumed."""
        for sampler in (getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None)):
            set_epoch = getattr(sampler, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self.epoch)  # a shuffle per epoch (Shards, a DistributedSampler, a rollout's sampler)
                break
        if self.batch_in_epoch and self.epoch_rng is not None:
            # Resuming mid-epoch: the iterator takes its seed from torch's RNG, so create it from the
            # state the interrupted run created it from, then continue with the restored state.
            now = torch.get_rng_state()
            torch.set_rng_state(self.epoch_rng)
            iterator = iter(loader)
            torch.set_rng_state(now)
        else:
            self.epoch_rng = torch.get_rng_state()
            iterator = iter(loader)
        for _ in range(self.batch_in_epoch):
            next(iterator, None)
        return iterator

    def next_epoch(self) -> None:
        self.epoch += 1
        self.batch_in_epoch = 0


def gathered(loader: Any, index: int) -> bool:
    """Whether this rank's micro-batch ``index`` of the epoch counts in TRL's gathered metrics (``Shards.gathered``;
    every micro-batch of a loader of your own)."""
    shards = getattr(loader, "batch_sampler", None)
    return shards.gathered(index) if isinstance(shards, Shards) else True


def kept(loader: Any, index: int, size: int) -> int:
    """How many of the ``size`` samples of this rank's micro-batch ``index`` an evaluation counts (``Shards.kept``;
    all of a loader of your own)."""
    shards = getattr(loader, "batch_sampler", None)
    return shards.kept(index, size) if isinstance(shards, Shards) else size


def to_device(batch: Any, device: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def forward_arguments(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """How a batch is passed to the model's forward: a mapping by keyword, a list or tuple by position, else whole."""
    if isinstance(batch, Mapping):
        return (), dict(batch)
    if isinstance(batch, (list, tuple)):
        return tuple(batch), {}
    return (batch,), {}


def takes_batch(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise ``SessionError`` naming ``loss_fn`` when the model's forward cannot take the batch, before DeepSpeed's
    engine calls it (where the ``TypeError`` would come from deep inside)."""
    import inspect

    try:
        inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as e:
        given = ", ".join(kwargs) if kwargs else f"{len(args)} positional value(s)"
        raise SessionError(
            f"{type(model).__name__}.forward does not take the batch ({given}): {e}; pass "
            "loss_fn=(model, batch) -> loss to Session.fit / step / evaluate, or give batches of its forward's arguments"
        ) from None
    except ValueError:
        pass  # no signature to check (a builtin): let the call say


def metrics_of(output: Any) -> dict[str, float]:
    """The numbers beside the loss in a ``loss_fn``'s mapping (scalars: numbers or one-element tensors), as floats."""
    if not isinstance(output, Mapping):
        return {}
    found = {}
    for name, value in output.items():
        if name == "loss":
            continue
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            found[str(name)] = float(value.detach().float())
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found[str(name)] = float(value)
        else:
            raise SessionError(f"loss_fn returned {name!r} beside the loss: a metric is a number or a scalar tensor")
    return found


def loss_of(output: Any) -> Any:
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


def counts(batch: Any) -> tuple[int, int]:
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


def trained_tokens(batch: Any) -> int | None:
    """The tokens a causal-LM loss trains on in ``batch``, as the HF Trainer counts them for ``num_items_in_batch``:
    ``shift_labels`` other than -100 when the batch carries them, else ``labels[..., 1:]`` (the model shifts the
    labels, so a row's first label is never a target); ``None`` when the batch has no labels."""
    if not isinstance(batch, Mapping):
        return None
    labels = batch.get("shift_labels")
    if not isinstance(labels, torch.Tensor):
        labels = batch.get("labels")
        if not isinstance(labels, torch.Tensor):
            return None
        labels = labels[..., 1:]
    return int(labels.ne(-100).sum())


def accepts_loss_kwargs(model: Any) -> bool:
    """Whether ``model``'s forward takes ``num_items_in_batch`` (the HF Trainer's ``model_accepts_loss_kwargs``): the
    model's own ``accepts_loss_kwargs`` when it says, else whether its forward takes ``**kwargs`` or the name."""
    import inspect

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model passes them on
    said = getattr(inner, "accepts_loss_kwargs", None)
    if isinstance(said, bool):
        return said
    try:
        parameters = inspect.signature(inner.forward).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is p.VAR_KEYWORD or p.name == "num_items_in_batch" for p in parameters)


def as_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out


@attrs.frozen
class StepOutput:
    """What one ``Session.step`` (one micro-batch) did."""

    loss: float
    """This micro-batch's loss on this process: its mean loss, or with ``num_items_in_batch`` its summed token loss
    over that count (its share of the optimizer step's loss, before any scaling for the processes)."""
    boundary: bool
    """True when this micro-batch completed a gradient-accumulation cycle and the optimizer stepped."""
    lr: float | None
    """Learning rate of the optimizer step this micro-batch belongs to (of the first parameter group)."""
    grad_norm: float | None
    """Global gradient norm of the optimizer step, at a boundary when DeepSpeed computed one; else ``None``."""
    global_step: int
    """Optimizer steps taken so far (after this micro-batch)."""
    metrics: Mapping[str, float] = attrs.field(factory=dict)
    """The numbers other than the loss a ``loss_fn`` returned with it (``{"loss": ..., "rewards/chosen": ...}``), on
    this process; ``fit`` logs their mean over the step's micro-batches and processes (TRL's metrics)."""


def forward_loss(
    engine: Any, batch: Any, model: Any, loss_fn: Callable[[Any, Any], Any] | None, num_items: int | None = None
) -> Any:
    """The loss of ``batch`` (already on the engine's device): ``loss_fn(engine, batch)``, else the model's forward on
    the batch (checked against what the forward takes), given ``num_items_in_batch`` when counted."""
    return forward(engine, batch, model, loss_fn, num_items)[0]


def forward(
    engine: Any, batch: Any, model: Any, loss_fn: Callable[[Any, Any], Any] | None, num_items: int | None = None
) -> tuple[Any, dict[str, float]]:
    """``forward_loss``'s loss and the metrics a ``loss_fn`` returned beside it (``metrics_of``)."""
    if loss_fn is not None:
        output = loss_fn(engine, batch)
        return loss_of(output), metrics_of(output)
    args, kwargs = forward_arguments(batch)
    if "shift_labels" in kwargs and "labels" not in kwargs:
        # Pre-shifted labels (a sequence-parallel shard's): the HF loss takes them as they are, given labels at all.
        kwargs["labels"] = kwargs["shift_labels"]
    takes_batch(model, args, kwargs)
    if num_items is not None:
        kwargs["num_items_in_batch"] = num_items  # HF's loss: summed over tokens, divided by this count
    return loss_of(engine(*args, **kwargs)), {}


def add_metrics(sums: dict[str, list[float]], numbers: Mapping[str, float]) -> None:
    """Each of a batch's ``numbers`` added to its name's ``[sum, batches]``: TRL's trainers average each metric over
    the batches that logged it, and a batch may log a name or not (KTO's ``logps/rejected``: only a batch with an
    undesirable completion)."""
    for name, value in numbers.items():
        kept = sums.setdefault(name, [0.0, 0.0])
        kept[0] += value
        kept[1] += 1.0


def metric_means(names: Sequence[str], summed: Sequence[float]) -> dict[str, float]:
    """Each name's mean from ``add_metrics``'s pairs summed over the processes (``summed``: sum, batches, in
    ``names``' order)."""
    return {n: summed[2 * i] / max(summed[2 * i + 1], 1.0) for i, n in enumerate(names)}


def evaluation_sums(
    engine: Any, loader: Any, session: Any, loss_fn: Callable[[Any, Any], Any] | None
) -> tuple[float, float, dict[str, list[float]]]:
    """``(sum of batch losses × samples, samples, the loss_fn's other numbers: each summed with the batches that
    returned it (add_metrics))`` over
    ``loader`` without gradients, on this process (the model put back in training mode after). As the HF Trainer's
    evaluation: each batch's loss counts once per sample it holds, an uneven end's filler samples not at all
    (``kept``), and a ``loss_fn`` is told which batches TRL's ``gather_for_metrics`` leaves out
    (``DataPosition.gathered``). A sequence-parallel shard's batch counts with its whole batch's loss."""
    from . import parallel

    was_training = engine.module.training
    engine.eval()
    total, count = 0.0, 0.0
    metrics: dict[str, list[float]] = {}
    try:
        with torch.no_grad():
            for index, batch in enumerate(loader):
                batch = to_device(batch, engine.device)
                session.position.gathered = gathered(loader, index)
                loss, numbers = forward(engine, batch, session.model, loss_fn)
                n = kept(loader, index, counts(batch)[0] or 1)
                if isinstance(loader, parallel.SequenceShards):  # this rank's shard: the batch's loss is its group's
                    loss, n = parallel.whole_batch_loss(loss, batch, loader.samples)
                total += float(loss.float()) * n
                count += n
                add_metrics(metrics, numbers)
    finally:
        session.position.gathered = True
        if was_training:
            engine.train()
    return total, count, metrics


def evaluation(engine: Any, loader: Any, session: Any, loss_fn: Callable[[Any, Any], Any] | None) -> dict[str, float]:
    """``Session.evaluate``'s numbers over every process (collective): ``eval_loss`` weighted by samples,
    ``eval_samples``, each number a ``loss_fn`` returns beside its loss as ``eval_NAME``, averaged over the
    batches and processes as TRL's trainers average what they log in evaluation (``eval_rewards/chosen``, ...), and
    ``eval_num_tokens``: the tokens the session has trained on, as TRL's trainers log it in evaluation. A
    tensor-parallel group's ranks evaluate the same batches, so each batch counts once."""
    from . import distributed

    total, count, sums = evaluation_sums(engine, loader, session, loss_fn)
    names = sorted(sums)  # every process's loss_fn returns the same names for a batch
    summed = distributed.all_sum([total, count, *(v for n in names for v in sums[n])], engine.device)
    tp = session.tensor_parallel_size
    total, count = summed[0] / tp, summed[1] / tp
    means = {f"eval_{n}": value for n, value in metric_means(names, summed[2:]).items()}
    trained = float(session.position.tokens)
    return {"eval_loss": total / max(count, 1.0), "eval_samples": count, "eval_num_tokens": trained, **means}


def micro_step(
    engine: Any,
    batch: Any,
    model: Any,
    loss_fn: Callable[[Any, Any], Any] | None,
    *,
    num_items: int | None,
    boundary: bool | None,
    scale: int,
    group: int | None = None,
) -> StepOutput:
    """One micro-batch through ``engine`` (``Session.step``): forward, backward and DeepSpeed's step.

    ``boundary`` given: this micro-batch ends the optimizer step or not, whatever DeepSpeed's count says (the HF
    Trainer's last, shorter step of an epoch). ``num_items``: the step's trained tokens (HF's loss; the model gets
    the count, the loss is multiplied by ``scale``, the processes sharing the count, and not divided by the
    accumulation steps). ``group``: the micro-batches of this optimizer step; a mean loss (no ``num_items``) is
    divided by it, as the HF Trainer divides by ``current_gradient_accumulation_steps``, where DeepSpeed divides by
    the accumulation steps: an epoch's last, shorter step trains on its micro-batches' mean, not a fraction of it.
    """
    if not engine.module.training:
        engine.train()
    batch = to_device(batch, engine.device)
    if boundary is None:
        boundary = (engine.micro_steps + 1) % engine.gradient_accumulation_steps() == 0
    engine.set_gradient_accumulation_boundary(boundary)
    loss, metrics = forward(engine, batch, model, loss_fn, num_items if loss_fn is None else None)
    if num_items is None and group not in (None, engine.gradient_accumulation_steps()):
        engine.backward(loss / group, scale_wrt_gas=False)
    elif num_items is None:
        engine.backward(loss)
    else:
        engine.backward(loss * scale, scale_wrt_gas=False)
    lrs = engine.get_lr()
    lr = as_float(lrs[0]) if lrs else None  # the lr this optimizer step applies (the scheduler moves it after)
    engine.step()
    grad_norm = as_float(engine.get_global_grad_norm()) if boundary else None
    return StepOutput(
        loss=float(loss.detach().float()),
        boundary=boundary,
        lr=lr,
        grad_norm=grad_norm,
        global_step=int(engine.global_steps),
        metrics=metrics,
    )
