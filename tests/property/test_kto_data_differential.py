"""Unpaired data as TRL 1.16's KTOTrainer prepares it, on data nobody chose: Hypothesis draws unpaired records
(standard and conversational, whitespace at either end, a literal EOS or template marker inside, empty standard
completions, long texts, any mix of labels) and the options (``max_length``, the micro-batch size the KL pairs are
rotated in, with or without a KL estimate, the chat templates: the tokenizer's, the job's ``data.chat_template``, or
dsbuild's fallback for a tokenizer without one). Property: ``dsbuild.data.unpaired`` keeps the records
``KTOTrainer._prepare_dataset`` keeps, with its ``prompt_ids`` / ``completion_ids`` / ``KL_completion_ids`` and
labels, and ``collate_unpaired`` makes its ``DataCollatorForUnpairedPreference``'s batch, tensor for tensor.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import transformers
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import chat_templates, content, trl_examples
from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference, KTOTrainer

from dsbuild.data.unpaired import collate_unpaired, load_unpaired

pytestmark = [pytest.mark.train, pytest.mark.slow]  # TRL's preparation over generated records

TEMPLATES = chat_templates()


@st.composite
def kto_cases(draw: st.DrawFn) -> dict[str, Any]:
    """Records of one kind (text or messages), ``max_length``, the micro-batch size and whether a KL is estimated."""
    conversational = draw(st.booleans())
    records = []
    for _ in range(draw(st.integers(1, 7))):
        prompt, completion = draw(content(allow_empty=False)), draw(content(allow_empty=not conversational))
        record: dict[str, Any] = {"prompt": prompt, "completion": completion, "label": draw(st.booleans())}
        if conversational:
            record["prompt"] = [{"role": "user", "content": prompt}]
            record["completion"] = [{"role": "assistant", "content": completion}]
        records.append(record)
    template = draw(st.sampled_from(sorted(TEMPLATES))) if conversational else None
    given = draw(st.sampled_from(["tokenizer", "job"] + (["none"] if template == "fallback" else [])))
    return {"records": records, "template": template, "given": given if conversational else "tokenizer",
            "max_length": draw(st.sampled_from([None, 4, 16, 64, 300])), "batch": draw(st.integers(2, 4)),
            "kl": draw(st.booleans())}  # fmt: skip


def _tokenizer(case: dict[str, Any], side: str) -> Any:
    """The byte tokenizer, with the case's template where it is the tokenizer's, and always on TRL's side."""
    tokenizer = transformers.ByT5Tokenizer()
    if case["template"] is not None and (side == "trl" or case["given"] == "tokenizer"):
        tokenizer.chat_template = TEMPLATES[case["template"]]
    return tokenizer


def _trl(case: dict[str, Any], tokenizer: Any) -> list[dict[str, Any]]:
    """TRL's own ``KTOTrainer._prepare_dataset``, its ``self`` holding what it reads."""
    trainer = SimpleNamespace(_tokenizer=tokenizer, calculate_KL=case["kl"], desirable_weight=1.0,
                              undesirable_weight=1.0)  # fmt: skip
    args = SimpleNamespace(dataset_num_proc=None, max_length=case["max_length"],
                           per_device_train_batch_size=case["batch"])  # fmt: skip
    prepared = KTOTrainer._prepare_dataset(trainer, Dataset.from_list(case["records"]), tokenizer, args, "train")
    names = ["prompt_ids", "completion_ids", "label"] + (["KL_completion_ids"] if case["kl"] else [])
    return [{k: row[k] for k in names} for row in prepared]


@given(case=kto_cases())
@settings(max_examples=trl_examples() // 3, deadline=None)
def test_kto_records_are_trls(case: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    """The records kept, their token ids, KL completions and labels, and the collated batch equal TRL 1.16's
    KTOTrainer preparation with the template dsbuild picked (``chat_template_for``)."""
    path = Path(tmp_path_factory.mktemp("kto")) / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in case["records"]))
    job_template = TEMPLATES[case["template"]] if case["given"] == "job" else None
    theirs = _trl(case, _tokenizer(case, "trl"))
    try:
        ours, dropped = load_unpaired(path, _tokenizer(case, "dsbuild"), key="data.path",
                                      max_length=case["max_length"], batch_size=case["batch"] if case["kl"] else None,
                                      chat_template=job_template)  # fmt: skip
    except Exception as e:  # every record's prompt fills max_length: refused by name, TRL keeps nothing
        assert not theirs and "kto.max_length" in str(e)
        return
    assert ours == theirs
    assert dropped == len(case["records"]) - len(theirs)
    pad = _tokenizer(case, "trl").pad_token_id
    for start in range(0, len(ours), case["batch"]):
        chunk = ours[start : start + case["batch"]]
        batch = DataCollatorForUnpairedPreference(pad_token_id=pad, max_length=case["max_length"])(chunk)
        collated = collate_unpaired(chunk, pad_token_id=pad, max_length=case["max_length"])
        assert collated.keys() == batch.keys()
        for name, tensor in batch.items():
            assert torch.equal(collated[name], tensor), name
