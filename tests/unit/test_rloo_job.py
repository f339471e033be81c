"""RLOO jobs before anything trains (issue 44 item 3): ``task = "rloo"`` reads GRPO's ``[rollout]``, ``[rewards]`` and
``[reference]`` and an ``[rloo]`` table of TRL 1.16's ``RLOOConfig`` names and defaults; every ``RLOOConfig`` field
runs or is refused by its dotted key with what to write instead; ``dsbuild validate`` and ``plan`` see the task."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path
from typing import Any

import attrs
import pytest

from dsbuild.cli import main
from dsbuild.errors import ConfigError, InvalidValueError
from dsbuild.job import load_job
from dsbuild.job.rl import RLOOSpec
from dsbuild.job.spec import job_keys
from dsbuild.job.trl_keys import RLOO_NOT_RUN

RLOO = """
    task = "rloo"
    [model]
    tokenizer = "byte"
    [model.config]
    model_type = "llama"
    hidden_size = 64
    intermediate_size = 128
    num_hidden_layers = 2
    num_attention_heads = 4
    vocab_size = 384
    [data]
    path = "prompts.jsonl"
    format = "prompt"
    [rewards]
    functions = ["my_rewards:length"]
    [training]
    per_device_train_batch_size = 8
    [strategy]
    config = "zero2"
