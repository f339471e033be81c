"""A GRPO job's reward models, scored as TRL 1.16's ``GRPOTrainer`` scores a model among its ``reward_funcs``.

TRL takes a string in ``reward_funcs`` as a model: ``AutoModelForSequenceClassification.from_pretrained(path,
num_labels=1)``, its tokenizer from the same path (``reward_processing_classes``), the tokenizer's EOS as its pad
token when it has none and that pad id in the model's config (the score is read at the last token that is not
padding), and the model wrapped by ``prepare_deepspeed`` (a DeepSpeed engine without an optimizer, ZeRO-3 partitioned
when the policy is). Each step it scores every completion of the process in one forward: the prompt and the
completion joined (a plain prompt: the texts concatenated; a conversation: the messages of both rendered by the reward
tokenizer's chat template), tokenized without special tokens and padded on the right, ``logits[:, 0]``.

Here a reward model is that, with a DeepSpeed inference engine of its own (``Config.for_inference`` of the policy's
config: stage 3 stays 3, partitioned over the ranks; ``offload``: its parameters kept in CPU memory between uses,
which needs stage 3) on the policy's process group. Under ZeRO-3 its forward is collective: every rank scores, with
the reward models before any reward function, so a function that fails on one rank cannot leave the others waiting
in a model's forward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..job.formats import FALLBACK_CHAT_TEMPLATE
from ..session import distributed
from ..session.reference import Policy, frozen_engine
from .rewards import RewardFunction

__all__ = ["RewardModel", "reward_model", "reward_name"]


def reward_name(source: str | Path) -> str:
    """The name TRL logs a reward model's rewards under (``rewards/NAME/mean``): its config's id, the last part."""
    return str(source).rstrip("/").rsplit("/", 1)[-1]


class RewardModel:
    """A reward model called as a reward function is (TRL's keyword arguments; one float per completion)."""

    def __init__(self, engine: Any, tokenizer: Any, chat_template: str | None = None) -> None:
        self.engine, self.tokenizer, self.chat_template = engine, tokenizer, chat_template

    def texts(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[str]:
        """What TRL scores: a plain prompt and its completion concatenated; a conversation's messages (the prompt's,
        then the completion's) rendered by the reward tokenizer's chat template."""
        if prompts and _conversational(prompts[0]):
            return [
                str(self.tokenizer.apply_chat_template([*p, *c], chat_template=self.chat_template, tokenize=False))
                for p, c in zip(prompts, completions, strict=True)
            ]
        return [p + c for p, c in zip(prompts, completions, strict=True)]

    @distributed.quietly
    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **_: Any) -> list[float]:
        """The reward of each completion: ``logits[:, 0]`` of the texts, right-padded, without special tokens, in one
        forward without gradients. Collective under ZeRO-3 (every rank calls it once a step)."""
        inputs = self.tokenizer(
            text=self.texts(prompts, completions), return_tensors="pt", padding=True, padding_side="right",
            add_special_tokens=False,
        )  # fmt: skip
        device = self.engine.device
        with torch.inference_mode():
            logits = self.engine(**{k: v.to(device) for k, v in inputs.items()}).logits
        return [float(x) for x in logits[:, 0].float().tolist()]


def _conversational(prompt: Any) -> bool:
    """TRL's ``is_conversational`` of a prompt: a list of messages (mappings with a role)."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], Mapping) and "role" in prompt[0]


def reward_model(
    policy: Policy, source: str | Path, *, offload: bool = False, stage: int | None = None
) -> RewardFunction:
    """The reward model at ``source`` (a local folder or hub id with its tokenizer) beside ``policy``, as TRL loads and
    prepares it, named as TRL names it; a conversation is rendered by its tokenizer's chat template, else the fallback
    template every task uses (``FALLBACK_CHAT_TEMPLATE``: TRL would fail). ``stage``: its engine's own ZeRO stage (0
    or 3; default the policy's rule). Collective: every rank builds it."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    hidden = getattr(AutoConfig.from_pretrained(str(source)).get_text_config(), "hidden_size", None)
    config = policy.config.for_inference(offload, hidden_size=hidden if isinstance(hidden, int) else None, stage=stage)
    engine = frozen_engine(policy, str(source), config, kind="AutoModelForSequenceClassification", num_labels=1)
    engine.module.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    template = None if getattr(tokenizer, "chat_template", None) else FALLBACK_CHAT_TEMPLATE
    return reward_name(source), RewardModel(engine, tokenizer, template)
