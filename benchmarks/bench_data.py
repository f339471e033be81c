"""Tokenizing a job's data: ``dsbuild.data.load`` (Hugging Face ``datasets``: JSON Lines to Arrow, every record
checked, ``Dataset.map(batched=True)`` cached) against the hand-written path it replaced (``read_records`` +
``tokenize`` over Python lists, kept below as it was).

A generated JSON Lines file of 200,000 Alpaca records (instruction, an input for a third of them, output; 40 to
400 characters each, fixed seed), the Alpaca prompt template, max_length 512. Two tokenizers: ByT5's byte-level
one (a slow, pure-Python tokenizer) and a byte-level BPE of 8,000 tokens trained on the same file with
``tokenizers`` (a fast, Rust tokenizer, as most models have). Each case runs in a fresh process; the timed work
is loading and tokenizing (imports and building the tokenizer are not counted); peak RSS is the process's (and
its map workers'). Cases alternate within a round; medians over the rounds. "first run" starts from an empty
``datasets`` cache; "cached run" is a new process on the cache the first run left.

    .venv/bin/python benchmarks/bench_data.py --rounds 3 [--records 200000] [--json benchmarks/results/data.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

WORDS = (
    "the a model data train step loss token batch learn rate layer weight value sum number add what is of to and "
    "deepspeed zero stage offload optimizer gradient memory process node rank shard split pack sequence length"
).split()


def generate(path: Path, n: int, seed: int = 0) -> None:
    """``n`` Alpaca records, one per line."""
    rng = random.Random(seed)

    def sentence(low: int, high: int) -> str:
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < rng.randint(low, high):
            words.append(rng.choice(WORDS))
        return " ".join(words).capitalize() + "."

    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            record = {"instruction": sentence(20, 120), "input": sentence(10, 80) if i % 3 == 0 else "",
                      "output": sentence(10, 200)}  # fmt: skip
            f.write(json.dumps(record) + "\n")


def train_bpe(data: Path, where: Path) -> None:
    """A byte-level BPE tokenizer trained on the data, saved as a transformers tokenizer folder."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train([str(data)], vocab_size=8000, special_tokens=["<pad>", "</s>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(str(where))


# -- the hand-written path dsbuild had before issue 13 (dsbuild/data.py), unchanged but for its error messages ------

IGNORE_INDEX = -100
_HEAD = "Below is an instruction that describes a task{with_input}. Write a response that appropriately completes the request.\n\n"  # fmt: skip
TEMPLATES = {
    "alpaca": (
        _HEAD.format(with_input="") + "### Instruction:\n{instruction}\n\n### Response:\n",
        _HEAD.format(with_input=", paired with an input that provides further context")
        + "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n",
    )
}


def _json_lines(text: str) -> Iterator[tuple[int, Any]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield number, json.loads(line)


def old_read_records(path: Path, fmt: str) -> list[dict[str, str]]:
    text = path.read_text(encoding="utf-8-sig")
    records = []
    for _, record in _json_lines(text):
        out: dict[str, str] = {}
        for field, required in (("instruction", True), ("input", False), ("output", True)):
            value = record.get(field)
            if value is None and not required:
                value = ""
            if not isinstance(value, str):
                raise ValueError(f"field {field!r}")
            out[field] = value
        if not out["output"]:
            raise ValueError("empty output")
        records.append(out)
    return records


def old_prompt_of(record: Mapping[str, str], template: str = "alpaca") -> str:
    without, with_input = TEMPLATES[template]
    if record.get("input"):
        return with_input.format(instruction=record["instruction"], input=record["input"])
    return without.format(instruction=record["instruction"])


def old_tokenize(records: Sequence[Mapping[str, str]], tokenizer: Any, max_length: int) -> list[dict[str, list[int]]]:
    def ids_of(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    eos = tokenizer.eos_token_id
    tail = [eos] if eos is not None else []
    samples = []
    for record in records:
        prompt = ids_of(old_prompt_of(record))
        response = ids_of(record["output"]) + tail
        ids = prompt + response
        labels = [IGNORE_INDEX] * len(prompt) + response
        if len(ids) > max_length:
            ids, labels = ids[:max_length], labels[:max_length]
        if all(label == IGNORE_INDEX for label in labels[1:]):
            continue
        samples.append({"input_ids": ids, "labels": labels})
    return samples


# -- one case, in a fresh process --------------------------------------------------------------------------------


def child(case: str, data: Path, tokenizer_dir: str, cache: Path, num_proc: int) -> None:
    from transformers import AutoTokenizer, ByT5Tokenizer

    tokenizer = ByT5Tokenizer() if tokenizer_dir == "byte" else AutoTokenizer.from_pretrained(tokenizer_dir)
    started = time.perf_counter()
    if case == "hand-written":
        n = len(old_tokenize(old_read_records(data, "alpaca"), tokenizer, 512))
    else:
        from dsbuild.data import load
        from dsbuild.job import DataSpec

        spec = DataSpec(path=data, format="alpaca", max_length=512, num_proc=num_proc if num_proc > 1 else None)
        done = load(spec, tokenizer, cache_dir=str(cache))
        n = len(done.train)
    seconds = time.perf_counter() - started
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"seconds": seconds, "samples": n, "peak_mib": max(own, workers) / 1024}))


