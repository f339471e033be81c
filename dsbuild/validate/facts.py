"""What the rules read: a config plus what DeepSpeed will make of it, the ``Diagnostic`` a rule yields, and
the registry of rules."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, TypeGuard

import attrs

from ..config import AUTO, ConfigFields, ZeroOptimization
from ..config.optim import Optimizer
from ..errors import needs_hint
from .catalogue import DEEPSPEED_OPTIMIZERS, REMOVALS_SINCE, TORCH_OPTIMIZERS

__all__ = ["REGISTERED", "Diagnostic", "Facts", "Rule", "Severity", "Target", "is_table", "known", "param", "rule"]

Severity = Literal["error", "warning"]

Target = Literal["deepspeed", "hf"]


@attrs.frozen
class Diagnostic:
    """One finding about a config."""

    path: str
    """Dotted key path, e.g. ``zero_optimization.offload_param``."""
    severity: Severity
    """``"error"`` (DeepSpeed refuses it or it will not train as meant) or ``"warning"``."""
    message: str
    """What is wrong."""
    hint: str | None = None
    """What to do about it."""
    rule: str = ""
    """The rule that found it (see ``RULES``), e.g. ``"offload-param-below-stage-3"``."""
    needs: tuple[str, ...] = attrs.field(default=(), eq=False)
    """``resolve()``'s arguments that would give what is missing (``Problem.needs``)."""

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        hint = self.hint or needs_hint(self.needs)
        return f"{text} ({hint})" if hint else text


def known(value: Any) -> Any:
    """``value`` unless it is ``AUTO`` (then ``None``: unknown until resolved)."""
    return None if value is AUTO else value


def is_table(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """A free table (a torch optimizer's or scheduler's params), not a typed section."""
    return isinstance(value, Mapping)


def param(params: Any, name: str) -> Any:
    """Optimizer/scheduler param ``name`` from typed params or a free table; ``None`` when unset."""
    if params is None:
        return None
    if isinstance(params, Mapping):  # a free table, as read from a file
        return params.get(name)
    return getattr(params, name, None)


class Facts:
    """The config plus what DeepSpeed will make of it; ``None`` means unknown (an ``"auto"``)."""

    def __init__(
        self,
        config: ConfigFields,
        world_size: int | None,
        target: Target,
        resolved: bool,
        version: tuple[int, ...] | None,
        waiting: frozenset[str] = frozenset(),
    ) -> None:
        self.config = config
        self.world_size = world_size
        self.target = target
        self.resolved = resolved
        self.waiting = waiting
        """The ``"auto"`` keys a resolved config holds until the run knows what fills them (``resolve``'s
        ``waiting_for``)."""
        self.version = version
        self.version_text = "DeepSpeed " + ".".join(map(str, version)) if version else "DeepSpeed"
        self.rule = ""  # the rule running now (validate() sets it): its diagnostics carry its name

        zero = config.zero_optimization or ZeroOptimization()
        self.zero = zero
        self.stage: int | None = 0 if zero.stage is None else known(zero.stage)
        oo, op = zero.offload_optimizer, zero.offload_param
        self.oo_device: str | None = "none" if oo is None or oo.device is None else known(oo.device)
        self.op_device: str | None = "none" if op is None or op.device is None else known(op.device)
        self.cpu_optimizer: bool | None = None if self.oo_device is None else self.oo_device in ("cpu", "nvme")

        fp16, bf16 = config.fp16_config, config.bf16_config
        self.fp16: bool | None = False if fp16 is None or fp16.enabled is None else known(fp16.enabled)
        self.bf16: bool | None = False if bf16 is None or bf16.enabled is None else known(bf16.enabled)
        self.loss_scale: float | None = 0 if fp16 is None or fp16.loss_scale is None else known(fp16.loss_scale)
        self.clipping: float | None = 1.0 if config.gradient_clipping is None else known(config.gradient_clipping)

        self.optimizer: Optimizer | None = config.optimizer_config
        name = None if self.optimizer is None else self.optimizer.type
        self.opt_name: str | None = name
        # DeepSpeed lower-cases its own names and looks any other name up in torch.optim as written.
        self.opt_ds: str | None = name.lower() if name and name.lower() in DEEPSPEED_OPTIMIZERS else None
        self.opt_torch = name in TORCH_OPTIMIZERS and self.opt_ds is None

    def is_removed(self) -> bool:
        """Whether the installed DeepSpeed has dropped the removed features (unknown version: yes)."""
        return self.version is None or self.version >= REMOVALS_SINCE

    def flag(self, value: Any, default: bool) -> bool | None:
        """A boolean setting with DeepSpeed's default; ``None`` when it is ``"auto"``."""
        return default if value is None else known(value)

    def error(self, path: str, message: str, hint: str | None = None) -> Diagnostic:
        return Diagnostic(path, "error", message, hint, self.rule)

    def warning(self, path: str, message: str, hint: str | None = None) -> Diagnostic:
        return Diagnostic(path, "warning", message, hint, self.rule)

    def cpu_adam(self) -> bool | None:
        """Whether DeepSpeed will build its CPU Adam (needed by the low-precision master weights)."""
        if self.cpu_optimizer is None:
            return None
        if not self.cpu_optimizer:
            return False
        if self.optimizer is None:
            return None  # a client optimizer: DeepSpeedCPUAdam or not, we cannot tell
        return self.opt_ds in ("adam", "adamw") and param(self.optimizer.params, "torch_adam") is not True


Rule = Callable[[Facts], Iterator[Diagnostic]]
REGISTERED: dict[str, Rule] = {}
"""Every rule by its id, in the order their modules define them (``validate.RULES`` is the catalogue in order)."""


def rule(name: str) -> Callable[[Rule], Rule]:
    """Register a rule under ``name``; its docstring is its entry in the docs' catalogue."""

    def register(fn: Rule) -> Rule:
        REGISTERED[name] = fn
        return fn

    return register
