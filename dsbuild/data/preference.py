"""Preference data for DPO and reward modelling, as TRL 1.16's ``DPOTrainer`` and ``RewardTrainer`` prepare it:
records checked, tokenized and collated.

A record (TRL's preference format) has ``chosen`` and ``rejected`` and, usually, ``prompt``: all three strings
(standard) or all three lists of ``{"role", "content"}`` messages (conversational). Without ``prompt`` the prompt is
implicit: the common start of ``chosen`` and ``rejected``, cut as TRL's ``extract_prompt`` cuts it.

Tokenizing (``tokenize_pair``, TRL's ``_prepare_dataset``): a standard record's completions end with the tokenizer's EOS
(added when missing; an empty completion is its EOS alone, as TRL trains it); a conversational one is rendered with the
chat template (the prompt with the generation prompt): ``data.chat_template``, else the tokenizer's, else
``FALLBACK_CHAT_TEMPLATE`` (``tokens.chat_template_for``, the rule of every task; TRL itself fails without a template). The prompt's tokens are those ``prompt`` and ``prompt + chosen`` / ``prompt + rejected`` share
(``common_prefix_length``), the rest is each completion. With ``truncation_mode = "keep_start"`` a pair whose prompt
alone fills ``max_length`` is dropped (nothing of the completions would be left to learn from).

Collating (``collate_pairs``, TRL's ``DataCollatorForPreference``): the batch is ``[chosen rows; rejected rows]``,
``prompt + completion`` each, truncated to ``max_length`` by ``truncation_mode``, right-padded, with an
``attention_mask`` and a ``completion_mask``.

A reward job's pairs (``load_reward_data``, TRL's ``RewardTrainer._prepare_dataset``) are the same tokens joined:
``chosen_ids`` is all of ``prompt + chosen`` (its EOS, or its chat template's rendering), ``rejected_ids`` the same;
a pair either of whose sequences is longer than ``[reward] max_length`` is left out, not cut. A record's ``margin``
(a number) is carried; ``collate_scored_pairs`` (TRL's ``DataCollatorForPreference`` of the reward trainer) pads
``[chosen rows; rejected rows]`` on the right, with the margins beside them.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ..errors import ConfigError, Problem
from ..job.formats import FIELDS as FORMAT_FIELDS
from ..job.rl import TRUNCATION_MODES, DPOSpec, RewardSpec
from .records import NOTHING_TO_LEARN, Record, iter_records, read_checked
from .tokens import chat_template_for, common_prefix_length, template_key

if TYPE_CHECKING:
    from ..job.spec import DataSpec

__all__ = [
    "FIELDS",
    "check_data",
    "check_pair",
    "collate_pairs",
    "collate_scored_pairs",
    "extract_prompt",
    "load_data",
    "load_job_pairs",
    "load_job_reward_pairs",
    "load_reward_data",
    "read_pairs",
    "score_pairs",
    "tokenize_pair",
    "tokenize_pairs",
]

FIELDS: Final = FORMAT_FIELDS["preference"]


def _messages(value: Any, field: str) -> str | None:
    """What is wrong with a list of chat messages, or ``None``."""
    for i, message in enumerate(value):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            return f"{field}[{i}] is not a message with a role and a content"
        if not isinstance(message.get("content"), str):
            return f"{field}[{i}].content is {type(message.get('content')).__name__}, expected a string"
    return None


def check_pair(record: Any) -> tuple[Record | None, str | None]:
    """A preference record in TRL's shape (``prompt`` left out when implicit), or ``None`` and what is wrong."""
    if not isinstance(record, Mapping):
        return None, f"is {type(record).__name__}, expected an object with chosen and rejected"
    missing = [name for name in ("chosen", "rejected") if name not in record]
    if missing:
        return None, f"has no {' and no '.join(missing)} (a preference record: prompt, chosen, rejected)"
    present = [name for name in FIELDS if name in record]
    kinds = {name: "text" if isinstance(record[name], str) else "messages" for name in present}
    for name in present:
        value = record[name]
        if not isinstance(value, (str, list)):
            return None, f"{name} is {type(value).__name__}, expected a string or a list of messages"
        if isinstance(value, list) and (problem := _messages(value, name)) is not None:
            return None, problem
    if len(set(kinds.values())) > 1:
        return None, "mixes text and messages: prompt, chosen and rejected are all strings or all lists of messages"
    if kinds.get("chosen") == "messages" and (not record["chosen"] or not record["rejected"]):
        return None, f"chosen or rejected is an empty list of messages {NOTHING_TO_LEARN}"
    margin = record.get("margin")
    if "margin" in record and (isinstance(margin, bool) or not isinstance(margin, (int, float))):
        return None, f"margin is {type(margin).__name__}, expected a number (a reward job's margin of the pair)"
    kept = {name: record[name] for name in present}
    return (kept if margin is None else {**kept, "margin": float(margin)}), None


