"""Unpaired preference data for KTO, as TRL 1.16's ``KTOTrainer`` prepares it: records checked, tokenized, paired
with a mismatched completion for the KL estimate, and collated.

A record (TRL's unpaired preference format) has ``prompt``, ``completion`` and ``label`` (true: desirable): prompt
and completion both strings (standard) or both lists of ``{"role", "content"}`` messages (conversational).

Tokenizing (``tokenize_unpaired``, ``KTOTrainer._prepare_dataset``): a standard completion gets the tokenizer's EOS
appended (unless it ends with it); ``prompt`` and ``prompt + completion`` are tokenized apart (a conversation with
its chat template, the prompt with the generation prompt) and the completion starts where the two diverge. A record
whose prompt alone fills ``max_length`` is left out. Then the KL completions (``kl_completions``): in consecutive
chunks of ``per_device_train_batch_size`` records, each record takes the completion of the one before it (the first
the chunk's last), the mismatched pairs TRL's KL estimate scores; the chunks are the micro-batches a KTO job trains on,
in order (``session.batches.Shards`` unshuffled), as TRL trains KTO with ``train_sampling_strategy = "sequential"``.

Collating (``collate_unpaired``, TRL's ``DataCollatorForUnpairedPreference``): ``input_ids``, ``attention_mask`` and
``completion_mask`` of ``prompt + completion``, and the same with a ``KL_`` prefix of ``prompt + KL completion``,
each cut to ``max_length`` (its start kept) and right-padded; ``label``; and the reference's log-probs of both
(``PRECOMPUTED``) where the records carry them (``[reference] precompute``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, Problem
from .records import NOTHING_TO_LEARN, Record, read_checked
from .tokens import chat_template_for, common_prefix_length, template_key

PRECOMPUTED = ("ref_logps", "ref_KL_logps")
"""The reference's summed log-probs of a record's completion and of its KL completion, as TRL's precomputed columns
name them (``KTOTrainer._precompute_ref_logps``)."""

__all__ = [
    "PRECOMPUTED",
    "check_unpaired",
    "collate_unpaired",
    "kl_completions",
    "load_kto_data",
    "load_unpaired",
    "read_unpaired",
    "tokenize_unpaired",
]


def check_unpaired(record: Any) -> tuple[Record | None, str | None]:
    """An unpaired record in TRL's shape, or ``None`` and what is wrong."""
    if not isinstance(record, Mapping):
        return None, f"is {type(record).__name__}, expected an object with prompt, completion and label"
    missing = [name for name in ("prompt", "completion", "label") if name not in record]
    if missing:
        return None, f"has no {' and no '.join(missing)} (an unpaired record: prompt, completion, label)"
    if not isinstance(record["label"], bool):
        return None, f"label is {type(record['label']).__name__}, expected true (desirable) or false"
    prompt, completion = record["prompt"], record["completion"]
    for name, value in (("prompt", prompt), ("completion", completion)):
        if not isinstance(value, (str, list)):
            return None, f"{name} is {type(value).__name__}, expected a string or a list of messages"
        if isinstance(value, list) and not all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value
        ):
            return None, f"{name} holds an item that is not a message with a string role and content"
    if isinstance(prompt, str) != isinstance(completion, str):
        return None, "mixes text and messages: prompt and completion are both strings or both lists of messages"
    if isinstance(completion, list) and not completion:
        return None, f"completion is an empty list of messages {NOTHING_TO_LEARN}"
    return {"prompt": prompt, "completion": completion, "label": record["label"]}, None


def read_unpaired(path: str | Path) -> list[Record]:
    """The checked unpaired records of a JSON array or JSON Lines file; every bad one reported at once."""
    return read_checked(path, "unpaired", check_unpaired)


def _ids(tokenizer: Any, value: str | list[Any], **template: Any) -> list[int]:
    """TRL's ``_tokenize``: a chat template for messages, the tokenizer's call for text."""
    if isinstance(value, list):
        return list(tokenizer.apply_chat_template(value, tokenize=True, return_dict=True, **template)["input_ids"])
    return list(tokenizer(text=value)["input_ids"])


def tokenize_unpaired(record: Mapping[str, Any], tokenizer: Any, chat_template: str | None = None) -> dict[str, Any]:
    """``prompt_ids``, ``completion_ids`` and ``label`` of one checked record, as TRL tokenizes it (module docstring)."""
    prompt, completion = record["prompt"], record["completion"]
    if isinstance(completion, list):
        template = {"chat_template": chat_template_for(tokenizer, chat_template)}
        prompt_ids = _ids(tokenizer, prompt, add_generation_prompt=True, **template)
        whole = _ids(tokenizer, prompt + completion, **template)
    else:
        eos = tokenizer.eos_token
        completion = completion if completion.endswith(eos) else completion + eos
        prompt_ids, whole = _ids(tokenizer, prompt), _ids(tokenizer, prompt + completion)
    cut = common_prefix_length(prompt_ids, whole)
    return {"prompt_ids": prompt_ids[:cut], "completion_ids": whole[cut:], "label": bool(record["label"])}


