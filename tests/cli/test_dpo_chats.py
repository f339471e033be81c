"""A DPO job of conversational pairs and a tokenizer without a chat template (the byte tokenizer of every example) is
rendered by the one rule of every task (issue 43): ``data.chat_template``, else the tokenizer's, else the fallback
template; ``dsbuild validate`` printed transformers' 58-line traceback and refused ``data.chat_template`` for
``format = "preference"``. A template that cannot render a pair is refused naming the key, the file and the line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsbuild.cli import main

pytestmark = pytest.mark.train

JOB = """\
task = "dpo"
[model]
tokenizer = "byte"
[model.config]
model_type = "llama"
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 4
num_key_value_heads = 4
vocab_size = 384
[data]
path = "pairs.jsonl"
format = "preference"
{data}
[dpo]
max_length = 128
[training]
output_dir = "out"
per_device_train_batch_size = 2
max_steps = 1
logging_steps = 1
save_strategy = "no"
[strategy]
config = "zero0"
"""


def _turn(role: str, text: str) -> list[dict[str, str]]:
    return [{"role": role, "content": text}]


PAIRS = [
    {"prompt": _turn("user", "2 + 2?"), "chosen": _turn("assistant", "4"), "rejected": _turn("assistant", "5")},
    {"prompt": _turn("user", "Say hi"), "chosen": _turn("assistant", "hi"), "rejected": _turn("assistant", "no")},
]

TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)
REFUSES_THE_SECOND = (
    "{% for m in messages %}{% if m['content'] == 'Say hi' %}{{ raise_exception('no greetings') }}{% endif %}"
    "{{ m['content'] }}{% endfor %}"
)


def _job(tmp_path: Path, data: str = "") -> Path:
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS), encoding="utf-8")
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(data=data), encoding="utf-8")
    return job


def _validate(capsys: pytest.CaptureFixture[str], job: Path) -> tuple[int, str]:
    code = main(["validate", str(job)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out + err


@pytest.mark.parametrize("template", [None, TEMPLATE], ids=["fallback", "data.chat_template"])
def test_conversational_pairs_with_the_byte_tokenizer_validate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, template: str | None
) -> None:
    """Without a template anywhere the fallback renders the pairs; ``data.chat_template`` is taken for preference
    data as for chats."""
    data = f"chat_template = {json.dumps(template)}" if template else ""
    code, out = _validate(capsys, _job(tmp_path, data))
    assert code == 0, out


def test_a_template_that_cannot_render_a_pair_is_refused_by_key_file_and_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Exit 1, no traceback: the key that sets the template, the file, the line and what the template said."""
    code, out = _validate(capsys, _job(tmp_path, f"chat_template = {json.dumps(REFUSES_THE_SECOND)}"))
    assert code == 1
    where = f"data.chat_template: {tmp_path / 'pairs.jsonl'}: line 2: the chat template cannot render this pair"
    assert f"{where}: no greetings" in out


@pytest.mark.procs
@pytest.mark.parametrize("template", [None, TEMPLATE], ids=["fallback", "data.chat_template"])
def test_a_dpo_job_of_conversational_pairs_trains(tmp_path: Path, template: str | None) -> None:
    """``dsbuild train`` of the pairs takes a step with the fallback template and with ``data.chat_template`` (the
    pairs are TRL's preparation with that template: tests/property/test_dpo_data_differential.py); the model's
    tokenizer is saved with ``data.chat_template`` when the job sets it."""
    data = f"chat_template = {json.dumps(template)}" if template else ""
    job = _job(tmp_path, data).read_text() + "\n"
    (tmp_path / "job.toml").write_text(job.replace('save_strategy = "no"', 'save_strategy = "steps"\nsave_steps = 1'))
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-m", "dsbuild", "train", str(tmp_path / "job.toml")], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    steps = [json.loads(line) for line in (tmp_path / "out" / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "loss" in r] == [1]
    if template is None:
        return
    saved = json.loads((tmp_path / "out" / "model" / "tokenizer_config.json").read_text())
    assert (
        saved.get("chat_template") == TEMPLATE
        or (tmp_path / "out" / "model" / "chat_template.jinja").read_text(encoding="utf-8") == TEMPLATE
    )
