"""What the commands' parsers need and nothing more: the argument types, the shared options and the choices.

Light by design (argparse and the standard library only): ``dsbuild.cli`` builds every command's parser from this
and ``output``, and a command imports what it runs on only when it runs, so ``dsbuild presets`` does not pay for
DeepSpeed's verdict, the job reader or the data pipeline.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

__all__ = [
    "CONSUMERS",
    "FORMATS",
    "TARGETS",
    "Commands",
    "add_run_facts",
    "add_target",
    "node_count",
    "non_negative_int",
    "port_number",
    "positive_int",
]

FORMATS = ("json", "toml")

TARGETS = ("auto", "deepspeed", "hf")

CONSUMERS = ("deepspeed", "hf", "accelerate", "trl")

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_run_facts(p: argparse.ArgumentParser) -> None:
    """The facts ``resolve`` needs: world size, training arguments, hidden size, total steps."""
    p.add_argument(
        "--world-size", type=positive_int, metavar="N", help="number of processes (default: a job's, else 1)"
    )
    p.add_argument(
        "--training",
        metavar="TOML",
        type=Path,
        help="training arguments: a TOML file of Training fields (not for jobs)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=(
            "override a training argument (training.learning_rate=2e-5) or a ds_config key (zero_optimization.stage=2); "
            "for a job file, any job value (strategy.overrides.zero_optimization.stage=2)"
        ),
    )
    p.add_argument("--hidden-size", type=positive_int, metavar="H", help="the model's hidden size")
    p.add_argument(
        "--model",
        type=Path,
        metavar="DIR|CONFIG.json",
        help="a model directory or its config.json: its hidden size, when --hidden-size is not given",
    )
    p.add_argument("--total-steps", type=positive_int, metavar="N", help="optimizer steps of the run")


def add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default="auto",
        help='who reads the config: "deepspeed" as is, "hf" (the HF Trainer / Accelerate, which fill "auto"), or '
        '"auto" (default): "hf" for a config holding "auto", else "deepspeed"',
    )


MOST = 10**15
"""The largest integer an option takes: a larger one is a typo, and would overflow the float arithmetic it feeds."""


def _int_at_least(least: int, expected: str, most: int = MOST) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``least`` and <= ``most`` (``expected`` names it in the error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # not an integer, or more digits than Python converts
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        if value > most:
            up_to = "1e15" if most == MOST else str(most)
            raise argparse.ArgumentTypeError(f"expected {expected} up to {up_to}, got {text!r}")
        return value

    return parse


positive_int = _int_at_least(1, "a positive integer")
non_negative_int = _int_at_least(0, "an integer >= 0")
port_number = _int_at_least(1, "a TCP port number", most=65535)


def node_count(text: str) -> tuple[int, int]:
    """An argparse ``type`` for ``--nnodes``: ``N`` (that many nodes) or ``MIN:MAX`` (an elastic run, torchrun's
    spelling); ``(MIN, MAX)``."""
    low, colon, high = text.partition(":")
    try:
        least, most = positive_int(low), positive_int(high if colon else low)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected N or MIN:MAX (positive integers), got {text!r}") from None
    if least > most:
        raise argparse.ArgumentTypeError(f"expected MIN <= MAX, got {text!r}")
    return least, most
