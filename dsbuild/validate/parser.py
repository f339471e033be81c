"""The rules of what DeepSpeed's parser (``DeepSpeedConfig``) refuses, or ignores keys of."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from ..config import NOT_KEYS, ConfigFields, Optimizer, Scheduler, in_strict_section, strict_section
from ..config.fields import describe, key_of
from ..config.keys import IGNORED_KEY_HINT, unknown_key
from ..config.optim import optimizer_params_class, scheduler_params_class
from ..config.walk import leaves
from ..io.convert import REMOVED_KEYS, to_dict
from .catalogue import REMOVED_ZERO_KEYS
from .facts import Diagnostic, Facts, is_table, known, rule


@rule("removed-section")
def removed_sections(f: Facts) -> Iterator[Diagnostic]:
    """A top-level section DeepSpeed removed (``amp``, ``sparse_attention``, ...): DeepSpeed refuses the config."""
    for key in f.config.extra:
        if key in REMOVED_KEYS:
            if f.is_removed():
                yield f.error(
                    key, f"removed from DeepSpeed: {f.version_text} refuses a config with it", REMOVED_KEYS[key]
                )
            else:
                yield f.warning(key, "deprecated: newer DeepSpeed refuses a config with it", REMOVED_KEYS[key])


@rule("unknown-key")
def unknown_keys(f: Facts) -> Iterator[Diagnostic]:
    """Keys kept by ``from_dict(strict=False)``: DeepSpeed ignores them at the top level and in some sections,
    refuses them in its strict sections (``zero_optimization``, ``fp16``, ...), and fails on unknown optimizer and
    scheduler params when it builds them."""
    for path, _value in f.config.ignored.items():
        if path == "optimizer.params.max_grad_norm":
            continue  # the optimizer-params rule says it better
        head, _, rest = path.partition(".")
        key = path.rpartition(".")[2]
        hint = _unknown_key_hint(f.config, path)
        if key == "cpu_offload_use_pin_memory":
            yield f.warning(
                path,
                "deprecated; DeepSpeed reads and ignores it",
                "set pin_memory in offload_optimizer / offload_param",
            )
        elif head == "zero_optimization" and key in REMOVED_ZERO_KEYS and rest == key:
            if f.is_removed():
                yield f.error(path, f"removed from DeepSpeed: {f.version_text} refuses a config with it", hint)
            else:
                yield f.warning(path, "deprecated: newer DeepSpeed refuses a config with it", hint)
        elif head in ("optimizer", "scheduler") and rest.startswith("params."):
            what = f.opt_name if head == "optimizer" else _scheduler_name(f.config)
            yield f.error(
                path,
                f"{what} takes no parameter {key!r}: DeepSpeed fails with a TypeError when it builds the {head}",
                hint or "remove it",
            )
        elif (strict := strict_section(path)) is not None:
            yield f.error(
                path, f"unknown key: DeepSpeed refuses it ({strict} allows no other keys)", hint or "remove it"
            )
        elif hint is not None and hint.startswith("did you mean"):
            # A misspelt known key: DeepSpeed ignores it silently, so the setting meant is not applied.
            yield f.error(path, "unknown key: DeepSpeed ignores it, so this setting is not applied", hint)
        else:
            yield f.warning(path, "unknown key: DeepSpeed ignores it", hint or "remove it or fix its spelling")


@rule("written-as-text")
def written_as_text(f: Facts) -> Iterator[Diagnostic]:
    """A value a file wrote as text or as a number (``"3"``, ``"true"``, ``1`` for true), read as the value meant.
    DeepSpeed's pydantic sections read it so (a warning); in a key DeepSpeed reads by hand it keeps the text and
    fails on it, or takes ``"false"`` for true (an error: the file as written does not run; what dsbuild writes
    does)."""
    written = dict(leaves(to_dict(f.config))) if f.config.coerced else {}
    for path, original in f.config.coerced.items():
        read = written.get(path)
        message = f"written as {describe(original)}, read as {describe(read)}"
        hint = f"write {describe(read)} (dsbuild export writes it so)"
        if in_strict_section(path) or not isinstance(original, str):
            yield f.warning(path, f"{message}, as DeepSpeed's parser reads it", hint)
        else:
            yield f.error(path, f"{message} by dsbuild, but DeepSpeed reads this key as written: the text", hint)


@rule("section-requirements")
def section_requirements(f: Facts) -> Iterator[Diagnostic]:
    """What DeepSpeed asserts in the sections it reads by hand: autotuning directories not empty, dynamic batching
    with ``max_tokens``, curriculum learning with ``curriculum_metrics``, no AutoEP ``load_balance_coeff``."""
    tuning = f.config.autotuning
    for key in ("results_dir", "exps_dir"):
        if tuning is not None and getattr(tuning, key) == "":
            yield f.error(f"autotuning.{key}", "empty: DeepSpeed asserts a directory name", "remove it for the default")
    sampling = f.config.data_efficiency.data_sampling if f.config.data_efficiency else None
    dynamic = sampling.dynamic_batching if sampling else None
    if dynamic is not None and dynamic.enabled is True and dynamic.max_tokens is None:
        yield f.error(
            "data_efficiency.data_sampling.dynamic_batching.max_tokens",
            "missing: dynamic batching needs a token budget",
            "set max_tokens",
        )
    curriculum = sampling.curriculum_learning if sampling else None
    if is_table(curriculum) and curriculum.get("enabled") is True and "curriculum_metrics" not in curriculum:
        yield f.error(
            "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics",
            "missing: curriculum learning needs its metrics",
            "set curriculum_metrics",
        )
    expert = f.config.extra.get("expert_parallel")
    if is_table(expert) and expert.get("load_balance_coeff") is not None:
        yield f.error(
            "expert_parallel.load_balance_coeff",
            "not supported: DeepSpeed 0.19 refuses any value but null",
            "remove it",
        )


@rule("fp16-and-bf16")
def both_precisions(f: Facts) -> Iterator[Diagnostic]:
    """fp16 and bf16 both enabled: DeepSpeed's parser refuses it."""
    if f.fp16 and f.bf16:
        yield f.error(
            "fp16.enabled", "fp16 and bf16 are both enabled", "keep one: .bf16() or .fp16() turns the other off"
        )


