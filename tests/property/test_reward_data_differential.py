"""Preference data as TRL 1.16's RewardTrainer prepares it, on data nobody chose: Hypothesis draws preference records
(standard and conversational, the prompt given or implicit, whitespace at either end, a literal EOS or template
marker inside, empty standard completions, long texts, a ``margin`` or none) and the options (``max_length``, chat
templates: the tokenizer's, the job's ``data.chat_template``, or dsbuild's fallback for a tokenizer without one).
Property: ``dsbuild.data.preference.score_pairs`` keeps the pairs ``RewardTrainer._prepare_dataset`` keeps, with its
``chosen_ids`` / ``rejected_ids`` and margins, and ``collate_scored_pairs`` makes its ``DataCollatorForPreference``'s
batch, tensor for tensor.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import transformers
from datasets import Dataset
from hypothesis import example, given, settings
from hypothesis import strategies as st
from strategies import chat_templates, content, trl_examples
from trl.trainer.reward_trainer import DataCollatorForPreference, RewardTrainer

from dsbuild.data.preference import check_pair, collate_scored_pairs, score_pairs

pytestmark = [pytest.mark.train, pytest.mark.slow]  # TRL's preparation over generated pairs

TEMPLATES = chat_templates()


@st.composite
def reward_cases(draw: st.DrawFn) -> dict[str, Any]:
    """Records of one kind (text or messages; the prompt given or implicit; margins or none) and ``max_length``."""
    conversational, implicit, margins = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    records = []
    for _ in range(draw(st.integers(1, 4))):
        prompt = draw(content(allow_empty=False))
        chosen, rejected = (draw(content(allow_empty=not conversational)) for _ in range(2))
        if conversational:
            prompt = [{"role": "user", "content": prompt}]  # type: ignore[assignment]
            chosen = [{"role": "assistant", "content": chosen}]  # type: ignore[assignment]
            rejected = [{"role": "assistant", "content": rejected}]  # type: ignore[assignment]
        record: dict[str, Any] = (
            {"chosen": prompt + chosen, "rejected": prompt + rejected}
            if implicit
            else {"prompt": prompt, "chosen": chosen, "rejected": rejected}
        )
        if margins:
            record["margin"] = draw(st.floats(-3, 3, allow_nan=False, width=32))
        records.append(record)
    template = draw(st.sampled_from(sorted(TEMPLATES))) if conversational else None
    given = draw(st.sampled_from(["tokenizer", "job"] + (["none"] if template == "fallback" else [])))
    return {"records": records, "template": template, "given": given if conversational else "tokenizer",
            "max_length": draw(st.sampled_from([None, 4, 16, 64, 300]))}  # fmt: skip


def _tokenizer(case: dict[str, Any], side: str) -> Any:
    """The byte tokenizer, with the case's template where it is the tokenizer's, and always on TRL's side."""
    tokenizer = transformers.ByT5Tokenizer()
    if case["template"] is not None and (side == "trl" or case["given"] == "tokenizer"):
        tokenizer.chat_template = TEMPLATES[case["template"]]
    return tokenizer


def _trl(case: dict[str, Any], tokenizer: Any) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
    """TRL's own ``RewardTrainer._prepare_dataset`` (its ``self`` is not read) and collator."""
    args = SimpleNamespace(dataset_num_proc=None, max_length=case["max_length"])
    prepared = RewardTrainer._prepare_dataset(None, Dataset.from_list(case["records"]), tokenizer, args, "train")
    names = ["chosen_ids", "rejected_ids"] + (["margin"] if "margin" in case["records"][0] else [])
    rows = [{k: row[k] for k in names} for row in prepared]
    return rows, (DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id)(rows) if rows else {})


@given(reward_cases())
@settings(max_examples=trl_examples() // 3, deadline=None)
@example(
    {"records": [{"prompt": "2 + 2 =", "chosen": "", "rejected": " 5", "margin": 1.0}], "template": None,
     "given": "tokenizer", "max_length": 8}
)  # fmt: skip
@example(
    {"records": [{"chosen": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}],
                  "rejected": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "b"}]}],
     "template": "fallback", "given": "none", "max_length": None}
)  # fmt: skip
def test_reward_pairs_are_trls(case: dict[str, Any]) -> None:
    """The pairs kept, their token ids and margins, and the collated batch equal TRL 1.16's RewardTrainer
    preparation with the template dsbuild picked (``chat_template_for``)."""
    tokenizer = _tokenizer(case, "dsbuild")
    job_template = TEMPLATES[case["template"]] if case["given"] == "job" else None
    checked = []
    for record in case["records"]:
        pair, problem = check_pair(record)
        assert problem is None, problem
        checked.append(pair)
    ours, dropped = score_pairs(checked, tokenizer, max_length=case["max_length"], chat_template=job_template)
    theirs, batch = _trl(case, _tokenizer(case, "trl"))
    assert [{**p, "margin": pytest.approx(p["margin"])} if "margin" in p else p for p in ours] == theirs
    assert dropped == len(case["records"]) - len(theirs)
    if theirs:
        collated = collate_scored_pairs(ours, pad_token_id=tokenizer.pad_token_id)
        assert collated.keys() == batch.keys()
        for name, tensor in batch.items():
            assert torch.equal(collated[name], tensor), name
