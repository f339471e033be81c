"""``gathered`` and ``generate`` (issue 32): the unsharded model's tokens under ZeRO-3 on 2 processes, no hang when one
rank reaches EOS first, everything put back after, and refusals. The 2-process run is ``_generation_worker.py`` under
torchrun; the rest runs in the pytest process (world size 1).
"""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _session_common import tiny_llama

from dsbuild import Config, SessionError, Training
from dsbuild.session import Session

pytestmark = pytest.mark.train

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.procs
@pytest.mark.slow
def test_zero3_generation_on_two_processes_is_the_unsharded_models_and_never_hangs(tmp_path: Path) -> None:
    """ZeRO-3 on 2 processes, greedy, rank 0 reaching EOS at its first token while rank 1 runs on: the tokens of the
    unsharded model inside ``gathered`` (each rank stops alone) and outside it (synced), hooks, modes and partitioning
    put back (also after an exception), and the next training step bitwise the one without generation."""
    from dsbuild.session.distributed import free_port

    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
        str(Path(__file__).parent / "_generation_worker.py"), str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-5000:]
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, r in enumerate(results):
        assert r["loss_error"] <= 1e-5, r
        for case in ("gathered", "gathered_again", "hooked"):
            assert r[case]["equal"], (rank, case, r[case])
        inside = r["gathered"]["inside"]
        assert inside["eval"] and inside["checkpointing_off"] and inside["whole"], inside
        assert inside["hooks"][:2] == [0, 0], inside  # DeepSpeed's forward and backward module hooks off
        assert r["restored"] and r["restored_after_raise"], r
        assert r["same_start"] and r["step_equal"] and r["step_moved"], r
    # Rank 0 stopped at its first new token; rank 1 ran all 8. Inside gathered each stops alone (rank 0: 1 forward);
    # outside, synced, rank 0 keeps stepping with rank 1 (as many forwards, its extra tokens dropped).
    assert results[0]["gathered"]["new_tokens"] == 1 and results[1]["gathered"]["new_tokens"] == 8
    assert results[0]["gathered"]["forwards"] == 1 and results[1]["gathered"]["forwards"] == 8
    assert results[0]["hooked"]["forwards"] == results[1]["hooked"]["forwards"] == 8


@pytest.mark.engine
def test_gathered_below_zero3_only_switches_modes_and_puts_them_back() -> None:
    """At ZeRO-0 ``gathered`` moves no weight: eval mode and checkpointing off inside, train mode and checkpointing
    back after; ``generate`` there equals the plain model's greedy tokens."""
    s = Session.from_pretrained(tiny_llama(), Config.zero(0).adamw(lr=1e-3).batch(micro=2), Training(seed=3),
                                gradient_checkpointing=True)  # fmt: skip
    model = s.model
    ids = torch.tensor([[5, 9, 17, 33]])
    with s.gathered() as inside:
        assert inside is model and not any(m.training for m in model.modules())
        assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
        out = s.generate(ids, torch.ones_like(ids), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert model.training and any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    model.eval()
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                                  pad_token_id=0)  # fmt: skip
    model.train()
    assert torch.equal(out, expected)


@pytest.mark.engine
def test_prompts_generate_cannot_continue_are_refused_with_the_reason() -> None:
    """Right-padded rows, a mask of another shape and a 1-D prompt are refused before the model runs."""
    s = Session.from_pretrained(tiny_llama(), Config.zero(0).adamw(lr=1e-3).batch(micro=2))
    ids = torch.tensor([[5, 9, 17, 0], [4, 6, 8, 10]])
    with pytest.raises(SessionError, match="end in padding"):
        s.generate(ids, torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]), max_new_tokens=2)
    with pytest.raises(SessionError, match="attention_mask is"):
        s.generate(ids, torch.ones(2, 3, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(SessionError, match="expected a \\(rows, tokens\\)"):
        s.generate(torch.tensor([5, 9]), max_new_tokens=2)
