"""A ``[model.config]`` table its transformers class accepted is remembered (``~/.cache/dsbuild/model-config``): the
check from the cache says what a fresh check says, a damaged entry is checked again, and the launcher of a
2-process run checks an accepted table again without importing torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dsbuild.job import BYTE_TOKENIZER, ModelSpec
from dsbuild.run import model

pytestmark = pytest.mark.train  # transformers' config classes; tests/conftest.py skips it without the extra

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 384}  # fmt: skip

_FIELDS = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
           "vocab_size", "rms_norm_eps", "tie_word_embeddings", "hidden_act", "max_position_embeddings",
           "attention_bias", "num_hiden_layers", "hidden_szie", "rope_theta", "head_dim", "pad_token_id"]  # fmt: skip
"""LlamaConfig's fields, two misspelt (a typo is a problem) and ``rope_theta`` (a legacy name that passes)."""

_VALUES = st.one_of(
    st.integers(-4, 512), st.booleans(), st.floats(-1e3, 1e3, allow_nan=False), st.sampled_from(["silu", "big", ""]),
    st.none(), st.lists(st.integers(0, 4), max_size=2),
)  # fmt: skip


def _spec(config: dict[str, Any]) -> ModelSpec:
    return ModelSpec(config=config, tokenizer=BYTE_TOKENIZER)


def _verdict(config: dict[str, Any]) -> tuple[list[tuple[str, str, str | None]], int | None]:
    """What the check says of a table (every problem, the vocabulary size) and what ``vocab_size`` gives."""
    spec = _spec(config)
    problems = [(p.path, p.message, p.hint) for p in model.model_problems(spec, hub=False)]
    return problems, model.vocab_size(spec)


def _in(cache: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", cache)
    return Path(cache) / "dsbuild" / "model-config"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fields=st.dictionaries(st.sampled_from(_FIELDS), _VALUES, max_size=5),
    other=st.dictionaries(st.sampled_from(_FIELDS), _VALUES, max_size=3),
)
@example(fields={}, other={})
@example(fields={"hidden_size": "big"}, other={})
@example(fields={"num_attention_heads": 3}, other={"num_hiden_layers": 1})  # the class refuses 64 / 3
def test_a_check_from_the_cache_says_what_a_fresh_check_says(
    monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any], other: dict[str, Any]
) -> None:
    """For any table (names right, misspelt or legacy; values of any type), checked again after it and another
    table were checked: the same problems and vocabulary size as a check without a cache."""
    table, unrelated = {**TINY, **fields}, {**TINY, **other}
    with tempfile.TemporaryDirectory() as none, tempfile.TemporaryDirectory() as kept:
        (Path(none) / "file").write_text("")
        _in(str(Path(none) / "file"), monkeypatch)  # no cache: nothing can be read or made under a file
        want = _verdict(table)
        _in(kept, monkeypatch)
        _verdict(table)
        _verdict(unrelated)
        assert _verdict(table) == want
        remembered = list((Path(kept) / "dsbuild" / "model-config").glob("*.json"))
        assert len(remembered) <= 2  # accepted tables only: one entry each
        if not want[0]:
            assert remembered  # an accepted table is remembered: the check above came from the cache
        if want[0]:
            assert _verdict(table)[0] == want[0]  # a table with problems is checked each time


@pytest.mark.parametrize(
    "entry",
    [b"not json", b'{"vocab_size": true}', b'{"vocab_size": -1}', b"[384]", b'{"size": 384}', b" " * 5000],
    ids=["not-json", "bool", "negative", "list", "other-key", "too-big"],
)
def test_a_damaged_entry_is_checked_again_and_replaced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, entry: bytes
) -> None:
    """An entry that is not what dsbuild wrote is no verdict: the table is checked again and the entry rewritten."""
    folder = _in(str(tmp_path), monkeypatch)
    want = _verdict(TINY)
    (path,) = folder.glob("*.json")
    path.write_bytes(entry)
    assert _verdict(TINY) == want == ([], 384)
    assert json.loads(path.read_text()) == {"vocab_size": 384}


def test_a_fifo_where_the_entry_would_be_is_not_waited_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A FIFO in the entry's place (nothing would ever be written to it): the table is checked, not waited on."""
    folder = _in(str(tmp_path), monkeypatch)
    _verdict(TINY)
    (path,) = folder.glob("*.json")
    path.unlink()
    os.mkfifo(path)
    assert _verdict(TINY) == ([], 384)


def test_a_cache_that_cannot_be_written_leaves_the_check_as_it_was(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """XDG_CACHE_HOME a file (no folder can be made under it): the check runs and says the same, nothing raised."""
    blocked = tmp_path / "cache"
    blocked.write_text("a file")
    _in(str(blocked), monkeypatch)
    assert _verdict(TINY) == ([], 384)
    assert _verdict({**TINY, "hidden_size": "big"})[0][0][0] == "model.config.hidden_size"


def test_another_transformers_checks_the_table_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The entry is keyed by what judged the table: another transformers version is another entry."""
    import dsbuild.env.versions as versions

    folder = _in(str(tmp_path), monkeypatch)
    _verdict(TINY)
    real = versions.installed
    monkeypatch.setattr(versions, "installed", lambda name: "0.0.1" if name == "transformers" else real(name))
    _verdict(TINY)
    assert len(list(folder.glob("*.json"))) == 2


_PLAN = textwrap.dedent(
    """
    import json, sys
    from dsbuild.run.start import LaunchOptions, LaunchPlan
    plan = LaunchPlan.of(None, LaunchOptions(nproc_per_node=2, sets=tuple(sys.argv[1:])))
    print(json.dumps({"backend": plan.backend, "problems": [str(d) for d in plan.problems],
                      "warnings": list(plan.warnings), "samples": len(plan.data.train) if plan.data else 0, "torch": "torch" in sys.modules}))
    """
)


@pytest.mark.procs
def test_the_launcher_checks_an_accepted_table_again_without_torch(tmp_path: Path) -> None:
    """The plan of the demo job on 2 processes, twice in new processes sharing a cache: the second has the same
    problems, warnings and tokenized samples and never imported torch; a table with a problem is still refused."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "DS_ACCELERATOR": "cpu"}

    def plan(*sets: str) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-c", _PLAN, *sets], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    first, again = plan(), plan()
    assert first["backend"] == again["backend"] == "torchrun"
    assert (first["torch"], again["torch"]) == (True, False)
    assert {k: v for k, v in first.items() if k != "torch"} == {k: v for k, v in again.items() if k != "torch"}
    assert first["problems"] == [] and first["samples"] > 0
    refused = plan("model.config.hidden_size='big'")
    assert [p for p in refused["problems"] if p.startswith("model.config.hidden_size: got 'big'")], refused
