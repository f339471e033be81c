"""The formats a job's ``[data]`` names: what each record holds, the prompt templates of instruction data, the chat
roles and the fallback chat template, and what ``data.path`` may name.

Part of the job file's format (the reader checks ``data.format``, ``data.template`` and ``[data.columns]`` against
it); the data package turns records into tokens with it. Stdlib only.
"""

from __future__ import annotations

import re
import string
from typing import Final

__all__ = [
    "CHAT_FORMATS",
    "DATA_SUFFIXES",
    "FALLBACK_CHAT_TEMPLATE",
    "FIELDS",
    "FORMATS",
    "IGNORE_INDEX",
    "PACKING_STRATEGIES",
    "ROLES",
    "SHAREGPT_ROLES",
    "TEMPLATED_FORMATS",
    "TEMPLATES",
    "TEMPLATE_KEYS",
    "TRAINED_ROLE",
    "is_hub_id",
    "template_problems",
]

FORMATS: Final = (
    "alpaca", "messages", "prompt_completion", "sharegpt", "text", "tokenized", "preference", "prompt", "unpaired",
)  # fmt: skip
"""The ``[data] format`` values a job understands (``"preference"``: the pairs of ``task = "dpo"``; ``"prompt"``: the
prompts of ``task = "grpo"``, TRL's prompt-only format; ``"unpaired"``: the labelled completions of ``task = "kto"``,
TRL's unpaired preference format)."""

CHAT_FORMATS: Final = ("messages", "sharegpt")
"""Formats of conversations, rendered with a chat template; the loss is on the assistant's turns."""

TEMPLATED_FORMATS: Final = (*CHAT_FORMATS, "prompt_completion", "preference", "prompt", "unpaired")
"""Formats whose records may be rendered with a chat template (``data.chat_template``, else the tokenizer's, else
``FALLBACK_CHAT_TEMPLATE``: ``data.tokens.chat_template_for``, every task): ``prompt_completion``, ``preference``
(DPO's pairs) and ``prompt`` (GRPO's) when their records hold conversations, as TRL's conversational formats."""

PACKING_STRATEGIES: Final = ("bfd", "bfd_split", "wrapped")
"""TRL's ``packing_strategy`` values: best-fit decreasing (an overlong sample cut at ``max_length``), best-fit
decreasing with overlong samples split into pieces, and wrapped (every sample concatenated, cut every
``max_length`` tokens)."""

FIELDS: Final = {
    "text": ("text",),
    "alpaca": ("instruction", "input", "output"),
    "messages": ("messages", "role", "content"),
    "sharegpt": ("conversations", "from", "value"),
    "prompt_completion": ("prompt", "completion"),
    "tokenized": ("input_ids", "labels", "completion_mask", "attention_mask"),
    "preference": ("prompt", "chosen", "rejected"),
    "prompt": ("prompt",),
    "unpaired": ("prompt", "completion", "label"),
}
"""The fields each format reads, by their usual names; ``[data.columns]`` gives a file's own names for them."""

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

TEMPLATE_KEYS: Final = ("prompt_no_input", "prompt_input")
"""The keys of a ``[data.template]`` table (Stanford Alpaca's names): the prompt without and with an input."""

_PLACEHOLDERS: Final = {"prompt_no_input": ("instruction",), "prompt_input": ("instruction", "input")}

ROLES: Final = ("system", "developer", "user", "assistant", "tool")
"""The ``role`` values of ``"messages"`` records (OpenAI's chat format)."""

TRAINED_ROLE: Final = "assistant"
"""The role whose turns the loss is taken on (unless ``data.train_on_prompt``)."""

SHAREGPT_ROLES: Final = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "function_call": "assistant",
    "observation": "tool",
    "function": "tool",
    "tool": "tool",
}
"""ShareGPT's ``from`` values and the chat role each becomes."""

FALLBACK_CHAT_TEMPLATE: Final = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' + '\\n' }}{% endgeneration %}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML: the chat template of conversations for a tokenizer without one (the byte tokenizer) and no
``data.chat_template``. Each turn is ``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n``; an assistant turn's content and
end-of-turn sit in ``{% generation %}`` markers, so ``apply_chat_template(..., return_assistant_tokens_mask=True)``
(TRL's ``assistant_only_loss``) masks what dsbuild trains on."""

DATA_SUFFIXES: Final = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}
"""Data files ``data.path`` may name (or a folder may hold), and the ``datasets`` loader of each."""

_HUB_ID: Final = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}")


def is_hub_id(text: str) -> bool:
    """Whether ``text`` reads as a hub dataset id (``owner/name``) rather than a local path."""
    if not _HUB_ID.fullmatch(text) or ".." in text:
        return False
    return not any(text.lower().endswith(suffix) for suffix in DATA_SUFFIXES)


def template_problems(templates: dict[str, str]) -> list[tuple[str, str]]:
    """``(key, message)`` for each ``[data.template]`` prompt that names a field it may not, or misses one it needs."""
    problems = []
    for key, text in templates.items():
        allowed = _PLACEHOLDERS[key]
        try:
            named = [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
        except ValueError as e:
            problems.append((key, f"not a template: {e} (write a literal brace as {{{{ or }}}})"))
            continue
        for name in named:
            if name not in allowed:
                expected = " and ".join(f"{{{a}}}" for a in allowed)
                problems.append((key, f"{{{name}}} is not a field it can fill; it fills {expected}"))
        for name in allowed:
            if name not in named:
                problems.append((key, f"missing {{{name}}}"))
    return problems
