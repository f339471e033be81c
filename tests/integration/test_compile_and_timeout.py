"""What the config asks of the run, the run does: ``training.torch_compile`` compiles the engine (the same losses
as eager), DeepCompile on DeepSpeed's CPU accelerator is refused with DeepSpeed's reason before anything starts, and
``training.ddp_timeout`` bounds how long a collective waits for a lost rank."""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import transformers
from _session_common import batch, tiny_llama

from dsbuild import Config, SessionError, Training
from dsbuild.cli import main
from dsbuild.session import Session
from dsbuild.session.distributed import free_port

pytestmark = [
    pytest.mark.train,
    pytest.mark.engine,
    pytest.mark.procs,
]  # the training extra; tests/conftest.py skips it without

CPU_REASON = "This op had not been implemented on CPU backend."


def test_torch_compile_compiles_the_engine_and_trains_as_eager() -> None:
    """torch_compile (aot_eager here: no C++ build) gives a compiled engine whose losses equal the eager run's."""
    torch.manual_seed(0)
    eager_model = transformers.LlamaForCausalLM(tiny_llama())
    compiled_model = transformers.LlamaForCausalLM(tiny_llama())
    compiled_model.load_state_dict(eager_model.state_dict())
    config = Config.zero(2).adamw(lr=1e-3).batch(micro=2, grad_accum=1)
    data = batch(2, 16)
    compiled = Session(
        compiled_model, config, training=Training(torch_compile=True, torch_compile_backend="aot_eager", max_steps=3)
    )
    eager = Session(eager_model, config, training=Training(max_steps=3))
    got = [compiled.step(data).loss for _ in range(3)]
    assert compiled.engine.is_compiled and not eager.engine.is_compiled
    assert got == pytest.approx([eager.step(data).loss for _ in range(3)], rel=1e-6)


def test_deepcompile_on_the_cpu_accelerator_is_refused_with_deepspeeds_reason(tmp_path: Path) -> None:
    """Session refuses before building the engine; dsbuild train exits 1 before any process starts, naming the key."""
    config = Config.zero(2).adamw(lr=1e-3).batch(micro=2, grad_accum=1).set(compile={"deepcompile": True})
    session = Session(transformers.LlamaForCausalLM(tiny_llama()), config, training=Training(max_steps=2))
    with pytest.raises(SessionError, match=r"compile\.deepcompile: DeepCompile does not run on DeepSpeed's cpu"):
        _ = session.engine
    code = main(
        ["train", "--set=strategy.overrides.compile.deepcompile=true",
         f"--set=training.output_dir={str(tmp_path / 'out')!r}"]
    )  # fmt: skip
    assert code == 1
    assert not (tmp_path / "out" / "history.jsonl").exists()


@pytest.mark.parametrize("group", ["world", "deepspeed"])
def test_a_collective_waits_at_most_ddp_timeout_for_a_lost_rank(tmp_path: Path, group: str) -> None:
    """Two processes, ddp_timeout = 5: rank 1 never comes to the collective, rank 0 fails within seconds, not 30
    minutes (torch's default), in the world group and in a group DeepSpeed makes as it makes its data-, sequence-
    and tensor-parallel groups (``deepspeed.comm.new_group(ranks)``, no timeout of its own)."""
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, time
            import torch, torch.distributed as dist
            import deepspeed.comm
            from dsbuild.session import distributed
            distributed.init(timeout=5)
            group = deepspeed.comm.new_group([0, 1]) if GROUP == "deepspeed" else None
            if distributed.rank() == 1:
                time.sleep(120)  # frozen
            start = time.monotonic()
            try:
                dist.all_reduce(torch.ones(1), group=group)
            except Exception as e:
                print(f"failed after {time.monotonic() - start:.1f} s: {type(e).__name__}", flush=True)
                sys.exit(3)
            """
        ).replace("GROUP", repr(group))
    )
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "DS_ACCELERATOR": "cpu", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True))
    start = time.monotonic()
    try:
        out, _ = procs[0].communicate(timeout=110)
    finally:
        procs[1].kill()
        procs[1].wait()
    assert procs[0].returncode == 3, out
    seconds = float(out.split("failed after ")[1].split(" s")[0])
    assert 4 <= seconds <= 30, out
    assert time.monotonic() - start < 110
