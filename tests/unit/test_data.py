"""Job data: every file type and format read the same way (through ``datasets``), the loss masked token by token,
packing that loses nothing, and bad data named by file and line before anything trains."""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import transformers

from dsbuild import ConfigError
from dsbuild._util.safe_read import count_records
from dsbuild.data import IGNORE_INDEX, check, load, pack, prompt_of, read_records, tokenize
from dsbuild.job import DataSpec
from dsbuild.job.formats import FALLBACK_CHAT_TEMPLATE, TEMPLATES

pytestmark = pytest.mark.train  # the training extra; tests/conftest.py skips it without

ALPACA = [
    {"instruction": "Add.", "input": "1 and 2", "output": "3"},
    {"instruction": "What is 2+2?", "output": "4"},
    {"instruction": "Name a colour.", "input": "", "output": "red"},
]
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "3+3?"},
    {"role": "assistant", "content": "6"},
]


@pytest.fixture(scope="module")
def tok() -> Any:
    """ByT5's byte-level tokenizer: id = byte + 3, EOS = 1, no files and no chat template."""
    return transformers.ByT5Tokenizer()


def ids(text: str) -> list[int]:
    return [b + 3 for b in text.encode()]


def write(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


def spec(path: Path | str, fmt: str = "alpaca", **options: Any) -> DataSpec:
    return DataSpec(path=path, format=fmt, **options)


def loaded(path: Path | str, tok: Any, cache: Path, fmt: str = "alpaca", **options: Any) -> Any:
    return load(spec(path, fmt, **options), tok, cache_dir=str(cache))


def samples(data: Any) -> list[dict[str, list[int]]]:
    return [dict(s) for s in data]


def error(fn: Any, *args: Any, **kwargs: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    return info.value


# -- reading without datasets (the stdlib reader scripts use) -------------------------------------------------


def test_alpaca_records_from_json_lines_and_from_an_array(tmp_path: Path) -> None:
    """JSONL and Alpaca's own JSON array read the same; a missing input is an empty one."""
    records = ALPACA[:2]
    jsonl = write(tmp_path / "a.jsonl", records)
    array = tmp_path / "a.json"
    array.write_text(json.dumps(records))
    expected = [{"instruction": "Add.", "input": "1 and 2", "output": "3"},
                {"instruction": "What is 2+2?", "input": "", "output": "4"}]  # fmt: skip
    assert read_records(jsonl, "alpaca") == read_records(array, "alpaca") == expected
    assert count_records(jsonl) == count_records(array) == 2


def test_every_bad_record_is_named(tmp_path: Path) -> None:
    """Line numbers and field names, all in one error that names the file (an empty output is not one: as in TRL,
    the model learns the end-of-sequence token from it)."""
    path = write(
        tmp_path / "bad.jsonl",
        [{"instruction": "x", "output": "y"}, {"instruction": "x"}, [1, 2], {"instruction": 3, "output": "y"},
         "", {"instruction": "x", "output": ""}],
    )  # fmt: skip
    with pytest.raises(ConfigError) as info:
        read_records(path, "alpaca")
    assert info.value.source == str(path)
    assert [str(p) for p in info.value.problems] == [
        "line 2: field 'output': expected a string, it is missing or null",
        "line 3: expected a JSON object, got list",
        "line 4: field 'instruction': expected a string, got int",
    ]
    broken = write(tmp_path / "broken.jsonl", ['{"text": "a"}', '{"text": '])
    with pytest.raises(ConfigError, match=r"line 2: invalid JSON at column 10"):
        read_records(broken, "text")
    with pytest.raises(ConfigError, match="field 'body': expected a string, it is missing or null"):
        read_records(write(tmp_path / "t.jsonl", [{"text": "a"}]), "text", text_field="body")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="the data file is empty"):
        read_records(empty, "text")


def test_bad_prompt_completion_and_tokenized_records_are_named(tmp_path: Path) -> None:
    """TRL's record shapes get the same per-line errors: wrong types, ragged lengths, bad ids."""
    path = write(
        tmp_path / "pc.jsonl",
        [{"prompt": "Q", "completion": "A"}, {"prompt": "Q"}, {"prompt": [{"role": "user", "content": "Q"}], "completion": "A"},
         {"prompt": [{"role": "user", "content": "Q"}], "completion": [{"role": "robot", "content": "A"}]},
         {"prompt": "Q", "completion": ""}],
    )  # fmt: skip
    with pytest.raises(ConfigError) as info:
        read_records(path, "prompt_completion")
    assert [str(p) for p in info.value.problems] == [
        "line 2: field 'completion': expected a string, it is missing or null",
        "line 3: field 'completion': expected a list of messages, got str",
        "line 4: completion[0].role: got 'robot', expected one of 'system', 'developer', 'user', 'assistant', 'tool'",
    ]
    path = write(
        tmp_path / "tok.jsonl",
        [{"input_ids": [5, 6, 7]}, {"input_ids": [5, True]}, {"input_ids": [5, 6], "labels": [6]},
         {"input_ids": [5, 6], "labels": [-5, 6]}, {"input_ids": [5, 6], "attention_mask": [1, 2]},
         {"input_ids": [5, 6], "labels": [6, -100]}, {"input_ids": []}],
    )  # fmt: skip
    with pytest.raises(ConfigError) as info:
        read_records(path, "tokenized")
    assert [str(p) for p in info.value.problems] == [
        "line 2: input_ids[1]: got True, expected a token id >= 0",
        "line 3: field 'labels': 1 values for 2 input_ids",
        "line 4: labels[0]: got -5, expected a token id >= 0 or -100",
        "line 5: attention_mask[1]: got 2, expected 0 or 1",
    ]  # labels with nothing trained, and no ids, are taken as TRL takes them (such a sample is left out)
    (given,) = read_records(
        write(tmp_path / "ok.jsonl", [{"input_ids": [5, 6], "attention_mask": [1, 1], "completion_mask": [0, 1]}]),
        "tokenized",
    )
    assert given == {"input_ids": [5, 6], "labels": None, "completion_mask": [0, 1]}


# -- the loss, token by token -----------------------------------------------------------------------------------


def test_alpaca_loss_is_on_the_response_and_eos_only(tok: Any) -> None:
    """Prompt tokens are labelled -100; the response and the end-of-sequence token are learnt."""
    record = {"instruction": "What is 2+2?", "input": "", "output": "4"}
    prompt = prompt_of(record, "plain")
    assert prompt == "What is 2+2?\n"
    out = tokenize([record], tok, "alpaca", max_length=64, template="plain")
    (sample,) = out.samples
    assert sample["input_ids"] == [*ids(prompt + "4"), 1]
    assert sample["labels"] == [IGNORE_INDEX] * len(ids(prompt)) + ids("4") + [1]
    assert "### Input:\n1 and 2" in prompt_of({"instruction": "Add.", "input": "1 and 2", "output": "3"})
    own = ("Q: {instruction}\nA: ", "Q: {instruction}\nWith: {input}\nA: ")
    (with_input,) = tokenize([ALPACA[0]], tok, "alpaca", max_length=64, template=own).samples
    assert with_input["input_ids"] == [*ids("Q: Add.\nWith: 1 and 2\nA: 3"), 1]
    assert with_input["labels"] == [IGNORE_INDEX] * len(ids("Q: Add.\nWith: 1 and 2\nA: ")) + ids("3") + [1]
    (everything,) = tokenize([record], tok, "alpaca", max_length=64, template="plain", train_on_prompt=True).samples
    assert everything["labels"] == everything["input_ids"]


def test_chat_loss_is_on_the_assistant_turns_only(tok: Any) -> None:
    """With assistant_only_loss, messages and sharegpt render through the fallback ChatML template and only the
    assistant turns are learnt (a slow tokenizer: the turns are found by rendering turn by turn)."""
    turns = [
        ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n", False),
        ("4<|im_end|>\n", True),
        ("<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n", False),
        ("6<|im_end|>\n", True),
    ]
    expected_labels = [
        x for text, trained in turns for x in (ids(text) if trained else [IGNORE_INDEX] * len(ids(text)))
    ]
    (sample,) = tokenize([{"messages": CHAT}], tok, "messages", max_length=256, assistant_only_loss=True).samples
    assert sample["input_ids"] == ids("".join(text for text, _ in turns))
    assert sample["labels"] == expected_labels
    sharegpt = {"conversations": [{"from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]),
                                   "value": m["content"]} for m in CHAT]}  # fmt: skip
    (shared,) = tokenize(
        read_like([sharegpt], "sharegpt"), tok, "sharegpt", max_length=256, assistant_only_loss=True
    ).samples
    assert shared == sample
    own = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    (mine,) = tokenize(
        [{"messages": CHAT[1:3]}], tok, "messages", max_length=256, chat_template=own, assistant_only_loss=True
    ).samples
    assert mine["input_ids"] == ids("user: 2+2?\nassistant: 4\n")
    assert mine["labels"] == [IGNORE_INDEX] * len(ids("user: 2+2?\nassistant: ")) + ids("4\n")
    (everything,) = tokenize([{"messages": CHAT}], tok, "messages", max_length=256, train_on_prompt=True).samples
    assert everything["labels"] == everything["input_ids"]


def read_like(records: list[dict[str, Any]], fmt: str) -> list[dict[str, Any]]:
    """Records checked the way a file's are."""
    from dsbuild.data import check_record

    out = []
    for record in records:
        checked, problem = check_record(record, fmt)
        assert problem is None, problem
        out.append(checked)
    return out


def test_a_fast_tokenizer_gives_the_ids_its_call_gives(tmp_path: Path) -> None:
    """Batches go through a fast tokenizer's own encode_batch; the ids are those of calling the tokenizer per text."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([r["instruction"] + " " + r["output"] for r in ALPACA] * 20, vocab_size=300,
                            special_tokens=["</s>"])  # fmt: skip
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>")
    out = tokenize(ALPACA, fast, "alpaca", max_length=512, template="plain")
    for record, sample in zip(ALPACA, out.samples, strict=True):
        prompt = fast(prompt_of({"input": "", **record}, "plain"), add_special_tokens=False)["input_ids"]
        response = fast(record["output"], add_special_tokens=False)["input_ids"]
        assert sample["input_ids"] == [*prompt, *response, fast.eos_token_id]


def test_the_documented_templates_are_the_ones_used() -> None:
    """docs/jobs.md shows Alpaca's two prompts and the fallback chat template exactly as the code has them."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "jobs.md").read_text(encoding="utf-8")
    shown = re.findall(r"^```(?:text|jinja)\n(.*?)^```", page, re.S | re.M)
    assert TEMPLATES["alpaca"][0] in shown and TEMPLATES["alpaca"][1] in shown
    assert FALLBACK_CHAT_TEMPLATE + "\n" in shown


def test_truncation_drops_records_whose_response_is_cut_away(tok: Any) -> None:
    """A sample longer than max_length is cut; one with no response token left is dropped and counted."""
    records = [
        {"instruction": "x" * 10, "input": "", "output": "yes"},
        {"instruction": "x" * 40, "input": "", "output": "no"},
    ]
    out = tokenize(records, tok, "alpaca", max_length=13, template="plain")
    assert (out.truncated, out.dropped, len(out.samples)) == (2, 1, 1)
    assert len(out.samples[0]["input_ids"]) == 13 and out.samples[0]["labels"][-2:] == ids("ye")
    text = tokenize([{"text": "hello"}], tok, "text", max_length=64)
    assert text.samples[0]["labels"] == text.samples[0]["input_ids"] == [*ids("hello"), 1]


# -- packing ------------------------------------------------------------------------------------------------------


def test_packing_fills_sequences_and_loses_no_token() -> None:
    """Every packed sequence fits max_length; cut at its restarting positions it gives back every sample whole."""
    lengths = [3, 17, 9, 32, 1, 30, 8, 8, 12, 2, 25, 31, 5, 16, 16, 4]
    originals = [
        {"input_ids": [100 * i + j for j in range(n)], "labels": [IGNORE_INDEX] + [100 * i + j for j in range(1, n)]}
        for i, n in enumerate(lengths)
    ]
    packed = pack(originals, max_length=32)
    assert all(len(p["input_ids"]) == len(p["labels"]) == len(p["position_ids"]) <= 32 for p in packed)
    assert len(packed) == -(-sum(lengths) // 32)  # as few sequences as the tokens need
    back = []
    for p in packed:
        starts = [i for i, position in enumerate(p["position_ids"]) if position == 0] + [len(p["input_ids"])]
        for a, b in itertools.pairwise(starts):
            assert p["position_ids"][a:b] == list(range(b - a))
            assert p["labels"][a] == IGNORE_INDEX  # not predicted from the sample before it
            back.append({"input_ids": p["input_ids"][a:b], "labels": p["labels"][a:b]})
    assert sorted(back, key=lambda s: s["input_ids"]) == sorted(originals, key=lambda s: s["input_ids"])


def test_split_and_wrapped_packing_lose_no_token() -> None:
    """bfd_split splits an overlong sample into pieces that keep every token; wrapped concatenates and cuts."""
    samples = [{"input_ids": list(range(n)), "labels": list(range(n))} for n in (70, 5, 30)]
    split = pack(samples, max_length=32, strategy="bfd_split")
    assert all(len(p["input_ids"]) <= 32 for p in split)
    assert sum(len(p["input_ids"]) for p in split) == 105
    pieces = sorted(
        len(p["input_ids"][a:b])
        for p in split
        for a, b in itertools.pairwise([i for i, x in enumerate(p["position_ids"]) if x == 0] + [len(p["input_ids"])])
    )
    assert pieces == [5, 6, 30, 32, 32]  # 70 = 32 + 32 + 6
    wrapped = pack(samples, max_length=32, strategy="wrapped")
    assert [len(p["input_ids"]) for p in wrapped] == [32, 32, 32, 9]
    assert [x for p in wrapped for x in p["input_ids"]] == [x for s in samples for x in s["input_ids"]]
    assert all(p["position_ids"] == list(range(len(p["input_ids"]))) for p in wrapped)
    assert [x for p in wrapped for x in p["labels"]] == [x for s in samples for x in s["labels"]]  # kept, as TRL


def test_packed_samples_do_not_attend_to_each_other(tok: Any) -> None:
    """A packed batch gives a Llama the same logits per sample as the samples alone: the boundaries hold."""
    torch = pytest.importorskip("torch")
    from _session_common import tiny_llama

    from dsbuild.data import collate

    config = tiny_llama(max_position_embeddings=2048)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").train()
    alone = [{"input_ids": ids(text), "labels": ids(text)} for text in ("first sample", "the second", "3rd")]
    (packed,) = pack(alone, max_length=64)
    batch = collate([packed, {**packed, "input_ids": packed["input_ids"][:5], "labels": packed["labels"][:5],
                              "position_ids": packed["position_ids"][:5]}])  # fmt: skip
    assert "attention_mask" not in batch and batch["position_ids"][1].tolist()[5:8] == [0, 0, 0]  # TRL's padding
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0]
        start = 0
        for sample in sorted(alone, key=lambda s: -len(s["input_ids"])):  # packed longest first
            n = len(sample["input_ids"])
            own = model(input_ids=torch.tensor([sample["input_ids"]])).logits[0]
            assert torch.allclose(logits[start : start + n], own, atol=1e-5)
            start += n


# -- loading through datasets: every file type ------------------------------------------------------------------


def write_all_kinds(tmp_path: Path, records: list[dict[str, str]]) -> dict[str, Path]:
    """The same records as JSON Lines, a JSON array, CSV, Parquet, Arrow, a folder of files and save_to_disk."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    full = [{"instruction": r["instruction"], "input": r.get("input", ""), "output": r["output"]} for r in records]
    kinds = {"jsonl": write(tmp_path / "d.jsonl", records), "json": tmp_path / "d.json", "csv": tmp_path / "d.csv"}
    kinds["json"].write_text(json.dumps(records, indent=1))
    with open(kinds["csv"], "w", newline="") as f:
        writer = csv.DictWriter(f, ["instruction", "input", "output"])
        writer.writeheader()
        writer.writerows(full)
    table = pa.Table.from_pylist(full)
    pq.write_table(table, tmp_path / "d.parquet")
    kinds["parquet"] = tmp_path / "d.parquet"
    with pa.ipc.new_stream(tmp_path / "d.arrow", table.schema) as stream:
        stream.write_table(table)
    kinds["arrow"] = tmp_path / "d.arrow"
    (tmp_path / "folder").mkdir()
    write(tmp_path / "folder" / "a.jsonl", records[:1])
    write(tmp_path / "folder" / "b.jsonl", records[1:])
    kinds["folder"] = tmp_path / "folder"
    datasets.Dataset.from_list(full).save_to_disk(str(tmp_path / "disk"))
    kinds["save_to_disk"] = tmp_path / "disk"
    datasets.DatasetDict(
        train=datasets.Dataset.from_list(full), test=datasets.Dataset.from_list(full[:1])
    ).save_to_disk(str(tmp_path / "splits"))
    kinds["save_to_disk splits"] = tmp_path / "splits"
    return kinds


def test_every_file_type_gives_the_same_samples(tmp_path: Path, tok: Any) -> None:
    """JSONL, JSON, CSV, Parquet, Arrow, a folder of files and save_to_disk folders load to the same samples."""
    kinds = write_all_kinds(tmp_path, ALPACA)
    expected = tokenize(read_records(kinds["jsonl"], "alpaca"), tok, "alpaca", 64, template="plain").samples
    for kind, path in kinds.items():
        data = loaded(path, tok, tmp_path / "cache", template="plain", max_length=64)
        assert samples(data.train) == expected, kind
        assert data.evaluation is None and data.note == ""
    split = loaded(kinds["save_to_disk splits"], tok, tmp_path / "cache", template="plain", eval_split="test")
    assert split.evaluation is not None and len(split.train) == 3 and len(split.evaluation) == 1


@pytest.mark.procs
def test_tokenizing_is_cached_across_processes(tmp_path: Path, tok: Any) -> None:
    """A second load, here or in a new process (another rank), reads datasets' cache instead of tokenizing again."""
    path = write(tmp_path / "d.jsonl", ALPACA * 5)
    cache = tmp_path / "cache"
    first = loaded(path, tok, cache)
    files = sorted(str(p) for p in cache.rglob("*.arrow"))
    assert len([f for f in files if Path(f).name.startswith("cache-")]) >= 2  # the check and tokenize maps wrote
    again = loaded(path, tok, cache)
    assert samples(again.train) == samples(first.train)
    script = (
        "import sys, transformers; from dsbuild.data import load; from dsbuild.job import DataSpec\n"
        f"load(DataSpec(path=sys.argv[1], format='alpaca'), transformers.ByT5Tokenizer(), cache_dir={str(cache)!r})"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(str(p) for p in cache.rglob("*.arrow")) == files  # nothing new was written


def test_eval_split_holds_out_the_same_records_every_time(tmp_path: Path, tok: Any) -> None:
    """eval_split = 0.25 holds out a quarter, drawn by the seed: the same records on every run and rank."""
    records = [{"text": f"record {i}"} for i in range(20)]
    path = write(tmp_path / "t.jsonl", records)
    first = loaded(path, tok, tmp_path / "cache", "text", eval_split=0.25)
    second = load(spec(path, "text", eval_split=0.25), tok, seed=42, cache_dir=str(tmp_path / "other"))
    assert first.evaluation is not None and second.evaluation is not None
    assert (len(first.train), len(first.evaluation)) == (15, 5)
    assert samples(first.evaluation) == samples(second.evaluation)
    assert sorted(map(str, samples(first.train) + samples(first.evaluation))) == sorted(
        str({"input_ids": [*ids(r["text"]), 1], "labels": [*ids(r["text"]), 1]}) for r in records
    )
    held_all = error(
        loaded, write(tmp_path / "one.jsonl", records[:1]), tok, tmp_path / "cache", "text", eval_split=0.5
    )
    assert str(held_all) == "data.eval_split: 0.5 of 1 records leaves none to train on"


def test_cut_and_packed_data_says_so_in_numbers(tmp_path: Path, tok: Any) -> None:
    """The note gives how many samples were cut and by how much, left out, and packed into how many sequences."""
    records = [{"instruction": "x" * n, "output": "yes"} for n in (4, 12, 30, 40)]  # 9, 17, 35 and 45 tokens
    path = write(tmp_path / "a.jsonl", records)
    data = loaded(path, tok, tmp_path / "cache", template="plain", max_length=16)
    assert data.note == (
        "3 of 4 training samples cut at max_length 16, by 1/19/29 tokens (min/median/max; the longest is 45); "
        "2 training samples left out: no token of theirs is trained on (max_length 16 cut it away, or they had none; "
        "their prompts are 31/36/41 tokens), as TRL leaves them out"
    )
    packed = loaded(path, tok, tmp_path / "cache", template="plain", max_length=16, packing=True)
    assert [len(s["input_ids"]) for s in packed.train] == [16, 16, 16, 9]  # TRL packs the untrained ones too
    assert "4 training samples packed (bfd) into 4 sequences of up to 16 tokens (89% full)" in packed.note


# -- bad data: named by file and line, before anything trains -------------------------------------------------


def test_bad_records_are_named_in_every_file_type(tmp_path: Path, tok: Any) -> None:
    """A missing field names its record (line, or [i]) and field in JSONL, CSV and Parquet alike."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = write(tmp_path / "a.jsonl", [ALPACA[0], "", {"instruction": "x", "answer": "y"}])
    e = error(check, spec(jsonl), cache_dir=str(tmp_path / "c"))
    assert e.source == str(jsonl)
    assert [str(p) for p in e.problems] == ["line 3: field 'output': expected a string, it is missing or null"]
    table = pa.Table.from_pylist([{"instruction": "a", "answer": "b"}, {"instruction": "c", "answer": "d"}])
    pq.write_table(table, tmp_path / "a.parquet")
    e = error(check, spec(tmp_path / "a.parquet"), cache_dir=str(tmp_path / "c"))
    assert [str(p) for p in e.problems] == [
        "[0]: field 'output': expected a string, it is missing or null",
        "[1]: field 'output': expected a string, it is missing or null",
        "no record has the field 'output'; the records' fields are 'instruction', 'answer' "
        "(name the file's field in [data.columns])",
    ]
    assert check(spec(tmp_path / "a.parquet", columns={"output": "answer"}), cache_dir=str(tmp_path / "c")) is None
    bad_csv = tmp_path / "a.csv"
    bad_csv.write_text('instruction,input,answer\n"two\nlines",,4\n')  # a CSV's empty field is "" (allowed)
    e = error(check, spec(bad_csv), cache_dir=str(tmp_path / "c"))
    assert next(str(p) for p in e.problems) == "line 2: field 'output': expected a string, it is missing or null"


def test_wrong_types_broken_json_and_empty_files(tmp_path: Path, tok: Any) -> None:
    """Mixed types, a line that is not JSON, an empty file: each one line, naming the file and the line."""
    mixed = write(tmp_path / "m.jsonl", [{"messages": CHAT}, {"messages": [{"role": "user", "content": ["x"]}]},
                                         {"messages": "hi"}, {"messages": [{"role": "bot", "content": "x"}]},
                                         {"messages": CHAT[:2]}])  # fmt: skip
    e = error(check, spec(mixed, "messages"), cache_dir=str(tmp_path / "c"))
    assert [str(p) for p in e.problems] == [
        "line 2: messages[0].content: expected a string, got list",
        "line 3: field 'messages': expected a list of messages, got str",
        "line 4: messages[0].role: got 'bot', expected one of 'system', 'developer', 'user', 'assistant', 'tool'",
    ]
    sharegpt = write(
        tmp_path / "s.jsonl", [{"conversations": [{"from": "human", "value": "a"}, {"from": "bot", "value": "b"}]}]
    )
    e = error(check, spec(sharegpt, "sharegpt"), cache_dir=str(tmp_path / "c"))
    assert str(e.problems[0]).startswith("line 1: conversations[1].from: got 'bot', expected one of 'system', 'human'")
    not_objects = write(tmp_path / "n.jsonl", [{"text": "a"}, [1, 2], "3"])
    e = error(check, spec(not_objects, "text"), cache_dir=str(tmp_path / "c"))
    assert [str(p) for p in e.problems] == [
        "line 2: expected a JSON object, got list",
        "line 3: expected a JSON object, got int",
    ]
    broken = write(tmp_path / "b.jsonl", [ALPACA[0], '{"instruction": "x", "output": '])
    e = error(check, spec(broken), cache_dir=str(tmp_path / "c"))
    assert (e.source, [str(p) for p in e.problems]) == (
        str(broken),
        ["line 2: invalid JSON at column 32: Expecting value"],
    )
    for name, text in (("e.jsonl", ""), ("w.jsonl", "\n  \n"), ("e.csv", ""), ("e.parquet", "")):
        (tmp_path / name).write_text(text)
        assert str(error(check, spec(tmp_path / name), cache_dir=str(tmp_path / "c"))) == (
            f"{tmp_path / name}: the data file is empty"
        )


def test_deeply_nested_json_is_refused_before_a_parser_sees_it(tmp_path: Path, tok: Any) -> None:
    """Nesting that would end the process in pyarrow (or overflow Python's parser) is one error naming the line."""
    deep = "[" * 100_000 + "]" * 100_000
    lines = tmp_path / "deep.jsonl"
    lines.write_text(json.dumps({"text": "a"}) + "\n" + '{"text": "[[[ in a string is text", "x": ' + deep + "}\n")
    array = tmp_path / "deep.json"
    array.write_text('[\n{"text": "a"},\n{"text": ' + deep + "}\n]\n")
    for path, line in ((lines, 2), (array, 3)):
        e = error(check, spec(path, "text"), cache_dir=str(tmp_path / "c"))
        assert (e.source, [str(p) for p in e.problems]) == (str(path), [f"line {line}: nested deeper than 64 levels"])
    fine = tmp_path / "fine.jsonl"
    fine.write_text(json.dumps({"text": "[" * 100 + "{" * 100}) + "\n")  # brackets in strings are text
    assert check(spec(fine, "text"), cache_dir=str(tmp_path / "c")) is None


def test_records_with_nothing_to_train_on(tmp_path: Path, tok: Any) -> None:
    """An empty text is a sample of its EOS, kept as TRL keeps it; data none of whose samples trains a token (after
    position 0) is one error for the file; all cut away gives the lengths."""
    some = write(tmp_path / "some.jsonl", [{"text": "a"}, {"text": ""}])
    assert check(spec(some, "text"), cache_dir=str(tmp_path / "c")) is None
    assert [x["input_ids"] for x in samples(loaded(some, tok, tmp_path / "c", "text").train)] == [[*ids("a"), 1], [1]]
    every = write(tmp_path / "all.jsonl", [{"text": ""}] * 8)
    e = error(loaded, every, tok, tmp_path / "c", "text")
    assert str(e).startswith(f"data.path: {every}: none of its 8 samples has a token to train on")
    long = write(tmp_path / "long.jsonl", [{"instruction": "x" * n, "output": "y" * m} for n, m in ((70, 2), (90, 5), (120, 9))])  # fmt: skip
    e = error(loaded, long, tok, tmp_path / "c", template="plain", max_length=64)
    assert str(e) == (
        f"data.path: {long}: none of its 3 samples has a token to train on (max_length 64 cuts away every token they "
        "train on: prompts are 71/91/121 tokens (min/median/max), responses 3/6/10; max_length = 131 keeps every "
        "sample whole, 122 keeps a token of each response)"
    )


def test_a_chat_template_that_cannot_be_split_is_refused(tmp_path: Path, tok: Any) -> None:
    """A template that raises, or renders earlier turns differently, is one error naming the key."""
    path = write(tmp_path / "m.jsonl", [{"messages": CHAT}])
    raising = "{{ raise_exception('roles must alternate') }}"
    e = error(loaded, path, tok, tmp_path / "c", "messages", chat_template=raising)
    assert str(e) == "data.chat_template: the chat template refuses it: roles must alternate"
    last_only = "{{ messages[-1]['content'] }}"
    e = error(loaded, path, tok, tmp_path / "c", "messages", chat_template=last_only)
    assert str(e).startswith("data.chat_template: the chat template renders earlier turns differently")


@pytest.mark.procs
def test_a_hub_id_without_the_hub_names_data_path(tmp_path: Path) -> None:
    """Offline, a hub dataset id is one clear error naming data.path, not a traceback."""
    script = (
        "from dsbuild.data import check; from dsbuild.job import DataSpec; from dsbuild import ConfigError\n"
        "try: check(DataSpec(path='someone/some-data', format='text'))\n"
        "except ConfigError as e: print(e)"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(
        "data.path: 'someone/some-data' is not a local file or folder, and the hub cannot be reached to load it"
    )


def test_collate_pads_and_masks() -> None:
    """Padding is masked out of attention and labelled -100."""
    torch = pytest.importorskip("torch")
    from dsbuild.data import collate

    batch = collate(
        [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8], "labels": [8]}], pad_token_id=0
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]  # every batch has them; padding 0, as TRL's
    assert batch["input_ids"].dtype == torch.long
    free = collate(
        [{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}, {"input_ids": [8, 9], "labels": [8, 9]}], padding_free=True
    )
    assert free["input_ids"].tolist() == [[5, 6, 7, 8, 9]] and "attention_mask" not in free
    assert free["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert free["labels"].tolist() == [[-100, 6, 7, -100, 9]]  # no sample predicted from the one before


def test_an_untrained_end_of_turn_is_warned_about(tok: Any) -> None:
    """TRL's warning: a chat template that puts the assistant's end-of-turn with the next message never teaches the
    model to stop; the fallback template trains it."""
    from dsbuild.data.tokens import Encoding, stop_untrained

    late = (
        "{% for m in messages %}{% if not loop.first %}<|end|>\n{% endif %}{{ m.role }}: {{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<|end|>\nassistant: {% endif %}"
    )
    warning = stop_untrained(tok, Encoding("messages", 64, chat_template=late, assistant_only_loss=True))
    assert warning is not None and "end-of-turn" in warning
    assert stop_untrained(tok, Encoding("messages", 64, assistant_only_loss=True)) is None
    assert stop_untrained(tok, Encoding("messages", 64, chat_template=late, assistant_only_loss=False)) is None


def test_load_of_a_job_holds_out_what_its_run_holds_out(tmp_path: Path, tok: Any) -> None:
    """load(job, tokenizer) draws an eval_split with the job's training.seed, as dsbuild train does; a DataSpec
    alone draws with 42 (training.seed's default), so another seed holds out other records."""
    from dsbuild.job import Job

    records = [{"text": f"note {i}"} for i in range(40)]
    (tmp_path / "notes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    table = {
        "model": {"config": {"model_type": "llama"}, "tokenizer": "byte"},
        "data": {"path": "notes.jsonl", "format": "text", "eval_split": 0.25},
        "training": {"seed": 7, "max_steps": 1},
        "strategy": {"config": "zero2"},
    }
    job = Job.from_dict(table, base_dir=tmp_path)
    cache = str(tmp_path / "cache")

    def held_out(data: Any) -> list[list[int]]:
        return [list(row["input_ids"]) for row in data.evaluation]

    assert held_out(load(job, tok, cache_dir=cache)) == held_out(load(job.data, tok, seed=7, cache_dir=cache))
    assert held_out(load(job.data, tok, cache_dir=cache)) != held_out(load(job, tok, cache_dir=cache))