"""


def _write(tmp_path: Path, text: str, prompts: int = 8) -> Path:
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(prompts)))
    (tmp_path / "my_rewards.py").write_text("def length(completions, **_):\n    return [1.0 for _ in completions]\n")
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_job(path)
    return [str(p) for p in info.value.problems]


def _rloo_fields() -> dict[str, Any]:
    """``RLOOConfig``'s fields and defaults, ``TrainingArguments``' left out (read from the installed TRL)."""
    import transformers
    import trl

    training = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    return {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(trl.RLOOConfig)
        if f.name not in training
    }


@pytest.mark.train
def test_every_rloo_config_field_runs_or_says_what_to_write_instead() -> None:
    """Each field is a key of ``RLOOSpec`` (with TRL's default) or a row of ``RLOO_NOT_RUN`` that runs only at TRL's
    default and says why and what instead (a field of a newer TRL fails here until it is one)."""
    fields = _rloo_fields()
    missing = sorted(set(fields) - set(job_keys(RLOOSpec)) - set(RLOO_NOT_RUN))
    assert missing == [], f"RLOOConfig fields dsbuild neither reads nor refuses: {missing}"
    assert sorted(set(RLOO_NOT_RUN) - set(fields)) == []
    for key, row in RLOO_NOT_RUN.items():
        assert row.runs == fields[key] and type(row.runs) is type(fields[key]), key
        assert row.why and row.instead, key
    spec = RLOOSpec()
    for key in job_keys(RLOOSpec):
        assert getattr(spec, key) == fields[key], key


@pytest.mark.train
def test_an_rloo_config_reads_back_as_its_spec() -> None:
    """``RLOOSpec.from_trl`` of a TRL ``RLOOConfig`` with every option changed is the spec of those options, and
    ``to_trl`` builds that config again."""
    import trl

    options = {"num_generations": 4, "beta": 0.0, "epsilon": 0.1, "epsilon_high": 0.3, "normalize_advantages": True,
               "reward_clip_range": (-1.0, 2.0), "temperature": 0.7, "num_iterations": 2, "steps_per_generation": 2,
               "mask_truncated_completions": True, "max_completion_length": 64}  # fmt: skip
    config = trl.RLOOConfig(output_dir="/tmp/x", per_device_train_batch_size=4, use_cpu=True, report_to=[], **options)
    spec = RLOOSpec.from_trl(config)
    assert spec == RLOOSpec(**options)
    again = trl.RLOOConfig(output_dir="/tmp/x", per_device_train_batch_size=4, use_cpu=True, report_to=[],
                           **spec.to_trl())  # fmt: skip
    assert RLOOSpec.from_trl(again) == spec


def test_an_rloo_job_reads_grpos_tables_and_rloos_defaults(tmp_path: Path) -> None:
    """``task = "rloo"``: ``[rloo]`` defaults to RLOOConfig's (2 generations, beta 0.05: a reference by default, the
    policy's start when ``[reference]`` is left out); a step is one generation batch of whole prompt groups."""
    job = load_job(_write(tmp_path, RLOO))
    assert job.task == "rloo" and job.rloo == RLOOSpec() and job.grpo is None and job.reference is None
    assert job.rewards is not None and job.rollout is not None and job.rollout.backend == "hf"
    # 8 prompts, 8 completions a step (4 prompts × 2 generations): 2 steps an epoch, 3 epochs (HF's default)
    assert job.total_steps() == 6
    assert job.task_shapes() == {"reference": True}
    assert load_job(_write(tmp_path, RLOO + "    [rloo]\n    beta = 0.0\n")).task_shapes() == {"reference": False}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (RLOO + "    [rloo]\n    num_generations = 3\n", "rloo.num_generations: generation_batch_size (8) must be"),
        (RLOO + "    [rloo]\n    num_generations = 1\n", "rloo.num_generations: got 1, expected an integer >= 2"),
        (RLOO + "    [rloo]\n    generation_batch_size = 12\n",
         "rloo.generation_batch_size: generation_batch_size (12) must be divisible by the global batch size (8)"),
        (RLOO + "    [rloo]\n    beta = -1\n", "rloo.beta: got -1"),
        (RLOO + "    [rloo]\n    reward_clip_range = [2, 1]\n", "rloo.reward_clip_range: got a list [2, 1], expected [low, high]"),
        (RLOO + "    [rloo]\n    reward_clip_range = 1\n", "rloo.reward_clip_range: got 1, expected [low, high]"),
        (RLOO + "    [rloo]\n    normalise_advantages = true\n", "rloo.normalise_advantages: unknown"),
        (RLOO + "    [rloo]\n    loss_type = \"dapo\"\n", "rloo.loss_type: unknown"),
        (RLOO + "    [rloo]\n    use_vllm = true\n", "rloo.use_vllm: dsbuild train does not start vLLM"),
        (RLOO + "    [rloo]\n    disable_dropout = true\n", "rloo.disable_dropout: an RLOO job trains with"),
        (RLOO + "    [rloo]\n    reward_weights = [2.0]\n", "rloo.reward_weights: a job's reward weights are"),
        (RLOO + "    [rloo]\n    generation_kwargs = {temperature = 0.5}\n",
         "rloo.generation_kwargs: TRL's generate arguments are [rloo]'s sampling keys (write rloo.temperature = 0.5)"),
        (RLOO + "    [rloo]\n    sync_ref_model = true\n", "rloo.sync_ref_model: the reference sync is not built"),
        (RLOO + "    [rloo]\n    beta = 0.0\n    [reference]\n", "reference: not used with rloo.beta = 0"),
        (RLOO + "    [grpo]\n", "grpo: [grpo] is read by task = 'grpo'; this job's task is 'rloo'"),
        (RLOO.replace("    [rewards]\n    functions = [\"my_rewards:length\"]\n", ""),
         "rewards: missing: an RLOO job needs [rewards]"),
        (RLOO.replace('format = "prompt"', 'format = "alpaca"'),
         "data.format: got 'alpaca' for task = 'rloo' (an RLOO job reads prompts"),
        (RLOO.replace('format = "prompt"', 'format = "prompt"\n    max_length = 64'),
         "data.max_length: not read for task = \"rloo\" ([rloo] max_completion_length, as TRL's RLOOConfig)"),
        (RLOO.replace('task = "rloo"', 'task = "sft"').replace('format = "prompt"', 'format = "alpaca"') + "    [rloo]\n",
         "rloo: [rloo] is read by task = 'rloo'; this job's task is 'sft'"),
    ],
)  # fmt: skip
def test_bad_rloo_jobs_name_the_key(tmp_path: Path, text: str, expected: str) -> None:
    """Each mistake of an RLOO job (or another job with its table) is named by its dotted key, with what to do."""
    found = _problems(_write(tmp_path, text))
    assert any(p.startswith(expected) for p in found), found


