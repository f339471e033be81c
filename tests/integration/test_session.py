"""Session against real DeepSpeed on CPU: tiny Llama models built from a config, no mocks.

Every engine in this file shares the one process group of the pytest process
(world size 1; DeepSpeed creates it once and reuses it). What must see a fresh
process (no process group yet) or several processes runs in a subprocess.
"""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import deepspeed
import peft
import pytest
import torch
from _session_common import TokenData, batch, tiny_llama
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, ByT5Tokenizer
from transformers.integrations import is_deepspeed_zero3_enabled

from dsbuild import AUTO, Config, SessionError
from dsbuild.errors import CheckpointError
from dsbuild.outputs import manifest
from dsbuild.resolve.training import Training
from dsbuild.session import Session

pytestmark = [
    pytest.mark.train,
    pytest.mark.engine,
    pytest.mark.procs,
]  # the training extra; tests/conftest.py skips it without

ROOT = Path(__file__).resolve().parents[2]
LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def trainable(s: Session) -> list[Any]:
    """Copies of the trainable weights, whole (gathered from their ZeRO-3 partitions), in fp32."""
    params = [p for p in s.model.parameters() if p.requires_grad]
    with deepspeed.zero.GatheredParameters(params):
        return [p.detach().float().clone() for p in params]


def changed(before: list[Any], after: list[Any]) -> list[bool]:
    return [not torch.equal(a, b) for a, b in zip(before, after, strict=True)]


def hf_loss(model: Any, b: dict[str, Any]) -> float:
    model.eval()
    with torch.no_grad():
        return float(model(**b).loss)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_one_step_at_each_zero_stage_changes_every_weight(stage: int) -> None:
    """One optimizer step at ZeRO stage 0-3 updates every trainable tensor (not only runs)."""
    s = Session.from_pretrained(tiny_llama(), Config.zero(stage).adamw(lr=1e-2).batch(micro=2, grad_accum=1))
    assert s.engine.zero_optimization_stage() == stage
    before = trainable(s)
    out = s.step(batch())
    assert out.boundary and out.global_step == 1 and out.lr == pytest.approx(1e-2)
    assert out.loss > 0
    assert out.grad_norm is None or out.grad_norm > 0
    assert all(changed(before, trainable(s)))
    assert not is_deepspeed_zero3_enabled()  # the ZeRO-3 construction scope did not leak


def test_bf16_fit_resolves_hf_autos_from_the_run(tmp_path: Path) -> None:
    """An all-"auto" HF preset trains in bf16: the step count comes from fit, metrics reach the CSV monitor."""
    training = Training(
        per_device_train_batch_size=2, gradient_accumulation_steps=2, learning_rate=1e-2, bf16=True, logging_steps=1
    )
    s = Session.from_pretrained(tiny_llama(), "hf_zero2", training=training, output_dir=tmp_path)
    # Until fit counts the steps, the keys that need them are "auto" in Session.config (never a stand-in count).
    assert s.config.scheduler.params.total_num_steps is AUTO
    assert s.config.train_batch_size == 4
    before = trainable(s)
    history = s.fit(TokenData(8), epochs=2, eval_data=TokenData(4, seed=5), eval_every=2)
    assert s.config.scheduler.params.total_num_steps == 4
    assert s.engine.bfloat16_enabled()
    assert {p.dtype for p in s.model.parameters()} == {torch.bfloat16}
    train = [h for h in history if "loss" in h]
    assert [h["step"] for h in train] == [1, 2, 3, 4]
    # DeepSpeed's WarmupDecayLR over 4 steps (it raises the 1 warmup step to 2, log-rate): 0, 0, then the peak,
    # then linear decay (the 4th step's lr is still the peak: (4 - 2) / (4 - 2)).
    assert [h["lr"] for h in train] == pytest.approx([0.0, 0.0, 1e-2, 1e-2])
    assert s.engine.lr_scheduler.total_num_steps == 4 and s.engine.get_lr() == pytest.approx([5e-3])
    assert all(h["tokens_per_sec"] > 0 and h["samples_per_sec"] > 0 for h in train)
    assert [h["step"] for h in history if "eval_loss" in h] == [2, 4]
    assert all(changed(before, trainable(s)))

    written = json.loads((tmp_path / "ds_config.json").read_text())
    assert '"auto"' not in json.dumps(written)
    assert written["scheduler"]["params"]["total_num_steps"] == 4  # 8 samples / (2 x 2) x 2 epochs
    assert written["train_batch_size"] == 4 and written["bf16"]["enabled"] is True
    logs = tmp_path / "logs" / "train"
    for name in ("Train_loss", "Train_lr", "Train_grad_norm", "Train_tokens_per_sec", "Eval_loss"):
        assert (logs / f"{name}.csv").is_file(), name
    assert len((logs / "Train_loss.csv").read_text().splitlines()) == 1 + 4


