"""Preference data as TRL 1.16's DPOTrainer prepares it, on data nobody chose: Hypothesis draws preference records
(standard and conversational, the prompt given or implicit in chosen / rejected, whitespace at either end, a literal
EOS or template marker inside, empty standard completions, long texts that ``max_length`` cuts) and the options
(``max_length``, ``truncation_mode``, chat templates: the tokenizer's, the job's ``data.chat_template`` with a
tokenizer without one, or neither, where dsbuild renders with its fallback template). Property:
``dsbuild.data.preference`` keeps the pairs TRL's ``_prepare_dataset`` keeps, with its ``prompt_ids`` /
``chosen_ids`` / ``rejected_ids``, and collates them into ``DataCollatorForPreference``'s batch, tensor for tensor;
TRL's tokenizer holds the template dsbuild rendered with (TRL itself fails on conversations without one).

Every counterexample Hypothesis found is kept as an ``@example``.
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
from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer

from dsbuild.data.preference import check_pair, collate_pairs, tokenize_pairs

pytestmark = [pytest.mark.train, pytest.mark.slow]  # ~26 s of TRL's preparation over generated pairs

TEMPLATES = chat_templates()


@st.composite
def preference_cases(draw: st.DrawFn) -> dict[str, Any]:
    """Records of one kind (text or messages; the prompt given or implicit) and the options TRL's DPOConfig takes."""
    conversational = draw(st.booleans())
    implicit = draw(st.booleans())
    records = []
    for _ in range(draw(st.integers(1, 4))):
        prompt = draw(content(allow_empty=False))
        chosen, rejected = (draw(content(allow_empty=not conversational)) for _ in range(2))
        if conversational:
            prompt = [{"role": "user", "content": prompt}]  # type: ignore[assignment]
            chosen = [{"role": "assistant", "content": chosen}]  # type: ignore[assignment]
            rejected = [{"role": "assistant", "content": rejected}]  # type: ignore[assignment]
        if implicit:
            records.append({"chosen": prompt + chosen, "rejected": prompt + rejected})
        else:
            records.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    template = draw(st.sampled_from(sorted(TEMPLATES))) if conversational else None
    given = draw(st.sampled_from(["tokenizer", "job"] + (["none"] if template == "fallback" else [])))
    return {
        "records": records,
        "template": template,
        "given": given if conversational else "tokenizer",
        "max_length": draw(st.sampled_from([None, 4, 16, 64, 300])),
        "truncation_mode": draw(st.sampled_from(["keep_start", "keep_end"])),
    }


def _tokenizer(case: dict[str, Any], side: str) -> Any:
    """The byte tokenizer, holding the case's template where it is given to the tokenizer, and always on TRL's side
    (``data.chat_template``, or dsbuild's fallback for a tokenizer without a template, is what TRL gets as the
    tokenizer's)."""
    tokenizer = transformers.ByT5Tokenizer()
    if case["template"] is not None and (side == "trl" or case["given"] == "tokenizer"):
        tokenizer.chat_template = TEMPLATES[case["template"]]
    return tokenizer


def _trl(case: dict[str, Any], tokenizer: Any) -> tuple[list[dict[str, list[int]]], dict[str, torch.Tensor]]:
    """TRL's own ``DPOTrainer._prepare_dataset`` (its ``self`` reads only the tokenizer) and collator."""
    args = SimpleNamespace(
        dataset_num_proc=None, max_length=case["max_length"], truncation_mode=case["truncation_mode"]
    )
    prepared = DPOTrainer._prepare_dataset(
        SimpleNamespace(_tokenizer=tokenizer), Dataset.from_list(case["records"]), tokenizer, args, "train"
    )
    rows = [{k: list(row[k]) for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for row in prepared]
    collator = DataCollatorForPreference(
        pad_token_id=tokenizer.pad_token_id, max_length=case["max_length"], truncation_mode=case["truncation_mode"]
    )
    return rows, (collator(rows) if rows else {})


@given(preference_cases())
@settings(max_examples=trl_examples())
@example(
    {"records": [{"chosen": "ab", "rejected": "abc"}], "template": None, "given": "tokenizer", "max_length": None,
     "truncation_mode": "keep_start"}
)  # fmt: skip
@example(
    {"records": [{"chosen": " a", "rejected": "b"}], "template": None, "given": "tokenizer", "max_length": 4,
     "truncation_mode": "keep_start"}
)  # fmt: skip
@example(
    {"records": [{"prompt": "2 + 2 =", "chosen": "", "rejected": " 5"}], "template": None, "given": "tokenizer",
     "max_length": None, "truncation_mode": "keep_start"}
)  # fmt: skip
@example(
    {"records": [{"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "a"}],
                  "rejected": [{"role": "assistant", "content": "b"}]}],
     "template": "fallback", "given": "none", "max_length": None, "truncation_mode": "keep_start"}
)  # fmt: skip
@example(
    {"records": [{"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "a"}],
                  "rejected": [{"role": "assistant", "content": "b"}]}],
     "template": "llama3_training", "given": "job", "max_length": 16, "truncation_mode": "keep_start"}
)  # fmt: skip
def test_preference_pairs_are_trls(case: dict[str, Any]) -> None:
    """The pairs kept, their token ids and the collated batch equal TRL 1.16's DPOTrainer preparation with the
    template dsbuild picked (``chat_template_for``)."""
    tokenizer = _tokenizer(case, "dsbuild")
    job_template = TEMPLATES[case["template"]] if case["given"] == "job" else None
    checked = []
    for record in case["records"]:
        pair, problem = check_pair(record)
        assert problem is None, problem
        checked.append(pair)
    ours, dropped = tokenize_pairs(
        checked, tokenizer, max_length=case["max_length"], truncation_mode=case["truncation_mode"],
        chat_template=job_template,
    )  # fmt: skip
    theirs, batch = _trl(case, _tokenizer(case, "trl"))
    assert ours == theirs
    assert dropped == len(case["records"]) - len(theirs)
    if theirs:
        collated = collate_pairs(
            ours, pad_token_id=tokenizer.pad_token_id, max_length=case["max_length"],
            truncation_mode=case["truncation_mode"],
        )  # fmt: skip
        assert collated.keys() == batch.keys()
        for name, tensor in batch.items():
            assert torch.equal(collated[name], tensor), name
