"""DeepSpeed's Muon kernels, once dsbuild's ``lazy_compile`` is installed: not wrapped in ``torch.compile`` when the
module is imported (every ZeRO engine imports it), wrapped at their first call, with the result of DeepSpeed's own
``@torch.compile``. ``tests/integration/test_muon.py`` trains Muon through an engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.train, pytest.mark.procs]  # each side in a fresh interpreter: the module is imported once

SCRIPT = """
import json, sys
import torch
wrapped = []
real = torch.compile
def counted(*args, **kwargs):
    wrapped.append(1)
    return real(*args, **kwargs)
torch.compile = counted
if sys.argv[1] == "dsbuild":
    from dsbuild.session import distributed
    distributed.init()  # where a run installs it: with the process group, before any engine (one process: no port)
    distributed.init()  # again (each Session calls it): installed once
from deepspeed.runtime.zero.muon import original_muon
at_import = len(wrapped)
G = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
first = original_muon.zeropower_via_newtonschulz5(G, 5)
second = original_muon.zeropower_via_newtonschulz5(G * 2, 5)
print(json.dumps({"at_import": at_import, "after_calls": len(wrapped), "name": original_muon.zeropower_via_newtonschulz5.__name__,
                  "values": [first.tolist(), second.tolist()]}))
"""


def _run(side: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, side],
        capture_output=True, text=True, timeout=300, env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_muons_kernels_are_wrapped_at_their_first_call_with_deepspeeds_result() -> None:
    """Protects the ~1 s and ~30 MiB each rank of a run without Muon no longer pays, and Muon's numbers."""
    plain, lazy = _run("deepspeed"), _run("dsbuild")
    assert plain["at_import"] == 3  # DeepSpeed's three decorated kernels, at import: what dsbuild avoids
    assert lazy["at_import"] == 0 and lazy["after_calls"] == 1  # the one kernel called, once for both calls
    assert lazy["name"] == plain["name"] == "zeropower_via_newtonschulz5"
    assert lazy["values"] == plain["values"]