def read_pairs(path: str | Path) -> list[Record]:
    """The checked preference records of a JSON array or JSON Lines file; every bad one reported at once."""
    return read_checked(path, "preference", check_pair)


def extract_prompt(record: Mapping[str, Any]) -> Record:
    """TRL's ``extract_prompt``, exactly: the prompt is where ``chosen`` and ``rejected`` first differ (one character
    or message back when a space precedes it; as TRL's loop, the last index compared when one is a prefix of the
    other)."""
    chosen, rejected = record["chosen"], record["rejected"]
    idx = 0
    for idx in range(min(len(chosen), len(rejected))):
        if chosen[idx] != rejected[idx]:
            if chosen[idx - 1] == " ":
                idx -= 1
            break
    return {"prompt": chosen[:idx], "chosen": chosen[idx:], "rejected": rejected[idx:]}


def _ids(tokenizer: Any, value: str | list[Any], **template: Any) -> list[int]:
    """TRL's ``_tokenize``: a chat template for messages, the tokenizer's call for text."""
    if isinstance(value, list):
        return list(tokenizer.apply_chat_template(value, tokenize=True, return_dict=True, **template)["input_ids"])
    return list(tokenizer(text=value)["input_ids"])


def tokenize_pair(record: Mapping[str, Any], tokenizer: Any, chat_template: str | None = None) -> dict[str, list[int]]:
    """``prompt_ids``, ``chosen_ids`` and ``rejected_ids`` of one checked record, as TRL tokenizes it (module
    docstring); a conversation rendered with ``chat_template_for`` (the job's template, else the tokenizer's, else
    the fallback)."""
    pair = dict(record) if "prompt" in record else extract_prompt(record)
    if isinstance(pair["chosen"], list):
        template = {"chat_template": chat_template_for(tokenizer, chat_template)}
        prompt = _ids(tokenizer, pair["prompt"], add_generation_prompt=True, **template)
        chosen = _ids(tokenizer, pair["prompt"] + pair["chosen"], **template)
        rejected = _ids(tokenizer, pair["prompt"] + pair["rejected"], **template)
    else:
        eos = tokenizer.eos_token
        ends = {name: pair[name] if pair[name].endswith(eos) else pair[name] + eos for name in ("chosen", "rejected")}
        prompt = _ids(tokenizer, pair["prompt"])
        chosen = _ids(tokenizer, pair["prompt"] + ends["chosen"])
        rejected = _ids(tokenizer, pair["prompt"] + ends["rejected"])
    cut = min(common_prefix_length(prompt, chosen), common_prefix_length(prompt, rejected))
    return {"prompt_ids": prompt[:cut], "chosen_ids": chosen[cut:], "rejected_ids": rejected[cut:]}


def tokenize_pairs(
    records: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    *,
    max_length: int | None,
    truncation_mode: str = "keep_start",
    chat_template: str | None = None,
    source: str | Path | None = None,
) -> tuple[list[dict[str, list[int]]], int]:
    """Every record tokenized (``tokenize_pair``) and how many were dropped: with ``keep_start``, those whose prompt
    alone fills ``max_length``. A conversation the chat template cannot render is a ``ConfigError`` under the key
    that sets the template, naming the record (its file and line when ``source``, the file ``records`` came
    from, is given)."""
    from jinja2 import TemplateError

    if truncation_mode not in TRUNCATION_MODES:
        raise ConfigError(
            Problem("dpo.truncation_mode", f"got {truncation_mode!r}, expected 'keep_start' or 'keep_end'")
        )
    with warnings.catch_warnings():  # ByT5's "already has </s>": TRL's own texts end with EOS the same way
        warnings.filterwarnings("ignore", message="This sequence already has", category=UserWarning)
        pairs = []
        for i, record in enumerate(records):
            try:
                pairs.append(tokenize_pair(record, tokenizer, chat_template))
            except TemplateError as e:  # a template of the job's or the tokenizer's that refuses this conversation
                where = _where(source, i)
                message = f"{where}: the chat template cannot render this pair: {e}"
                hint = "set data.chat_template to a template that renders it"
                raise ConfigError(Problem(template_key(chat_template), message, hint)) from None
    if max_length is None or truncation_mode != "keep_start":
        return pairs, 0
    kept = [pair for pair in pairs if len(pair["prompt_ids"]) < max_length]
    return kept, len(pairs) - len(kept)


