"""Write the demo job's data set: single-digit arithmetic questions as Alpaca instruction records.

Run once (the output is committed): python -m dsbuild.demo.make_data

Deterministic (a fixed seed), so the files are the same on every machine. No
evaluation question is in the training set as it is worded there; the same sum
may be, worded differently, so the evaluation loss falls as the model learns the
arithmetic rather than the wording (a tiny model on a CPU learns single digits
in a minute; two-digit sums take it far longer).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN, EVAL = 480, 64
"""Records in arith_train.jsonl and arith_eval.jsonl."""

QUESTIONS = ("What is {a} {op} {b}?", "Compute {a} {op} {b}.", "{a} {op} {b} = ?")
TASKS = {"+": "Add the two numbers.", "-": "Subtract the second number from the first."}


def record(rng: random.Random) -> dict[str, str]:
    """One question: the sum or difference of two digits (differences never negative)."""
    a, b = rng.randrange(10), rng.randrange(10)
    op = rng.choice("+-")
    if op == "-" and b > a:
        a, b = b, a
    answer = str(a + b if op == "+" else a - b)
    if rng.random() < 0.25:  # some records put the operands in "input", as Alpaca does
        return {"instruction": TASKS[op], "input": f"{a} and {b}", "output": answer}
    return {"instruction": rng.choice(QUESTIONS).format(a=a, op=op, b=b), "input": "", "output": answer}


def main(out: Path = HERE) -> None:
    rng = random.Random(1234)
    seen: set[str] = set()
    records: list[dict[str, str]] = []
    while len(records) < TRAIN + EVAL:
        r = record(rng)
        key = r["instruction"] + "|" + r["input"]
        if key not in seen:
            seen.add(key)
            records.append(r)
    for name, part in (("arith_train.jsonl", records[:TRAIN]), ("arith_eval.jsonl", records[TRAIN:])):
        path = out / name
        path.write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
        print(f"wrote {len(part)} records to {path}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