def run_case(case: str, data: Path, tokenizer_dir: str, cache: Path, num_proc: int) -> dict[str, Any]:
    env = {**os.environ, "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    done = subprocess.run(
        [sys.executable, __file__, "--child", case, "--data", str(data), "--tokenizer", tokenizer_dir,
         "--cache", str(cache), "--num-proc", str(num_proc)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{case} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child")
    parser.add_argument("--data", type=Path)
    parser.add_argument("--tokenizer")
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--num-proc", type=int, default=1)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.data, args.tokenizer, args.cache, args.num_proc)
        return

    root = Path(tempfile.mkdtemp(prefix="bench_data_"))
    try:
        data = root / "alpaca.jsonl"
        generate(data, args.records)
        print(f"{args.records} records, {data.stat().st_size / 2**20:.1f} MiB of JSON Lines")
        train_bpe(data, root / "bpe")
        tokenizers = {"byte (ByT5, slow)": "byte", "BPE 8k (fast)": str(root / "bpe")}
        cases = ["hand-written", "dsbuild first run", "dsbuild cached run", "dsbuild first run, num_proc 2"]
        samples: dict[str, dict[str, list[dict[str, Any]]]] = {t: {c: [] for c in cases} for t in tokenizers}
        for i in range(args.rounds):
            for label, tokenizer_dir in tokenizers.items():
                cache = root / f"cache{i}-{tokenizer_dir == 'byte'}"
                for case in cases:
                    where = cache if "num_proc" not in case else root / f"cache{i}-np-{tokenizer_dir == 'byte'}"
                    result = run_case(case, data, tokenizer_dir, where, 2 if "num_proc" in case else 1)
                    result["records_per_s"] = args.records / result["seconds"]
                    samples[label][case].append(result)
                    print(f"round {i + 1}: {label}: {case}: {result['seconds']:.2f} s, "
                          f"{result['records_per_s']:,.0f} records/s, {result['peak_mib']:.0f} MiB, {result['samples']} samples")  # fmt: skip
                shutil.rmtree(cache, ignore_errors=True)
        medians = {
            t: {c: {k: statistics.median(r[k] for r in runs) for k in ("seconds", "records_per_s", "peak_mib")}
                for c, runs in by_case.items()}
            for t, by_case in samples.items()
        }  # fmt: skip
        print()
        for label, by_case in medians.items():
            base = by_case["hand-written"]
            for case, m in by_case.items():
                print(f"{label:<18} {case:<30} {m['seconds']:7.2f} s {m['records_per_s']:10,.0f} records/s "
                      f"{m['peak_mib']:7.0f} MiB   x{m['records_per_s'] / base['records_per_s']:.2f} speed, "
                      f"x{m['peak_mib'] / base['peak_mib']:.2f} memory")  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps({"records": args.records, "rounds": args.rounds, "samples": samples,
                                             "medians": medians}, indent=1))  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
