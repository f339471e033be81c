"""Records: each checked against its format and put in one shape, every problem named; JSON / JSON Lines files read
without ``datasets`` (stdlib only).

The shape of a checked record (``check_record``):

- ``"text"``: ``{"text": str}``;
- ``"alpaca"``: ``{"instruction": str, "input": str, "output": str}`` (a missing ``input`` is ``""``);
- ``"messages"`` and ``"sharegpt"``: ``{"messages": [{"role": str, "content": str}, ...]}`` (ShareGPT's ``from``
  values become chat roles);
- ``"prompt_completion"``: ``{"prompt": str, "completion": str}``, or both lists of messages (TRL's
  conversational prompt-completion);
- ``"tokenized"``: ``{"input_ids": [int, ...], "labels": [int, ...]}`` (the ids as labels when the record has
  none; an ``attention_mask`` is checked and left out, as TRL leaves it).

``[data.columns]`` gives a file's own names for the fields; messages name the file's fields.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TextIO

import attrs

from .._util.safe_read import check_json_depth
from ..errors import ConfigError, Problem
from ..job.formats import FORMATS, IGNORE_INDEX, ROLES, SHAREGPT_ROLES, TEMPLATES

__all__ = [
    "NOTHING_TO_LEARN",
    "Checker",
    "Record",
    "check_record",
    "first_text",
    "iter_records",
    "json_lines_where",
    "no_sample_left",
    "prompt_of",
    "read_checked",
    "read_records",
]

Record = dict[str, Any]
"""A checked record, in the shape of its format (see the module docstring)."""

NOTHING_TO_LEARN: Final = "(there would be nothing to learn)"
"""Ends the message of a record that is well formed but has no token to train on."""

SHOWN: Final = 10
"""Bad records listed in an error; the rest are counted."""

_WHOLE_FILE_HINT: Final = (
    "check the text / output fields are not empty, and that max_length leaves room for the response"
)


def check_record(
    record: Any, fmt: str, columns: Mapping[str, str] | None = None, vocab_size: int | None = None
) -> tuple[Record | None, str | None]:
    """``(checked record, None)``, or ``(None, what is wrong)`` naming the field as the file names it.

    ``vocab_size``: the model's; a ``"tokenized"`` record's ids and labels must be below it (an id past the
    embedding would end the run in its first step)."""
    names = columns or {}
    if not isinstance(record, Mapping):
        return None, f"expected a JSON object, got {_type(record)}"
    if fmt == "text":
        field = names.get("text", "text")
        text, problem = _string(record, field)
        return ({"text": text}, None) if problem is None else (None, problem)
    if fmt == "alpaca":
        out: Record = {}
        for key, required in (("instruction", True), ("input", False), ("output", True)):
            field = names.get(key, key)
            value, problem = _string(record, field, required=required)
            if problem is not None:
                return None, problem
            out[key] = value
        return out, None
    if fmt == "prompt_completion":
        return _check_prompt_completion(record, names)
    if fmt == "tokenized":
        return _check_tokenized(record, names, vocab_size)
    return _check_chat(record, fmt, names)


def _check_chat(record: Mapping[str, Any], fmt: str, names: Mapping[str, str]) -> tuple[Record | None, str | None]:
    list_key, role_key, content_key = ("messages", "role", "content") if fmt == "messages" else ("conversations", "from", "value")  # fmt: skip
    field = names.get(list_key, list_key)
    known: Mapping[str, str] = SHAREGPT_ROLES if fmt == "sharegpt" else {r: r for r in ROLES}
    what = "messages" if fmt == "messages" else "turns"
    messages, problem = _turns(record.get(field), field, what, names.get(role_key, role_key), names.get(content_key, content_key), known)  # fmt: skip
    if problem is not None:
        return None, problem
    return {"messages": messages}, None


def _turns(
    turns: Any, field: str, what: str, role_field: str, content_field: str, known: Mapping[str, str]
) -> tuple[list[dict[str, str]], str | None]:
    """The turns of a conversation as ``{"role", "content"}`` messages, or what is wrong with the first bad one."""
    if not isinstance(turns, list):
        got = "it is missing or null" if turns is None else f"got {_type(turns)}"
        return [], f"field {field!r}: expected a list of {what}, {got}"
    messages = []
    for i, turn in enumerate(turns):
        where = f"{field}[{i}]"
        if not isinstance(turn, Mapping):
            return [], f"{where}: expected an object with {role_field!r} and {content_field!r}, got {_type(turn)}"
        role = turn.get(role_field)
        if role not in known:
            got = "it is missing or null" if role is None else f"got {role!r}"
            return [], f"{where}.{role_field}: {got}, expected one of {', '.join(map(repr, known))}"
        content = turn.get(content_field)
        if not isinstance(content, str):
            got = "it is missing or null" if content is None else f"got {_type(content)}"
            return [], f"{where}.{content_field}: expected a string, {got}"
        messages.append({"role": known[str(role)], "content": content})
    return messages, None


def _check_prompt_completion(record: Mapping[str, Any], names: Mapping[str, str]) -> tuple[Record | None, str | None]:
    """TRL's prompt-completion record: two strings (standard), or two lists of messages (conversational)."""
    prompt_field, completion_field = names.get("prompt", "prompt"), names.get("completion", "completion")
    prompt, completion = record.get(prompt_field), record.get(completion_field)
    if isinstance(prompt, list) or isinstance(completion, list):
        roles = {r: r for r in ROLES}
        out: Record = {}
        for key, field, value in (("prompt", prompt_field, prompt), ("completion", completion_field, completion)):
            messages, problem = _turns(value, field, "messages", "role", "content", roles)
            if problem is not None:
                return None, problem
            out[key] = messages
        return out, None
    text, problem = _string(record, prompt_field)
    if problem is not None:
        return None, problem
    answer, problem = _string(record, completion_field)
    if problem is not None:
        return None, problem
    return {"prompt": text, "completion": answer}, None


