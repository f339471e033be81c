"""Data as TRL's SFTTrainer (1.16) prepares it: the shipped records in every format, with every packing strategy
and loss-mask option, give the ids, labels, positions and sequence lengths the real SFTTrainer and its collator
give (a differential test: TRL is not mocked, its own dataset preparation and collator run)."""

from __future__ import annotations

import itertools
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import transformers
import trl

from dsbuild.data import load, prompt_of
from dsbuild.data.batching import collate
from dsbuild.job import DataSpec
from dsbuild.job.formats import FALLBACK_CHAT_TEMPLATE

pytestmark = pytest.mark.train  # the training extra; tests/conftest.py skips it without

ROOT = Path(__file__).resolve().parents[2]
PACKINGS = [None, "bfd", "bfd_split", "wrapped"]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _records() -> dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Each format's records for dsbuild and the same records as TRL takes them, built from the shipped data (the
    demo's arithmetic and the example notes)."""
    demo = _jsonl(ROOT / "dsbuild" / "demo" / "arith_train.jsonl")[:160]
    notes = _jsonl(ROOT / "examples" / "data" / "notes.jsonl")
    pc = [{"prompt": prompt_of({"input": "", **r}, "plain"), "completion": r["output"]} for r in demo]
    conv = [
        {
            "prompt": [{"role": "user", "content": r["prompt"]}],
            "completion": [{"role": "assistant", "content": r["completion"]}],
        }
        for r in pc
    ]
    chats = []
    for i in range(0, len(demo) - 1, 2):  # ragged: a system turn on every third conversation
        a, b = pc[i], pc[i + 1]
        turns = [{"role": "system", "content": "Answer with a number."}] if i % 3 == 0 else []
        turns += [
            {"role": "user", "content": a["prompt"]},
            {"role": "assistant", "content": a["completion"]},
            {"role": "user", "content": b["prompt"] * (1 + i % 4)},
            {"role": "assistant", "content": b["completion"]},
        ]
        chats.append({"messages": turns})
    sharegpt = [
        {
            "conversations": [
                {"from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]), "value": m["content"]}
                for m in c["messages"]
            ]
        }
        for c in chats
    ]
    tokenized = []
    for n, note in enumerate(notes):
        ids = [b + 3 for b in note["text"].encode()] + [1]
        labels = [-100] * (n % 7) + ids[n % 7 :]
        tokenized.append({"input_ids": ids, "labels": labels})
    return {
        "text": (notes, notes),
        "alpaca": (demo, pc),
        "prompt_completion": (pc, pc),
        "prompt_completion_conversational": (conv, conv),
        "messages": (chats, chats),
        "sharegpt": (sharegpt, chats),
        "tokenized": (tokenized, tokenized),
    }


RECORDS = _records()
# Some samples cut or split, none cut wholly (TRL packs a sample with nothing left to train on; dsbuild leaves it out).
MAX_LENGTH = {
    "text": 64,
    "tokenized": 64,
    "alpaca": 52,
    "prompt_completion": 52,
    "prompt_completion_conversational": 104,
}
LOSS_OPTIONS = {
    "alpaca": "completion_only_loss",
    "prompt_completion": "completion_only_loss",
    "prompt_completion_conversational": "assistant_only_loss",
    "messages": "assistant_only_loss",
    "sharegpt": "assistant_only_loss",
}


def _cases() -> Iterator[Any]:
    for name in RECORDS:
        for packing in PACKINGS:
            option = LOSS_OPTIONS.get(name)
            for value in (True, False) if option else (None,):
                loss = {option: value} if option else {}
                yield pytest.param(name, packing, loss, id=f"{name}-{packing or 'unpacked'}-{loss or 'default'}")


def _tokenizer() -> Any:
    """ByT5's ids (byte + 3; EOS 1) as a fast tokenizer: TRL's assistant_only_loss needs a fast one's offsets. It
    carries dsbuild's fallback chat template, so TRL and dsbuild render chats the same way."""
    from tokenizers import Tokenizer, models

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{chr(b): b + 3 for b in range(256)}}  # ASCII data: chars = bytes
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.add_special_tokens(["<pad>", "</s>", "<unk>"])
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    tok.chat_template = FALLBACK_CHAT_TEMPLATE
    return tok


