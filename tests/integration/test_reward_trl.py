"""``task = "reward"`` as TRL 1.16's ``RewardTrainer`` trains a reward model (issue 44): ``dsbuild train`` on a reward
job against TRL's trainer on real DeepSpeed ZeRO-3 with the config the job resolved (``_reward_worker.py``), each in a
process of its own: the same causal Llama folder (each side building the one-label sequence classifier from it, the
score head new), the same ragged pairs, 3 optimizer steps of 2 pairs × accumulation 2 in the HF Trainer's shuffled
order, fp32, lr 1e-3, an evaluation of the pairs after the last step. Standard pairs with a ``margin`` column and
``center_rewards_coefficient``; conversational pairs with an implicit prompt and a chat template. Then the same job on
2 processes, and the trained model scoring completions in a GRPO job's ``[rewards] models``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.procs]  # each side trains in a process of its own

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_reward_worker.py"
ROOT = HERE.parents[1]
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
METRICS = ("loss", "accuracy", "margin", "min_reward", "mean_reward", "max_reward", "num_tokens")
"""What TRL's RewardTrainer logs per step and in evaluation (``eval_*``), compared to 1e-5 (``num_tokens``, its running
count of trained tokens, exactly)."""

JOB = """
task = "reward"
[model]
name_or_path = "{base}"
tokenizer = "byte"
[data]
path = "{pairs}"
eval_path = "{pairs}"
format = "preference"
{data}
[reward]
{reward}
[training]
output_dir = "{out}"
per_device_train_batch_size = {micro}
gradient_accumulation_steps = 2
learning_rate = 1e-3
weight_decay = 0.0
lr_scheduler_type = "constant"
max_steps = 3
logging_steps = 1
save_strategy = "no"
eval_strategy = "steps"
eval_steps = 3
per_device_eval_batch_size = {micro}
seed = 0
[strategy]
name = "deepspeed_train"
config = "zero3"
[launch]
nproc_per_node = {processes}
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(HERE), "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _check(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stderr[-5000:]


def _job(tmp: Path, name: str, base: Path, pairs: Path, *, micro: int = 2, processes: int = 1, data: str = "",
         reward: str = "", extra: str = "") -> dict[str, Any]:  # fmt: skip
    """``dsbuild train`` on a reward job: its step and evaluation records and its saved model's weights."""
    from transformers import AutoModelForSequenceClassification

    out = tmp / name
    job = tmp / f"{name}.toml"
    job.write_text(JOB.format(base=base, pairs=pairs, out=out, micro=micro, processes=processes, data=data,
                              reward=reward) + extra)  # fmt: skip
    _check(subprocess.run([sys.executable, "-m", "dsbuild", "train", str(job)], capture_output=True, text=True,
                          env=_env(), cwd=tmp, timeout=600))  # fmt: skip
    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    model = AutoModelForSequenceClassification.from_pretrained(out / "model")
    return {"records": [r for r in records if "loss" in r], "evaluation": [r for r in records if "eval_loss" in r],
            "weights": {k: v.detach() for k, v in model.named_parameters()}, "out": out, "model": model}  # fmt: skip


def _trl(tmp: Path, name: str, base: Path, pairs: Path, ds_config: Path, *more: str) -> dict[str, Any]:
    out = tmp / name
    _check(subprocess.run([sys.executable, str(WORKER), str(base), str(pairs), str(out), "--ds-config",
                           str(ds_config), *more], capture_output=True, text=True, env=_env(), cwd=ROOT,
                          timeout=600))  # fmt: skip
    result = json.loads((out / "result.json").read_text())
    return {**result, "weights": torch.load(out / "weights.pt")}


def _write_base(path: Path) -> Path:
    """A tiny random causal Llama and the byte tokenizer: the model both sides make a reward model of."""
    from transformers import AutoModelForCausalLM, ByT5Tokenizer, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=384, max_position_embeddings=256)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    ByT5Tokenizer().save_pretrained(path)
    return path


