"""A task is one module on each side (``dsbuild.job.tasks``: what a job file says of it; ``dsbuild.run.tasks``: what
it runs), registered by one line in ``JOB_TASKS``; the reader, ``validate``, ``plan``'s facts, the JSON Schema and
the run look tasks up there and branch on no task's name."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import attrs
import pytest

import dsbuild
from dsbuild.errors import ConfigError
from dsbuild.job import Job, load_job
from dsbuild.job.schema import job_schema
from dsbuild.job.tasks import JOB_TASKS, TABLE_SPECS, JobTask
from dsbuild.job.tasks.dpo import PAIR_DATA_KEYS
from dsbuild.validate import Diagnostic

PACKAGE = Path(dsbuild.__file__).parent

BRANCHES_ALLOWED = {
    "job/tasks": "the tasks themselves",
    "run/tasks": "the tasks themselves",
    "job/trl_import.py": "TRL's scripts, one per trainer, each with arguments of its own",
    "job/trl_export.py": "TRL's SFT script's data arguments, and which TRL trainer takes a rollout function",
    "job/trl_keys.py": "TRL's keys that a job does not run, by table",
}
"""Where a module may still name tasks, and why."""


def test_every_task_is_a_module_on_each_side_and_its_tables_are_jobs() -> None:
    """Each task of ``JOB_TASKS`` has its job module and its run module of the same name; every table it reads has a
    spec class and a field of ``Job``; a task with a data format of its own names the function of ``dsbuild.data``
    that reads it (``JobTask.reader``, what ``dsbuild.data.load`` calls)."""
    import importlib

    from dsbuild.run.tasks import TASKS

    assert list(TASKS) == list(JOB_TASKS)
    fields = {a.name for a in attrs.fields(Job)}
    for name, task in JOB_TASKS.items():
        assert (PACKAGE / "job" / "tasks" / f"{name}.py").is_file(), name
        assert (PACKAGE / "run" / "tasks" / f"{name}.py").is_file(), name
        assert set(task.tables) <= set(TABLE_SPECS) and set(task.tables) <= fields, (name, task.tables)
        assert (task.reader is None) == (task.format is None), (name, task.reader)
        if task.reader is not None:
            module, function = task.reader.split(":")
            assert callable(getattr(importlib.import_module(f"dsbuild.data.{module}"), function)), task.reader


def _branches(path: Path) -> list[str]:
    """Where ``path`` compares a ``task`` with a task's name, or holds a dict keyed by two task names or more."""
    names = set(JOB_TASKS)
    found = []

    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        return isinstance(node, ast.Tuple | ast.List | ast.Set) and any(named(e) for e in node.elts)

    def is_task(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "task") or (
            isinstance(node, ast.Attribute) and node.attr == "task"
        )

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(is_task(s) for s in sides) and any(named(s) for s in sides):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Dict) and sum(k is not None and named(k) for k in node.keys) >= 2:
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: a dict by task")
    return found


def test_no_module_but_the_tasks_branches_on_a_task_name() -> None:
    """The reader, ``Job``, the schema, the run, the worker and the Session name no task (``BRANCHES_ALLOWED``: the
    places that still do, each with its reason)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if not any(where == allowed or where.startswith(allowed + "/") for allowed in BRANCHES_ALLOWED):
            found.extend(_branches(path))
    assert found == []


def _toy_problems(job: Any, world_size: int) -> list[Diagnostic]:
    return [Diagnostic("reward.max_length", "error", f"toy at {world_size} processes")]


TOY = JobTask(
    "toy", label="toy", config="ToyConfig", tables=("reward",), format="unpaired", records="labelled completions",
    fields="prompt / completion / label", records_are="unpaired data is", data_keys=PAIR_DATA_KEYS,
    length="[reward] max_length", problems=_toy_problems, shapes=lambda job: {"seq_len": job.reward.max_length},
)  # fmt: skip
"""A task registered by one line, reading the tables and data of others."""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "data.jsonl").write_text('{"prompt": "a", "completion": "b", "label": true}\n')
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


JOB = """\
task = "toy"
[model]
tokenizer = "byte"
[model.config]
model_type = "llama"
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
vocab_size = 384
[data]
path = "data.jsonl"
format = "unpaired"
[reward]
max_length = 64
[training]
per_device_train_batch_size = 2
[strategy]
config = "zero2"
"""


def test_a_task_registered_by_one_line_is_read_validated_planned_and_in_the_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One line in ``JOB_TASKS`` is all the job side needs: the reader reads the task's tables and data and names its
    mistakes, ``validate`` asks its ``problems``, ``plan``'s facts its ``shapes``, the schema lists it."""
    monkeypatch.setitem(JOB_TASKS, "toy", TOY)
    job = load_job(_write(tmp_path, JOB))
    assert job.task == "toy" and job.reward is not None and job.reward.max_length == 64
    assert job.task_shapes() == {"seq_len": 64}
    assert [d.message for d in job.validate(world_size=3) if d.path == "reward.max_length"] == ["toy at 3 processes"]
    assert "toy" in job_schema()["properties"]["task"]["enum"]
    wrong = JOB.replace('format = "unpaired"', 'format = "text"\nmax_length = 9') + "[dpo]\n"
    with pytest.raises(ConfigError) as info:
        load_job(_write(tmp_path, wrong))
    assert [str(p) for p in info.value.problems] == [
        "dpo: [dpo] is read by task = 'dpo'; this job's task is 'toy' (set task = \"dpo\", or leave [dpo] out)",
        "data.format: got 'text' for task = 'toy' (a toy job reads labelled completions: format = \"unpaired\" "
        "(prompt / completion / label))",
        'data.max_length: not read for task = "toy" ([reward] max_length, as TRL\'s ToyConfig)',
    ]
    sft = JOB.replace('task = "toy"\n', "").replace("[reward]\nmax_length = 64\n", "")
    with pytest.raises(ConfigError) as info:
        load_job(_write(tmp_path, sft))
    assert [str(p) for p in info.value.problems] == [
        "data.format: got 'unpaired' for task = 'sft' (unpaired data is read by a KTO or toy job: task = \"kto\" or "
        '"toy")'
    ]
