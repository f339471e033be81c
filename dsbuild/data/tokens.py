"""Checked records as token ids for a causal LM, with labels that keep the loss on what is to be learnt, exactly as
TRL's ``SFTTrainer`` (1.16) prepares them (``tests/property/test_trl_data_differential.py`` holds it on generated
records and options):

- ``"text"``: the text and the end-of-sequence token (``data.eos_token``, else the tokenizer's; not added again
  when the text ends with it), tokenized as the tokenizer tokenizes a text (its own special tokens included, a BOS
  where it adds one), every token trained on;
- ``"alpaca"`` and standard ``"prompt_completion"``: prompt + completion + EOS tokenized as one text; the tokens
  it shares with the prompt tokenized alone are the prompt, not trained on (``completion_only_loss``);
- chats (``"messages"``, ``"sharegpt"``, conversational ``"prompt_completion"``): the conversation rendered by
  the chat template (``data.chat_template``, else the tokenizer's, else ``FALLBACK_CHAT_TEMPLATE``) and tokenized
  in one ``apply_chat_template``; with ``assistant_only_loss`` the tokens its ``{% generation %}`` blocks mark are
  the assistant's, and with ``completion_only_loss`` what follows the prompt rendered with the generation prompt is
  the completion. For a template without the markers (TRL refuses it), what each assistant turn adds to the
  conversation rendered turn by turn is the assistant's (``chat_segments``);
- ``"tokenized"``: the record's ``input_ids`` and ``labels`` as given; without labels, the ids, masked by the
  record's ``completion_mask`` with ``completion_only_loss``.

Tokens not trained on get the label ``-100``, which HF models leave out of the loss. A sample longer than
``max_length`` is cut at the end (unless packing splits or wraps it instead). As TRL, a sample every label of which
is ``-100`` is left out (unless packed) by the caller (``labelled`` is 0). A causal LM predicts token ``t`` from
those before it, so the label at position 0 teaches nothing: data none of whose samples has a trained label after
it (``trained`` is 0 for all) would only give NaN losses (0 / 0), and is refused.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from os.path import commonpath
from typing import Any, Final

import attrs

from ..errors import ConfigError, Problem
from ..job.formats import CHAT_FORMATS, FALLBACK_CHAT_TEMPLATE, IGNORE_INDEX, TEMPLATED_FORMATS, TEMPLATES, TRAINED_ROLE
from .records import Record, prompt_of

__all__ = [
    "COLUMNS",
    "Encoding",
    "Tokenized",
    "Unusable",
    "chat_segments",
    "chat_template_for",
    "common_prefix_length",
    "encode",
    "keep_trained_template",
    "render",
    "split_at",
    "stop_untrained",
    "template_key",
    "tokenize",
    "with_eos_token",
]

COLUMNS: Final = ("input_ids", "labels", "length", "prompt_length", "trained", "labelled", "problem")
"""What ``encode`` returns per sample: the ids and labels (cut at ``max_length``), the length before the cut,
the tokens before the first trained one, the trained labels after position 0, the labels that are not ``-100``
(position 0 included: TRL keeps a sample with any), and what made the record unusable (``""`` when nothing did)."""

_GENERATION: Final = re.compile(r"\{%-?\s*generation\s*-?%\}")
"""A ``{% generation %}`` block in a chat template: HF marks the tokens inside it as the assistant's."""


@attrs.frozen
class Encoding:
    """How records become samples: the format and the job's ``[data]`` options that decide the tokens."""

    fmt: str
    max_length: int
    prompts: tuple[str, str] = TEMPLATES["alpaca"]
    """The ``"alpaca"`` prompt templates: (without input, with input)."""
    chat_template: str | None = None
    """The chat template of conversations; ``None``: the tokenizer's, else ``FALLBACK_CHAT_TEMPLATE``."""
    assistant_only_loss: bool = False
    """Conversations: the loss on the assistant's tokens only."""
    completion_only_loss: bool = True
    """Prompt / completion and instruction records: the loss on the completion only."""
    eos_token: str | None = None
    """The token ending a text or completion; ``None``: the tokenizer's end-of-sequence token."""
    cut: bool = True
    """Cut samples at ``max_length``; off where packing splits or wraps overlong samples instead."""


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


