"""Muon, DeepSpeed's own (MuonWithAuxAdam), trained through Session from a typed config: the builder verb and a
config file give the same section, and a tiny Llama's loss falls over 10 steps."""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest
import torch
import transformers
from _session_common import batch, tiny_llama

from dsbuild import Config, ConfigError
from dsbuild.config import MuonParams
from dsbuild.session import Session

pytestmark = [
    pytest.mark.train,
    pytest.mark.engine,
    pytest.mark.procs,
]  # the training extra; tests/conftest.py skips it without


def test_muon_params_are_typed() -> None:
    """The verb and a file's section read to the same typed params; a bad value names its key."""
    built = Config.zero(2).muon(lr=0.02, adam_lr=3e-3, momentum=0.95, betas=(0.9, 0.95), per_head_muon=False)
    read = Config.from_dict(
        {
            "zero_optimization": {"stage": 2},
            "optimizer": {
                "type": "Muon",
                "params": {"lr": 0.02, "adam_lr": 3e-3, "momentum": 0.95, "betas": [0.9, 0.95], "per_head_muon": False},
            },
        }
    )
    assert isinstance(built.optimizer_config.params, MuonParams)
    assert built.optimizer_config == read.optimizer_config
    with pytest.raises(ConfigError, match=r"optimizer\.params\.momentum"):
        Config.from_dict({"optimizer": {"type": "Muon", "params": {"momentum": 1.5}}})


@pytest.mark.parametrize("stage", [1, 2])
def test_muon_trains_a_tiny_llama(stage: int) -> None:
    """10 steps with Muon on the hidden matrices and Adam on the rest: the loss falls, every weight kind moves."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny_llama())
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    session = Session(model, Config.zero(stage).muon(lr=0.02, adam_lr=3e-3).batch(micro=2, grad_accum=1))
    data = batch(2, 16)
    losses = [session.step(data).loss for _ in range(10)]
    assert losses[-1] < 0.9 * losses[0], losses
    assert type(session.engine.optimizer).__name__ in ("DeepSpeedZeroOptimizer", "MuonWithAuxAdam")
    params = dict(session.engine.module.named_parameters())
    muon = {name for name, p in params.items() if getattr(p, "use_muon", False)}
    assert muon and muon != set(params), "Muon should take the hidden matrices and leave the rest to Adam"
    moved = {name for name, p in params.items() if not torch.equal(p.detach().float(), before[name].float())}
    assert moved == set(params), f"not trained: {sorted(set(params) - moved)}"