def test_an_rloo_spec_refuses_a_bad_value_by_its_key() -> None:
    """Built in code, a bad value fails where it is set, named by its dotted key."""
    with pytest.raises(InvalidValueError, match=r"^rloo.reward_clip_range: got a list \[1.0\], expected \[low,"):
        RLOOSpec(reward_clip_range=(1.0,))
    with pytest.raises(ConfigError, match=r"^rloo.generation_batch_size: 'generation_batch_size' and"):
        RLOOSpec(generation_batch_size=8, steps_per_generation=2)


def test_a_batch_that_does_not_hold_whole_groups_at_the_runs_world_size_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``dsbuild validate`` passes an RLOO job whose groups fit its own 2 processes (exit 0); ``dsbuild train
    --nproc-per-node 3`` refuses it before anything starts, naming ``rloo.num_generations`` (exit 1)."""
    text = RLOO.replace("per_device_train_batch_size = 8", "per_device_train_batch_size = 2")
    path = _write(tmp_path, text + "    [launch]\n    nproc_per_node = 2\n    [rloo]\n    num_generations = 4\n")
    assert main(["validate", str(path)]) == 0
    capsys.readouterr()
    assert main(["train", str(path), "--nproc-per-node", "3"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"dsbuild: error: {path}: rloo.num_generations: generation_batch_size (6) must be "
                          "divisible by num_generations (4)."), err  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_plan_counts_an_rloo_jobs_reference_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``dsbuild plan --model`` of an RLOO job counts a reference at RLOOConfig's default beta (0.05), none with
    ``beta = 0``."""

    def notes(extra: str) -> list[str]:
        path = _write(tmp_path, RLOO + extra)
        assert main(["plan", "--model", str(path), "--json"]) == 0
        return list(json.loads(capsys.readouterr().out)["notes"])

    assert any(n.startswith("reference model") for n in notes(""))
    assert not any(n.startswith("reference model") for n in notes("    [rloo]\n    beta = 0.0\n"))


@pytest.mark.train
def test_export_for_trl_writes_the_rloo_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``dsbuild export --for trl`` of an RLOO job writes ``[rloo]``'s keys (``trl rloo --config``): TRL's
    ``RLOOConfig`` builds from them and reads back as the job's spec."""
    import trl
    import yaml
    from transformers import AutoModelForCausalLM, LlamaConfig

    AutoModelForCausalLM.from_config(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                 num_attention_heads=4, vocab_size=384)).save_pretrained(tmp_path / "m")  # fmt: skip
    text = RLOO.replace('tokenizer = "byte"\n    [model.config]', 'name_or_path = "m"\n    [model.config]')
    text = text.split("    [model.config]")[0] + "    [data]" + text.split("    [data]")[1]
    path = _write(
        tmp_path, text + "    [rloo]\n    num_generations = 4\n    beta = 0.1\n    reward_clip_range = [-1, 1]\n"
    )
    assert main(["export", "--for", "trl", str(path), "-o", str(tmp_path / "trl.yaml")]) == 0
    capsys.readouterr()
    written = yaml.safe_load((tmp_path / "trl.yaml").read_text())
    fields = set(_rloo_fields())
    config = trl.RLOOConfig(output_dir=str(tmp_path / "o"), use_cpu=True, report_to=[], per_device_train_batch_size=8,
                            **{k: v for k, v in written.items() if k in fields})  # fmt: skip
    job = load_job(path).rloo
    assert job is not None and job.beta == 0.1 and job.reward_clip_range == (-1, 1)
    # TRL's config fills steps_per_generation from the accumulation steps (1), which the job leaves to the default
    assert RLOOSpec.from_trl(config) == attrs.evolve(job, steps_per_generation=1)