def _ids(value: Any, field: str, allowed: str = "ids", vocab_size: int | None = None) -> tuple[list[int], str | None]:
    if not isinstance(value, list):
        got = "it is missing or null" if value is None else f"got {_type(value)}"
        return [], f"field {field!r}: expected a list of integers, {got}"
    for i, item in enumerate(value):
        ok = isinstance(item, int) and not isinstance(item, bool)
        if ok and allowed == "ids":
            ok = item >= 0
        elif ok and allowed == "labels":
            ok = item >= 0 or item == IGNORE_INDEX
        elif ok and allowed == "mask":
            ok = item in (0, 1)
        if ok and vocab_size is not None and allowed in ("ids", "labels"):
            ok = item < vocab_size
        if not ok:
            below = f" and below the model's vocab_size {vocab_size}" if vocab_size is not None else ""
            expected = {"ids": f"a token id >= 0{below}", "labels": f"a token id >= 0{below} or -100"}.get(
                allowed, "0 or 1"
            )
            return [], f"{field}[{i}]: got {item!r}, expected {expected}"
    return list(value), None


def _check_tokenized(
    record: Mapping[str, Any], names: Mapping[str, str], vocab_size: int | None = None
) -> tuple[Record | None, str | None]:
    """An already tokenized record (TRL's tokenized form): ``input_ids``, and ``labels``, ``completion_mask`` and
    ``attention_mask`` of the same length where given (``labels`` ``None`` when not: ``data.tokens`` makes them)."""
    ids_field = names.get("input_ids", "input_ids")
    ids, problem = _ids(record.get(ids_field), ids_field, "ids", vocab_size)
    if problem is not None:
        return None, problem
    out: Record = {"input_ids": ids, "labels": None}
    for key, allowed in (("labels", "labels"), ("completion_mask", "mask"), ("attention_mask", "mask")):
        field = names.get(key, key)
        if record.get(field) is None:
            continue
        values, problem = _ids(record[field], field, allowed, vocab_size)
        if problem is not None:
            return None, problem
        if len(values) != len(ids):
            return None, f"field {field!r}: {len(values)} values for {len(ids)} input_ids"
        if key != "attention_mask":  # TRL's collator makes its own
            out[key] = values
    return out, None


def _string(record: Mapping[str, Any], field: str, *, required: bool = True) -> tuple[str, str | None]:
    value = record.get(field)
    if value is None and not required:
        return "", None
    if not isinstance(value, str):
        got = "it is missing or null" if value is None else f"got {_type(value)}"
        return "", f"field {field!r}: expected a string, {got}"
    return value, None


def _type(value: Any) -> str:
    return type(value).__name__


@attrs.define
class Checker:
    """Checks records one by one and keeps what an error needs: the first bad ones, how many, how many empty."""

    fmt: str
    columns: Mapping[str, str] = attrs.field(factory=dict)
    records: int = 0
    bad: list[tuple[int, str]] = attrs.field(factory=list)
    """``(index, problem)`` of the first ``SHOWN`` bad records."""
    more: int = 0
    """Bad records past those."""
    empty: int = 0
    """Records well formed but with nothing to learn."""

    def check(self, record: Any) -> Record | None:
        """``record`` checked (``None`` when it is bad, and counted)."""
        checked, problem = check_record(record, self.fmt, self.columns)
        self.add(problem)
        return checked

    def add(self, problem: str | None) -> None:
        """Count the next record, bad when ``problem`` says what is wrong with it."""
        if problem:
            if problem.endswith(NOTHING_TO_LEARN):
                self.empty += 1
            if len(self.bad) < SHOWN:
                self.bad.append((self.records, problem))
            else:
                self.more += 1
        self.records += 1

    def raise_if_bad(
        self, source: str, where: Callable[[int], str], key: str = "data.path", extra: Sequence[Problem] = ()
    ) -> None:
        """A ``ConfigError`` naming every bad record (``where(index)``: ``line 3``) and then ``extra``, or the whole
        file when none of its records has anything to learn."""
        if not self.records:
            raise ConfigError("no records in the data", source=source)
        if self.empty == self.records:
            raise no_sample_left(source, self.records, key)
        if self.bad:
            problems = [Problem("", f"{where(index)}: {problem}") for index, problem in self.bad]
            if self.more:  # a hint on the last one shown, so that the count of errors is the count of records shown
                last = problems[-1]
                problems[-1] = Problem(last.path, last.message, f"and {self.more} more bad records after it")
            raise ConfigError([*problems, *extra], source=source)