def _pairs(tmp: Path) -> tuple[Path, Path]:
    """Examples/data/pairs.jsonl with a margin per pair (ragged, standard), and the same pairs as conversations whose
    prompt is implicit (the user's turn both share)."""
    records = [json.loads(line) for line in (ROOT / "examples" / "data" / "pairs.jsonl").read_text().splitlines()]
    standard, chat = tmp / "pairs.jsonl", tmp / "chat.jsonl"
    standard.write_text("".join(json.dumps({**r, "margin": 0.25 * i - 1.0}) + "\n" for i, r in enumerate(records)))
    turns = [
        {name: [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r[name]}]
         for name in ("chosen", "rejected")}
        for r in records
    ]  # fmt: skip
    chat.write_text("".join(json.dumps(t) + "\n" for t in turns))
    return standard, chat


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("reward")
    base = _write_base(tmp / "base")
    standard, chat = _pairs(tmp)
    ours = _job(tmp, "one", base, standard, reward="center_rewards_coefficient = 0.01")
    theirs = _trl(tmp, "trl", base, standard, ours["out"] / "ds_config.json", "--center", "0.01")
    data = f"chat_template = {json.dumps(TEMPLATE)}"
    chat_ours = _job(tmp, "chat", base, chat, data=data)
    chat_theirs = _trl(tmp, "chat_trl", base, chat, chat_ours["out"] / "ds_config.json", "--template", TEMPLATE)
    two = _job(tmp, "two", base, standard, micro=1, processes=2, reward="center_rewards_coefficient = 0.01")
    lora = _job(tmp, "lora", base, standard, extra="[model.lora]\nr = 4\nmerge = true\n")
    return {"tmp": tmp, "base": base, "one": ours, "trl": theirs, "chat": chat_ours, "chat_trl": chat_theirs,
            "two": two, "lora": lora, "standard": standard}  # fmt: skip


def _margin(model: Any, pairs: Path) -> float:
    """The mean ``r_chosen - r_rejected`` of the pairs under ``model`` (on CPU, all pairs in one batch), tokenized
    and padded as the reward job does."""
    from transformers import ByT5Tokenizer

    from dsbuild.data.preference import collate_scored_pairs, read_pairs, score_pairs

    scored, _ = score_pairs(read_pairs(pairs), ByT5Tokenizer(), max_length=None)
    batch = collate_scored_pairs(scored, pad_token_id=0)
    with torch.no_grad():
        rewards = model.eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, 0]
    chosen, rejected = rewards.chunk(2)
    return float((chosen - rejected).mean())


def _same(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], steps: int, prefix: str = "") -> None:
    assert len(ours) == len(theirs) == steps
    for mine, other in zip(ours, theirs, strict=True):
        for name in METRICS:
            key = prefix + name
            assert mine[key] == pytest.approx(other[key], abs=1e-5), (key, mine, other)


def _close_weights(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], start: dict[str, Any]) -> None:
    """Every weight TRL's to 1e-6 (measured: equal), the score head's included, and the weights moved."""
    assert sorted(ours) == sorted(theirs)
    assert max(float((ours[k] - theirs[k]).abs().max()) for k in theirs) <= 1e-6
    assert max(float((theirs[k] - start[k]).abs().max()) for k in theirs if k != "score.weight") > 1e-4


