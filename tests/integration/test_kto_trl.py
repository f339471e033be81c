"""``task = "kto"`` as TRL 1.16's ``KTOTrainer`` trains (issue 44): ``dsbuild train`` on a KTO job against TRL's
trainer on real DeepSpeed ZeRO-3 with the config the job resolved (``_kto_worker.py``), each in a process of its own:
the same tiny Llama folder as policy and reference, the same ragged unpaired records (desirable and undesirable
alternating, so every micro-batch holds both), 3 optimizer steps of 2 records × accumulation 2 in order (KTO's
sequential sampling, the KL pairs rotated within each micro-batch), fp32, lr 1e-3. Standard records with ``kto``'s KL
estimate, beta and both weights set; conversational records with ``apo_zero_unpaired`` and a chat template; and 9
records on 2 processes × 2 against TRL under torchrun (an uneven end: Accelerate's filler, left out of what TRL
gathers).
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
WORKER = HERE / "_kto_worker.py"
ROOT = HERE.parents[1]
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
METRICS = ("loss", "kl", "entropy", "logits/chosen", "logits/rejected", "rewards/chosen", "logps/chosen",
           "rewards/rejected", "logps/rejected", "rewards/margins", "num_tokens")  # fmt: skip
"""What TRL's KTOTrainer logs per step, compared to 1e-5 (``num_tokens``, its running count of trained tokens,
exactly)."""

JOB = """
task = "kto"
[model]
name_or_path = "{base}"
tokenizer = "byte"
[data]
path = "{records}"
format = "unpaired"
{data}
[kto]
{kto}
[training]
output_dir = "{out}"
per_device_train_batch_size = 2
gradient_accumulation_steps = {accumulation}
learning_rate = 1e-3
weight_decay = 0.0
lr_scheduler_type = "constant"
max_steps = 3
logging_steps = 1
save_strategy = "no"
seed = 0
{training}
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


def _job(
    tmp: Path,
    name: str,
    base: Path,
    records: Path,
    *,
    data: str = "",
    kto: str = "",
    processes: int = 1,
    evaluate: bool = False,
) -> dict[str, Any]:
    """``dsbuild train`` on a KTO job (2 records a micro-batch: × 2 accumulation on 1 process, × 1 on several): its
    step records, its evaluation's after the last step (``evaluate``: of the training records, 2 a batch) and its
    saved model's weights."""
    from transformers import AutoModelForCausalLM

    out = tmp / name
    job = tmp / f"{name}.toml"
    accumulation = 2 if processes == 1 else 1
    if evaluate:
        data += f"\neval_path = {json.dumps(str(records))}"
    training = 'eval_strategy = "steps"\neval_steps = 3\nper_device_eval_batch_size = 2' if evaluate else ""
    job.write_text(JOB.format(base=base, records=records, out=out, data=data, kto=kto, processes=processes,
                              accumulation=accumulation, training=training))  # fmt: skip
    _check(subprocess.run([sys.executable, "-m", "dsbuild", "train", str(job)], capture_output=True, text=True,
                          env=_env(), cwd=tmp, timeout=600))  # fmt: skip
    records_ = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    return {"records": [r for r in records_ if "loss" in r], "evaluation": [r for r in records_ if "eval_loss" in r],
            "out": out, "weights": {k: v.detach() for k, v in model.named_parameters()}}  # fmt: skip


def _trl(
    tmp: Path, name: str, base: Path, records: Path, ds_config: Path, *more: str, processes: int = 1
) -> dict[str, Any]:
    from dsbuild.session.distributed import free_port

    out = tmp / name
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port",
                     str(free_port())]  # fmt: skip
        more = (*more, "--accumulation", "1")
    _check(subprocess.run([*launcher, str(WORKER), str(base), str(records), str(out), "--ds-config",
                           str(ds_config), *more], capture_output=True, text=True, env=_env(), cwd=ROOT,
                          timeout=600))  # fmt: skip
    result = json.loads((out / "result.json").read_text())
    return {**result, "weights": torch.load(out / "weights.pt")}


def _write_base(path: Path) -> Path:
    """A tiny random Llama and the byte tokenizer: the policy's start and the reference on both sides."""
    from transformers import AutoModelForCausalLM, ByT5Tokenizer, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=384, max_position_embeddings=256)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    ByT5Tokenizer().save_pretrained(path)
    return path