def test_lora_on_zero3_with_checkpointing_saves_real_adapters(tmp_path: Path) -> None:
    """LoRA + ZeRO-3 + non-reentrant checkpointing: saved adapters are whole, trained, and load with peft."""
    s = Session.from_pretrained(
        tiny_llama(), Config.zero(3).adamw(lr=1e-2).batch(micro=2), lora=LORA, gradient_checkpointing=True
    )
    assert not is_deepspeed_zero3_enabled()
    base = s.model.get_base_model()
    assert getattr(base, "is_activation_checkpointing", None) or base.is_gradient_checkpointing
    names = [n for n, p in s.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)  # only the adapters reach the optimizer
    frozen = [p for p in s.model.parameters() if not p.requires_grad]
    assert all(p.ds_numel > 0 and p.numel() == 0 for p in frozen)  # built partitioned, inside zero.Init
    s.engine  # noqa: B018 - builds the engine, which partitions the adapters too
    assert all(p.ds_numel > 0 and p.numel() == 0 for p in s.model.parameters())
    before = trainable(s)
    for _ in range(2):
        s.step(batch())
    assert all(changed(before, trainable(s)))

    s.save_model(tmp_path / "adapters")
    saved = load_file(tmp_path / "adapters" / "adapter_model.safetensors")
    assert len(saved) == 8  # q_proj, v_proj x A, B x 2 layers
    assert all(t.numel() > 0 for t in saved.values())
    assert all(t.abs().sum() > 0 for k, t in saved.items() if "lora_B" in k)  # lora_B starts at zero

    base = AutoModelForCausalLM.from_config(tiny_llama())
    loaded = peft.PeftModel.from_pretrained(base, tmp_path / "adapters")
    session_lora = dict(zip(names, trainable(s), strict=True))
    for name, p in loaded.named_parameters():
        if "lora_" in name:
            assert torch.equal(p.detach().float(), session_lora[name]), name

    # merge_lora=True: a plain HF model that computes what the session's model computes.
    s.save_model(tmp_path / "merged", merge_lora=True)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    b = batch(seed=11)
    assert hf_loss(merged, b) == pytest.approx(s.evaluate(TokenData(2, seed=11))["eval_loss"], rel=1e-5)


def test_full_finetune_on_zero3_saves_a_model_transformers_reloads(tmp_path: Path) -> None:
    """A ZeRO-3 full fine-tune exported in HF format reloads (whole weights, normal from_pretrained) with the same loss."""
    s = Session.from_pretrained(
        tiny_llama(), Config.zero(3).adamw(lr=1e-2).batch(micro=2), tokenizer=ByT5Tokenizer(), output_dir=tmp_path
    )
    for _ in range(2):
        s.step(batch())
    expected = s.evaluate(TokenData(2, seed=11))["eval_loss"]
    path = s.save_model()
    assert path == tmp_path / "model" and (path / "model.safetensors").is_file()

    reloaded = AutoModelForCausalLM.from_pretrained(path)
    assert not is_deepspeed_zero3_enabled()
    assert all(p.numel() > 0 and not hasattr(p, "ds_id") for p in reloaded.parameters())  # not built in zero.Init
    assert hf_loss(reloaded, batch(seed=11)) == pytest.approx(expected, rel=1e-6)
    assert AutoTokenizer.from_pretrained(path)("ab")["input_ids"] == ByT5Tokenizer()("ab")["input_ids"]

    # The saved directory is a starting point too: loaded into zero.Init partitions, it computes the same loss.
    again = Session.from_pretrained(path, Config.zero(3).adamw(lr=1e-2).batch(micro=2), tokenizer=path)
    assert again.evaluate(TokenData(2, seed=11))["eval_loss"] == pytest.approx(expected, rel=1e-6)
    assert again.tokenizer is not None and not is_deepspeed_zero3_enabled()


