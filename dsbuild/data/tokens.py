"""Checked records as token ids for a causal LM, with labels that keep the loss on what is to be learnt.

Each record becomes segments of text, each trained on or not, tokenized without special tokens and joined:

- ``"text"``: the text, trained on, then the tokenizer's end-of-sequence token;
- ``"alpaca"``: the prompt (the template filled with instruction and input), not trained on, then the output and
  the end-of-sequence token, trained on (so the model learns to stop);
- chats: the conversation rendered by the chat template (``data.chat_template``, else the tokenizer's, else
  ``FALLBACK_CHAT_TEMPLATE``); the text each assistant turn adds is trained on, the rest is not.

Tokens not trained on get the label ``-100``, which HF models leave out of the loss; with ``train_on_prompt``
every token is trained on. A sample longer than ``max_length`` is cut at the end. A causal LM predicts token
``t`` from those before it, so the label at position 0 teaches nothing: a sample with no trained label after it
is left out by the caller (``trained`` is 0), since a batch of such samples would make the loss NaN (0 / 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from ..errors import ConfigError, Problem
from ..job.formats import CHAT_FORMATS, FALLBACK_CHAT_TEMPLATE, IGNORE_INDEX, TEMPLATES, TRAINED_ROLE
from .records import Record, prompt_of

__all__ = [
    "COLUMNS",
    "Encoding",
    "Tokenized",
    "Unusable",
    "chat_segments",
    "chat_template_of",
    "encode",
    "keep_trained_template",
    "tokenize",
]

COLUMNS: Final = ("input_ids", "labels", "length", "prompt_length", "trained", "problem")
"""What ``encode`` returns per sample: the ids and labels (cut at ``max_length``), the length before the cut,
the tokens before the first trained one, the trained labels after position 0, and what made the record unusable
(``""`` when nothing did)."""


@attrs.frozen
class Encoding:
    """How records become samples: the format and the job's ``[data]`` options that decide the tokens."""

    fmt: str
    max_length: int
    prompts: tuple[str, str] = TEMPLATES["alpaca"]
    """The ``"alpaca"`` prompt templates: (without input, with input)."""
    chat_template: str | None = None
    """The chat template of conversations; ``None``: the tokenizer's, else ``FALLBACK_CHAT_TEMPLATE``."""
    train_on_prompt: bool = False


@attrs.frozen
class Tokenized:
    """Tokenized samples (lists of ids; ``labels`` hold ``-100`` where no loss is taken) and what was cut."""

    samples: list[dict[str, list[int]]]
    """One ``{"input_ids": [...], "labels": [...]}`` per kept record."""
    truncated: int = 0
    """Records cut at ``max_length``."""
    dropped: int = 0
    """Records left out because no token of theirs is trained on (an empty text; a response cut away by
    ``max_length``)."""


class Unusable(Exception):
    """A record the chat template cannot render into trained and untrained parts."""


def chat_template_of(tokenizer: Any, options: Encoding) -> str | None:
    """The chat template conversations are rendered with: the job's, else ``None`` (the tokenizer's own), else
    ``FALLBACK_CHAT_TEMPLATE`` for a tokenizer without one."""
    if options.chat_template is not None:
        return options.chat_template
    return None if getattr(tokenizer, "chat_template", None) else FALLBACK_CHAT_TEMPLATE


def keep_trained_template(tokenizer: Any, fmt: str, chat_template: str | None) -> None:
    """Give ``tokenizer`` the chat template a job of format ``fmt`` trains with, so that the tokenizer saved beside
    the model renders conversations as they were trained (``apply_chat_template`` works on the exported model, as
    LLaMA-Factory and axolotl save theirs); text formats leave it as it is."""
    if fmt not in CHAT_FORMATS:
        return
    template = chat_template_of(tokenizer, Encoding(fmt, 1, ("", ""), chat_template))
    if template is not None:
        tokenizer.chat_template = template


def chat_segments(
    messages: Sequence[Mapping[str, str]], tokenizer: Any, template: str | None
) -> list[tuple[str, bool]]:
    """A conversation as ``(text, trained)`` segments: each assistant turn's text trained, the rest not.

    The conversation is rendered up to each assistant turn with the generation prompt, and up to its end;
    what the turn adds is the assistant's. A template that rewrites earlier turns when one is added cannot be
    split this way, and the record is refused.
    """
    from jinja2 import TemplateError

    def render(part: Sequence[Mapping[str, str]], prompt: bool) -> str:
        text = tokenizer.apply_chat_template(
            list(part), chat_template=template, tokenize=False, add_generation_prompt=prompt
        )
        return str(text)

    segments: list[tuple[str, bool]] = []
    done = ""
    try:
        for i, message in enumerate(messages):
            if message["role"] != TRAINED_ROLE:
                continue
            before = render(messages[:i], True) if i else ""
            after = render(messages[: i + 1], False)
            if not (before.startswith(done) and after.startswith(before)):
                raise Unusable(
                    "the chat template renders earlier turns differently once a turn is added, so the assistant's "
                    "tokens cannot be told apart (set data.chat_template)"
                )
            segments += [(before[len(done) :], False), (after[len(before) :], True)]
            done = after
        whole = render(messages, False)
    except (TemplateError, ValueError, TypeError) as e:
        raise Unusable(f"the chat template refuses it: {e}") from None
    if not whole.startswith(done):
        raise Unusable("the chat template renders the whole conversation differently from its turns")
    segments.append((whole[len(done) :], False))
    return [(text, trained) for text, trained in segments if text]