def chat_template_for(tokenizer: Any, chat_template: str | None) -> str | None:
    """The chat template conversations are rendered with, the one rule of every task and format (SFT's chats and
    conversational prompt / completion records, DPO's pairs, GRPO's prompts): the job's ``data.chat_template``, else
    ``None`` (the tokenizer's own), else ``FALLBACK_CHAT_TEMPLATE`` for a tokenizer without one."""
    if chat_template is not None:
        return chat_template
    return None if getattr(tokenizer, "chat_template", None) else FALLBACK_CHAT_TEMPLATE


def template_key(chat_template: str | None) -> str:
    """The key that sets the template ``chat_template_for`` picks, for a message about it: ``data.chat_template``
    when the job sets it, else ``model.tokenizer`` (the tokenizer's own, or the fallback for a tokenizer without)."""
    return "data.chat_template" if chat_template is not None else "model.tokenizer"


def with_eos_token(tokenizer: Any, token: str | None) -> Any:
    """``tokenizer``, or with ``data.eos_token`` a copy of it whose end-of-sequence token is ``token``: what TRL does
    to its tokenizer, so that one that adds its EOS itself (T5's) adds that one."""
    if token is None or getattr(tokenizer, "eos_token", None) == token:
        return tokenizer
    import copy

    changed = copy.deepcopy(tokenizer)
    changed.eos_token = token
    return changed


def keep_trained_template(tokenizer: Any, fmt: str, chat_template: str | None) -> None:
    """Give ``tokenizer`` the chat template a job of format ``fmt`` trains with, so that the tokenizer saved beside
    the model renders conversations as they were trained (``apply_chat_template`` works on the exported model, as
    LLaMA-Factory and axolotl save theirs); text formats leave it as it is, and so do prompt / completion records
    without a ``data.chat_template`` (they may be plain text)."""
    if fmt not in CHAT_FORMATS and not (fmt in TEMPLATED_FORMATS and chat_template):
        return
    template = chat_template_for(tokenizer, chat_template)
    if template is not None:
        tokenizer.chat_template = template


def render(tokenizer: Any, messages: Sequence[Mapping[str, str]], template: str | None, prompt: bool) -> str:
    """A conversation as the chat template writes it (``prompt``: with the generation prompt after it)."""
    text = tokenizer.apply_chat_template(
        list(messages), chat_template=template, tokenize=False, add_generation_prompt=prompt
    )
    return str(text)


def chat_segments(
    messages: Sequence[Mapping[str, str]], tokenizer: Any, template: str | None
) -> list[tuple[str, bool]]:
    """A conversation as ``(text, trained)`` segments: each assistant turn's text trained, the rest not.

    The conversation is rendered up to each assistant turn with the generation prompt, and up to its end;
    what the turn adds is the assistant's. A template that rewrites earlier turns when one is added cannot be
    split this way, and the record is refused.
    """
    from jinja2 import TemplateError

    segments: list[tuple[str, bool]] = []
    done = ""
    try:
        for i, message in enumerate(messages):
            if message["role"] != TRAINED_ROLE:
                continue
            before = render(tokenizer, messages[:i], template, True) if i else ""
            after = render(tokenizer, messages[: i + 1], template, False)
            if not (before.startswith(done) and after.startswith(before)):
                raise Unusable(
                    "the chat template renders earlier turns differently once a turn is added, so the assistant's "
                    "tokens cannot be told apart (set data.chat_template)"
                )
            segments += [(before[len(done) :], False), (after[len(before) :], True)]
            done = after
        whole = render(tokenizer, messages, template, False)
    except (TemplateError, ValueError, TypeError) as e:
        raise Unusable(f"the chat template refuses it: {e}") from None
    if not whole.startswith(done):
        raise Unusable("the chat template renders the whole conversation differently from its turns")
    segments.append((whole[len(done) :], False))
    return [(text, trained) for text, trained in segments if text]