def test_resumed_run_reproduces_the_uninterrupted_losses(tmp_path: Path) -> None:
    """Stop at step 2 mid-epoch, save, resume in a new session: steps 3-5 match the uninterrupted run exactly."""
    # Dropout on, so the restored RNG states matter; 6 micro-batches per epoch, so the run crosses an epoch.
    model = tiny_llama(attention_dropout=0.1)
    training = Training(
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        learning_rate=1e-2,
        warmup_steps=2,
        max_steps=5,
        seed=7,
    )
    data = TokenData(12)

    def run(out: Path) -> Session:
        return Session.from_pretrained(model, "hf_zero3", training=training, output_dir=out)

    full = [(h["loss"], h["lr"]) for h in run(tmp_path / "a").fit(data)]
    first = run(tmp_path / "b")
    head = [(h["loss"], h["lr"]) for h in first.fit(data, max_steps=2, save_every=2)]
    assert manifest.read_latest(tmp_path / "b" / "checkpoints") == "global_step2"

    resumed = run(tmp_path / "b")
    state = resumed.load_checkpoint()
    assert state["global_step"] == 2 and state["epoch"] == 0 and state["batch_in_epoch"] == 4
    tail = [(h["loss"], h["lr"]) for h in resumed.fit(data)]
    assert len(full) == 5 and head == full[:2]
    # Equal up to float rounding only: DeepSpeed's CPU Adam keeps beta**step in process-wide state, updated by
    # multiplication step by step, or by pow() after a jump (a resume), which can differ in the last bit.
    # A lost RNG state or data position moves the loss by ~1e-3, far outside this tolerance.
    assert [lr for _, lr in tail] == [lr for _, lr in full[2:]]
    assert [loss for loss, _ in tail] == pytest.approx([loss for loss, _ in full[2:]], rel=1e-5, abs=0)


def test_crash_while_saving_leaves_the_previous_checkpoint_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`latest` moves only after a complete save; a failed save is removed and names the last complete one;
    keep_last prunes old checkpoints."""
    cfg = Config.zero(2).adamw(lr=1e-2).batch(micro=2)
    s = Session.from_pretrained(tiny_llama(), cfg, keep_last=2)
    ckpt = tmp_path / "ckpt"
    for _ in range(3):
        s.step(batch())
        s.save_checkpoint(ckpt)
    assert sorted(p.name for p in ckpt.iterdir() if p.is_dir()) == ["global_step2", "global_step3"]
    good = trainable(s)

    def crash(save_dir: Any, tag: str) -> None:
        raise OSError("disk full")

    s.step(batch())
    monkeypatch.setattr(manifest, "write_latest", crash)
    with pytest.raises(
        CheckpointError, match=r"disk full.*files were removed.*last complete checkpoint is .*global_step3"
    ):
        s.save_checkpoint(ckpt)
    monkeypatch.undo()
    assert not (ckpt / "global_step4").exists()  # the failed save is gone ...
    assert manifest.read_latest(ckpt) == "global_step3"  # ... and latest still names the complete one

    again = Session.from_pretrained(tiny_llama(), cfg)
    assert again.load_checkpoint(ckpt)["global_step"] == 3
    assert again.global_step == 3
    assert not any(changed(good, trainable(again)))


def test_custom_loop_with_a_plain_module(tmp_path: Path) -> None:
    """A plain nn.Module in the user's own loop: loss_fn, accumulation boundaries, weights move only at boundaries."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    s = Session(model, Config.zero(1).adam(lr=1e-2).batch(micro=4, grad_accum=2), total_steps=2)

    def mse(m: Any, b: tuple[Any, Any]) -> Any:
        x, y = b
        return torch.nn.functional.mse_loss(m(x), y)

    xs, ys = torch.randn(4, 4, 8), torch.randn(4, 4, 1)
    before = trainable(s)
    outs = [s.step((xs[0], ys[0]), loss_fn=mse)]
    assert not any(changed(before, trainable(s)))  # accumulating: no optimizer step yet
    outs += [s.step((x, y), loss_fn=mse) for x, y in zip(xs[1:], ys[1:], strict=True)]
    assert [o.boundary for o in outs] == [False, True, False, True]
    assert [o.global_step for o in outs] == [0, 1, 1, 2]
    assert all(changed(before, trainable(s)))

    s.save_model(tmp_path / "m")
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    fresh.load_state_dict(load_file(tmp_path / "m" / "model.safetensors"))
    assert all(torch.equal(a, b) for a, b in zip(trainable(s), [p.detach() for p in fresh.parameters()], strict=True))


