"""Tiny models and data shared by the Session tests and their worker scripts (no downloads)."""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from typing import Any

import torch
from torch.utils.data import Dataset

VOCAB = 384


def tiny_llama(**overrides: Any) -> Any:
    """A 2-layer Llama config small enough to train in a fraction of a second per step on a CPU."""
    from transformers import LlamaConfig

    fields: dict[str, Any] = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=64,
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


class TokenData(Dataset[dict[str, torch.Tensor]]):
    """Fixed random token sequences: each sample is its own label (causal LM)."""

    def __init__(self, n: int, length: int = 16, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, VOCAB, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def batch(n: int = 2, length: int = 16, seed: int = 1) -> dict[str, torch.Tensor]:
    data = TokenData(n, length, seed)
    return {k: torch.stack([data[i][k] for i in range(n)]) for k in ("input_ids", "attention_mask", "labels")}


class Regression(torch.nn.Module):
    """A model the HF Trainer and a Session both train as it is: ``forward(x, y)`` returns the loss (MSE)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def forward(self, x: Any, y: Any) -> dict[str, Any]:
        return {"loss": torch.nn.functional.mse_loss(self.net(x), y)}
