"""The keys of TRL's ``DPOConfig``, ``GRPOConfig``, ``RLOOConfig``, ``RewardConfig`` and ``KTOConfig`` that ``dsbuild train`` does not run, in one
table: each with the one value it runs as TRL runs it (TRL's default, where the key then does nothing a job would miss),
why another value is refused, and what to write instead. A ``[dpo]`` / ``[grpo]`` / ``[rloo]`` / ``[reward]`` / ``[kto]`` table takes these keys (a
config pasted from TRL reads), and ``not_run`` names each one set to another value by its dotted key. The keys of
``DPOSpec`` / ``GRPOSpec`` / ``RLOOSpec`` are the ones that run (``RewardSpec``'s for ``[reward]``); a TRL config's field in neither
(a key of a newer TRL) fails ``tests/unit/test_trl_keys.py`` (``test_rloo_job.py`` for ``RLOOConfig``).
Stdlib only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final, NamedTuple

from ..errors import Problem

__all__ = [
    "GENERATION_KEYS",
    "KTO_NOT_RUN",
    "NOT_RUN",
    "REWARD_NOT_RUN",
    "RLOO_NOT_RUN",
    "NotRun",
    "generation_kwargs_instead",
    "not_run",
]


class NotRun(NamedTuple):
    """A TRL key ``dsbuild train`` does not run."""

    runs: Any
    """The value that runs as TRL runs it (TRL's default); any other is refused."""
    why: str
    """Why another value is refused."""
    instead: str
    """What to write instead."""


_VLLM: Final = NotRun(
    None,
    "dsbuild train does not start vLLM",
    'generate with vLLM in a rollout function: [rollout] backend = "function", function = "my_rollouts:complete", '
    'weight_sink = "my_rollouts:load" (docs/rl.md, "A vLLM rollout function")',
)
_LOGS: Final = "dsbuild train logs completions to completions.jsonl only (grpo.log_completions), without images"
_LOGS_INSTEAD: Final = "leave it out: completions.jsonl holds every logged completion"
_ENTROPY: Final = NotRun(None, "the entropy bonus is not built into dsbuild train", "leave it out")
_BATCHING: Final = NotRun(
    False,
    "the policy generates with transformers' generate",
    'batch generation in a rollout function of your own ([rollout] backend = "function")',
)


def _vllm(runs: Any) -> NotRun:
    """A vLLM setting: configured where vLLM is started, in the rollout function."""
    return _VLLM._replace(runs=runs, instead="configure vLLM in your rollout function (see grpo.use_vllm)")


def _entropy(runs: Any) -> NotRun:
    return _ENTROPY._replace(runs=runs)


DPO_NOT_RUN: Final = {
    "use_weighting": NotRun(False, "WPO's weighting is not built into dsbuild train", "leave it out"),
    "sync_ref_model": NotRun(False, "TR-DPO's reference sync is not built into dsbuild train", "leave it out"),
    "precompute_ref_log_probs": NotRun(False, "a job's reference is [reference]'s", "set reference.precompute = true"),
    "model_init_kwargs": NotRun(
        None,
        "a job builds its model from [model]",
        "set [model] dtype and attn_implementation (or [model.config] for a model made from its config)",
    ),
    "trust_remote_code": NotRun(False, "dsbuild does not run a hub model's own code", "use a model transformers knows"),
    "router_aux_loss_coef": NotRun(None, "a DPO job adds no mixture-of-experts router loss", "leave it out"),
    "dataset_num_proc": NotRun(None, "a DPO job tokenizes its pairs in one process", "leave it out"),
    "pad_to_multiple_of": NotRun(
        "auto", "a DPO job pads to the longest pair of the micro-batch (TRL's 'auto' off Neuron)", "leave it out"
    ),
    "pad_token": NotRun(
        None, "the pad token is the tokenizer's (TRL deprecates this key)", "use a tokenizer with a pad token"
    ),
    "activation_offloading": NotRun(
        False, "activation offloading is not built into dsbuild train", "set [model] gradient_checkpointing = true"
    ),
}

GRPO_NOT_RUN: Final = {
    # keys of GRPOSpec that only their default runs
    "sync_ref_model": NotRun(False, "the reference sync is not built into dsbuild train", "leave it out"),
    "top_entropy_quantile": NotRun(1.0, "the entropy mask is not built into dsbuild train", "leave it at 1.0"),
    "multi_objective_aggregation": NotRun(
        "sum_then_normalize", "only sum_then_normalize is built into dsbuild train", "leave it out"
    ),
    "num_generations_eval": NotRun(None, "a GRPO job does not evaluate (no eval data)", "leave it out"),
    # the model and its data
    "model_init_kwargs": NotRun(
        None,
        "a job builds its model from [model]",
        "set [model] dtype and attn_implementation (or [model.config] for a model made from its config)",
    ),
    "trust_remote_code": NotRun(False, "dsbuild does not run a hub model's own code", "use a model transformers knows"),
    "router_aux_loss_coef": NotRun(None, "a GRPO job adds no mixture-of-experts router loss", "leave it out"),
    "disable_dropout": NotRun(
        False,
        "a GRPO job trains with the model's dropout",
        "set the dropout to 0 in the model's config ([model.config]) or leave it out",
    ),
    "cast_lm_head_to_fp32": NotRun(False, "the LM head is not cast apart from the model", "set [model] dtype"),
    "pad_to_multiple_of": NotRun("auto", "a GRPO job pads to the longest prompt and completion", "leave it out"),
    "chat_template_kwargs": NotRun(
        None, "the chat template gets no arguments", "write the template you want in [data] chat_template"
    ),
    # generation
    "generation_kwargs": NotRun(None, "TRL's generate arguments are [grpo]'s sampling keys", "see below"),
    "cache_implementation": NotRun(None, "the policy generates with the model's own cache", "leave it out"),
    "use_transformers_continuous_batching": _BATCHING,
    "transformers_continuous_batching_config": _BATCHING._replace(runs=None),
    "use_transformers_paged": _BATCHING,
    "max_tool_calling_iterations": NotRun(
        None,
        "tools are not built into dsbuild train",
        'call your tools in a rollout function ([rollout] backend = "function")',
    ),
    "use_vllm": _VLLM._replace(runs=False),
    "vllm_mode": _vllm("colocate"),
    "vllm_model_impl": _vllm("vllm"),
    "vllm_enable_sleep_mode": _vllm(False),
    "vllm_structured_outputs_regex": _vllm(None),
    "vllm_server_base_url": _vllm(None),
    "vllm_server_host": _vllm("0.0.0.0"),
    "vllm_server_port": _vllm(8000),
    "vllm_server_timeout": _vllm(240.0),
    "vllm_group_port": _vllm(51216),
    "vllm_gpu_memory_utilization": _vllm(0.3),
    "vllm_max_model_length": _vllm(None),
    "vllm_tensor_parallel_size": _vllm(1),
    "vllm_importance_sampling_correction": _vllm(True),
    "vllm_importance_sampling_mode": _vllm("sequence_mask"),
    "vllm_importance_sampling_clip_max": _vllm(3.0),
    "vllm_importance_sampling_clip_min": _vllm(None),
    "vllm_importance_sampling_cap": _vllm(None),
    # the loss and the rewards
    "reward_weights": NotRun(None, "a job's reward weights are [rewards]'s", "set [rewards] weights = {value}"),
    "off_policy_mask_threshold": NotRun(None, "the off-policy mask is not built into dsbuild train", "leave it out"),
    "entropy_coef": _entropy(0.0),
    "use_adaptive_entropy": _entropy(False),
    "entropy_coef_min": _entropy(0.0),
    "entropy_coef_max": _entropy(1.0),
    "entropy_coef_delta": _entropy(0.005),
    "entropy_target": _entropy(0.2),
    # logging
    "log_multimodal": NotRun(True, _LOGS, _LOGS_INSTEAD),
    "log_unique_prompts": NotRun(False, _LOGS, _LOGS_INSTEAD),
    "log_completions_hub_repo": NotRun(None, _LOGS, _LOGS_INSTEAD),
}

_RLOO_AS_GRPO: Final = frozenset(
    {"sync_ref_model", "model_init_kwargs", "trust_remote_code", "pad_to_multiple_of", "chat_template_kwargs",
     "cache_implementation", "use_transformers_continuous_batching", "transformers_continuous_batching_config",
     "use_transformers_paged", "reward_weights", "log_multimodal", "log_unique_prompts"}
    | {key for key in GRPO_NOT_RUN if key.startswith("vllm_") and "importance_sampling" not in key}
    | {"use_vllm"}
)  # fmt: skip
"""The keys of ``GRPO_NOT_RUN`` that ``RLOOConfig`` has too, refused for the same reason."""

REWARD_NOT_RUN: Final = {
    "model_init_kwargs": DPO_NOT_RUN["model_init_kwargs"],
    "trust_remote_code": DPO_NOT_RUN["trust_remote_code"],
    "chat_template_path": NotRun(
        None, "a job's chat template is [data]'s", "set data.chat_template to the template's text (Jinja)"
    ),
    "dataset_num_proc": NotRun(None, "a reward job tokenizes its pairs in one process", "leave it out"),
    "eos_token": NotRun(
        None,
        "a reward job ends each text with its tokenizer's end-of-sequence token",
        "leave it out, or give [model] a tokenizer whose EOS is the one you want",
    ),
    "pad_to_multiple_of": NotRun(
        "auto", "a reward job pads to the longest sequence of the micro-batch (TRL's 'auto' off Neuron)", "leave it out"
    ),
    "activation_offloading": DPO_NOT_RUN["activation_offloading"],
    "pad_token": DPO_NOT_RUN["pad_token"],
}

RLOO_NOT_RUN: Final = {
    # RLOOConfig's keys are GRPOConfig's but for the loss: the same rows, an RLOO job named where a row names its job
    **{key: row for key, row in GRPO_NOT_RUN.items() if key in _RLOO_AS_GRPO},
    "num_generations_eval": NotRun(None, "an RLOO job does not evaluate (no eval data)", "leave it out"),
    "router_aux_loss_coef": NotRun(None, "an RLOO job adds no mixture-of-experts router loss", "leave it out"),
    "disable_dropout": GRPO_NOT_RUN["disable_dropout"]._replace(why="an RLOO job trains with the model's dropout"),
    "generation_kwargs": NotRun(None, "TRL's generate arguments are [rloo]'s sampling keys", "see below"),
}

KTO_NOT_RUN: Final = {
    "precompute_ref_log_probs": DPO_NOT_RUN["precompute_ref_log_probs"],
    "sync_ref_model": DPO_NOT_RUN["sync_ref_model"],
    "ref_model_mixup_alpha": NotRun(0.6, "TR-DPO's reference sync is not built into dsbuild train", "leave it out"),
    "ref_model_sync_steps": NotRun(512, "TR-DPO's reference sync is not built into dsbuild train", "leave it out"),
    "model_init_kwargs": DPO_NOT_RUN["model_init_kwargs"],
    "trust_remote_code": DPO_NOT_RUN["trust_remote_code"],
    "router_aux_loss_coef": NotRun(None, "a KTO job adds no mixture-of-experts router loss", "leave it out"),
    "dataset_num_proc": NotRun(None, "a KTO job tokenizes its records in one process", "leave it out"),
    "pad_to_multiple_of": NotRun(
        "auto", "a KTO job pads to the longest sequence of the micro-batch (TRL's 'auto' off Neuron)", "leave it out"
    ),
    "activation_offloading": DPO_NOT_RUN["activation_offloading"],
}

NOT_RUN: Final[Mapping[str, Mapping[str, NotRun]]] = {
    "dpo": DPO_NOT_RUN,
    "grpo": GRPO_NOT_RUN,
    "reward": REWARD_NOT_RUN,
    "rloo": RLOO_NOT_RUN,
    "kto": KTO_NOT_RUN,
}
"""By table: the TRL keys a job's table takes but runs only at one value."""

GENERATION_KEYS: Final = {
    "max_new_tokens": "max_completion_length",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
}
"""The arguments of ``generate`` (TRL's ``generation_kwargs``) that a ``[grpo]`` key sets, by that key."""


def generation_kwargs_instead(value: Any, table: str = "grpo") -> str:
    """What to write instead of ``generation_kwargs = value``: the sampling keys of ``[table]`` (``[grpo]``,
    ``[rloo]``) its entries map to, and the entries no key sets."""
    if not isinstance(value, Mapping):
        return f"set the sampling keys of [{table}]: {', '.join(dict.fromkeys(GENERATION_KEYS.values()))}"
    mapped = [f"{table}.{GENERATION_KEYS[k]} = {_toml(v)}" for k, v in value.items() if k in GENERATION_KEYS]
    other = [str(k) for k in value if k not in GENERATION_KEYS]
    parts = [f"write {', '.join(mapped)}"] if mapped else []
    if other:
        parts.append(f"{', '.join(other)}: not run by the policy's sampling (a rollout function can pass them)")
    return "; ".join(parts) or "leave it out"


def not_run(
    table_path: str, table: Mapping[str, Any], values: Mapping[str, Any], read: Collection[str]
) -> list[Problem]:
    """A problem for each key of ``NOT_RUN[table_path]`` that ``table`` sets to another value than the one that runs
    (``values``: what the spec read of the keys it reads, ``read``; a bad value there is already named)."""
    problems = []
    for key, row in NOT_RUN.get(table_path, {}).items():
        if key not in table or (key in read and key not in values):
            continue
        value = values[key] if key in read else table[key]
        if _same(value, row.runs):
            continue
        instead = generation_kwargs_instead(value, table_path) if key == "generation_kwargs" else row.instead
        instead = instead.replace("{value}", _toml(value))
        problems.append(Problem(f"{table_path}.{key}", f"{row.why}", instead))
    return problems


def _toml(value: Any) -> str:
    """A value as a job file writes it (numbers, strings, booleans and lists of them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_toml(v) for v in value)}]"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _same(value: Any, runs: Any) -> bool:
    """Whether ``value`` is the value that runs (``1`` is ``1.0``; ``True`` is not ``1``)."""
    if isinstance(value, bool) or isinstance(runs, bool):
        return value is runs
    return bool(value == runs)