def no_sample_left(source: str, samples: int, key: str, hint: str | None = None) -> ConfigError:
    """The error for data of which no sample has a token to train on (a run on it would only give NaN losses)."""
    return ConfigError(
        Problem(key, f"{source}: none of its {samples} samples has a token to train on", hint or _WHOLE_FILE_HINT)
    )


def prompt_of(record: Mapping[str, str], template: str | tuple[str, str] = "alpaca") -> str:
    """The prompt of an instruction record: the template (a name or the pair of prompts) filled with its fields."""
    without, with_input = TEMPLATES[template] if isinstance(template, str) else template
    if record.get("input"):
        return with_input.format(instruction=record["instruction"], input=record["input"])
    return without.format(instruction=record["instruction"])


# -- JSON and JSON Lines without datasets ----------------------------------------------------------------------


def read_records(
    path: str | Path, fmt: str, *, text_field: str = "text", columns: Mapping[str, str] | None = None
) -> list[Record]:
    """The checked records of a JSON array or JSON Lines file; every bad record is reported at once (the first 10).

    Stdlib only: what ``datasets`` loads for a job, this reads for a script of your own (and for an error that
    must name the line ``datasets`` could not parse).
    """
    if fmt not in FORMATS:
        raise ConfigError(Problem("format", f"got {fmt!r}, expected one of {', '.join(map(repr, FORMATS))}"))
    names = {"text": text_field, **(columns or {})}
    checker = Checker(fmt, names)
    records: list[Record] = []
    wheres: list[str] = []
    for where, record in iter_records(Path(path)):
        wheres.append(where)
        checked = checker.check(record)
        if checked is not None:
            records.append(checked)
    checker.raise_if_bad(str(path), wheres.__getitem__)
    return records


def read_checked(path: str | Path, fmt: str, check: Callable[[Any], tuple[Record | None, str | None]]) -> list[Record]:
    """The records of a JSON array or JSON Lines file that ``check`` accepts (``(record, None)`` or ``(None, what is
    wrong)``); every bad one reported at once, by its line (``Checker``). The reader of DPO's pairs and GRPO's
    prompts."""
    checker = Checker(fmt)
    records: list[Record] = []
    wheres: list[str] = []
    for where, record in iter_records(Path(path)):
        wheres.append(where)
        checked, problem = check(record)
        checker.add(problem)
        if checked is not None:
            records.append(checked)
    checker.raise_if_bad(str(path), wheres.__getitem__)
    return records


def first_text(f: TextIO, source: str) -> str:
    """The first character of a text file that is not blank (``"["`` for a JSON array); ``ConfigError`` if none."""
    while chunk := f.read(4096):
        if stripped := chunk.lstrip():
            return stripped[0]
    raise ConfigError("the data file is empty", source=source)


def iter_records(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` pairs of a JSON array or JSON Lines file; ``where`` is ``line N`` or ``[i]``."""
    source = str(path)
    try:
        check_json_depth(path)
        with open(path, encoding="utf-8-sig") as f:
            head = first_text(f, source)
            f.seek(0)
            if head == "[":  # a JSON array (Alpaca's own alpaca_data.json)
                try:
                    data = json.load(f)
                except json.JSONDecodeError as e:
                    raise ConfigError(
                        f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}", source=source
                    ) from None
                if not isinstance(data, list):
                    raise ConfigError(f"expected a JSON array of records, got {_type(data)}", source=source)
                yield from ((f"[{i}]", record) for i, record in enumerate(data))
                return
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    yield f"line {number}", json.loads(line.rstrip("\r\n"))
                except json.JSONDecodeError as e:
                    raise ConfigError(
                        Problem("", f"line {number}: invalid JSON at column {e.colno}: {e.msg}"), source=source
                    ) from None
    except FileNotFoundError:
        raise ConfigError("no such file", source=source) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, expected a data file", source=source) from None
    except UnicodeDecodeError:
        raise ConfigError(Problem("", "not UTF-8 text", "save the data as UTF-8"), source=source) from None
    except OSError as e:
        raise ConfigError(f"cannot read the file: {e.strerror or e}", source=source) from None


def json_lines_where(path: Path, indices: list[int]) -> dict[int, str]:
    """``line N`` of the records at ``indices`` of a JSON Lines file (blank lines hold no record)."""
    wanted = set(indices)
    found: dict[int, str] = {}
    index = 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if index in wanted:
                found[index] = f"line {number}"
                if len(found) == len(wanted):
                    break
            index += 1
    return found
