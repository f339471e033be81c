"""GRPO jobs before anything trains (issue 33): TRL's prompt order and its sharding over processes, the job's tables
read and refused by their dotted keys, the functions a job names found (or named when they cannot be), prompt data
checked, and the reward functions' answers judged as the run judges them."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trl.trainer.utils as trl_utils
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from dsbuild.errors import ConfigError
from dsbuild.job import load_job
from dsbuild.job.functions import load_function
from dsbuild.job.rl import GRPOSpec

pytestmark = pytest.mark.train  # held against TRL's RepeatSampler and Accelerate's sharding (torch's generator)

GRPO = """
    task = "grpo"
    [model]
    name_or_path = "org/model"
    [data]
    path = "prompts.jsonl"
    format = "prompt"
    [rewards]
    functions = ["my_rewards:length"]
    [training]
    per_device_train_batch_size = 8
    [strategy]
    config = "zero3"
"""

REWARDS = """
def length(completions, **_):
    return [float(len(c)) for c in completions]

def broken(completions, **_):
    raise RuntimeError("the grader is down")

not_a_function = 3
"""


def _write(tmp_path: Path, text: str, name: str = "job.toml", prompts: int = 8) -> Path:
    (tmp_path / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"p{i}", "n": i}) + "\n" for i in range(prompts))
    )
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _problems(path: Path, **overrides: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_job(path, overrides)
    return [str(p) for p in info.value.problems]


# -- TRL's order -------------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.integers(1, 40), generations=st.integers(1, 5), batch=st.integers(1, 6), repeat=st.integers(1, 3),
    seed=st.integers(0, 2**31 - 1), epochs=st.integers(1, 3),
)  # fmt: skip
@example(prompts=7, generations=2, batch=3, repeat=2, seed=42, epochs=2)  # TRL's docstring's example, two epochs
def test_the_prompt_order_is_trls_repeat_sampler(
    prompts: int, generations: int, batch: int, repeat: int, seed: int, epochs: int
) -> None:
    """``prompt_order`` is TRL's ``RepeatSampler`` (one sampler iterated epoch after epoch, its generator going on)."""
    from dsbuild.rl.rollouts import prompt_order

    sampler = trl_utils.RepeatSampler(list(range(prompts)), mini_repeat_count=generations, batch_size=batch,
                                      repeat_count=repeat, shuffle=True, seed=seed)  # fmt: skip
    for epoch in range(epochs):
        ours = prompt_order(prompts, num_generations=generations, batch_size=batch, repeat_count=repeat, seed=seed,
                            epoch=epoch)  # fmt: skip
        assert ours == list(sampler)
        assert len(ours) == len(sampler)


