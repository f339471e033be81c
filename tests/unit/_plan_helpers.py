"""Shared by the tests/unit/test_plan_*.py files: the GiB and the small model shape they plan for."""

from __future__ import annotations

GiB = 2**30


SMALL = {
    "vocab_size": 211,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}