@rule("fp16-dynamic-loss-scale")
def loss_scale_bounds(f: Facts) -> Iterator[Diagnostic]:
    """With fp16 and dynamic loss scaling (``loss_scale`` 0), ``loss_scale_window`` and ``min_loss_scale`` must be > 0."""
    fp16 = f.config.fp16_config
    if fp16 is None or not f.fp16 or f.loss_scale != 0:
        return
    for key, default in (("loss_scale_window", 1000), ("min_loss_scale", 1)):
        value = getattr(fp16, key)
        value = default if value is None else known(value)
        if value is not None and value <= 0:
            yield f.error(
                f"fp16.{key}",
                f"got {value}, expected > 0 with dynamic loss scaling (loss_scale 0)",
                f"remove it for DeepSpeed's default {default}, or set a static fp16.loss_scale",
            )


@rule("partial-offload-below-stage-3")
def partial_offload(f: Facts) -> Iterator[Diagnostic]:
    """``offload_optimizer.ratio`` below 1 (partial offload) needs stage 3: DeepSpeed's parser refuses it."""
    oo = f.zero.offload_optimizer
    ratio = None if oo is None or oo.ratio is None else known(oo.ratio)
    if ratio is not None and ratio < 1 and f.stage is not None and f.stage != 3:
        yield f.error(
            "zero_optimization.offload_optimizer.ratio",
            f"partial offload (ratio {ratio}) needs ZeRO stage 3, got stage {f.stage}",
            "remove ratio to offload all optimizer states, or use .zero(3)",
        )


@rule("allreduce-sum")
def allreduce_sum(f: Facts) -> Iterator[Diagnostic]:
    """``gradient_allreduce_op: "sum"`` is refused at stage 3, with ZenFlow and with DeepCompile."""
    if known(f.config.gradient_allreduce_op) != "sum":
        return
    deepcompile = f.config.compile is not None and f.config.compile.deepcompile is True
    for reason, applies in (
        ("ZeRO stage 3", f.stage == 3),
        ("ZenFlow (zero_optimization.zenflow)", f.zero.zenflow is not None),
        ("DeepCompile (compile.deepcompile)", deepcompile),
    ):
        if applies:
            yield f.error(
                "gradient_allreduce_op", f'"sum" is not supported with {reason}', 'remove it to reduce with "mean"'
            )