def _segments(
    record: Record, fmt: str, tokenizer: Any, options: Encoding, template: str | None
) -> list[tuple[str, bool]]:
    if fmt == "text":
        return [(record["text"], True)]
    if fmt == "alpaca":
        return [(prompt_of(record, options.prompts), False), (record["output"], True)]
    return chat_segments(record["messages"], tokenizer, template)


def _token_ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """The ids of each text, without special tokens, in one call: a fast tokenizer encodes the list in parallel.

    A fast tokenizer's own ``encode_batch`` gives the ids calling the tokenizer gives, without the attention
    masks and the dict per text that ``__call__`` builds (a fifth of the time of tokenizing); the first text of
    the batch is encoded both ways to make sure of it for this tokenizer.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        fast = [list(encoding.ids) for encoding in backend.encode_batch(texts, add_special_tokens=False)]
        if fast[0] == list(tokenizer(texts[:1], add_special_tokens=False)["input_ids"][0]):
            return fast
    ids: list[list[int]] = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return ids


def encode(records: Sequence[Record | None], tokenizer: Any, options: Encoding) -> dict[str, list[Any]]:
    """The ``COLUMNS`` of checked records (``None``: a record already refused, which gives an empty sample)."""
    chat = options.fmt in CHAT_FORMATS
    template = chat_template_of(tokenizer, options) if chat else None
    eos = tokenizer.eos_token_id
    tail = [eos] if eos is not None and not chat else []  # a chat template ends its turns its own way
    parts: list[list[tuple[str, bool]] | str] = []
    texts: list[str] = []
    for record in records:
        if record is None:
            parts.append("refused")
            continue
        try:
            segments = _segments(record, options.fmt, tokenizer, options, template)
        except Unusable as e:
            parts.append(str(e))
            continue
        parts.append(segments)
        texts += [text for text, _ in segments]
    ids_of = iter(_token_ids(tokenizer, texts) if texts else [])
    out: dict[str, list[Any]] = {name: [] for name in COLUMNS}
    for part in parts:
        ids: list[int] = []
        labels: list[int] = []
        prompt: int | None = None  # tokens before the first trained one
        problem = ""
        if isinstance(part, str):
            problem = part
        else:
            for _, trained in part:
                tokens = list(next(ids_of))
                if trained or options.train_on_prompt:
                    if prompt is None and tokens:
                        prompt = len(ids)
                    labels += tokens
                else:
                    labels += [IGNORE_INDEX] * len(tokens)
                ids += tokens
            if tail and prompt is None:
                prompt = len(ids)
            ids += tail
            labels += tail
        length = len(ids)
        if length > options.max_length:
            ids, labels = ids[: options.max_length], labels[: options.max_length]
        out["input_ids"].append(ids)
        out["labels"].append(labels)
        out["length"].append(length)
        out["prompt_length"].append(length if prompt is None else prompt)
        # Trained labels after position 0 (a label there teaches nothing: no token comes before it).
        out["trained"].append(len(labels) - (labels[0] != IGNORE_INDEX if labels else 0) - labels.count(IGNORE_INDEX))
        out["problem"].append(problem)
    return out


def tokenize(
    records: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    fmt: str,
    max_length: int,
    *,
    template: str | tuple[str, str] = "alpaca",
    chat_template: str | None = None,
    train_on_prompt: bool = False,
) -> Tokenized:
    """Checked records (``read_records``) as samples for a causal LM; see the module docstring for the loss.

    A sample cut at ``max_length`` is counted in ``truncated``; one left without a trained token is dropped and
    counted in ``dropped``. A conversation the chat template refuses is an error naming the record.
    """
    prompts = TEMPLATES[template] if isinstance(template, str) else template
    options = Encoding(fmt, max_length, prompts, chat_template, train_on_prompt)
    columns = encode([dict(r) for r in records], tokenizer, options)
    problems = [Problem("", f"[{i}]: {p}") for i, p in enumerate(columns["problem"]) if p]
    if problems:
        raise ConfigError(problems)
    samples = []
    for ids, labels, trained in zip(columns["input_ids"], columns["labels"], columns["trained"], strict=True):
        if trained:
            samples.append({"input_ids": ids, "labels": labels})
    truncated = sum(1 for length in columns["length"] if length > max_length)
    return Tokenized(samples, truncated, len(records) - len(samples))
