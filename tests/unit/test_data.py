"""Job data: reading Alpaca and text records (every bad record named), tokenizing with the loss on responses only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dsbuild import ConfigError
from dsbuild.data import IGNORE_INDEX, prompt_of, read_records, tokenize
from dsbuild.io import count_records


class Bytes:
    """A stand-in tokenizer: one id per byte (offset 3, like ByT5), EOS = 1."""

    eos_token_id = 1

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids = [b + 3 for b in text.encode()]
        return {"input_ids": ids + ([1] if add_special_tokens else [])}


def write(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


def test_alpaca_records_from_json_lines_and_from_an_array(tmp_path: Path) -> None:
    """JSONL and Alpaca's own JSON array read the same; a missing input is an empty one."""
    records = [
        {"instruction": "Add.", "input": "1 and 2", "output": "3"},
        {"instruction": "What is 2+2?", "output": "4"},
    ]
    jsonl = write(tmp_path / "a.jsonl", records)
    array = tmp_path / "a.json"
    array.write_text(json.dumps(records))
    expected = [{"instruction": "Add.", "input": "1 and 2", "output": "3"},
                {"instruction": "What is 2+2?", "input": "", "output": "4"}]  # fmt: skip
    assert read_records(jsonl, "alpaca") == read_records(array, "alpaca") == expected
    assert count_records(jsonl) == count_records(array) == 2


def test_every_bad_record_is_named(tmp_path: Path) -> None:
    """Line numbers and field names, all in one error that names the file."""
    path = write(
        tmp_path / "bad.jsonl",
        [{"instruction": "x", "output": "y"}, {"instruction": "x"}, [1, 2], {"instruction": 3, "output": "y"},
         "", {"instruction": "x", "output": ""}],
    )  # fmt: skip
    with pytest.raises(ConfigError) as info:
        read_records(path, "alpaca")
    assert info.value.source == str(path)
    assert [str(p) for p in info.value.problems] == [
        "line 2: field 'output': expected a string, it is missing",
        "line 3: expected a JSON object, got list",
        "line 4: field 'instruction': expected a string, got int",
        "line 6: field 'output': empty (there would be nothing to learn)",
    ]
    broken = write(tmp_path / "broken.jsonl", ['{"text": "a"}', '{"text": '])
    with pytest.raises(ConfigError, match=r"line 2: invalid JSON at column 10"):
        read_records(broken, "text")
    with pytest.raises(ConfigError, match="field 'body': expected a string, it is missing"):
        read_records(write(tmp_path / "t.jsonl", [{"text": "a"}]), "text", text_field="body")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="the data file is empty"):
        read_records(empty, "text")


def test_alpaca_loss_is_on_the_response_and_eos_only() -> None:
    """Prompt tokens are labelled -100; the response and the end-of-sequence token are learnt."""
    record = {"instruction": "What is 2+2?", "input": "", "output": "4"}
    prompt = prompt_of(record, "plain")
    assert prompt == "What is 2+2?\n"
    out = tokenize([record], Bytes(), "alpaca", max_length=64, template="plain")
    (sample,) = out.samples
    n = len(prompt.encode())
    assert sample["input_ids"] == [b + 3 for b in (prompt + "4").encode()] + [1]
    assert sample["labels"] == [IGNORE_INDEX] * n + [ord("4") + 3, 1]
    assert "### Input:\n1 and 2" in prompt_of({"instruction": "Add.", "input": "1 and 2", "output": "3"})


def test_truncation_drops_records_whose_response_is_cut_away() -> None:
    """A sample longer than max_length is cut; one with no response token left is dropped and counted."""
    records = [
        {"instruction": "x" * 10, "input": "", "output": "yes"},
        {"instruction": "x" * 40, "input": "", "output": "no"},
    ]
    out = tokenize(records, Bytes(), "alpaca", max_length=13, template="plain")
    assert (out.truncated, out.dropped, len(out.samples)) == (2, 1, 1)
    assert len(out.samples[0]["input_ids"]) == 13 and out.samples[0]["labels"][-2:] == [ord("y") + 3, ord("e") + 3]
    text = tokenize([{"text": "hello"}], Bytes(), "text", max_length=64)
    assert text.samples[0]["labels"] == text.samples[0]["input_ids"] == [b + 3 for b in b"hello"] + [1]


def test_collate_pads_and_masks() -> None:
    torch = pytest.importorskip("torch")
    from dsbuild.data import collate

    batch = collate(
        [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8], "labels": [8]}], pad_token_id=0
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["input_ids"].dtype == torch.long