def split_at(segments: Sequence[tuple[str, bool]], at: int) -> list[tuple[str, bool, bool]]:
    """``(text, trained, after)`` segments: ``segments`` cut at character ``at``; ``after`` says which side."""
    out: list[tuple[str, bool, bool]] = []
    start = 0
    for text, trained in segments:
        end = start + len(text)
        if start < at < end:
            out += [(text[: at - start], trained, False), (text[at - start :], trained, True)]
        else:
            out.append((text, trained, start >= at))
        start = end
    return out


Plan = tuple[str, Any, Any]
"""How one record is tokenized: ``("chat", segments, None)``, ``("text", prompt or None, text)`` or
``("ids", input_ids, labels)``."""


def _plan(record: Record, tokenizer: Any, options: Encoding, template: str | None, eos: str | None) -> Plan:
    fmt = options.fmt

    def ended(text: str) -> str:  # TRL's add_eos
        return text + eos if eos and not text.endswith(eos) else text

    if fmt == "tokenized":
        ids = record["input_ids"]
        if record.get("labels") is not None:  # given: as they are (TRL leaves a labels column alone)
            return "ids", ids, record["labels"]
        mask = record.get("completion_mask")
        if mask is not None and options.completion_only_loss:
            return "ids", ids, [i if bit else IGNORE_INDEX for i, bit in zip(ids, mask, strict=True)]
        return "ids", ids, ids
    if fmt == "text":
        return "text", None, ended(record["text"])
    if fmt == "alpaca":
        prompt = prompt_of(record, options.prompts)
        return "text", prompt, prompt + ended(record["output"])
    if fmt == "prompt_completion" and isinstance(record["prompt"], str):
        return "text", record["prompt"], record["prompt"] + ended(record["completion"])
    if as_trl(tokenizer, template, options):
        return _trl_chat(record, tokenizer, template, options)
    if fmt == "prompt_completion":
        segments = chat_segments([*record["prompt"], *record["completion"]], tokenizer, template)
        from jinja2 import TemplateError

        try:
            prompt = render(tokenizer, record["prompt"], template, True)
        except (TemplateError, ValueError, TypeError) as e:
            raise Unusable(f"the chat template refuses it: {e}") from None
        whole = "".join(text for text, _ in segments)
        at = len(prompt) if whole.startswith(prompt) else len(commonpath([prompt, whole]))
        trained = [
            (text, (after or not options.completion_only_loss) and (assistant or not options.assistant_only_loss))
            for text, assistant, after in split_at(segments, at)
        ]
        return "chat", [(text, bool(flag)) for text, flag in trained if text], None
    segments = chat_segments(record["messages"], tokenizer, template)
    if not options.assistant_only_loss:
        segments = [(text, True) for text, _ in segments]
    return "chat", segments, None


def as_trl(tokenizer: Any, template: str | None, options: Encoding) -> bool:
    """Whether a conversation is tokenized as TRL tokenizes it, in one ``apply_chat_template`` call whose
    ``{% generation %}`` blocks give the assistant's tokens: always where the loss is on every token, and where it
    is on the assistant's with a template that marks them (and a fast tokenizer, whose offsets HF maps them with).
    Otherwise (``assistant_only_loss`` with a template without markers, which TRL refuses) dsbuild finds what each
    assistant turn adds by rendering the conversation turn by turn (``chat_segments``)."""
    if not options.assistant_only_loss:
        return True
    text = template if template is not None else getattr(tokenizer, "chat_template", None)
    return isinstance(text, str) and bool(_GENERATION.search(text)) and hasattr(tokenizer, "backend_tokenizer")


