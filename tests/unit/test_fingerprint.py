"""Fingerprints of run settings are the same in every process: a resume in a new process (after preemption, a
requeue, a restart) compares the fingerprints a checkpoint recorded with its own, so a digest that followed a set's
order (the interpreter's hash seed) refused LoRA resumes at random."""

from __future__ import annotations

import enum
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsbuild.outputs.manifest import canonical, fingerprint


class Kind(str, enum.Enum):
    CAUSAL_LM = "CAUSAL_LM"


def test_equal_settings_have_one_fingerprint_whatever_their_order_or_spelling() -> None:
    """Sets in any order, mappings in any order, 16 and 16.0, an enum and its value, a tuple and a list: one digest."""
    a = {"r": 8, "lora_alpha": 16, "target_modules": {"q_proj", "k_proj", "v_proj", "o_proj"}, "task": Kind.CAUSAL_LM}
    b = {
        "task": "CAUSAL_LM",
        "target_modules": frozenset(["o_proj", "v_proj", "k_proj", "q_proj"]),
        "lora_alpha": 16.0,
        "r": 8,
    }
    assert canonical(a) == canonical(b)
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint((1, 2), Path("/x")) == fingerprint([1, 2], "/x")
    assert fingerprint({"alpha": 16.5}) != fingerprint({"alpha": 16})
    assert canonical(float("nan")) == "nan" and canonical({3: {True}}) == {"3": [True]}


LORA = """
import sys, torch, transformers, peft
from dsbuild.session.export import lora_fingerprint
config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2)
model = peft.get_peft_model(transformers.LlamaForCausalLM(config),
                            peft.LoraConfig(r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
assert isinstance(model.peft_config["default"].target_modules, set)  # what peft keeps: a set
print(lora_fingerprint(model))
"""


@pytest.mark.procs
@pytest.mark.train
def test_the_lora_fingerprint_is_the_same_under_every_hash_seed() -> None:
    """peft keeps target_modules as a set, whose order follows PYTHONHASHSEED: processes with different seeds (a run
    and its resume) give the same LoRA fingerprint."""
    pytest.importorskip("peft")
    digests = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", LORA], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        digests.add(done.stdout.strip())
    assert len(digests) == 1, digests
