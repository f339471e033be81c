"""The JSON Schema of job files (``dsbuild schema --job``) says what the job reader reads: the jobs we ship and
document validate, and a key or a value the reader refuses is refused by the schema at the same path."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import jsonschema
import pytest
import tomllib

from dsbuild import ConfigError, load_job
from dsbuild.cli import main
from dsbuild.job import demo_job_path
from dsbuild.job.schema import job_schema
from dsbuild.job.spec import DataSpec, LaunchSpec, LoraSpec, ModelSpec, StrategySpec, job_keys, table_keys
from dsbuild.resolve.training import Training

ROOT = Path(__file__).resolve().parents[2]
VALIDATOR = jsonschema.Draft202012Validator(job_schema())
TABLES = {"model": ModelSpec, "data": DataSpec, "strategy": StrategySpec, "launch": LaunchSpec}


def _errors(job: dict[str, Any]) -> list[str]:
    """The paths the schema refuses, dotted."""
    found = []
    for error in VALIDATOR.iter_errors(job):
        path = ".".join(str(p) for p in error.absolute_path)
        if error.validator == "additionalProperties":  # the unknown key is in the message, not the path
            extra = re.findall(r"'([^']+)' was unexpected", error.message)
            found += [f"{path}.{key}" if path else key for key in extra]
        else:
            found.append(path)
    return found


def test_the_schema_is_valid_draft_2020_12() -> None:
    """Editors read it: it is a well-formed schema of the draft it names."""
    jsonschema.Draft202012Validator.check_schema(job_schema())


def _documented_jobs() -> list[tuple[str, str]]:
    """Every job TOML in the docs (a block with a [strategy] table) and the job files we ship."""
    found = [(str(demo_job_path().relative_to(ROOT)), demo_job_path().read_text())]
    found += [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "examples").glob("*.toml"))]
    for page in sorted((ROOT / "docs").glob("*.md")):
        for i, block in enumerate(re.findall(r"^```toml\n(.*?)^```", page.read_text(), re.S | re.M)):
            if re.search(r"^\[strategy\]", block, re.M) and re.search(r"^\[model\]", block, re.M):
                found.append((f"{page.relative_to(ROOT)} block {i}", block))
    return found


@pytest.mark.parametrize(("where", "text"), _documented_jobs(), ids=[w for w, _ in _documented_jobs()])
def test_shipped_and_documented_jobs_validate(where: str, text: str) -> None:
    """The demo, the examples and every complete job in the docs are valid to an editor too."""
    assert _errors(tomllib.loads(text)) == []


def test_every_key_the_reader_takes_is_in_the_schema() -> None:
    """The schema's keys are the reader's, table by table, and [training]'s are Training's."""
    properties = VALIDATOR.schema["properties"]
    for name, cls in TABLES.items():
        assert set(properties[name]["properties"]) == set(table_keys(cls)), name
    lora = VALIDATOR.schema["$defs"]["job.model.lora"]["properties"]
    assert set(lora) == set(table_keys(LoraSpec))
    taken = {a for a in attrs.fields(Training) if "training" in a.metadata}
    assert set(properties["training"]["properties"]) == {a.name for a in taken}


def _typed_keys() -> list[tuple[str, str]]:
    return [
        (table, key)
        for table, cls in {**TABLES, "model.lora": LoraSpec}.items()
        for key, meta in job_keys(cls).items()
        if meta.spec is not None and key != "name"  # strategy.name: read by hand, its choices the same
    ]


@pytest.mark.parametrize(("table", "key"), _typed_keys(), ids=[f"{t}.{k}" for t, k in _typed_keys()])
def test_a_value_of_the_wrong_type_is_refused_by_both(tiny_job: Callable[..., Path], table: str, key: str) -> None:
    """A table where a typed key wants a value: the reader and the schema both refuse it, at the same key."""
    path = tiny_job()
    job = tomllib.loads(path.read_text())
    node = job
    for part in table.split("."):
        node = node.setdefault(part, {})
    node[key] = {"not": "a value"}
    assert f"{table}.{key}" in _errors(job)
    path.write_text(json.dumps(job))
    json_job = path.with_suffix(".json")
    path.rename(json_job)
    with pytest.raises(ConfigError) as caught:
        load_job(json_job)
    assert f"{table}.{key}" in [p.path for p in caught.value.problems]


@pytest.mark.parametrize("table", ["model", "data", "training", "strategy", "launch", ""])
def test_an_unknown_key_is_refused_by_both(tiny_job: Callable[..., Path], table: str) -> None:
    """A key no table takes: the schema flags it (as an editor would underline it) and the reader refuses it."""
    path = tiny_job()
    job = tomllib.loads(path.read_text())
    node = job.setdefault(table, {}) if table else job
    node["learning_rat"] = 1
    where = f"{table}.learning_rat" if table else "learning_rat"
    assert where in _errors(job)
    json_job = path.with_suffix(".json")
    json_job.write_text(json.dumps(job))
    with pytest.raises(ConfigError) as caught:
        load_job(json_job)
    assert where in [p.path for p in caught.value.problems]


def test_the_command_writes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """dsbuild schema --job -o FILE writes the same schema, atomically."""
    out = tmp_path / "job.schema.json"
    assert main(["schema", "--job", "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == job_schema()