@rule("low-precision-master-weights")
def master_weights(f: Facts) -> Iterator[Diagnostic]:
    """fp16/bf16 master weights and bf16 optimizer states need ZeRO 1-3 (parser) and, mostly, CPU offload with
    DeepSpeed's CPU Adam (engine)."""
    fp16, bf16 = f.config.fp16_config, f.config.bf16_config
    fp16_master = fp16 is not None and fp16.fp16_master_weights_and_grads is True
    bf16_master = bf16 is not None and bf16.bf16_master_weights_and_grads is True
    bf16_states = bf16 is not None and bf16.bf16_optimizer_states is True
    if not (fp16_master or bf16_master or bf16_states):
        return  # every finding below is about one of them
    settings = (
        ("fp16.fp16_master_weights_and_grads", fp16_master),
        ("bf16.bf16_master_weights_and_grads", bf16_master),
        ("bf16.bf16_optimizer_states", bf16_states),
    )
    if f.stage == 0:
        for path, on in settings:
            if on:
                yield f.error(path, "needs ZeRO stage 1, 2 or 3, got stage 0", "use .zero(stage) or remove it")
        return
    if bf16_states and bf16 is not None and bf16.bf16_master_weights_and_grads in (None, False):
        yield f.error(
            "bf16.bf16_optimizer_states",
            "needs bf16.bf16_master_weights_and_grads",
            "set bf16_master_weights_and_grads: true",
        )
    if fp16_master and bf16_master:
        yield f.error(
            "bf16.bf16_master_weights_and_grads",
            "fp16_master_weights_and_grads and bf16_master_weights_and_grads exclude each other",
            "keep the one matching the training precision",
        )
    cpu_adam = f.cpu_adam()
    # bf16 master weights may stay on the device only when the optimizer states are bf16 too, without offload.
    bf16_on_device = bf16_states and f.cpu_optimizer is False
    needs_cpu_adam = (
        ("fp16.fp16_master_weights_and_grads", fp16_master),
        ("bf16.bf16_master_weights_and_grads", bf16_master and not bf16_on_device),
    )
    for path, needed in needs_cpu_adam:
        if needed and cpu_adam is False:
            yield f.error(
                path,
                "needs optimizer offload with DeepSpeed's CPU Adam (the engine stops otherwise)",
                "offload optimizer states (.offload_cpu()) with optimizer Adam or AdamW, without torch_adam",
            )


@rule("compute-grad-norm")
def compute_grad_norm(f: Facts) -> Iterator[Diagnostic]:
    """``compute_grad_norm: false`` only at stages 1-2 (parser), and there only without clipping, offload or
    ZenFlow (engine)."""
    if f.zero.compute_grad_norm is not False:
        return
    path = "zero_optimization.compute_grad_norm"
    if f.stage is not None and f.stage not in (1, 2):
        yield f.error(path, f"false is supported only with ZeRO stage 1 or 2, got stage {f.stage}", "remove it")
        return
    if f.clipping is not None and f.clipping > 0:
        source = (
            "DeepSpeed's default gradient_clipping 1.0"
            if f.config.gradient_clipping is None
            else f"gradient_clipping {f.clipping}"
        )
        yield f.error(
            path,
            f"false needs gradient clipping off, but {source} clips",
            "set gradient_clipping: 0, or remove compute_grad_norm",
        )
    if f.oo_device in ("cpu", "nvme"):
        yield f.error(path, "false does not work with optimizer offload", "remove compute_grad_norm or the offload")
    if f.zero.zenflow is not None:
        yield f.error(path, "false does not work with ZenFlow", "remove compute_grad_norm or zenflow")
    grad_accum = f.config.data_types.grad_accum_dtype if f.config.data_types else None
    if f.stage == 1 and f.bf16 and known(grad_accum) == "fp32" and f.oo_device != "cpu":
        yield f.error(
            path,
            "false does not work at stage 1 with bf16 and fp32 gradient accumulation (DeepSpeed's BF16 optimizer)",
            "remove compute_grad_norm",
        )


def _scheduler_name(config: ConfigFields) -> str:
    return config.scheduler.type if config.scheduler is not None else "the scheduler"


def _unknown_key_hint(config: ConfigFields, path: str) -> str | None:
    """ "did you mean" (or a known replacement) for an unknown key at ``path``, as the reader gives it."""
    *parents, key = path.split(".")
    cls = _section_at(config, parents)
    if cls is None:
        return None
    names = {key_of(a) for a in attrs.fields(cls)} - NOT_KEYS
    hint = unknown_key(cls, "", key, names).hint
    return "remove it" if hint == IGNORED_KEY_HINT else hint


def _section_at(config: ConfigFields, parents: list[str]) -> Any:
    """The section class at a dotted key path (optimizer/scheduler params by their ``type``), or ``None``."""
    cls: Any = ConfigFields
    for part in parents:
        if cls is Optimizer and part == "params":
            cls = optimizer_params_class(config.optimizer_config.type) if config.optimizer_config else None
        elif cls is Scheduler and part == "params":
            cls = scheduler_params_class(config.scheduler.type) if config.scheduler else None
        else:
            attribute = {key_of(a): a for a in attrs.fields(cls)}.get(part)
            spec = attribute.metadata.get("dsbuild") if attribute is not None else None
            cls = spec.section if spec is not None and spec.kind == "section" else None
        if cls is None:
            return None
    return cls