def _trl_chat(record: Record, tokenizer: Any, template: str | None, options: Encoding) -> Plan:
    """A conversation (or conversational prompt / completion) as TRL 1.16's ``SFTTrainer`` tokenizes it: the whole
    conversation in one ``apply_chat_template``; the loss on the assistant's marked tokens (``assistant_only_loss``)
    and, for prompt / completion, on what follows the tokens it shares with the prompt rendered with the generation
    prompt (``completion_only_loss``)."""
    from jinja2 import TemplateError

    def tokens(messages: list[Mapping[str, str]], **kwargs: Any) -> Mapping[str, Any]:
        out: Mapping[str, Any] = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, chat_template=template, **kwargs
        )
        return out

    masks: list[Sequence[int]] = []
    try:
        if options.fmt == "prompt_completion":
            prompt_ids = list(tokens(list(record["prompt"]), add_generation_prompt=True)["input_ids"])
            done = tokens(
                [*record["prompt"], *record["completion"]], return_assistant_tokens_mask=options.assistant_only_loss
            )
            ids = list(done["input_ids"])
            shared = common_prefix_length(prompt_ids, ids)
            if options.completion_only_loss:
                masks.append([0] * shared + [1] * (len(ids) - shared))
        else:
            done = tokens(list(record["messages"]), return_assistant_tokens_mask=options.assistant_only_loss)
            ids = list(done["input_ids"])
    except (TemplateError, ValueError, TypeError) as e:
        raise Unusable(f"the chat template refuses it: {e}") from None
    if options.assistant_only_loss:
        marked = list(done.get("assistant_masks") or [])
        if 1 not in marked:
            raise Unusable(
                "the chat template marks no assistant token in it ({% generation %} blocks), so nothing would be "
                "trained on"
            )
        masks.append(marked)
    labels = [i if all(bits) else IGNORE_INDEX for i, *bits in zip(ids, *masks, strict=False)]
    return "ids", ids, labels