def _where(source: str | Path | None, index: int) -> str:
    """Where the ``index``-th record is: its file and line (or ``[i]``) when ``source`` is known, else ``[index]``."""
    if source is None:
        return f"[{index}]"
    for i, (where, _) in enumerate(iter_records(Path(source))):
        if i == index:
            return f"{source}: {where}"
    return f"{source}: [{index}]"


def collate_pairs(
    examples: Sequence[Mapping[str, Any]],
    *,
    pad_token_id: int,
    max_length: int | None = None,
    truncation_mode: str = "keep_start",
    pad_to_multiple_of: int | None = None,
) -> dict[str, Any]:
    """TRL's ``DataCollatorForPreference``: ``input_ids``, ``attention_mask`` and ``completion_mask`` of
    ``[chosen rows; rejected rows]``, each truncated to ``max_length`` and right-padded; the reference's
    ``ref_chosen_logps`` / ``ref_rejected_logps`` carried when the examples have them (precomputed)."""
    import torch

    rows = [e["prompt_ids"] + e["chosen_ids"] for e in examples] + [
        e["prompt_ids"] + e["rejected_ids"] for e in examples
    ]
    masks = [[0] * len(e["prompt_ids"]) + [1] * len(e["chosen_ids"]) for e in examples] + [
        [0] * len(e["prompt_ids"]) + [1] * len(e["rejected_ids"]) for e in examples
    ]
    if max_length is not None:
        cut = slice(None, max_length) if truncation_mode == "keep_start" else slice(-max_length, None)
        rows, masks = [r[cut] for r in rows], [m[cut] for m in masks]
    width = max(len(r) for r in rows)
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    out = {
        "input_ids": torch.tensor([r + [pad_token_id] * (width - len(r)) for r in rows]),
        "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
        "completion_mask": torch.tensor([m + [0] * (width - len(m)) for m in masks]),
    }
    for name in ("ref_chosen_logps", "ref_rejected_logps"):
        if name in examples[0]:
            out[name] = torch.tensor([e[name] for e in examples])
    return out


# -- a job's pairs --------------------------------------------------------------------------------------------------


def check_data(spec: DataSpec) -> None:
    """Every pair of a DPO job's training and evaluation files checked (``read_pairs``); one error per file."""
    read_pairs(spec.path)
    if spec.eval_path is not None:
        read_pairs(spec.eval_path)


Pairs = list[dict[str, list[int]]]


def load_data(spec: DataSpec, tokenizer: Any, dpo: DPOSpec | None = None) -> tuple[Pairs, Pairs | None, str]:
    """A DPO job's training and evaluation pairs checked and tokenized as TRL's ``DPOTrainer`` prepares them
    (``dpo``'s ``max_length`` and ``truncation_mode``; default TRL's), and a note of how many pairs a too-long prompt
    dropped (``""``: none)."""
    dpo = dpo or DPOSpec()
    notes: list[str] = []

    def tokenized(path: str | Path, key: str, what: str) -> list[dict[str, list[int]]]:
        records = read_pairs(path)
        pairs, dropped = tokenize_pairs(records, tokenizer, max_length=dpo.max_length,
                                        truncation_mode=dpo.truncation_mode, chat_template=spec.chat_template,
                                        source=path)  # fmt: skip
        if not pairs:
            raise ConfigError(Problem(key, f"{path}: the prompt of every one of its {len(records)} pairs fills "
                                           f"dpo.max_length = {dpo.max_length}: no pair is left to learn from"))  # fmt: skip
        if dropped:
            notes.append(f"{dropped} of {len(records)} {what} pairs dropped: the prompt alone fills "
                         f"dpo.max_length = {dpo.max_length} (TRL's keep_start)")  # fmt: skip
        return pairs

    train = tokenized(spec.path, "data.path", "training")
    evaluation = tokenized(spec.eval_path, "data.eval_path", "evaluation") if spec.eval_path is not None else None
    return train, evaluation, "; ".join(notes)


