"""Training data of a job: instruction (Alpaca) and plain-text records, tokenized for a causal LM.

Two halves, so that checking a job stays instant:

- reading (``read_records``, ``count_records``): JSON / JSONL files into plain
  records, every problem reported with the file, line and field; stdlib only;
- tokenizing (``tokenize``, ``collate``): records into ``input_ids`` /
  ``labels`` lists, then padded tensors per batch. Only ``collate`` imports
  torch, when it is called.

Formats:

- ``"alpaca"``: records with ``instruction``, optional ``input`` and ``output``
  (a JSON array, or JSON Lines). The prompt is built from a template and the
  loss is computed on the response only: prompt tokens get the label ``-100``,
  which the HF models' loss ignores. The response ends with the tokenizer's
  end-of-sequence token, so the model learns to stop.
- ``"text"``: JSON Lines with a text field (``text`` by default); the loss is on
  every token.

Sequences longer than ``max_length`` are cut at the end; an instruction record
whose response is cut away entirely is dropped (it would have no loss at all),
and ``Tokenized.dropped`` counts them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from .errors import ConfigError, Problem
from .job.formats import FORMATS, IGNORE_INDEX, TEMPLATES

__all__ = [
    "FORMATS",
    "IGNORE_INDEX",
    "TEMPLATES",
    "Tokenized",
    "collate",
    "prompt_of",
    "read_records",
    "tokenize",
]

# -- reading ---------------------------------------------------------------------


def _json_lines(text: str, source: str) -> Iterator[tuple[int, Any]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(
                Problem("", f"line {number}: invalid JSON at column {e.colno}: {e.msg}"), source=source
            ) from None


def _load(path: Path) -> list[tuple[str, Any]]:
    """``(where, record)`` pairs of a JSON array or JSON Lines file; ``where`` is ``line N`` or ``[i]``."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError("no such file", source=source) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, expected a data file", source=source) from None
    except UnicodeDecodeError:
        raise ConfigError(Problem("", "not UTF-8 text", "save the data as UTF-8"), source=source) from None
    except OSError as e:
        raise ConfigError(f"cannot read the file: {e.strerror or e}", source=source) from None
    stripped = text.lstrip()
    if not stripped:
        raise ConfigError("the data file is empty", source=source)
    if stripped.startswith("["):  # a JSON array (Alpaca's own alpaca_data.json)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}", source=source) from None
        return [(f"[{i}]", record) for i, record in enumerate(data)]
    return [(f"line {n}", record) for n, record in _json_lines(text, source)]


def read_records(path: str | Path, fmt: str, *, text_field: str = "text") -> list[dict[str, str]]:
    """The records of a data file, checked for ``fmt``; every bad record is reported at once (the first 10).

    ``"alpaca"`` gives ``{"instruction", "input", "output"}`` dicts (``input`` may be
    missing or empty); ``"text"`` gives ``{"text": ...}``.
    """
    if fmt not in FORMATS:
        raise ConfigError(Problem("format", f"got {fmt!r}, expected one of {', '.join(map(repr, FORMATS))}"))
    path = Path(path)
    records: list[dict[str, str]] = []
    problems: list[Problem] = []
    for where, record in _load(path):
        checked, problem = _check_record(record, fmt, text_field)
        if problem is not None:
            problems.append(Problem("", f"{where}: {problem}"))
        elif checked is not None:
            records.append(checked)
    if problems:
        more = len(problems) - 10
        shown = problems[:10] + ([Problem("", f"... and {more} more")] if more > 0 else [])
        raise ConfigError(shown, source=str(path))
    if not records:
        raise ConfigError("no records in the data file", source=str(path))
    return records


def _check_record(record: Any, fmt: str, text_field: str) -> tuple[dict[str, str] | None, str | None]:
    if not isinstance(record, Mapping):
        return None, f"expected a JSON object, got {type(record).__name__}"
    if fmt == "text":
        value = record.get(text_field)
        if not isinstance(value, str):
            got = "it is missing" if value is None else f"got {type(value).__name__}"
            return None, f"field {text_field!r}: expected a string, {got}"
        return {"text": value}, None
    out: dict[str, str] = {}
    for field, required in (("instruction", True), ("input", False), ("output", True)):
        value = record.get(field)
        if value is None and not required:
            value = ""
        if not isinstance(value, str):
            got = "it is missing" if value is None else f"got {type(value).__name__}"
            return None, f"field {field!r}: expected a string, {got}"
        out[field] = value
    if not out["output"]:
        return None, "field 'output': empty (there would be nothing to learn)"
    return out, None


def prompt_of(record: Mapping[str, str], template: str = "alpaca") -> str:
    """The prompt of an instruction record: the template filled with its instruction (and input)."""
    without, with_input = TEMPLATES[template]
    if record.get("input"):
        return with_input.format(instruction=record["instruction"], input=record["input"])
    return without.format(instruction=record["instruction"])


# -- tokenizing ------------------------------------------------------------------


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


def _ids(tokenizer: Any, text: str) -> list[int]:
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return list(ids)


def tokenize(
    records: Sequence[Mapping[str, str]], tokenizer: Any, fmt: str, max_length: int, *, template: str = "alpaca"
) -> Tokenized:
    """Records as token ids for a causal LM; ``alpaca`` records take loss on the response (and EOS) only."""
    eos = tokenizer.eos_token_id
    tail = [eos] if eos is not None else []
    samples: list[dict[str, list[int]]] = []
    truncated = dropped = 0
    for record in records:
        if fmt == "text":
            ids = _ids(tokenizer, record["text"]) + tail
            labels = list(ids)
        else:
            prompt = _ids(tokenizer, prompt_of(record, template))
            response = _ids(tokenizer, record["output"]) + tail
            ids = prompt + response
            labels = [IGNORE_INDEX] * len(prompt) + response
        if len(ids) > max_length:
            truncated += 1
            ids, labels = ids[:max_length], labels[:max_length]
        # A causal LM predicts token t from the tokens before it: a label at position 0 teaches nothing, and a
        # batch of samples without any other would make the loss NaN (0 / 0).
        if all(label == IGNORE_INDEX for label in labels[1:]):
            dropped += 1
            continue
        samples.append({"input_ids": ids, "labels": labels})
    return Tokenized(samples, truncated, dropped)


def collate(samples: Sequence[Mapping[str, Sequence[int]]], pad_token_id: int = 0) -> dict[str, Any]:
    """A batch of tensors: ids padded on the right to the longest sample, padding masked out and left out of the loss."""
    import torch

    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.full((len(samples), longest), pad_token_id, dtype=torch.long)
    labels = torch.full((len(samples), longest), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(samples), longest), dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s["input_ids"])
        ids[i, :n] = torch.tensor(s["input_ids"], dtype=torch.long)
        labels[i, :n] = torch.tensor(s["labels"], dtype=torch.long)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
