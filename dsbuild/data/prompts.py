"""Prompts for GRPO, as TRL 1.16's ``GRPOTrainer`` reads them: records checked and their prompts tokenized.

A record (TRL's prompt-only format) has ``prompt``: a string (standard) or a list of ``{"role", "content"}`` messages
(conversational). Its other fields are kept: the reward functions get them, one list per field (TRL passes every
column but ``prompt``, ``completion`` and ``completion_ids``).

Tokenizing (``prompt_ids``, TRL's ``_tokenize_prompts``): a standard prompt is the tokenizer's call on the text
(special tokens added as the tokenizer adds them); a conversational one is rendered with the chat template and the
generation prompt (``data.chat_template``, else the tokenizer's, else dsbuild's fallback template: ``chat_template_for``,
as for SFT and DPO data).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, Problem
from .records import NOTHING_TO_LEARN, Record, read_checked
from .tokens import chat_template_for

if TYPE_CHECKING:
    from ..job.spec import DataSpec

__all__ = ["check_data", "check_prompt", "load_data", "load_job_prompts", "prompt_ids", "read_prompts"]


def check_prompt(record: Any) -> tuple[Record | None, str | None]:
    """A prompt-only record (its other fields kept), or ``None`` and what is wrong."""
    if not isinstance(record, Mapping):
        return None, f"is {type(record).__name__}, expected an object with a prompt"
    if "prompt" not in record:
        return None, "has no prompt (a prompt-only record: prompt, and any fields the reward functions read)"
    prompt = record["prompt"]
    if isinstance(prompt, list):
        for i, message in enumerate(prompt):
            if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
                return None, f"prompt[{i}] is not a message with a role and a content"
            if not isinstance(message.get("content"), str):
                return None, f"prompt[{i}].content is {type(message.get('content')).__name__}, expected a string"
    elif not isinstance(prompt, str):
        return None, f"prompt is {type(prompt).__name__}, expected a string or a list of messages"
    if not prompt:
        return None, f"prompt is empty {NOTHING_TO_LEARN}"
    for name in ("completion", "completion_ids", "prompt_ids"):
        if name in record:
            return None, f"has {name!r}, a name the reward functions' own arguments use (rename the field)"
    return dict(record), None


def read_prompts(path: str | Path) -> list[Record]:
    """The checked records of a JSON array or JSON Lines file of prompts; every bad one reported at once. Standard
    and conversational prompts are not mixed in one file (TRL reads a dataset as one or the other)."""
    records = read_checked(path, "prompt", check_prompt)
    if len({isinstance(r["prompt"], str) for r in records}) > 1:
        message = f"{path}: mixes text prompts and lists of messages (TRL reads a dataset as one or the other)"
        raise ConfigError(Problem("data.path", message))
    return records


def prompt_ids(record: Mapping[str, Any], tokenizer: Any, chat_template: str | None = None) -> list[int]:
    """The prompt's tokens, as TRL's ``_tokenize_prompts`` makes them (module docstring)."""
    prompt = record["prompt"]
    if isinstance(prompt, list):
        template = chat_template_for(tokenizer, chat_template)
        rendered = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True,
                                                 chat_template=template)  # fmt: skip
        return list(rendered["input_ids"])
    return list(tokenizer(text=prompt)["input_ids"])


def check_data(spec: DataSpec) -> None:
    """Every record of a GRPO job's prompts file checked (``read_prompts``)."""
    read_prompts(spec.path)


def load_data(spec: DataSpec, tokenizer: Any) -> tuple[list[Record], None, str]:
    """A GRPO job's prompts checked, each record with its ``prompt_ids`` (no evaluation records, nothing cut)."""
    records = read_prompts(spec.path)
    return [{**record, "prompt_ids": prompt_ids(record, tokenizer, spec.chat_template)} for record in records], None, ""


def load_job_prompts(job: Any, tokenizer: Any) -> tuple[list[Record], None, str]:
    """A GRPO or RLOO job's prompts (``load_data`` of its ``[data]``)."""
    return load_data(job.data, tokenizer)
