"""What every test directory shares: markers from what a test needs, the guard that holds them, and a small job to
train or check.

Markers (``pyproject.toml``): ``engine`` (starts a DeepSpeed engine in the test's process), ``procs`` (starts other
processes: ``dsbuild`` commands, torchrun, Ray), ``slow`` (a long run) and ``train`` (needs the training extra:
torch, DeepSpeed, transformers; ``engine`` implies it). The fast loop is ``pytest -m "not engine and not procs and not slow"``
(README, Development). A test that starts an engine or a process without its marker fails, saying which marker to
add, so the fast loop stays fast: the guard counts ``DeepSpeedEngine`` and ``subprocess.Popen`` starts, passing every
call through (a compiler DeepSpeed runs is not a process a test starts). A config-only install (``pip install dsbuild``, no torch) runs the rest and skips the ``train`` and
``engine`` tests by marker, with the reason, instead of failing them on an import.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from dsbuild.job import demo_job_path

TRAINING_STACK = ("torch", "deepspeed", "transformers")
MISSING = [name for name in TRAINING_STACK if importlib.util.find_spec(name) is None]

TINY_MODEL = """\
[model]
tokenizer = "byte"
[model.config]
model_type = "llama"
hidden_size = 64
intermediate_size = 128
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 4
vocab_size = 384
"""
"""A 2-layer Llama built from its config, with the byte tokenizer: no download, a few seconds a step on a CPU."""

TINY_TRAINING: dict[str, Any] = {"per_device_train_batch_size": 4, "learning_rate": 1e-3, "max_steps": 10}


_NEEDS_TRAINING = re.compile(r"^pytestmark = (?:\[[^\]]*?|[^\n]*?)pytest\.mark\.(train|engine)\b", re.MULTILINE)
"""A module marked ``train`` or ``engine`` as a whole: ``pytestmark = pytest.mark.train``, or a list over lines."""
_IGNORED: list[str] = []


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Without the training extra, a module marked ``train`` or ``engine`` as a whole (``pytestmark``) is not
    imported (it imports torch at its top); the summary counts them."""
    if not MISSING or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if _NEEDS_TRAINING.search(collection_path.read_text(encoding="utf-8")):
        _IGNORED.append(collection_path.name)
        return True
    return None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _IGNORED:
        terminalreporter.write_line(
            f"{len(_IGNORED)} test modules not collected: they need the training extra "
            f"(pip install 'dsbuild[train]'): no {', '.join(MISSING)}"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the ``train`` and ``engine`` tests, by marker, where the training extra is not installed."""
    if not MISSING:
        return
    skip = pytest.mark.skip(reason=f"needs the training extra (pip install 'dsbuild[train]'): no {', '.join(MISSING)}")
    for item in items:
        if item.get_closest_marker("train") is not None or item.get_closest_marker("engine") is not None:
            item.add_marker(skip)


# -- the guard of the markers ---------------------------------------------------------------------------------------

NEEDS = {"engine": "starts a DeepSpeed engine", "procs": "starts a process (Python, torchrun, Ray, dsbuild)"}
"""What each marker says a test does, as the guard words it."""
_STARTED = dict.fromkeys(NEEDS, 0)


def _counted(kind: str, init: Callable[..., None]) -> Callable[..., None]:
    """``init``, counting each call as a start of ``kind``; everything passes through."""

    @functools.wraps(init)
    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        _STARTED[kind] += 1
        init(self, *args, **kwargs)

    return counted


class _WatchEngines(importlib.abc.MetaPathFinder):
    """Counts ``DeepSpeedEngine`` starts from the moment DeepSpeed is imported, whichever test imports it first."""

    NAME = "deepspeed.runtime.engine"

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name != self.NAME:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            engine = module.DeepSpeedEngine
            engine.__init__ = _counted("engine", engine.__init__)  # type: ignore[method-assign]

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_LAUNCHERS = ("python", "torchrun", "dsbuild", "ray", "deepspeed", "accelerate", "sbatch", "srun")
"""Programs whose start counts as a process a test starts (a compiler or ``ld`` that DeepSpeed's op builders run
while an engine starts does not)."""


def _counted_popen(init: Callable[..., None]) -> Callable[..., None]:
    """``Popen.__init__``, counting the start of a Python interpreter or a launcher as a ``procs`` start."""

    @functools.wraps(init)
    def counted(self: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
        program = args if isinstance(args, (str, bytes, os.PathLike)) else (args[0] if args else "")
        name = os.path.basename(os.fsdecode(program)).split()[0] if program else ""
        if name.startswith(_LAUNCHERS) or os.fsdecode(program) == sys.executable:
            _STARTED["procs"] += 1
        init(self, args, *rest, **kwargs)

    return counted


subprocess.Popen.__init__ = _counted_popen(subprocess.Popen.__init__)  # type: ignore[method-assign]
if _WatchEngines.NAME not in sys.modules:
    sys.meta_path.insert(0, _WatchEngines())


def _held(item: pytest.Item) -> Generator[None, Any, Any]:
    """One phase of ``item`` (its setup or its call), then a failure when it started what it is not marked for."""
    before = dict(_STARTED)
    result = yield
    unmarked = [kind for kind in NEEDS if _STARTED[kind] > before[kind] and item.get_closest_marker(kind) is None]
    if unmarked:
        said = " and ".join(NEEDS[kind] for kind in unmarked)
        marks = ", ".join(f"@pytest.mark.{kind}" for kind in unmarked)
        report = os.environ.get("DSBUILD_TEST_NEEDS")  # a file: list what is unmarked instead of failing
        if report:
            with open(report, "a", encoding="utf-8") as f:
                f.write(f"{item.nodeid}\t{' '.join(unmarked)}\n")
        else:
            pytest.fail(f"{item.nodeid} {said} but is not marked {marks} (tests/conftest.py)", pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    """A fixture that starts an engine or a process needs the marker on the tests that use it."""
    return (yield from _held(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    """A test that starts an engine or a process without its marker fails, naming the marker."""
    return (yield from _held(item))


# -- DeepSpeed's ops, built before the tests ------------------------------------------------------------------------

SUITE_OPS = ("FusedAdamBuilder", "ShareMemCommBuilder", "CPUAdamBuilder")
"""The ops the engine and process tests load on the CPU accelerator: Adam, the shared-memory collectives of
``init_distributed`` and CPU Adam (offload)."""

_LOAD_OPS = """
import sys
from concurrent.futures import ThreadPoolExecutor
from deepspeed.accelerator import get_accelerator
from dsbuild.session.cpu_features import install
install()
accelerator = get_accelerator()
if accelerator.device_name() == "cpu":  # each build is a compiler process: side by side in threads
    with ThreadPoolExecutor(len(sys.argv) - 1) as pool:
        list(pool.map(lambda op: accelerator.create_op_builder(op).load(verbose=False), sys.argv[1:]))
"""


def _compile_bytecode() -> None:
    """dsbuild's modules and the tests' helpers compiled to bytecode once, as an installed package ships them: with
    ``PYTHONDONTWRITEBYTECODE`` set (this VM sets it) an editable checkout is compiled from source by every process
    that imports it — every rank, launcher and worker the tests start (about 0.25 s of each). Files already compiled
    are left as they are; nothing is compiled where bytecode is written as usual."""
    if not sys.flags.dont_write_bytecode:
        return
    import compileall

    root = Path(__file__).resolve().parents[1]
    for folder in (root / "dsbuild", root / "tests" / "integration"):  # the package; the workers the tests start
        compileall.compile_dir(folder, quiet=1)


def _selects(config: pytest.Config, *markers: str) -> bool:
    """Whether ``-m`` (if given) selects a test marked with ``markers``, ``train`` besides."""
    from _pytest.mark.expression import Expression

    given = config.option.markexpr
    if not given:
        return True
    marks = {*markers, "train"}
    return bool(Expression.compile(given).evaluate(lambda name, **kwargs: name in marks))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Before any test (and before xdist's workers start): dsbuild's bytecode written (``_compile_bytecode``), and
    DeepSpeed's CPU ops built, in one process, side by side.

    torch builds an op in a shared folder (``~/.cache/torch_extensions``) and rebuilds it whenever the include paths
    differ (another checkout's ``.venv``): a build started by the first test that loads the op holds every test that
    loads it, in both workers, for a minute or more. Built, each load here is a second or two. The ops are not built
    for the fast loop, nor without the training extra; a build that fails is left to the tests that need it, which
    say why."""
    config = session.config
    if "PYTEST_XDIST_WORKER" in os.environ or config.option.collectonly:
        return
    _compile_bytecode()
    if MISSING:
        return
    if not (_selects(config, "engine") or _selects(config, "procs")):
        return
    import time

    started = time.monotonic()
    built = subprocess.run([sys.executable, "-c", _LOAD_OPS, *SUITE_OPS], capture_output=True, text=True)
    took = time.monotonic() - started
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and (took > 10 or built.returncode):
        last = (built.stderr.strip().splitlines() or ["no output"])[-1]
        failed = f"; failed (the tests that load them will say why): {last}"
        reporter.write_line(
            f"DeepSpeed's ops built before the tests in {took:.0f} s" + (failed if built.returncode else "")
        )


def _write_tiny_job(
    folder: Path,
    *,
    training: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
    extra: str = "",
    name: str = "job.toml",
) -> Path:
    shutil.copy(demo_job_path().parent / "arith_train.jsonl", folder / "train.jsonl")
    tables = {
        "data": {"path": "train.jsonl", "format": "alpaca", "max_length": 256, **(data or {})},
        "training": {**TINY_TRAINING, **(training or {})},
        "strategy": {"config": "zero2"},
    }
    text = TINY_MODEL + "".join(
        f"\n[{table}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in entries.items())
        for table, entries in tables.items()
    )
    path = folder / name
    path.write_text(text + extra, encoding="utf-8")
    return path


@pytest.fixture
def tiny_job(tmp_path: Path) -> Callable[..., Path]:
    """A writer of a small valid job in ``tmp_path``: the tiny Llama, the demo's arithmetic data copied to
    ``train.jsonl`` (alpaca), preset ``zero2``; ``training`` entries replace or add to ``TINY_TRAINING``, ``data``
    entries to ``[data]``, and ``extra`` is TOML text appended (more tables). Returns the job file's path."""
    return functools.partial(_write_tiny_job, tmp_path)


@pytest.fixture(scope="session")
def demo_on_two(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The demo job's finished run on 2 processes (``_runs.DEMO_ON_TWO``: fp32, 8 steps, every checkpoint kept), made
    once for the whole session and both xdist workers, and what its command printed: the uninterrupted run that
    resumes, preemptions and conversions are held to. Tests copy the folder (``_runs.stopped_after``), never change
    it."""
    from _runs import DEMO_ON_TWO, finished_once

    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        root = root.parent  # the session's folder, which every worker's own folder is in
    return finished_once(root, "demo-on-two", DEMO_ON_TWO)


@pytest.fixture(scope="module")
def module_tiny_job(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``tiny_job`` for a module-scoped fixture: the job written in a folder of its own that the module shares
    (a run made once for several tests)."""
    return functools.partial(_write_tiny_job, tmp_path_factory.mktemp("job"))


# -- Hypothesis profiles --------------------------------------------------------------------------------------------
# "ci" (the default: a fixed seed, so every run draws the same examples; 100 examples, each test may ask for more or
# fewer), "deep" (thousands of examples from a fresh seed: run before a release, docs/jobs.md) and "dev" (quick, for
# editing). A failure prints the falsifying example and the blob that replays it (``@reproduce_failure``); the example
# becomes an ``@example`` of the test. Choose one with ``HYPOTHESIS_PROFILE=deep pytest``.

settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "deep",
    max_examples=3000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=20, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