def _records(tmp: Path) -> tuple[Path, Path]:
    """examples/data/pairs.jsonl unpaired: pair i's chosen answer (desirable) for even i, its rejected answer
    (undesirable) for odd i (ragged, standard); and the same as conversations."""
    pairs = [json.loads(line) for line in (ROOT / "examples" / "data" / "pairs.jsonl").read_text().splitlines()]
    unpaired = [{"prompt": p["prompt"], "completion": p["chosen" if i % 2 == 0 else "rejected"], "label": i % 2 == 0}
                for i, p in enumerate(pairs)]  # fmt: skip
    standard, chat = tmp / "records.jsonl", tmp / "chat.jsonl"
    standard.write_text("".join(json.dumps(r) + "\n" for r in unpaired))
    turns = [{"prompt": [{"role": "user", "content": r["prompt"]}],
              "completion": [{"role": "assistant", "content": r["completion"]}], "label": r["label"]}
             for r in unpaired]  # fmt: skip
    chat.write_text("".join(json.dumps(t) + "\n" for t in turns))
    return standard, chat


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("kto")
    base = _write_base(tmp / "base")
    standard, chat = _records(tmp)
    ours = _job(tmp, "one", base, standard, kto="beta = 0.2\ndesirable_weight = 1.3\nundesirable_weight = 0.7",
                evaluate=True)  # fmt: skip
    theirs = _trl(tmp, "trl", base, standard, ours["out"] / "ds_config.json", "--beta", "0.2", "--desirable", "1.3",
                  "--undesirable", "0.7", "--evaluate")  # fmt: skip
    chat_ours = _job(tmp, "chat", base, chat, data=f"chat_template = {json.dumps(TEMPLATE)}",
                     kto='loss_type = "apo_zero_unpaired"')  # fmt: skip
    chat_theirs = _trl(tmp, "chat_trl", base, chat, chat_ours["out"] / "ds_config.json", "--loss-type",
                       "apo_zero_unpaired", "--template", TEMPLATE)  # fmt: skip
    # 9 records on 2 processes x 2: the last round's chunks are [8] and a filler of the first records (Accelerate's
    # even_batches), which TRL's gather_for_metrics leaves out of the KL estimate and the metrics (9 mod 4 = 1)
    nine = tmp / "nine.jsonl"
    nine.write_text("".join(standard.read_text().splitlines(keepends=True)[:9]))
    two = _job(tmp, "two", base, nine, kto="beta = 0.2", processes=2)
    two_trl = _trl(tmp, "two_trl", base, nine, two["out"] / "ds_config.json", "--beta", "0.2", processes=2)
    return {"one": ours, "trl": theirs, "chat": chat_ours, "chat_trl": chat_theirs, "two": two, "two_trl": two_trl}


def _same(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> None:
    """Each step's ``METRICS`` to 1e-5, and the same left out (TRL logs nothing of a side no gathered row has)."""
    assert len(ours) == len(theirs) == 3
    for mine, other in zip(ours, theirs, strict=True):
        assert [n for n in METRICS if n in mine] == [n for n in METRICS if n in other], (mine, other)
        for name in (n for n in METRICS if n in other):
            assert mine[name] == pytest.approx(other[name], abs=1e-5), (name, mine, other)


def _close_weights(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    assert sorted(ours) == sorted(theirs)
    assert max(float((ours[k] - theirs[k]).abs().max()) for k in theirs) <= 1e-5


def test_a_kto_job_trains_as_trls_kto_trainer(runs: dict[str, Any]) -> None:
    """Standard ragged records, ``kto`` with beta 0.2 and both weights set: per step the loss, the KL estimate from
    the mismatched pairs, entropy, logits, rewards, log-probs and margins are TRL's to 1e-5, the KL moved off 0 after
    the first step, and the saved weights are TRL's to 1e-5."""
    ours, theirs = runs["one"], runs["trl"]
    _same(ours["records"], theirs["records"])
    assert ours["records"][0]["kl"] == 0.0 and max(r["kl"] for r in ours["records"][1:]) > 0
    _close_weights(ours["weights"], theirs["weights"])


def test_a_kto_job_evaluates_as_trls_kto_trainer(runs: dict[str, Any]) -> None:
    """``eval_path`` evaluated after the last step, 2 records a batch (each with the KL completion its training chunk
    gives it, as TRL's eval dataset): the loss, KL estimate and every metric TRL logs in evaluation (``eval_*``) to
    1e-5 (measured 2e-7)."""
    ours, theirs = runs["one"]["evaluation"], runs["trl"]["evaluation"]
    assert len(ours) == len(theirs) == 1, (ours, theirs)
    names = {n for n in theirs[0] if n.startswith("eval_") and n not in EVAL_TIMING}
    mine = {n for n in ours[0] if n.startswith("eval_")}
    assert names <= mine and mine - names == {"eval_samples"}, (ours, theirs)  # dsbuild's count of what it evaluated
    for name in sorted(names):
        assert ours[0][name] == pytest.approx(theirs[0][name], abs=1e-5), (name, ours, theirs)


EVAL_TIMING = {"eval_runtime", "eval_samples_per_second", "eval_steps_per_second"}
"""What an evaluation record holds that depends on the machine, not the run."""


def test_conversational_records_train_as_trls_apo_zero_unpaired(runs: dict[str, Any]) -> None:
    """Conversations rendered by the job's chat template, ``apo_zero_unpaired`` (no KL: logged as 0): TRL's numbers
    per step to 1e-5 and its weights."""
    ours, theirs = runs["chat"], runs["chat_trl"]
    _same(ours["records"], theirs["records"])
    assert all(r["kl"] == 0.0 for r in ours["records"])
    _close_weights(ours["weights"], theirs["weights"])


def test_a_kto_job_on_two_processes_trains_as_trls_on_two(runs: dict[str, Any]) -> None:
    """9 records on 2 processes x 2 (one step of 2 chunks each time, the last round's second chunk a filler of the
    first records, as Accelerate deals an uneven end): TRL's KTOTrainer under torchrun logs the same numbers per step
    to 1e-5, the KL estimate and the metrics of the last step leaving the filler out as its gather_for_metrics does,
    and ends at the same weights."""
    ours, theirs = runs["two"], runs["two_trl"]
    _same(ours["records"], theirs["records"])
    assert "logits/rejected" not in ours["records"][-1]  # only [8] gathered: a desirable row, no rejected side
    _close_weights(ours["weights"], theirs["weights"])