def kl_completions(examples: Sequence[Mapping[str, Any]], batch_size: int) -> list[dict[str, Any]]:
    """Each example with its ``KL_completion_ids``: in chunks of ``batch_size`` in order, the completion of the
    example before it, the chunk's first taking its last (TRL's ``add_kl_completion_ids``)."""
    out: list[dict[str, Any]] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        rotated = [chunk[-1]["completion_ids"], *(e["completion_ids"] for e in chunk[:-1])]
        out.extend({**e, "KL_completion_ids": kl} for e, kl in zip(chunk, rotated, strict=True))
    return out


def load_unpaired(
    path: str | Path,
    tokenizer: Any,
    *,
    key: str,
    max_length: int | None,
    batch_size: int | None,
    chat_template: str | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """The records of ``path`` (its ``[data]`` key ``key``) tokenized, those whose prompt fills ``max_length`` left
    out (how many is the second value), with their KL completions when ``batch_size`` is given (``None``:
    ``apo_zero_unpaired``, no KL)."""
    from jinja2 import TemplateError

    records = read_unpaired(path)
    examples = []
    with warnings.catch_warnings():  # ByT5's "already has </s>": TRL's own texts end with EOS the same way
        warnings.filterwarnings("ignore", message="This sequence already has", category=UserWarning)
        for i, record in enumerate(records):
            try:
                examples.append(tokenize_unpaired(record, tokenizer, chat_template))
            except TemplateError as e:
                message = f"{path}: record {i}: the chat template cannot render it: {e}"
                hint = "set data.chat_template to a template that renders it"
                raise ConfigError(Problem(template_key(chat_template), message, hint)) from None
    kept = [e for e in examples if max_length is None or len(e["prompt_ids"]) < max_length]
    if not kept:
        raise ConfigError(Problem(key, f"{path}: the prompt of each of its {len(records)} records fills "
                                       f"kto.max_length = {max_length} tokens: nothing is left to learn from",
                                  "raise kto.max_length"))  # fmt: skip
    return (kl_completions(kept, batch_size) if batch_size else kept), len(examples) - len(kept)


def load_kto_data(job: Any, tokenizer: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str]:
    """A KTO job's training and evaluation examples (``load_unpaired`` with its ``[kto]``, the KL completions in
    chunks of ``per_device_train_batch_size`` for both, as TRL), and a note of how many were left out."""
    kto, data = job.kto, job.data
    size = job.training.per_device_train_batch_size if kto.loss_type == "kto" else None
    notes: list[str] = []

    def loaded(path: Any, key: str, what: str) -> list[dict[str, Any]]:
        kept, dropped = load_unpaired(path, tokenizer, key=key, max_length=kto.max_length, batch_size=size,
                                      chat_template=data.chat_template)  # fmt: skip
        if dropped:
            notes.append(f"{dropped} {what} records left out: their prompt fills kto.max_length = {kto.max_length} "
                         "tokens (as TRL's KTOTrainer)")  # fmt: skip
        return kept

    train = loaded(data.path, "data.path", "training")
    evaluation = loaded(data.eval_path, "data.eval_path", "evaluation") if data.eval_path is not None else None
    return train, evaluation, "; ".join(notes)


def collate_unpaired(
    examples: Sequence[Mapping[str, Any]], *, pad_token_id: int, max_length: int | None = None
) -> dict[str, Any]:
    """TRL's ``DataCollatorForUnpairedPreference`` (module docstring)."""
    import torch

    out: dict[str, Any] = {}
    for prefix, key in (("", "completion_ids"), ("KL_", "KL_completion_ids")):
        if key not in examples[0]:
            continue
        rows = [list(e["prompt_ids"]) + list(e[key]) for e in examples]
        masks = [[0] * len(e["prompt_ids"]) + [1] * len(e[key]) for e in examples]
        if max_length is not None:
            rows, masks = [r[:max_length] for r in rows], [m[:max_length] for m in masks]
        width = max(len(r) for r in rows)
        out[f"{prefix}input_ids"] = torch.tensor([r + [pad_token_id] * (width - len(r)) for r in rows])
        out[f"{prefix}attention_mask"] = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        out[f"{prefix}completion_mask"] = torch.tensor([m + [0] * (width - len(m)) for m in masks])
    out["label"] = torch.tensor([bool(e["label"]) for e in examples])
    for key in PRECOMPUTED:
        if key in examples[0]:
            out[key] = torch.tensor([float(e[key]) for e in examples])
    return out
