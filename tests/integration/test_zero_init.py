"""DeepSpeed's documented ZeRO-3 construction (a model built inside ``deepspeed.zero.Init`` in your own code) works
with the tested set once ``ready_for_zero_init`` ran, as docs/session.md says (transformers >= 5.24 otherwise fails
inside ``zero.Init`` importing ``torch._dynamo``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.train, pytest.mark.procs]  # the training extra; tests/conftest.py skips it without


BUILD = textwrap.dedent(
    """
    import json
    import deepspeed, transformers
    from dsbuild.session import distributed, ready_for_zero_init
    distributed.init()
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, vocab_size=300)
    ready_for_zero_init(config)
    with deepspeed.zero.Init(config_dict_or_path={"train_batch_size": 1, "zero_optimization": {"stage": 3}}):
        model = transformers.AutoModelForCausalLM.from_config(config)
    sizes = {p.ds_numel for p in model.parameters()}
    print(json.dumps({"partitioned": all(p.numel() == 0 for p in model.parameters()), "whole": sorted(sizes)[-1]}))
    """
)


def test_a_model_built_in_your_own_zero_init_is_partitioned() -> None:
    """The custom-loop pattern of docs/session.md builds a partitioned model in a fresh process (no dynamo error)."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-c", BUILD], capture_output=True, text=True, env=env, timeout=300)
    errors = [line for line in done.stderr.splitlines() if "Error:" in line]
    assert done.returncode == 0, (errors or done.stderr.splitlines() or ["no output"])[-1]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"partitioned": True, "whole": 300 * 64}
