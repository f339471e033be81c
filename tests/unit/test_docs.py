"""Every ```python block in README.md and docs/*.md runs, so the docs cannot drift from the code.

The blocks of one page run in order, in one namespace and one temporary directory,
as a reader following the page would run them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

# A block that needs what a test cannot have (a GPU, a model download) starts with this line.
SKIP_MARK = "# not run:"


def _blocks(page: Path) -> list[str]:
    codes = [m.group(1) for m in BLOCK.finditer(page.read_text(encoding="utf-8"))]
    return [c for c in codes if not c.lstrip().startswith(SKIP_MARK)]


TRAINING = re.compile(r"\b(import torch|Session|dsbuild\.data|transformers|deepspeed)\b")
"""What makes a page's examples need the training extra (they are skipped by the ``train`` marker without it)."""


def _param(page: Path) -> Any:
    needs_training = any(TRAINING.search(block) for block in _blocks(page))
    return pytest.param(page, id=str(page.relative_to(ROOT)), marks=[pytest.mark.train] if needs_training else [])


@pytest.mark.engine
@pytest.mark.parametrize("page", [_param(p) for p in PAGES])
def test_page_examples_run(page: Path, tmp_path: Path) -> None:
    """A documented example that raises is a bug in the docs or in the code."""
    namespace: dict[str, object] = {"__name__": "__doc_example__"}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for i, code in enumerate(_blocks(page)):
            exec(compile(code, f"{page.name} block {i}", "exec"), namespace)
    finally:
        os.chdir(cwd)


def test_the_rule_catalogue_page_lists_every_rule_in_order() -> None:
    """docs/validation.md's rule table names exactly the rules validate() runs, in their order."""
    from dsbuild.validate import RULES

    page = (ROOT / "docs" / "validation.md").read_text(encoding="utf-8")
    table = page.split("## The rule catalogue", 1)[1]
    listed = re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M)
    assert listed == list(RULES)


def test_the_session_page_lists_every_parameter() -> None:
    """docs/session.md names every parameter of Session's public methods, so the page is the whole API."""
    import inspect

    pytest.importorskip("deepspeed")
    session = pytest.importorskip("dsbuild.session")
    page = (ROOT / "docs" / "session.md").read_text(encoding="utf-8")
    for name in ("__init__", "from_pretrained", "step", "fit", "evaluate", "save_checkpoint", "load_checkpoint",
                 "save_model", "data_loader"):  # fmt: skip
        for parameter in inspect.signature(getattr(session.Session, name)).parameters:
            if parameter != "self":
                assert re.search(rf"\b{parameter}\b", page), f"Session.{name}: {parameter} is not on the page"
