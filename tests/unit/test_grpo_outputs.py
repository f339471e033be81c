"""What a GRPO run keeps and shows besides the loss (issue 42): the generation batch a checkpoint holds between the
optimizer steps it feeds (``rl.buffer``), the logged completions (``rl.completions``), the summary line's and the
loss plot's mean reward."""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import pytest
import torch

from dsbuild.rl.buffer import Generation, decode_tensor, encode_tensor
from dsbuild.rl.completions import CompletionLog

pytestmark = pytest.mark.train  # torch


def _generation() -> Generation:
    torch.manual_seed(0)
    return Generation(
        {"input_ids": torch.randint(0, 300, (4, 7)), "advantages": torch.randn(4),
         "old_logps": torch.randn(4, 7), "empty": torch.zeros(0, 3)},
        num_items=13.0, rows=2,
    )  # fmt: skip


def test_a_generation_batch_comes_back_from_its_json_state_bit_for_bit() -> None:
    """The state is JSON (what a checkpoint's position file holds) and gives back every tensor exactly, cut into the
    same micro-batches; at another world size or micro-batch size it gives none (the rows are another split)."""
    batch = _generation()
    state = json.loads(json.dumps(batch.state(world_size=2)))
    back = Generation.of_state(state, world_size=2, rows=2)
    assert back is not None and back.num_items == 13.0 and back.rows == 2
    for name, tensor in batch.tensors.items():
        assert back.tensors[name].dtype == tensor.dtype and torch.equal(back.tensors[name], tensor)
    second = back.micro_batch(1)
    assert torch.equal(second["old_logps"], batch.tensors["old_logps"][2:4]) and second["num_items_in_batch"] == 13.0
    assert Generation.of_state(state, world_size=1, rows=2) is None
    assert Generation.of_state(state, world_size=2, rows=4) is None
    assert Generation.of_state(None, world_size=2, rows=2) is None


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ({"dtype": "float64", "shape": [1], "data": ""}, "not a saved tensor"),
        ({"dtype": "int64", "shape": [2], "data": "AAAA"}, "has 3 bytes"),
        ({"dtype": "int64", "shape": [-1], "data": ""}, "shape"),
        ({"dtype": "int64", "shape": [1], "data": "!!"}, "base64"),
        ("text", "not a saved tensor"),
    ],
)
def test_a_damaged_saved_tensor_is_refused(value: object, said: str) -> None:
    """A checkpoint is untrusted input: a tensor of another type, a shape its bytes do not fill or bad base64 is a
    ``ValueError`` (the session says the checkpoint's generation batch is damaged), never a wrong tensor."""
    with pytest.raises(ValueError, match=said):
        decode_tensor(value)


def test_a_tensor_of_another_type_is_not_saved() -> None:
    with pytest.raises(TypeError):
        encode_tensor(torch.zeros(2, dtype=torch.bfloat16))


def test_logged_completions_are_appended_as_json_lines_and_the_first_are_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each completion is one line (step, prompt, completion, each reward by function, advantage; NaN as null), the
    file appended at each generation; ``num_completions_to_print`` lines are logged, a conversation by its text."""
    path = tmp_path / "completions.jsonl"
    log = CompletionLog(path, ["length", "format"], to_print=1)
    with caplog.at_level(logging.INFO, logger="dsbuild"):
        log.add(3, ["2+2=", "2+2="], [" 4", " five"], [[1.0, float("nan")], [0.5, 1.0]], [0.7, -0.7])
        log.add(5, [[{"role": "user", "content": "hi"}]], [[{"role": "assistant", "content": "hello"}]], [[1, 0]], [0])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0] == {"step": 3, "prompt": "2+2=", "completion": " 4", "rewards": {"length": 1.0, "format": None},
                       "advantage": 0.7}  # fmt: skip
    assert [r["step"] for r in rows] == [3, 3, 5] and rows[2]["completion"][0]["content"] == "hello"
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == f"completions of step 3 (2 in {path}):\n  '2+2=' -> '4': length 1.000, format -; advantage 0.700"
    assert said[1].endswith("'hi' -> 'hello': length 1.000, format 0.000; advantage 0.000")


GRPO_JOB = """
    task = "grpo"
    [model]
    name_or_path = "org/model"
    [data]
    path = "prompts.jsonl"
    format = "prompt"
    [rewards]
    functions = ["my_rewards:length"]
    [grpo]
    num_generations = 4
    [training]
    output_dir = "out"
    per_device_train_batch_size = 8
    [strategy]
    config = "zero3"
"""


def test_a_grpo_runs_summary_shows_the_mean_reward_beside_the_loss(tmp_path: Path) -> None:
    """The loss of GRPO says little: the summary line gives the mean reward of the first and last generation, and
    names the completions file when the run wrote one."""
    from dsbuild.job import load_job
    from dsbuild.outputs.run_folder import RunFolder
    from dsbuild.run.worker import summary_lines

    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(8)))
    (tmp_path / "my_rewards.py").write_text("def length(completions, **_):\n    return [1.0] * len(completions)\n")
    (tmp_path / "job.toml").write_text(textwrap.dedent(GRPO_JOB))
    job = load_job(tmp_path / "job.toml")
    folder = RunFolder(job.output_dir)
    folder.root.mkdir()
    records = [
        {"step": 1, "loss": 0.5, "reward": -0.25},
        {"step": 2, "loss": 0.1},
        {"step": 3, "loss": 0.2, "reward": 0.75},
    ]
    folder.history.write_text("".join(json.dumps(r) + "\n" for r in records))
    lines = summary_lines(job)
    assert lines[0] == "loss 0.500 at step 1 -> 0.200 at step 3; mean reward -0.250 at step 1 -> 0.750 at step 3"
    assert not any(line.startswith("completions") for line in lines)
    folder.completions.write_text("{}\n")
    assert any(line.startswith("completions") and str(folder.completions) in line for line in summary_lines(job))


def test_the_loss_plot_of_a_grpo_run_draws_the_mean_reward_on_a_second_axis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``reward`` in the history adds a second axis with the mean reward at the steps that generated; a run without
    it draws the loss alone, as before."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from dsbuild.outputs.plot import plot_loss

    drawn: list[Figure] = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (drawn.append(self), save(self, *a, **k))[1])
    history = [
        {"step": 1, "loss": 0.5, "reward": -0.25},
        {"step": 2, "loss": 0.1},
        {"step": 3, "loss": 0.2, "reward": 0.7},
    ]
    assert plot_loss(history, tmp_path / "loss.png").stat().st_size > 0
    loss_axis, reward_axis = drawn[0].axes
    assert reward_axis.get_ylabel() == "mean reward"
    assert [list(line.get_xdata()) for line in reward_axis.get_lines()] == [[1, 3]]
    assert [t.get_text() for t in loss_axis.get_legend().get_texts()] == ["training loss", "mean reward"]
    plot_loss([{k: v for k, v in r.items() if k != "reward"} for r in history], tmp_path / "plain.png")
    assert len(drawn[1].axes) == 1