def _start(base: Path, trained: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The starting weights: the base's (the new score head: the trained one's, its start is drawn by each side)."""
    from transformers import AutoModelForCausalLM

    start = {f"model.{k}" if not k.startswith("lm_head") else k: v.detach()
             for k, v in AutoModelForCausalLM.from_pretrained(base).model.named_parameters()}  # fmt: skip
    return {k: start.get(k, trained[k]) for k in trained}


def test_a_reward_job_trains_as_trls_reward_trainer(runs: dict[str, Any]) -> None:
    """Standard ragged pairs with a margin column and ``center_rewards_coefficient``: per step the loss, accuracy,
    margin and min / mean / max reward are TRL's to 1e-5 (measured 3e-8), the evaluation after the last step too
    (``eval_*``, 4e-8), and the saved model (``AutoModelForSequenceClassification``) holds TRL's weights (measured:
    equal; the score head both sides drew from the seed included)."""
    ours, theirs = runs["one"], runs["trl"]
    _same(ours["records"], theirs["records"], 3)
    _same(ours["evaluation"], theirs["evaluation"], 1, prefix="eval_")
    _close_weights(ours["weights"], theirs["weights"], _start(runs["base"], theirs["weights"]))
    assert ours["records"][0]["loss"] != pytest.approx(0.6931472, abs=1e-3)  # the margins and centring count


def test_the_saved_model_scores_as_the_run_evaluated(runs: dict[str, Any]) -> None:
    """The saved folders (all weights; LoRA merged, its score head trained with the adapters as peft's ``SEQ_CLS``)
    load with ``AutoModelForSequenceClassification`` and give the pairs the margin the run's last evaluation logged
    (1e-4); the LoRA run learned (its evaluation margin moved from its first step's)."""
    for name in ("one", "lora"):
        run = runs[name]
        assert run["model"].config.num_labels == 1 and run["model"].config.pad_token_id == 0
        logged = run["evaluation"][-1]["eval_margin"]
        assert _margin(run["model"], runs["standard"]) == pytest.approx(logged, abs=1e-4), name
    assert runs["lora"]["evaluation"][-1]["eval_margin"] != pytest.approx(runs["lora"]["records"][0]["margin"])


def test_conversational_pairs_with_an_implicit_prompt_train_as_trls(runs: dict[str, Any]) -> None:
    """Conversations (the prompt implicit: the user's turn both share), rendered by the job's chat template: TRL's
    numbers per step and in evaluation (measured 3e-8 and 4e-8), and its weights (equal)."""
    ours, theirs = runs["chat"], runs["chat_trl"]
    _same(ours["records"], theirs["records"], 3)
    _same(ours["evaluation"], theirs["evaluation"], 1, prefix="eval_")
    _close_weights(ours["weights"], theirs["weights"], _start(runs["base"], theirs["weights"]))


def test_two_processes_train_as_one(runs: dict[str, Any]) -> None:
    """2 processes × 1 pair × accumulation 2 see the 1-process run's 4 pairs per step: the same records (the reward
    extremes and mean over both processes' rewards, as TRL gathers them) and evaluation (1e-5; measured 6e-8 and
    2.4e-7), the same weights to 1e-5 (lr 1e-3: the gradients summed over processes in another order; measured
    4.3e-6)."""
    _same(runs["two"]["records"], runs["one"]["records"], 3)
    _same(runs["two"]["evaluation"], runs["one"]["evaluation"], 1, prefix="eval_")
    one, two = runs["one"]["weights"], runs["two"]["weights"]
    assert max(float((two[k] - one[k]).abs().max()) for k in one) <= 1e-5


GRPO = """
task = "grpo"
[model]
name_or_path = "{base}"
tokenizer = "byte"
[data]
path = "{prompts}"
format = "prompt"
[rewards]
models = ["{model}"]
[grpo]
num_generations = 4
max_completion_length = 6
[training]
output_dir = "{out}"
per_device_train_batch_size = 4
max_steps = 1
logging_steps = 1
save_strategy = "no"
seed = 0
[strategy]
config = "zero3"
"""


def test_the_trained_model_is_a_grpo_jobs_reward_model(runs: dict[str, Any]) -> None:
    """The reward job's saved folder is taken by a GRPO job's ``[rewards] models`` and scores its completions (its
    rewards logged under TRL's name for it, ``rewards/model/mean``); TRL's own reward-model scoring of that folder
    puts the trained pairs' chosen answers above the rejected as often as the job's last evaluation said."""
    from test_reward_models import trl_rewards

    tmp, model = runs["tmp"], runs["one"]["out"] / "model"
    job = tmp / "grpo.toml"
    job.write_text(GRPO.format(base=runs["base"], prompts=ROOT / "examples" / "data" / "prompts.jsonl", model=model,
                               out=tmp / "grpo"))  # fmt: skip
    _check(subprocess.run([sys.executable, "-m", "dsbuild", "train", str(job)], capture_output=True, text=True,
                          env=_env(), cwd=tmp, timeout=600))  # fmt: skip
    steps = [json.loads(line) for line in (tmp / "grpo" / "history.jsonl").read_text().splitlines()]
    assert next(r for r in steps if "loss" in r)["rewards/model/std"] > 0
    pairs = [json.loads(line) for line in (tmp / "pairs.jsonl").read_text().splitlines()]
    eos = "</s>"  # what the reward job appended to every answer
    chosen = trl_rewards(model, [p["prompt"] for p in pairs], [p["chosen"] + eos for p in pairs])
    rejected = trl_rewards(model, [p["prompt"] for p in pairs], [p["rejected"] + eos for p in pairs])
    accuracy = sum(c > r for c, r in zip(chosen, rejected, strict=True)) / len(pairs)
    assert accuracy == pytest.approx(runs["one"]["evaluation"][-1]["eval_accuracy"], abs=1e-6)
