"""DeepSpeed's own verdict on a config: the installed DeepSpeed's parser run on the dict dsbuild would hand it.

dsbuild's rules say what DeepSpeed will refuse; ``deepspeed_verdict`` asks DeepSpeed itself, so that
``dsbuild validate --deepspeed`` lists both in one report. The parser (``DeepSpeedConfig``) runs standalone:
no process group, no device work. The world size it sees is simulated by patching ``deepspeed.comm`` as the
parser module holds it, for the call only. DeepSpeed's logging, printing and warnings during the call are
silenced: its verdict is the exception it raises.

DeepSpeed is imported on first use, on the accelerator the environment picks (``DS_ACCELERATOR``); parsing
needs none in particular, and the choice stays the caller's (``dsbuild validate`` picks the CPU).
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, Final

from ..env.extras import require
from . import Diagnostic

__all__ = ["LABEL", "SECTIONS", "deepspeed_verdict"]

LABEL: Final = "deepspeed: DeepSpeedConfig refuses it"
"""How each of DeepSpeed's findings starts, so the reader sees who said it."""

SECTIONS: Final[Mapping[str, tuple[str, ...]]] = {
    "DeepSpeedZeroConfig": ("zero_optimization",),
    "DeepSpeedFP16Config": ("fp16",),
    "DeepSpeedBF16Config": ("bf16", "bfloat16"),
    "CompileConfig": ("compile",),
    "HybridEngineConfig": ("hybrid_engine",),
    "TPTrainingConfig": ("tensor_parallel",),
    "CommsLoggerConfig": ("comms_logger",),
    "DeepSpeedThroughputTimerConfig": ("timers.throughput",),
    "WeightQuantConfig": ("weight_quantization",),
    "DeepSpeedMonitorConfig": ("",),
}
"""DeepSpeed's pydantic config models by class name (a ``ValidationError``'s title) and the ds_config key each
reads, so an error's location becomes the dotted key the user wrote. Of several keys, the first the config has
(DeepSpeed reads ``bf16``, else its old name ``bfloat16``); ``""``: the model reads top-level keys. A model not
listed is named as it is (a test holds the table against the installed DeepSpeed)."""

_LOGGER = "DeepSpeed"  # DeepSpeed's own logger (deepspeed.utils.logging), which writes to stdout


def deepspeed_verdict(config: Mapping[str, Any], world_size: int = 1) -> list[Diagnostic]:
    """What DeepSpeed's config parser says of ``config`` as rank 0 of ``world_size`` processes: ``[]`` when it
    accepts it, else one error per problem it names, each labelled ``deepspeed:`` (``LABEL``).

    ``config`` is a ds_config dict as DeepSpeed reads it (``Config.to_dict()``; ``"auto"`` left in it reaches
    DeepSpeed as it is, and DeepSpeed's answer is reported as given).
    """
    require("asking DeepSpeed's config parser", "torch", "deepspeed")
    with _quiet_logger():
        from deepspeed.runtime import config as ds_config
    from pydantic import ValidationError

    comm = ds_config.dist
    saved = comm.get_world_size, comm.get_rank
    comm.get_world_size = lambda *args, **kwargs: world_size
    comm.get_rank = lambda *args, **kwargs: 0
    try:
        with _quiet_logger(), _quiet_output():
            ds_config.DeepSpeedConfig(copy.deepcopy(dict(config)))
    except ValidationError as e:
        found = [_pydantic_error(e.title, error, config) for error in e.errors()]
    except Exception as e:  # whatever DeepSpeed raises is its verdict: TypeError on "auto", AssertionError, ...
        found = [_diagnostic(": ".join(part for part in (type(e).__name__, _first_line(e)) if part))]
    else:
        found = []
    finally:
        comm.get_world_size, comm.get_rank = saved
    return list(dict.fromkeys(found))  # identical findings once


def _pydantic_error(title: str, error: Any, config: Mapping[str, Any]) -> Diagnostic:
    """One error of a pydantic model as ``ValidationError: KEY: MESSAGE``, its location as a dotted key."""
    where = _dotted(error["loc"])
    sections = SECTIONS.get(title)
    if sections is None:
        return _diagnostic(f"ValidationError ({title}): {where}: {error['msg']}")
    section = next((s for s in sections if s in config), sections[0])
    key = ".".join(part for part in (section, where) if part)
    return _diagnostic(f"ValidationError: {key}: {error['msg']}" if key else f"ValidationError: {error['msg']}")


def _dotted(loc: tuple[int | str, ...]) -> str:
    """``("offload_optimizer", "device")`` as ``offload_optimizer.device``; list indices as ``[0]``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


def _diagnostic(text: str) -> Diagnostic:
    return Diagnostic("", "error", f"{LABEL}: {text}", rule="deepspeed")


@contextlib.contextmanager
def _quiet_logger() -> Iterator[None]:
    """DeepSpeed's logger off (it also logs while being imported), then back as it was."""
    logger = logging.getLogger(_LOGGER)
    disabled = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = disabled


@contextlib.contextmanager
def _quiet_output() -> Iterator[None]:
    """Stray prints and warnings during the parse go nowhere (not used while importing: handlers made then would
    keep the swallowed stream)."""
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        yield