def _scored(pair: Mapping[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
    """A tokenized pair as the reward trainer holds it: the whole chosen and rejected sequences, and the margin."""
    out: dict[str, Any] = {"chosen_ids": pair["prompt_ids"] + pair["chosen_ids"],
                           "rejected_ids": pair["prompt_ids"] + pair["rejected_ids"]}  # fmt: skip
    return out if "margin" not in record else {**out, "margin": record["margin"]}


def score_pairs(
    records: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    *,
    max_length: int | None,
    chat_template: str | None = None,
    source: str | Path | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Checked records as TRL's ``RewardTrainer`` tokenizes them (``chosen_ids``, ``rejected_ids``, the ``margin``
    when a record has one) and how many were left out: those whose chosen or rejected sequence is longer than
    ``max_length``. Errors as ``tokenize_pairs``'."""
    pairs, _ = tokenize_pairs(records, tokenizer, max_length=None, chat_template=chat_template, source=source)
    scored = [_scored(p, r) for p, r in zip(pairs, records, strict=True)]
    kept = [p for p in scored if max_length is None or max(len(p["chosen_ids"]), len(p["rejected_ids"])) <= max_length]
    return kept, len(scored) - len(kept)


def load_reward_data(
    spec: DataSpec, tokenizer: Any, reward: RewardSpec | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str]:
    """A reward job's training and evaluation pairs checked and tokenized as TRL's ``RewardTrainer`` prepares them
    (module docstring), those longer than ``reward``'s ``max_length`` left out, and a note of how many were (``""``:
    none). Either every record of a file has a ``margin`` or none has (TRL's collator reads the first one's)."""
    reward = reward or RewardSpec()
    limit = reward.max_length
    notes: list[str] = []

    def tokenized(path: str | Path, key: str, what: str) -> list[dict[str, Any]]:
        records = read_pairs(path)
        with_margin = sum("margin" in r for r in records)
        if 0 < with_margin < len(records):
            raise ConfigError(Problem(key, f"{path}: {with_margin} of its {len(records)} pairs have a margin",
                                      "give every pair a margin, or none"))  # fmt: skip
        kept, dropped = score_pairs(records, tokenizer, max_length=limit, chat_template=spec.chat_template, source=path)
        if not kept:
            raise ConfigError(Problem(key, f"{path}: each of its {len(records)} pairs is longer than "
                                           f"reward.max_length = {limit} tokens: no pair is left to learn from",
                                      "raise reward.max_length"))  # fmt: skip
        if dropped:
            notes.append(f"{dropped} of {len(records)} {what} pairs left out: longer than "
                         f"reward.max_length = {limit} tokens (as TRL's RewardTrainer)")  # fmt: skip
        return kept

    train = tokenized(spec.path, "data.path", "training")
    evaluation = tokenized(spec.eval_path, "data.eval_path", "evaluation") if spec.eval_path is not None else None
    return train, evaluation, "; ".join(notes)


def load_job_pairs(job: Any, tokenizer: Any) -> tuple[Pairs, Pairs | None, str]:
    """A DPO job's pairs (``load_data`` of its ``[data]`` with its ``[dpo]``)."""
    return load_data(job.data, tokenizer, job.dpo)


def load_job_reward_pairs(job: Any, tokenizer: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str]:
    """A reward job's pairs (``load_reward_data`` of its ``[data]`` with its ``[reward]``)."""
    return load_reward_data(job.data, tokenizer, job.reward)


def collate_scored_pairs(
    examples: Sequence[Mapping[str, Any]], *, pad_token_id: int, pad_to_multiple_of: int | None = None
) -> dict[str, Any]:
    """TRL's reward collator: ``input_ids`` and ``attention_mask`` of ``[chosen rows; rejected rows]``, right-padded
    to the longest, and ``margin`` (float) when the examples have one."""
    import torch

    rows = [list(e["chosen_ids"]) for e in examples] + [list(e["rejected_ids"]) for e in examples]
    width = max(len(r) for r in rows)
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    out = {
        "input_ids": torch.tensor([r + [pad_token_id] * (width - len(r)) for r in rows]),
        "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
    }
    if "margin" in examples[0]:
        out["margin"] = torch.tensor([float(e["margin"]) for e in examples], dtype=torch.float)
    return out
