"""No silent ignore: every top-level key of the installed DeepSpeed's config schema is in one row of
``dsbuild.validate.feature_table.FEATURES`` (trained here, run elsewhere, refused), docs/features.md shows exactly that table, and
a config that turns on a refused feature stops ``Session`` and ``dsbuild train`` before anything starts."""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import re
from pathlib import Path

import pytest
import transformers
from _session_common import tiny_llama
from test_schema_coverage import deepspeed_schema

from dsbuild import Config, ConfigError
from dsbuild.cli import main
from dsbuild.session import Session
from dsbuild.validate.feature_table import ELSEWHERE, FEATURES, REFUSED, TRAINED, refusals

pytestmark = pytest.mark.train  # the training extra; tests/conftest.py skips it without

PAGE = Path(__file__).resolve().parents[2] / "docs" / "features.md"


def test_every_deepspeed_key_is_in_one_row() -> None:
    """A DeepSpeed upgrade that adds a top-level key fails here with its name; a row for a key DeepSpeed dropped too."""
    deepspeed_keys = {path.split(".")[0] for path in deepspeed_schema()}
    assert sorted(deepspeed_keys - set(FEATURES)) == [], "DeepSpeed reads these; put each in a row of FEATURES"
    assert sorted(set(FEATURES) - deepspeed_keys) == [], "DeepSpeed no longer reads these"
    assert {f.row for f in FEATURES.values()} == {TRAINED, ELSEWHERE, REFUSED}


def test_the_page_is_the_table() -> None:
    """docs/features.md lists every key under its row's heading, with the code's words."""
    text = PAGE.read_text(encoding="utf-8")
    headings = {"Trained here": TRAINED, "Checked here, run elsewhere": ELSEWHERE, "Refused": REFUSED}
    shown = {}
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        for key, what in re.findall(r"^\| `([a-z0-9_]+)` \| (.*) \|$", body, flags=re.M):
            shown[key] = (headings[title.strip()], what.replace("\\|", "|"))
    assert shown == {key: (f.row, f.what) for key, f in FEATURES.items()}


@pytest.mark.parametrize(
    ("section", "off"),
    [
        ({"hybrid_engine": {"enabled": True}}, {"hybrid_engine": {"enabled": False}}),
        ({"pipeline": {"stages": 2}}, {}),
    ],
)
def test_a_refused_feature_stops_session_and_dsbuild_train(
    section: dict, off: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Turned on: Session raises naming the key before building the engine, dsbuild train exits 1 before launch
    (at 2 processes). Present but off: neither refuses."""
    key = next(iter(section))
    config = Config.zero(2).adamw(lr=1e-3).batch(micro=2, grad_accum=1)
    assert [p.path for p in refusals({**config.to_dict(), **section})] == [key]
    assert refusals({**config.to_dict(), **off}) == []
    model = transformers.LlamaForCausalLM(tiny_llama())
    session = Session(model, Config.from_dict({**config.to_dict(), **section}))
    with pytest.raises(ConfigError, match=rf"{key}: not run by dsbuild"):
        _ = session.engine
    sets = [f"--set=strategy.overrides.{key}={value!r}".replace("'", '"').replace("True", "true")
            for key, value in _dotted(section)]  # fmt: skip
    out = tmp_path / "out"
    code = main(["train", "--nproc-per-node", "2", *sets, f"--set=training.output_dir={str(out)!r}"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"{key}: not run by dsbuild" in err and "not started" in err
    assert not (out / "history.jsonl").exists()


def _dotted(table: dict, prefix: str = "") -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for key, value in table.items():
        if isinstance(value, dict):
            out += _dotted(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out
