"""The formats a job's ``[data]`` names: what each record holds and the prompt templates of instruction data.

Part of the job file's format (the reader checks ``data.format`` and ``data.template`` against it); the data
module turns records into tokens with it.
"""

from __future__ import annotations

from typing import Final

__all__ = ["FORMATS", "IGNORE_INDEX", "TEMPLATES"]

FORMATS: Final = ("alpaca", "text")
"""The ``[data] format`` values a job understands."""

IGNORE_INDEX: Final = -100
"""The label HF causal LMs leave out of the loss (``CrossEntropyLoss(ignore_index=-100)``)."""

_ALPACA_HEAD: Final = (
    "Below is an instruction that describes a task{with_input}. "
    "Write a response that appropriately completes the request.\n\n"
)

TEMPLATES: Final = {
    "alpaca": (
        _ALPACA_HEAD.format(with_input="") + "### Instruction:\n{instruction}\n\n### Response:\n",
        _ALPACA_HEAD.format(with_input=", paired with an input that provides further context")
        + "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n",
    ),
    "plain": ("{instruction}\n", "{instruction}\n{input}\n"),
}
"""Prompt templates for ``"alpaca"`` records: (without input, with input). ``"alpaca"`` is Stanford Alpaca's."""