def _trl_rows(name: str, packing: str | None, loss: dict[str, bool], max_length: int) -> Any:
    from _session_common import tiny_llama
    from datasets import Dataset

    model = transformers.LlamaForCausalLM(tiny_llama())  # only its config is read: the data are prepared, not trained
    args = trl.SFTConfig(
        output_dir=tempfile.mkdtemp(),
        report_to=[],
        bf16=False,
        use_cpu=True,
        max_length=max_length,
        packing=packing is not None,
        packing_strategy=packing or "bfd",
        **loss,
    )
    trainer = trl.SFTTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(RECORDS[name][1]), processing_class=_tokenizer()
    )
    return trainer.train_dataset


def _dsbuild_rows(name: str, packing: str | None, loss: dict[str, bool], max_length: int, tmp: Path) -> Any:
    fmt = "prompt_completion" if name.startswith("prompt_completion") else name
    path = tmp / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS[name][0]), encoding="utf-8")
    options: dict[str, Any] = {"packing": packing is not None, "packing_strategy": packing or "bfd", **loss}
    if fmt == "alpaca":
        options["template"] = "plain"
    spec = DataSpec(path=path, format=fmt, max_length=max_length, **options)
    return load(spec, _tokenizer(), cache_dir=str(tmp / "cache")).train


def _lengths(positions: list[int]) -> list[int]:
    """Sequence lengths of a row from its restarting positions."""
    starts = [i for i, p in enumerate(positions) if p == 0] + [len(positions)]
    return [b - a for a, b in itertools.pairwise(starts)]


@pytest.mark.parametrize(("name", "packing", "loss"), list(_cases()))
def test_samples_equal_trl_sft_trainer(name: str, packing: str | None, loss: dict[str, bool], tmp_path: Path) -> None:
    """Every row dsbuild trains on equals the SFTTrainer's, as each collator hands it to the model."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    max_length = MAX_LENGTH.get(name, 160)
    theirs = _trl_rows(name, packing, loss, max_length)
    ours = _dsbuild_rows(name, packing, loss, max_length, tmp_path)
    assert len(ours) == len(theirs), f"{len(ours)} rows, TRL has {len(theirs)}"
    # TRL collates bfd packing padding-free (as one row per batch); the rows here are collated one at a time.
    padding_free = packing in ("bfd", "bfd_split")
    trl_collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=padding_free, return_position_ids=True)
    for i in range(len(theirs)):
        row = theirs[i]
        expected = trl_collate([row])
        got = collate([ours[i]])
        for key in ("input_ids", "labels", "position_ids"):
            assert got[key].tolist() == expected[key].tolist(), f"row {i}: {key} differs from TRL's"
        if "seq_lengths" in row:
            assert _lengths(got["position_ids"][0].tolist()) == list(row["seq_lengths"]), f"row {i}: lengths"


@pytest.mark.parametrize("packing", [None, "bfd"])
def test_padding_free_batches_equal_trl_collator(packing: str | None, tmp_path: Path) -> None:
    """A padding-free micro-batch of four rows is TRL's padding-free batch: one row, positions restarting."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    loss = {"assistant_only_loss": True}
    theirs = _trl_rows("messages", packing, loss, 160)
    ours = _dsbuild_rows("messages", packing, loss, 160, tmp_path)
    expected = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)([theirs[i] for i in range(4)])
    got = collate([ours[i] for i in range(4)], padding_free=True)
    for key in ("input_ids", "labels", "position_ids"):
        assert got[key].tolist() == expected[key].tolist(), key
