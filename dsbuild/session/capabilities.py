"""``Capabilities``: what the loops people embed DeepSpeed in (DPO, GRPO, PPO) ask of a ``Session`` beside training —
a reference model, per-token log-probs, generation under ZeRO-3, optimizer states offloaded between phases, the full
weights streamed out. Each is a module of its own (``reference``, ``logprobs``, ``generation``, ``offload``,
``weights``); these are the session's names for them (docs/rl.md)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import distributed
from .logprobs import token_logps
from .offload import at_home

if TYPE_CHECKING:
    import contextlib

    import torch
    from deepspeed import DeepSpeedEngine

    from .reference import BuiltFrom, Reference

__all__ = ["Capabilities"]


class Capabilities:
    """RL loops' verbs on the engine of the ``Session`` they are part of."""

    infer_batch_size: int
    built_from: BuiltFrom | None
    offloading: tuple[str, ...] = ()
    """The states ``offloaded()`` has in CPU memory now (DeepSpeed's names; none outside it): the verbs that need one
    are refused meanwhile (``offload.NEEDS``)."""

    @property
    def engine(self) -> DeepSpeedEngine:
        raise NotImplementedError  # the Session's

    def reference(
        self, path: str | Path | None = None, offload: bool = False, *, disable_dropout: bool = True
    ) -> Reference:
        """A frozen reference model beside this policy (``session.reference``: a LoRA policy's adapters disabled, else a
        second engine without an optimizer from ``path`` or from what this session was built from, with
        ``Config.for_inference(offload)``); ``disable_dropout`` turns dropout off in both, as TRL. Collective."""
        from .reference import reference_of

        return reference_of(self, path, offload=offload, dropout_off=disable_dropout)  # type: ignore[arg-type]

    @at_home
    @distributed.quietly
    def logprobs(
        self, batch: Mapping[str, Any], completion_mask: torch.Tensor | None = None, temperature: float = 1.0
    ) -> torch.Tensor:
        """Per-token log-probs of ``batch`` under the policy, fp32, with gradients unless under ``torch.no_grad()``:
        ``(rows, length)``, column ``t`` the log-prob of ``input_ids[:, t]`` (logits ÷ ``temperature`` before the
        log-softmax, as TRL), 0 outside ``completion_mask`` (else ``attention_mask``) and at each sequence's first
        token; packed rows by ``position_ids``; ``infer_batch_size`` rows per forward. Collective under ZeRO-3."""
        engine = self.engine
        return token_logps(
            engine, batch, completion_mask=completion_mask, temperature=temperature,
            batch_size=self.infer_batch_size, grad=True, device=engine.device,
        )  # fmt: skip

    @at_home
    def gathered(self) -> contextlib.AbstractContextManager[Any]:
        """The whole model on every rank for the duration (ZeRO-3's hooks off, gradient checkpointing off, eval mode),
        put back on exit (``generation.gathered``). Collective."""
        from .generation import gathered

        return gathered(self)  # type: ignore[arg-type]

    @at_home
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """HF ``generate`` on the model that never deadlocks under ZeRO-3 when ranks finish at different lengths
        (``generation.generate``). Collective under ZeRO-3."""
        from .generation import generate

        return generate(self, input_ids, attention_mask, **kwargs)  # type: ignore[arg-type]

    def offloaded(self, include: Iterable[str] | None = None, **kwargs: Any) -> contextlib.AbstractContextManager[Any]:
        """DeepSpeed's ``offload_states`` on entry, ``reload_states`` on exit, refused before anything moves where
        DeepSpeed cannot (``offload.offloaded``). Collective."""
        from .offload import offloaded

        return offloaded(self, include, **kwargs)  # type: ignore[arg-type]

    @at_home
    def full_parameters(self, bucket_mb: float = 1024, merge_lora: bool = True) -> Iterator[tuple[str, Any]]:
        """``(HF name, full tensor)`` of every weight, one bucket gathered at a time, LoRA merged per layer
        (``weights.full_parameters``). A collective iterator: every rank walks it to the end."""
        from .weights import full_parameters

        return full_parameters(self, bucket_mb=bucket_mb, merge_lora=merge_lora)
