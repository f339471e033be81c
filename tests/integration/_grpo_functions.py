"""The fixed rollout and the deterministic reward both sides of test_grpo_trl.py's differential run: no sampling, so
the two trainers see the same completions and rewards and differ only in how they train on them."""

from __future__ import annotations

import hashlib
from typing import Any

EOS = 1  # ByT5's </s>


def completion(prompt: str, k: int) -> list[int]:
    """The ``k``-th completion of ``prompt`` in a call: 2 to 9 byte tokens, every other one ending with EOS."""
    digest = hashlib.sha256(f"{prompt}/{k}".encode()).digest()
    length = 2 + digest[0] % 8
    ids = [3 + (b % 96) + 32 for b in digest[1 : 1 + length]]  # printable bytes (ByT5: byte + 3)
    return [*ids[:-1], EOS] if digest[-1] % 2 else ids


def complete(prompts: list[str]) -> list[list[int]]:
    """dsbuild's rollout function: each prompt's completion by its occurrence in the call (a group's differ)."""
    seen: dict[str, int] = {}
    out = []
    for prompt in prompts:
        seen[prompt] = seen.get(prompt, -1) + 1
        out.append(completion(prompt, seen[prompt]))
    return out


def reward(completions: list[str], target: list[int], **_: Any) -> list[float]:
    """Closeness of a completion's length to the record's ``target``, plus a share of its vowels."""
    return [
        -abs(len(c) - t) / 4 + sum(ch in "aeiou" for ch in c) / max(len(c), 1)
        for c, t in zip(completions, target, strict=True)
    ]


def trl_rollout(tokenizer: Any) -> Any:
    """TRL's ``rollout_func`` of the same completions (prompt tokens as TRL's ``_tokenize_prompts``)."""

    def rollout(prompts: list[str], _trainer: Any) -> dict[str, Any]:
        return {
            "prompt_ids": tokenizer(text=prompts)["input_ids"],
            "completion_ids": complete(prompts),
            "logprobs": None,
        }

    return rollout