def _token_ids(tokenizer: Any, texts: list[str], special: bool) -> list[list[int]]:
    """The ids of each text (``special``: with the tokenizer's own special tokens, as calling it on a text adds
    them), in one call: a fast tokenizer encodes the list in parallel.

    A fast tokenizer's own ``encode_batch`` gives the ids calling the tokenizer gives, without the attention
    masks and the dict per text that ``__call__`` builds (a fifth of the time of tokenizing); the first text of
    the batch is encoded both ways to make sure of it for this tokenizer.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        fast = [list(encoding.ids) for encoding in backend.encode_batch(texts, add_special_tokens=special)]
        if fast[0] == list(tokenizer(texts[:1], add_special_tokens=special)["input_ids"][0]):
            return fast
    with warnings.catch_warnings():  # T5's "This sequence already has </s>": the EOS is added as TRL adds it
        warnings.filterwarnings("ignore", message="This sequence already has")
        ids: list[list[int]] = tokenizer(texts, add_special_tokens=special)["input_ids"]
    return ids


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Leading ids ``a`` and ``b`` share (TRL's ``common_prefix_length``)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def encode(records: Sequence[Record | None], tokenizer: Any, options: Encoding) -> dict[str, list[Any]]:
    """The ``COLUMNS`` of checked records (``None``: a record already refused, which gives an empty sample)."""
    template = chat_template_for(tokenizer, options.chat_template) if options.fmt in TEMPLATED_FORMATS else None
    eos = options.eos_token if options.eos_token is not None else getattr(tokenizer, "eos_token", None)
    plans: list[Plan | str] = []
    chat_texts: list[str] = []
    texts: list[str] = []
    for record in records:
        if record is None:
            plans.append("refused")
            continue
        try:
            plan = _plan(record, tokenizer, options, template, eos)
        except Unusable as e:
            plans.append(str(e))
            continue
        plans.append(plan)
        if plan[0] == "chat":
            chat_texts += [text for text, _ in plan[1]]
        elif plan[0] == "text":
            texts += [text for text in plan[1:] if text is not None]
    chat_ids = iter(_token_ids(tokenizer, chat_texts, special=False) if chat_texts else [])
    text_ids = iter(_token_ids(tokenizer, texts, special=True) if texts else [])
    out: dict[str, list[Any]] = {name: [] for name in COLUMNS}
    for planned in plans:
        ids: list[int] = []
        labels: list[int] = []
        problem = ""
        step: Plan = ("", None, None) if isinstance(planned, str) else planned
        if isinstance(planned, str):
            problem = planned
        elif step[0] == "chat":
            for _, trained in step[1]:
                tokens = list(next(chat_ids))
                ids += tokens
                labels += tokens if trained else [IGNORE_INDEX] * len(tokens)
        elif step[0] == "text":
            prompt = list(next(text_ids)) if step[1] is not None else None
            ids = list(next(text_ids))
            shared = common_prefix_length(prompt, ids) if prompt is not None and options.completion_only_loss else 0
            labels = [IGNORE_INDEX] * shared + ids[shared:]
        else:
            ids, labels = list(step[1]), list(step[2])
        length = len(ids)
        first = next((i for i, label in enumerate(labels) if label != IGNORE_INDEX), length)
        if options.cut and length > options.max_length:
            ids, labels = ids[: options.max_length], labels[: options.max_length]
        out["input_ids"].append(ids)
        out["labels"].append(labels)
        out["length"].append(length)
        out["prompt_length"].append(first)
        # Trained labels after position 0 (a label there teaches nothing: no token comes before it).
        out["trained"].append(len(labels) - (labels[0] != IGNORE_INDEX if labels else 0) - labels.count(IGNORE_INDEX))
        out["labelled"].append(len(labels) - labels.count(IGNORE_INDEX))
        out["problem"].append(problem)
    return out


def stop_untrained(tokenizer: Any, options: Encoding) -> str | None:
    """TRL's warning, where it applies: the chat template leaves the assistant turn's end-of-turn out of what is
    trained, so the model never learns to stop (``None`` when it does not, or nothing is masked)."""
    if options.fmt not in TEMPLATED_FORMATS or not options.assistant_only_loss:
        return None
    probe = [
        {"role": "user", "content": "dummy"},
        {"role": "assistant", "content": "dummy"},
        {"role": "user", "content": "dummy"},
    ]
    try:
        segments = chat_segments(probe, tokenizer, chat_template_for(tokenizer, options.chat_template))
    except Unusable:
        return None
    trained = [text for text, flag in segments if flag]
    if trained and not trained[-1].rstrip().endswith("dummy"):
        return None
    return (
        "the chat template does not include the assistant turn's end-of-turn token in what is trained: the model "
        "may not learn to stop (the training loss still looks healthy); set assistant_only_loss = false, or use a "
        "chat template that ends the assistant's turn within it"
    )


def tokenize(
    records: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    fmt: str,
    max_length: int,
    *,
    template: str | tuple[str, str] = "alpaca",
    chat_template: str | None = None,
    train_on_prompt: bool = False,
    assistant_only_loss: bool = False,
    completion_only_loss: bool | None = None,
    eos_token: str | None = None,
) -> Tokenized:
    """Checked records (``read_records``) as samples for a causal LM; see the module docstring for the loss.

    The options are ``[data]``'s (TRL's names; ``train_on_prompt`` turns both ``*_only_loss`` off). A sample cut
    at ``max_length`` is counted in ``truncated``; one left without a trained token is dropped and counted in
    ``dropped``. A conversation the chat template refuses is an error naming the record.
    """
    prompts = TEMPLATES[template] if isinstance(template, str) else template
    completion = completion_only_loss if completion_only_loss is not None else fmt in ("prompt_completion", "alpaca")
    options = Encoding(
        fmt,
        max_length,
        prompts,
        chat_template,
        assistant_only_loss and not train_on_prompt,
        completion and not train_on_prompt,
        eos_token,
    )
    columns = encode([dict(r) for r in records], tokenizer, options)
    problems = [Problem("", f"[{i}]: {p}") for i, p in enumerate(columns["problem"]) if p]
    if problems:
        raise ConfigError(problems)
    samples = []
    for ids, labels, labelled in zip(columns["input_ids"], columns["labels"], columns["labelled"], strict=True):
        if labelled:  # TRL's rule: a sample whose every label is -100 is left out
            samples.append({"input_ids": ids, "labels": labels})
    truncated = sum(1 for length in columns["length"] if length > max_length)
    return Tokenized(samples, truncated, len(records) - len(samples))