def test_a_batch_the_forward_does_not_take_names_loss_fn() -> None:
    """A plain nn.Module given a (x, y) batch without loss_fn: a SessionError naming loss_fn, not DeepSpeed's
    TypeError from inside the engine."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 1))
    s = Session(model, Config.zero(0).adam(lr=1e-2).batch(micro=4), total_steps=1)
    with pytest.raises(
        SessionError, match=r"Sequential.forward does not take the batch .*pass loss_fn=\(model, batch\)"
    ):
        s.step((torch.randn(4, 8), torch.randn(4, 1)))
    with pytest.raises(SessionError, match=r"forward does not take the batch \(x, y\)"):
        s.step({"x": torch.randn(4, 8), "y": torch.randn(4, 1)})


def test_dict_batch_without_a_loss_is_a_clear_error() -> None:
    s = Session.from_pretrained(tiny_llama(), Config.zero(0).adamw(lr=1e-2).batch(micro=2))
    b = batch()
    del b["labels"]
    with pytest.raises(Exception, match="without a loss: put labels in the batch"):
        s.step(b)


_BAD_CONFIG = textwrap.dedent(
    """
    import os
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    from _session_common import tiny_llama
    from transformers import AutoModelForCausalLM
    from transformers.integrations import is_deepspeed_zero3_enabled
    from dsbuild import AUTO, Config, ConfigError
    from dsbuild.session import Session

    bad = [
        # 2 x 2 x 1 process is not 6
        Config.zero(3).adamw(lr=1e-3).batch(micro=2, grad_accum=2, total=6),
        # nothing fills the learning rate
        Config.zero(3).adamw(lr=AUTO).batch(micro=2),
    ]
    for config in bad:
        for build in (lambda: Session.from_pretrained(tiny_llama(), config),
                      lambda: Session(AutoModelForCausalLM.from_config(tiny_llama()), config)):
            try:
                build()
            except ConfigError as error:
                print("ConfigError:", str(error).splitlines()[0])
            else:
                raise SystemExit("no ConfigError")
    print("process group:", torch.distributed.is_initialized(), "zero3:", is_deepspeed_zero3_enabled())
    """
)


@pytest.mark.slow
def test_bad_config_fails_before_any_process_group_exists() -> None:
    """A config DeepSpeed would reject raises ConfigError before a process group, a zero.Init or an engine."""
    code = _BAD_CONFIG
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(Path(__file__).parent)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert sum(line.startswith("ConfigError:") for line in lines) == 4, done.stdout
    assert "process group: False zero3: False" in lines


@pytest.mark.slow
def test_cpu_offload_step_changes_weights() -> None:
    """ZeRO-3 with optimizer and parameters offloaded to CPU (DeepSpeed's cpu_adam; compiles on first use)."""
    s = Session.from_pretrained(tiny_llama(), Config.zero(3).offload_cpu().bf16().adamw(lr=1e-2).batch(micro=2))
    assert s.engine.zero_cpu_offload()
    before = trainable(s)
    out = s.step(batch())
    assert out.boundary and out.loss > 0
    assert all(changed(before, trainable(s)))


@pytest.mark.slow
def test_two_processes_under_torchrun(tmp_path: Path) -> None:
    """torchrun, 2 processes, ZeRO-3: batch sizes from the real world size, an evaluation of an odd number of samples
    counting each once (the HF Trainer's: the filler of the uneven end left out), one model saved that transformers
    loads, nothing left in /dev/shm."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    # --standalone: the rendezvous binds a port of its own (a port picked here first could be taken before torchrun
    # binds it, by the other xdist worker's runs).
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(Path(__file__).parent / "_session_worker.py"), str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["world_size"] == 2 and result["global_step"] == 3
    assert result["train_batch_size"] == 2 * 2 * 2  # micro x accumulation x world size
    assert json.loads((tmp_path / "ds_config.json").read_text())["train_batch_size"] == 8
    assert [h["step"] for h in result["history"] if "loss" in h] == [1, 2, 3]
    assert result["odd"]["eval_samples"] == 5
    assert result["odd"]["eval_loss"] == pytest.approx(sum(result["singles"]) / 5, rel=1e-5)
    assert (tmp_path / "checkpoints" / "global_step3" / "dsbuild_rank1.json").is_file()
    # DeepSpeed's shared-memory all-reduce (on when LOCAL_SIZE is set) leaves a 66 MB /dev/shm file per rank and run.
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{result['rendezvous']}_*"))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert hf_loss(model, batch()) > 0
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]


@pytest.mark.engine
def test_numbers_a_loss_fn_returns_beside_the_loss_are_logged_with_each_step() -> None:
    """A loss_fn returning {"loss": ..., "rewards/chosen": ...} (TRL's metrics) trains on the loss and logs each other
    number with the step, averaged over the step's micro-batches; something else beside the loss is refused."""
    s = Session.from_pretrained(tiny_llama(), Config.zero(0).adamw(lr=1e-2).batch(micro=2, grad_accum=2))
    calls = []

    def loss_fn(engine: Any, b: dict[str, Any]) -> dict[str, Any]:
        calls.append(len(calls))
        return {"loss": engine(**b).loss, "rewards/chosen": torch.tensor(float(len(calls))), "count": 1}

    records = s.fit(TokenData(8), max_steps=2, loss_fn=loss_fn)
    steps = [r for r in records if "loss" in r]
    assert [r["rewards/chosen"] for r in steps] == [1.5, 3.5]  # (1 + 2) / 2, (3 + 4) / 2
    assert [r["count"] for r in steps] == [1.0, 1.0]
    with pytest.raises(SessionError, match="'text' beside the loss"):
        s.step(batch(), loss_fn=lambda engine, b: {"loss": engine(**b).loss, "text": "no"})
