"""Write a tiny reward model folder for examples/job_grpo_reward_model.toml: ``python examples/make_reward_model.py
OUT`` (default: examples/reward_model).

A reward model is what TRL's ``GRPOTrainer`` takes as a string in ``reward_funcs``: an
``AutoModelForSequenceClassification`` with one label and its tokenizer, in one folder (``save_pretrained``). This one
is a 2-layer Llama built from its config with random weights and the byte-level tokenizer (no download): its scores
mean nothing, but it runs as a trained one would (dsbuild trains one with a job of its own once reward modelling is
a task; any folder a ``RewardTrainer`` saved works).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, ByT5Tokenizer, LlamaConfig


def main(out: Path) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=384, max_position_embeddings=256, num_labels=1,
                         pad_token_id=0)  # fmt: skip
    AutoModelForSequenceClassification.from_config(config).save_pretrained(out)
    ByT5Tokenizer().save_pretrained(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "reward_model")
