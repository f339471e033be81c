"""A GRPO job's reward model scores as TRL 1.16's ``GRPOTrainer`` scores a model among its ``reward_funcs`` (issue
42): held to TRL's own ``_calculate_rewards`` with the same model folder (an ``AutoModelForSequenceClassification``
with one label and its tokenizer), on plain and conversational prompts, the reward model on its own inference engine
(ZeRO-3, or stage 0 as ``[rewards] zero_stage = 0`` gives it) beside a ZeRO-3 policy (1 process here; 2 processes in tests/integration/test_grpo_runs.py's job)."""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _session_common import tiny_llama
from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild import Config
from dsbuild.rl.reward_models import reward_model, reward_name
from dsbuild.session import Session

pytestmark = [pytest.mark.train, pytest.mark.engine]

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
"""The reward tokenizer's chat template (ByT5's has none, and TRL's scoring of a conversation needs one)."""


def save_reward_model(folder: Path, seed: int = 3) -> Path:
    """A tiny Llama with a one-label classification head and the byte tokenizer (its chat template set), saved as a
    reward model folder: what TRL loads from a string in ``reward_funcs``."""
    from transformers import AutoModelForSequenceClassification, ByT5Tokenizer

    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(tiny_llama(num_labels=1, pad_token_id=0))
    model.save_pretrained(folder)
    tokenizer = ByT5Tokenizer()
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


def trl_rewards(folder: Path, prompts: list[Any], completions: list[Any]) -> list[float]:
    """TRL's ``_calculate_rewards`` with the model as TRL's __init__ loads it (num_labels=1, its tokenizer, pad id in
    the config), on a trainer object holding what the method reads."""
    from accelerate import PartialState
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, TrainerState
    from trl import GRPOTrainer

    PartialState()
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=1).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    trainer = GRPOTrainer.__new__(GRPOTrainer)
    values = dict(
        accelerator=SimpleNamespace(device=torch.device("cpu"), is_main_process=True),
        args=SimpleNamespace(report_to=[], device=torch.device("cpu"), past_index=-1), state=TrainerState(),
        environments=None, reward_funcs=[model], reward_processing_classes=[tokenizer],
        reward_func_names=[reward_name(folder)], chat_template_kwargs={}, is_deepspeed_enabled=False,
        _log_completion_extra=lambda *a: None, _log_metric=lambda *a: None,
    )  # fmt: skip
    trainer.__dict__.update(values)
    inputs = [{"prompt": p} for p in prompts]
    ids = [[1] for _ in prompts]
    out = GRPOTrainer._calculate_rewards(trainer, inputs, prompts, completions, ids)
    return [float(x) for x in out[:, 0].tolist()]


@pytest.fixture(scope="module")
def policy() -> Session:
    """A ZeRO-3 policy (the reward model's inference engine is for_inference of its config)."""
    return Session.from_pretrained(tiny_llama(), Config.zero(3).adamw(lr=1e-3).batch(micro=2))


@pytest.fixture(scope="module", params=[None, 0], ids=["the policy's stage", "zero_stage 0"])
def scored(policy: Session, tmp_path_factory: pytest.TempPathFactory, request: Any) -> tuple[Path, Any]:
    """The reward model on an engine of the policy's stage (3), or of its own (``[rewards] zero_stage = 0``: whole)."""
    folder = save_reward_model(tmp_path_factory.mktemp("rm") / "rm")
    name, model = reward_model(policy, folder, stage=request.param)
    assert name == "rm"  # TRL's name: the model id's last part (rewards/rm/mean)
    assert model.engine.zero_optimization_stage() == (3 if request.param is None else request.param)
    return folder, model


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
PROMPT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
"""A prompt is never empty (an empty text and completion is no token at all: TRL's forward fails on it too)."""


@settings(max_examples=8, deadline=None)
@given(pairs=st.lists(st.tuples(PROMPT, TEXT), min_size=1, max_size=5), chat=st.booleans())
def test_a_reward_model_scores_as_trl(scored: tuple[Path, Any], pairs: list[tuple[str, str]], chat: bool) -> None:
    """Prompts and completions of any text and ragged lengths (empty ones too), plain or as conversations: the
    rewards of the reward model, partitioned (ZeRO-3) or whole (stage 0), equal TRL's with the same folder to 1e-5."""
    folder, model = scored
    if chat:
        prompts: list[Any] = [[{"role": "user", "content": p}] for p, _ in pairs]
        completions: list[Any] = [[{"role": "assistant", "content": c}] for _, c in pairs]
    else:
        prompts, completions = [p for p, _ in pairs], [c for _, c in pairs]
    ours = model(prompts=prompts, completions=completions, completion_ids=[[1]] * len(pairs))
    assert ours == pytest.approx(trl_rewards(folder, prompts, completions), rel=1e-5, abs=1e-6)