@settings(max_examples=80, deadline=None)
@given(
    prompts=st.integers(1, 30), generations=st.integers(2, 4), per_device=st.integers(1, 4),
    accumulation=st.integers(1, 3), world=st.integers(1, 3), seed=st.integers(0, 1000),
    steps=st.none() | st.integers(1, 4), iterations=st.integers(1, 3),
)  # fmt: skip
@example(prompts=8, generations=4, per_device=2, accumulation=2, world=2, seed=0, steps=None, iterations=1)
@example(prompts=8, generations=4, per_device=2, accumulation=2, world=2, seed=0, steps=4, iterations=2)
def test_each_process_generates_for_what_accelerate_hands_it_in_trls_loader(
    prompts: int, generations: int, per_device: int, accumulation: int, world: int, seed: int, steps: int | None,
    iterations: int,
) -> None:  # fmt: skip
    """Each process's ``GenerationSampler`` batches are what TRL's data loader (batches of ``per_device ×
    steps_per_generation`` over the ``RepeatSampler``, each generation batch ``steps_per_generation × num_iterations``
    times) gives that process through Accelerate's ``BatchSamplerShard`` at each micro-step (the examples: the
    2-process runs of test_grpo_trl.py); the epoch's length is ``GRPOSpec.completions``'s."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    from dsbuild.rl.rollouts import GenerationSampler

    spec = GRPOSpec(num_generations=generations, steps_per_generation=steps, num_iterations=iterations)
    per_generation = spec.generation_steps(per_device, world, accumulation)
    generation_batch = per_device * world * per_generation
    assume(generation_batch % generations == 0 and prompts >= generation_batch // generations)
    for rank in range(world):  # each process's own sampler, seeded alike
        repeat = trl_utils.RepeatSampler(list(range(prompts)), mini_repeat_count=generations,
                                         batch_size=generation_batch // generations,
                                         repeat_count=iterations * per_generation, shuffle=True, seed=seed)  # fmt: skip
        batches = BatchSampler(repeat, batch_size=per_device * per_generation, drop_last=False)
        theirs = [list(b) for b in BatchSamplerShard(batches, num_processes=world, process_index=rank)]
        ours = GenerationSampler(prompts, spec, per_device=per_device, accumulation=accumulation, world_size=world,
                                 rank=rank, seed=seed)  # fmt: skip
        indices = list(ours)
        assert [indices[i : i + ours.batch_size] for i in range(0, len(indices), ours.batch_size)] == theirs
        micro_steps = len(ours) // ours.batch_size  # the data loader's batches: one a micro-step
        assert micro_steps * per_device * world == spec.completions(prompts, per_device, world, accumulation)


@pytest.mark.parametrize(
    ("keys", "steps"),
    [
        ({}, 2),  # TRL's default: one generation batch per optimizer step
        ({"steps_per_generation": 4}, 4),
        ({"generation_batch_size": 24}, 3),  # 24 completions over a global batch of 4 × 2 processes
        ({"num_iterations": 2}, 2),
        ({"steps_per_generation": 1, "num_iterations": 3}, 1),
    ],
)
def test_a_generation_batch_feeds_steps_per_generation_micro_steps_num_iterations_times(
    keys: dict[str, int], steps: int
) -> None:
    """``generation_steps`` is the ``steps_per_generation`` TRL's ``GRPOConfig`` fills (per device 4, accumulation 2;
    TRL's on 1 process); on 2 processes an epoch of 12 prompts (``num_generations`` 4) is whole generation batches,
    each trained on ``steps_per_generation × num_iterations`` micro-steps: ``completions`` counts the repeats."""
    from trl import GRPOConfig

    spec = GRPOSpec(num_generations=4, **keys)
    config = GRPOConfig(output_dir="unused", per_device_train_batch_size=4, gradient_accumulation_steps=2,
                        num_generations=4, report_to=[], use_cpu=True, **keys)  # fmt: skip
    assert spec.generation_steps(4, 1, 2) == config.steps_per_generation
    assert spec.generation_steps(4, 2, 2) == steps
    generation_batch = 4 * 2 * steps
    generations = 12 // (generation_batch // 4)
    micro_steps = spec.completions(12, 4, 2, 2) // (4 * 2)
    assert micro_steps == generations * steps * spec.num_iterations


# -- the job file ------------------------------------------------------------------------------------------------


def test_a_grpo_job_reads_its_tables_with_trls_defaults(tmp_path: Path) -> None:
    """``task = "grpo"`` reads ``[rollout]`` (default the policy's generate), ``[rewards]`` and ``[grpo]`` (TRL's
    GRPOConfig defaults), no reference with ``beta = 0``; a step is one generation batch of whole prompt groups."""
    job = load_job(_write(tmp_path, GRPO))
    assert job.task == "grpo" and job.reference is None and job.dpo is None
    assert job.rollout is not None and (job.rollout.backend, job.rollout.function) == ("hf", None)
    assert job.rewards is not None and job.rewards.functions == ("my_rewards:length",) and job.rewards.weights is None
    assert job.grpo == GRPOSpec()
    # 8 prompts, 8 completions per step: one prompt per step at TRL's default num_generations (8), 8 steps an epoch,
    # 3 epochs (HF's default); two prompts per step at num_generations 4.
    assert job.total_steps() == 24
    assert load_job(_write(tmp_path, GRPO + "    [grpo]\n    num_generations = 4\n")).total_steps() == 12
    kl = load_job(_write(tmp_path, GRPO + "    [grpo]\n    num_generations = 4\n    beta = 0.04\n    [reference]\n"))
    assert kl.reference is not None and kl.reference.path is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GRPO.replace("    [rewards]\n    functions = [\"my_rewards:length\"]\n", ""), "rewards: missing"),
        (GRPO.replace('"my_rewards:length"', '"my_rewards.length"'), "rewards.functions[0]: got 'my_rewards.length'"),
        (GRPO + "    [rewards.x]\n", "rewards.x: unknown"),
        (GRPO.replace('["my_rewards:length"]', '["my_rewards:length"]\n    weights = [1, 2]'),
         "rewards.weights: got 2 weights for 1 functions"),
        (GRPO + "    [rollout]\n    backend = \"function\"\n", "rollout.function: missing"),
        (GRPO + "    [rollout]\n    function = \"m:f\"\n", "rollout.function: not read with backend = \"hf\""),
        (GRPO + "    [rollout]\n    backend = \"vllm\"\n", "rollout.backend: got 'vllm'"),
        (GRPO + "    [rollout]\n    weight_sink = \"m:f\"\n", "rollout.weight_sink: not read with backend = \"hf\""),
        (GRPO + "    [grpo]\n    num_generations = 3\n", "grpo.num_generations: generation_batch_size (8) must be divisible"),
        (GRPO + "    [grpo]\n    generation_batch_size = 12\n",
         "grpo.generation_batch_size: generation_batch_size (12) must be divisible by the global batch size (8)"),
        (GRPO + "    [grpo]\n    generation_batch_size = 16\n    steps_per_generation = 2\n",
         "grpo.generation_batch_size: 'generation_batch_size' and 'steps_per_generation' can not be both"),
        (GRPO + "    [grpo]\n    loss_type = \"ppo\"\n", "grpo.loss_type: got 'ppo'"),
        (GRPO + "    [reference]\n", "reference: not used with grpo.beta = 0"),
        (GRPO + "    [dpo]\n", "dpo: [dpo] is read by task = 'dpo'; this job's task is 'grpo'"),
        (GRPO.replace('format = "prompt"', 'format = "alpaca"'), "data.format: got 'alpaca' for task = 'grpo'"),
        (GRPO.replace('format = "prompt"', 'format = "prompt"\n    eval_path = "prompts.jsonl"'),
         'data.eval_path: not read for task = "grpo" (a GRPO job does not evaluate)'),
        (GRPO.replace('path = "prompts.jsonl"', 'path = "org/prompts"'), "data.path: org/prompts: a GRPO job reads"),
        (GRPO.replace('task = "grpo"', 'task = "sft"').replace('format = "prompt"', 'format = "alpaca"'),
         "rewards: [rewards] is read by task = 'grpo' or task = 'rloo'; this job's task is 'sft'"),
    ],
)  # fmt: skip
def test_bad_grpo_jobs_name_the_key(tmp_path: Path, text: str, expected: str) -> None:
    """Each mistake of a GRPO job (or another job with GRPO's tables) is named by its dotted key."""
    found = _problems(_write(tmp_path, text))
    assert any(p.startswith(expected) for p in found), found


def test_a_reference_table_is_read_by_dpo_and_grpo_and_named_once_for_sft(tmp_path: Path) -> None:
    """``[reference]`` belongs to several tasks: an SFT job that has it gets one problem naming them all."""
    text = GRPO.replace('task = "grpo"', 'task = "sft"').replace('format = "prompt"', 'format = "alpaca"')
    found = _problems(_write(tmp_path, text.replace('[rewards]\n    functions = ["my_rewards:length"]', "[reference]")))
    assert [p for p in found if p.startswith("reference:")] == [
        "reference: [reference] is read by task = 'dpo' or task = 'grpo' or task = 'rloo' or task = 'kto'; this job's "
        "task is 'sft' "
        '(set task = "dpo", or leave [reference] out)'
    ]


def test_each_job_gets_the_functions_of_its_own_folder(tmp_path: Path) -> None:
    """Two jobs in one process whose folders each hold a ``my_rewards.py`` get each its own file's functions (the
    second was served the first's module, imported under the same name: a failure that depended on the order of the
    test modules)."""
    for name, value in (("a", 1.0), ("b", 2.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "my_rewards.py").write_text(f"def score(completions, **_):\n    return [{value}]\n")
    assert load_function("my_rewards:score", base_dir=tmp_path / "a", key="k")(completions=["x"]) == [1.0]
    assert load_function("my_rewards:score", base_dir=tmp_path / "b", key="k")(completions=["x"]) == [2.0]
    assert load_function("my_rewards:score", base_dir=tmp_path / "a", key="k")(completions=["x"]) == [1.0]


def test_the_functions_a_job_names_are_found_or_named(tmp_path: Path) -> None:
    """A function is imported from the job file's folder; a missing module, a missing name, a module that fails to
    import and a name that is not a function each fail its checks (exit 1) under the key, in one line."""
    _write(tmp_path, GRPO)
    (tmp_path / "bad_module.py").write_text("x = 1\nraise ValueError('no config')\n")
    assert load_function("my_rewards:length", base_dir=tmp_path, key="k")(completions=["ab"]) == [2.0]
    cases = {
        "my_rewards:nope": "k: 'my_rewards' has no 'nope' (it defines broken, length)",
        "no_such_module:f": "k: importing 'no_such_module' failed: ModuleNotFoundError",
        "bad_module:f": "k: importing 'bad_module' failed: ValueError: no config (bad_module.py:2)",
        "my_rewards:not_a_function": "k: my_rewards:not_a_function is int, not a function",
        "my rewards": "k: got 'my rewards', expected 'module:function'",
    }
    for ref, expected in cases.items():
        with pytest.raises(ConfigError) as info:
            load_function(ref, base_dir=tmp_path, key="k")
        assert info.value.fails_checks and str(info.value.problems[0]).startswith(expected), str(info.value)
        assert "\n" not in str(info.value.problems[0])


def test_the_preflight_names_every_function_that_cannot_be_found(tmp_path: Path) -> None:
    """Before any process starts (``dsbuild validate``, ``dsbuild train``), every function the job names is looked
    up and each one missing is reported, together."""
    from dsbuild.run.tasks.grpo import job_functions

    text = GRPO.replace('["my_rewards:length"]', '["my_rewards:length", "my_rewards:nope", "gone:f"]')
    text += '    [rollout]\n    backend = "function"\n    function = "my_rewards:broken"\n'
    job = load_job(_write(tmp_path, text))
    with pytest.raises(ConfigError) as info:
        job_functions(job)
    assert [p.path for p in info.value.problems] == ["rewards.functions[1]", "rewards.functions[2]"]
    found = job_functions(load_job(_write(tmp_path, GRPO.replace('["my_rewards:length"]', '["my_rewards:length"]'))))
    assert [name for name, _ in found["rewards"]] == ["my_rewards:length"] and not found["rollout"]


# -- prompt data -------------------------------------------------------------------------------------------------


def test_prompt_records_are_checked_as_trl_reads_them(tmp_path: Path) -> None:
    """A record needs a prompt (text or messages); a field named as a reward function's own argument is refused;
    standard and conversational prompts are not mixed; every bad record is named by its line."""
    from dsbuild.data.prompts import prompt_ids, read_prompts

    path = tmp_path / "p.jsonl"
    lines = [{"prompt": "ok"}, {"text": "x"}, {"prompt": 3}, {"prompt": ""}, {"prompt": "a", "completion": "b"},
             {"prompt": [{"role": "user"}]}]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(ConfigError) as info:
        read_prompts(path)
    text = str(info.value)
    for where in ("line 2", "line 3", "line 4", "line 5", "line 6"):
        assert where in text, text
    path.write_text(
        json.dumps({"prompt": "a"}) + "\n" + json.dumps({"prompt": [{"role": "user", "content": "b"}]}) + "\n"
    )
    with pytest.raises(ConfigError, match="mixes text prompts and lists of messages"):
        read_prompts(path)
    from transformers import ByT5Tokenizer

    tokenizer = ByT5Tokenizer()
    assert prompt_ids({"prompt": "hi"}, tokenizer) == tokenizer(text="hi")["input_ids"]  # TRL's _tokenize_prompts
    from dsbuild.job.formats import FALLBACK_CHAT_TEMPLATE

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    rendered = tokenizer.apply_chat_template(messages, chat_template=FALLBACK_CHAT_TEMPLATE, add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]  # fmt: skip
    assert prompt_ids({"prompt": messages}, tokenizer) == list(rendered)  # no template of its own: the fallback


# -- the reward functions' answers -------------------------------------------------------------------------------


class _Tokenizer:
    pad_token_id, eos_token_id, bos_token_id = 0, 1, None


class _Session:
    tokenizer = _Tokenizer()
    micro_batch_size, world_size, gradient_accumulation_steps = 2, 1, 1


def _steps(*rewards: Any) -> Any:
    from dsbuild.rl.rollouts import GRPOSteps

    return GRPOSteps(_Session(), GRPOSpec(num_generations=2), [(f"m:f{i}", f) for i, f in enumerate(rewards)])


@pytest.mark.parametrize(
    ("reward", "expected"),
    [
        (lambda completions, **_: 1 / 0, "raised ZeroDivisionError: division by zero"),
        (lambda completions, **_: [1.0], "returned 1 rewards for 2 completions"),
        (lambda completions, **_: 1.0, "returned float for 2 completions"),
        (lambda completions, **_: [1.0, float("nan")], "returned nan for completion 1"),
        (lambda completions, **_: [1.0, "high"], "returned 'high' for completion 1"),
    ],
)
def test_a_reward_function_that_fails_is_named_with_what_it_did(reward: Any, expected: str) -> None:
    """Raising, the wrong number of rewards, a NaN or a non-number: the run stops naming the function (never a
    silent zero); ``None`` is TRL's "not scored" (NaN, left out of the group's mean)."""
    rows, failure = _steps(reward)._score(["p", "p"], ["a", "b"], [[3], [4]], {})
    assert failure is not None and failure[0] == "m:f0" and failure[1].startswith(expected), failure
    rows, failure = _steps(lambda completions, **_: [None, 2.0])._score(["p", "p"], ["a", "b"], [[3], [4]], {})
    assert failure is None and str(rows) == "[[nan], [2.0]]"


def test_reward_functions_get_trls_arguments() -> None:
    """Called as TRL calls them: ``prompts``, ``completions``, ``completion_ids`` and each other field of the
    records as a list, by name."""
    seen: dict[str, Any] = {}

    def reward(**kwargs: Any) -> list[float]:
        seen.update(kwargs)
        return [0.0, 1.0]

    steps = _steps(reward)
    steps._score(["p", "q"], ["a", "b"], [[3], [4]], {"n": [1, 2]})
    state, log_extra, log_metric = seen.pop("trainer_state"), seen.pop("log_extra"), seen.pop("log_metric")
    assert seen == {"prompts": ["p", "q"], "completions": ["a", "b"], "completion_ids": [[3], [4]], "n": [1, 2]}
    assert state.global_step == 0 and log_extra("column", [1, 2]) is None
    log_metric("judge/calls", 2.0)
    log_metric("judge/calls", 4.0)
    assert steps.logged == {"judge/calls": [2.0, 4.0]}  # averaged into the step's metrics over every process


def test_a_reward_function_whose_signature_trl_cannot_call_fails_validate(tmp_path: Path) -> None:
    """Before any process starts, a reward function that does not take TRL's keyword arguments (no ``**kwargs``) is
    named by its ``[rewards] functions`` entry; an ``async def`` one is fine."""
    from dsbuild.run.tasks.grpo import job_functions

    text = GRPO.replace('["my_rewards:length"]', '["sig_rewards:judged", "sig_rewards:narrow"]')
    job = load_job(_write(tmp_path, text))
    (tmp_path / "sig_rewards.py").write_text(
        "def narrow(completions):\n    return []\n\nasync def judged(completions, **kw):\n    return []\n"
    )
    with pytest.raises(ConfigError) as info:
        job_functions(job)
    assert [str(p) for p in info.value.problems] == [
        "rewards.functions[1]: sig_rewards:narrow does not take TRL's keyword arguments prompts, completion_ids, "
        "trainer_state, log_extra, log_metric (TRL calls f(prompts=, completions=, completion_ids=, trainer_state=, "
        "log_extra=, log_metric=, **fields): add **kwargs)"
    ]
    assert info.value.fails_checks


# -- [rewards] models --------------------------------------------------------------------------------------------


def _reward_model_folder(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "num_labels": 1}')
    return folder


def test_reward_models_are_read_beside_functions_or_alone(tmp_path: Path) -> None:
    """``[rewards] models``: a folder relative to the job file (made absolute) or a hub id, with or without reward
    functions; the weights count the models first, then the functions."""
    _reward_model_folder(tmp_path / "rm")
    path = _write(tmp_path, GRPO.replace('functions = ["my_rewards:length"]', 'models = ["rm", "org/reward-model"]'))
    job = load_job(path)
    assert job.rewards is not None and job.rewards.functions == ()
    assert job.rewards.models == (str(tmp_path / "rm"), "org/reward-model")
    both = load_job(path, {"rewards.functions": ["my_rewards:length"], "rewards.weights": [1.0, 0.5, 2.0]})
    assert both.rewards is not None and both.rewards.weights == (1.0, 0.5, 2.0)


def test_reward_model_mistakes_are_named_by_their_keys(tmp_path: Path) -> None:
    """No model nor function, a folder that does not exist or is no model folder, a weight count that is not the
    models' and functions' and offloading below ZeRO-3: each named by its dotted key, together."""
    (tmp_path / "empty").mkdir()
    path = _write(tmp_path, GRPO)
    assert _problems(path, **{"rewards.functions": []}) == [
        "rewards.functions: got no reward function and no reward model, expected one or more (e.g. functions = "
        '["my_rewards:length"], or models = ["path/to/reward_model"])'
    ]
    found = _problems(path, **{"rewards.models": ["./missing", "empty"], "rewards.weights": [1.0, 2.0]})
    assert found == [
        f"rewards.models[0]: no such folder: {str(tmp_path / 'missing')!r} (a reward model's folder, relative to the "
        "job file)",
        f"rewards.models[1]: {str(tmp_path / 'empty')!r} is not a model folder (no config.json) (a folder "
        "save_pretrained wrote: an AutoModelForSequenceClassification with one label)",
        "rewards.weights: got 2 weights for 2 models and 1 functions (give one weight per reward model and function, "
        "the models' first)",
    ]
    _reward_model_folder(tmp_path / "rm")
    job = load_job(path, {"rewards.models": ["rm"], "rewards.offload_models": True, "strategy.config": "zero2"})
    assert [(d.path, d.severity) for d in job.validate()] == [("rewards.offload_models", "error")]
    assert load_job(path, {"rewards.models": ["rm"], "rewards.offload_models": True}).validate() == []
    # The reward models' own stage: 3 beside a ZeRO-2 policy offloads; 0 beside a ZeRO-3 one cannot; 1, 2 or 5 never.
    zero2 = {"rewards.models": ["rm"], "rewards.offload_models": True, "strategy.config": "zero2"}
    assert load_job(path, {**zero2, "rewards.zero_stage": 3}).validate() == []
    job = load_job(path, {"rewards.models": ["rm"], "rewards.offload_models": True, "rewards.zero_stage": 0})
    assert [(d.path, d.severity) for d in job.validate()] == [("rewards.offload_models", "error")]
    job = load_job(path, {"rewards.models": ["rm"], "rewards.zero_stage": 2})
    assert [(d.path, d.message) for d in job.validate()] == [
        ("rewards.zero_stage", "got 2 for the engine without an optimizer, expected 0 or 3")
    ]
    assert _problems(path, **{"rewards.models": ["rm"], "rewards.zero_stage": 5}) == [
        "rewards.zero_stage: got 5, expected an integer >= 0 and <= 3"
    ]
