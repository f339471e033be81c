"""Write the RLHF chain's data beside this script: ``python examples/rlhf/make_data.py`` (the files are in the repo;
this is how they were made, and the suite checks that it still makes them).

The preference a tiny model learns in a few dozen steps: answers are short made-up words, and a word with more
``a``'s in it is better. ``demonstrations.jsonl`` (SFT: prompt / completion) teaches the words' shape, about one
letter in six an ``a``; ``pairs.jsonl`` and ``pairs_eval.jsonl`` (the reward model: prompt / chosen / rejected)
are two words of one length, the chosen one with more ``a``'s; ``prompts.jsonl`` (GRPO) asks for words.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

PROMPTS = ("Word:", "A word:", "Say a word:", "Name a thing:", "Give a word:", "One word:", "Invent a word:", "Word?")
LETTERS = "bcdeghiklmnoprstu"


def word(rng: random.Random, length: int, a_share: float) -> str:
    """A made-up word of ``length`` letters, each an ``a`` with probability ``a_share``."""
    return "".join("a" if rng.random() < a_share else rng.choice(LETTERS) for _ in range(length))


def pair(rng: random.Random) -> dict[str, str]:
    """Two words of one length; the one with more ``a``'s is chosen."""
    length = rng.randint(3, 6)
    while True:
        first, second = word(rng, length, 0.3), word(rng, length, 0.3)
        if first.count("a") != second.count("a"):
            break
    chosen, rejected = sorted((first, second), key=lambda w: -w.count("a"))
    return {"prompt": rng.choice(PROMPTS), "chosen": " " + chosen, "rejected": " " + rejected}


def write(path: Path, records: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def main(out: Path) -> None:
    rng = random.Random(0)
    demos = [
        {"prompt": rng.choice(PROMPTS), "completion": " " + word(rng, rng.randint(3, 6), 1 / 6)} for _ in range(256)
    ]
    write(out / "demonstrations.jsonl", demos)
    write(out / "pairs.jsonl", [pair(rng) for _ in range(256)])
    write(out / "pairs_eval.jsonl", [pair(rng) for _ in range(64)])
    write(out / "prompts.jsonl", [{"prompt": p} for p in PROMPTS])
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
