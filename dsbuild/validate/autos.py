"""The "auto" rule: an ``"auto"`` left for DeepSpeed, judged by who will fill it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from ..config.walk import auto_paths
from ..resolve.hf_table import ACCELERATE_FILLS, BATCH_KEYS, FILLS
from .facts import Diagnostic, Facts, rule

_RESOLVE_HINT: Final = 'cfg.resolve(...) or `dsbuild export --resolve`; for the HF Trainer validate with target="hf"'

_FILLED_BY: Final = {fill.path: fill.arguments for fill in FILLS}
"""What fills each key the HF Trainer fills (the table's words)."""
_STAGE3_BUCKETS: Final = frozenset(fill.path for fill in FILLS if fill.stage3_only)
_ACCELERATE: Final = {fill.path: fill for fill in ACCELERATE_FILLS}


@rule("auto")
def autos(f: Facts) -> Iterator[Diagnostic]:
    """``"auto"`` left for DeepSpeed: judged by who fills it, per the target and ``resolved`` (module docstring)."""
    for path in auto_paths(f.config):
        if path in f.waiting:
            continue  # resolved once the run knows the fact it needs (the step count, the model's hidden size)
        filler = _FILLED_BY.get(path)
        below_3 = path in _STAGE3_BUCKETS and f.stage is not None and f.stage != 3
        if below_3:
            filler = None  # the HF Trainer and resolve() fill the stage-3 buckets only at stage 3
        if f.resolved:
            if filler:
                hint = f"resolve() fills it from {filler}: give resolve() that"
            else:
                hint = "remove it: only stage 3 reads it" if below_3 else "set a value: nothing fills it"
            yield f.error(path, '"auto" left after resolve', hint)
        elif f.target == "hf":
            if (
                filler
                or path in _STAGE3_BUCKETS
                or path == "zero_optimization.stage3_gather_16bit_weights_on_model_save"
            ):
                continue  # filled (Accelerate fills the buckets at any stage; zero3-16bit-save speaks of the save flag)
            accelerate = _ACCELERATE.get(path)
            if accelerate is not None:
                yield f.warning(
                    path,
                    f'"auto" is filled by Accelerate from its own {accelerate.setting} setting (accelerate config or '
                    f"the ACCELERATE_DEEPSPEED_* environment; default {accelerate.default}), not from this config",
                    "write the value here, so the config says what runs",
                )
                continue
            yield f.error(
                path,
                '"auto" is not filled here by the HF Trainer (Accelerate stops on it)',
                "set a value, or remove the key for DeepSpeed's default",
            )
        elif filler is not None:
            if path in BATCH_KEYS or path == "gradient_clipping":  # the file as written does not run: an error
                yield f.error(
                    path, '"auto" must be resolved first: DeepSpeed fails on it with a TypeError', _RESOLVE_HINT
                )
                continue
            if path in ("fp16.enabled", "bf16.enabled"):
                consequence = "DeepSpeed reads it as false and trains in fp32"
            else:
                consequence = "DeepSpeed reads it as unset and uses its default"
            yield f.warning(path, f'"auto" must be resolved first: {consequence}', _RESOLVE_HINT)
        elif below_3:
            yield f.error(
                path,
                f'"auto" is filled only at stage 3 (by resolve() and the HF Trainer), got stage {f.stage}',
                "remove it: only stage 3 reads it",
            )
        else:
            yield f.error(
                path,
                '"auto" is not filled here by resolve() or the HF Trainer',
                "set a value, or remove the key for DeepSpeed's default",
            )
