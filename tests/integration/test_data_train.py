"""Every data format and file type trains: loaded and tokenized by ``dsbuild.data``, stepped by a real DeepSpeed
engine on CPU; a chat job with packing and a held-out split runs end to end; with several ranks the first of each
node tokenizes and the others read its cache."""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import pytest
import transformers
from _session_common import tiny_llama

from dsbuild import Config
from dsbuild.data import collate, load
from dsbuild.job import DataSpec
from dsbuild.job.formats import FALLBACK_CHAT_TEMPLATE
from dsbuild.outputs.history import read as read_history
from dsbuild.session import Session
from dsbuild.session.distributed import free_port

pytestmark = [
    pytest.mark.train,
    pytest.mark.engine,
    pytest.mark.procs,
]  # the training extra; tests/conftest.py skips it without

QUESTIONS = [(f"What is {a} + {b}?", str(a + b)) for a in range(6) for b in range(4)]


def records(fmt: str) -> list[dict[str, Any]]:
    """The same 24 question-answer pairs in each format."""
    if fmt == "text":
        return [{"text": f"{q} {a}"} for q, a in QUESTIONS]
    if fmt == "alpaca":
        return [{"instruction": q, "input": "", "output": a} for q, a in QUESTIONS]
    if fmt == "messages":
        return [
            {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in QUESTIONS
        ]
    if fmt == "prompt_completion":
        return [{"prompt": q, "completion": " " + a} for q, a in QUESTIONS]
    if fmt == "conversational":  # TRL's conversational prompt-completion
        return [
            {"prompt": [{"role": "user", "content": q}], "completion": [{"role": "assistant", "content": a}]}
            for q, a in QUESTIONS
        ]
    if fmt == "tokenized":
        return [
            {
                "input_ids": [b + 3 for b in f"{q} {a}".encode()] + [1],
                "labels": [-100] * len(q.encode()) + [b + 3 for b in f" {a}".encode()] + [1],
            }
            for q, a in QUESTIONS
        ]
    return [{"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]} for q, a in QUESTIONS]


def write(folder: Path, fmt: str, kind: str) -> Path:
    rows = records(fmt)
    if kind == "jsonl":
        path = folder / f"{fmt}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        path = folder / f"{fmt}.json"
        path.write_text(json.dumps(rows))
    elif kind == "csv":
        path = folder / f"{fmt}.csv"
        datasets.Dataset.from_list(rows).to_csv(str(path), index=False)
    elif kind == "parquet":
        path = folder / f"{fmt}.parquet"
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    elif kind == "arrow":
        import pyarrow as pa

        path = folder / f"{fmt}.arrow"
        table = pa.Table.from_pylist(rows)
        with pa.ipc.new_stream(path, table.schema) as stream:
            stream.write_table(table)
    else:  # save_to_disk
        path = folder / f"{fmt}_disk"
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


CASES = [
    ("text", "jsonl", {}),
    ("text", "parquet", {"packing": True}),
    ("alpaca", "csv", {"template": "plain"}),
    ("alpaca", "json", {"eval_split": 0.25}),
    ("alpaca", "arrow", {"template": "plain", "train_on_prompt": True}),
    ("messages", "jsonl", {"packing": True, "eval_split": 0.25}),
    ("messages", "save_to_disk", {}),
    ("sharegpt", "json", {}),
    ("sharegpt", "parquet", {"train_on_prompt": True}),
    ("prompt_completion", "jsonl", {"packing": True, "packing_strategy": "bfd_split"}),
    ("conversational", "parquet", {"padding_free": True}),
    ("tokenized", "jsonl", {"packing": True, "packing_strategy": "wrapped"}),
]


def test_every_format_and_file_type_trains(tmp_path: Path) -> None:
    """Each format from each kind of file loads, and a DeepSpeed engine takes finite, falling steps on it."""
    tokenizer = transformers.ByT5Tokenizer()
    session = Session.from_pretrained(
        tiny_llama(max_position_embeddings=256), Config.zero(2).adamw(lr=3e-3).batch(micro=8)
    )
    for fmt, kind, options in CASES:
        length = {"alpaca": 192, "messages": 96, "sharegpt": 96, "conversational": 96}.get(
            fmt, 64
        )  # Alpaca's prompt is 154 bytes
        fmt_name = "prompt_completion" if fmt == "conversational" else fmt
        spec = DataSpec(path=write(tmp_path, fmt, kind), format=fmt_name, max_length=length, **options)
        data = load(spec, tokenizer, cache_dir=str(tmp_path / "cache"))
        assert len(data.train) >= (5 if spec.packing else 18), (fmt, kind, data.note)
        batch = collate(list(data.train)[:8], pad_token_id=0, padding_free=spec.padding_free)
        losses = [session.step(batch).loss for _ in range(3)]
        assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], (fmt, kind, losses)
        if data.evaluation is not None:
            assert len(data.evaluation) >= 1
            assert math.isfinite(session.evaluate(data.evaluation, collate_fn=collate)["eval_loss"])


def chat_job(tiny_job: Callable[..., Path], tmp_path: Path, **data: Any) -> Path:
    """conftest's tiny job on chat records (``messages.jsonl``), ``data`` added to ``[data]``: 4 steps, evaluated
    every 2, trained into ``tmp_path / "run"``."""
    write(tmp_path, "messages", "jsonl")
    return tiny_job(
        data={"path": "messages.jsonl", "format": "messages", "max_length": 128, **data},
        training={"output_dir": str(tmp_path / "run"), "learning_rate": 3e-3, "max_steps": 4, "save_steps": 4,
                  "eval_steps": 2, "logging_steps": 1},
        name="chat.toml",
    )  # fmt: skip


def env(tmp_path: Path, **more: str) -> dict[str, str]:
    full = {**os.environ, "DS_ACCELERATOR": "cpu", "HF_DATASETS_CACHE": str(tmp_path / "hf"), **more}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        full.pop(key, None)
    return full


@pytest.mark.slow
def test_a_packed_chat_job_with_a_held_out_split_trains_and_evaluates(
    tmp_path: Path, tiny_job: Callable[..., Path]
) -> None:
    """`dsbuild train` on chat records, packed, 25 % held out: the note says what was packed, evaluation is logged."""
    job = chat_job(tiny_job, tmp_path, packing=True, eval_split=0.25)
    done = subprocess.run(
        [sys.executable, "-m", "dsbuild", "train", str(job)],
        capture_output=True,
        text=True,
        env=env(tmp_path),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (
        "18 training samples packed (bfd) into" in done.stderr
        and "6 evaluation samples packed (bfd) into" in done.stderr
    )
    history = read_history(tmp_path / "run" / "history.jsonl")
    assert [h["step"] for h in history if h.get("eval_loss") is not None] == [2, 4]
    # The exported tokenizer renders conversations with the template the job trained with (ByT5 has none).
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "run" / "model")
    chat = [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]
    trained = transformers.ByT5Tokenizer().apply_chat_template(
        chat, chat_template=FALLBACK_CHAT_TEMPLATE, tokenize=False
    )
    assert exported.apply_chat_template(chat, tokenize=False) == trained


@pytest.mark.slow
def test_the_first_rank_of_a_node_tokenizes_and_the_other_reads_its_cache(
    tmp_path: Path, tiny_job: Callable[..., Path]
) -> None:
    """Two ranks started by torchrun without the launcher's preflight: only rank 0 runs the map."""
    job = chat_job(tiny_job, tmp_path)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
        "--tee", "3", "-m", "dsbuild.cli.rank", str(job),
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, env=env(tmp_path, DATASETS_VERBOSITY="info"), timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = done.stdout + done.stderr
    rank1 = [line for line in output.splitlines() if line.startswith("[default1]")]
    assert any("Loading cached processed dataset" in line for line in rank1), output[-3000:]
    assert not any("dsbuild: tokenizing" in line or "Caching processed dataset" in line for line in rank1)
