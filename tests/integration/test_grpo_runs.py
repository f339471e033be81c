"""GRPO jobs as users run them (issue 33): the policy sampling its own completions under ZeRO-3 on 2 processes, a
SIGTERM and ``--resume``, and reward functions that fail, each by ``dsbuild train`` in a process of its own."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsbuild.errors import RunStopped
from dsbuild.outputs import manifest
from dsbuild.outputs.history import read as read_history

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.procs]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "job_grpo.toml"

REWARDS = '''
import math
import os

CALLS = 0


def length(completions, **_):
    return [-abs(len(c) - 4) / 4 for c in completions]


def failing(completions, **_):
    """Fails as MODE says at its second call (the run's step 2), on the rank RANKS names."""
    global CALLS
    CALLS += 1
    good = [float(len(c) % 3) for c in completions]
    if CALLS < 2 or os.environ.get("RANK", "0") not in os.environ.get("FAIL_RANKS", "0").split(","):
        return good
    mode = os.environ["MODE"]
    if mode == "raises":
        raise KeyError("answer")
    if mode == "length":
        return good[:-1]
    return [math.nan] + good[1:]
'''


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", **extra}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _losses(out: Path) -> dict[int, float]:
    if not (out / "history.jsonl").exists():
        return {}
    return {int(h["step"]): float(h["loss"]) for h in read_history(out / "history.jsonl") if h.get("loss") is not None}


@pytest.fixture(scope="module")
def eager_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/job_grpo.toml's tiny Llama, with an EOS sampled often enough that completions take lengths from 1 to
    12 tokens: the ranks finish generating at different lengths."""
    import torch
    from _session_common import tiny_llama
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama(max_position_embeddings=128))
    with torch.no_grad():
        model.lm_head.weight[1] += 1.0  # ByT5's </s>: its logit moved by the sum of the normalised features
    path = tmp_path_factory.mktemp("grpo_base") / "base"
    model.save_pretrained(path)
    return path


def _train(out: Path, *options: str, base: Path) -> list[str]:
    """``dsbuild train`` of examples/job_grpo.toml with its model from ``base`` (a copy of the job beside ``out``)."""
    text = EXAMPLE.read_text()
    text = (
        text[: text.index("[model.config]")]
        + f"name_or_path = {json.dumps(str(base))}\n\n"
        + text[text.index("[data]") :]
    )
    text = text.replace('"data/prompts.jsonl"', json.dumps(str(ROOT / "examples" / "data" / "prompts.jsonl")))
    text = text.replace('"grpo_rewards:', '"grpo_rewards_copy:')
    job = out.parent / f"{out.name}.toml"
    job.write_text(text)
    (out.parent / "grpo_rewards_copy.py").write_text((ROOT / "examples" / "grpo_rewards.py").read_text())
    return [sys.executable, "-m", "dsbuild", "train", str(job), f"--set=training.output_dir={json.dumps(str(out))}",
            "--set=training.save_steps=100", *options]  # fmt: skip


TWO = ["--nproc-per-node", "2", "--set=training.max_steps=5", "--set=training.per_device_train_batch_size=4",
       "--set=training.learning_rate=1e-5"]  # fmt: skip
"""2 processes × 4 completions, 2 prompts per step (num_generations 4), the KL term on (beta 0.04: a reference)."""


def test_a_sampled_grpo_job_on_two_processes_stops_on_sigterm_and_resumes_exactly(
    tmp_path: Path, eager_base: Path
) -> None:
    """The policy samples its completions (``rollout.backend = "hf"``, ZeRO-3 gathered on each rank, ranks ending at
    different lengths) on 2 processes: no hang; SIGTERM after step 2 saves a verified checkpoint and exits 75;
    ``--resume`` samples the same completions (the RNG is in the checkpoint) and logs the uninterrupted run's losses."""
    reference = tmp_path / "reference"
    done = subprocess.run(_train(reference, *TWO, base=eager_base), capture_output=True, text=True, env=_env(),
                          timeout=600, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [r for r in read_history(reference / "history.jsonl") if "loss" in r]
    assert len(records) == 5 and sum(r["completions/min_length"] < r["completions/max_length"] for r in records) >= 3
    assert records[0]["kl"] == 0.0 and records[-1]["kl"] > 0.0

    out = tmp_path / "stopped"
    run = subprocess.Popen(_train(out, *TWO, base=eager_base), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=_env(), cwd=tmp_path)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(_losses(out)) < 2 and run.poll() is None:
        time.sleep(0.2)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=300)
    assert run.returncode == RunStopped.EXIT_CODE, err[-3000:]
    stopped_at = max(_losses(out))
    assert (
        stopped_at < 5
        and manifest.verify(out / "checkpoints" / f"global_step{stopped_at}")["global_step"] == stopped_at
    )
    resumed = subprocess.run(_train(out, *TWO, "--resume", base=eager_base), capture_output=True, text=True,
                             env=_env(), timeout=600, cwd=tmp_path)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got, expected = _losses(out), _losses(reference)
    assert sorted(got) == [1, 2, 3, 4, 5]
    assert [got[s] for s in range(stopped_at + 1, 6)] == pytest.approx(
        [expected[s] for s in range(stopped_at + 1, 6)], rel=1e-5, abs=1e-7
    )


@pytest.mark.parametrize(
    ("mode", "processes", "said"),
    [
        ("raises", 1, "the reward function failing_rewards:failing raised KeyError: 'answer'"),
        ("length", 1, "the reward function failing_rewards:failing returned 7 rewards for 8 completions"),
        ("nan", 1, "the reward function failing_rewards:failing returned nan for completion 0"),
        ("raises", 2, "the reward function failing_rewards:failing raised KeyError: 'answer' on rank 1"),
    ],
)
def test_a_reward_function_that_fails_stops_the_run_naming_it(
    tmp_path: Path, eager_base: Path, mode: str, processes: int, said: str
) -> None:
    """A reward function that raises, returns the wrong number of rewards or a NaN at step 2 (on 2 processes: on
    rank 1 only, the ranks generating in step under ZeRO-3, ``ds3_gather_for_generation = false``) ends the run with
    exit 1 and one line naming it (and the rank), before step 2 trains; the checkpoint of step 1 verifies."""
    (tmp_path / "failing_rewards.py").write_text(REWARDS)
    out = tmp_path / "run"
    options = ["--set=training.max_steps=4", "--set=training.save_steps=1", '--set=rewards.functions=["failing_rewards:failing"]',
               "--set=rewards.weights=[1.0]", "--set=grpo.beta=0.0", f"--set=launch.nproc_per_node={processes}",
               f"--set=training.per_device_train_batch_size={8 // processes}", "--set=grpo.ds3_gather_for_generation=false"]  # fmt: skip
    env = _env(MODE=mode, FAIL_RANKS="1" if processes == 2 else "0", PYTHONPATH=str(tmp_path))
    done = subprocess.run(_train(out, *options, base=eager_base), capture_output=True, text=True, env=env, timeout=600,
                          cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if said in line]
    assert lines, done.stderr[-3000:]
    assert "training stopped before step 2" in lines[0] and "global_step1" in lines[0], lines[0]
    assert "Traceback" not in done.stderr  # told once, by dsbuild: the rank whose function failed, and its frames
    if processes == 2:
        assert lines[0].startswith("dsbuild: error: training failed on local rank 1: " + said), lines[0]
    if mode == "raises":
        assert f'{tmp_path / "failing_rewards.py"}:21 in failing: raise KeyError("answer")' in done.stderr
    assert sorted(_losses(out)) == [1]
    assert manifest.verify(out / "checkpoints" / "global_step1")["global_step"] == 1


SINK = """
import json
import math
import os

SEEN = {}


def complete(prompts):
    return [[40 + (i % 7)] * (2 + i % 5) for i in range(len(prompts))]


def sink(name, tensor):
    SEEN[name] = float(tensor.double().sum())
    if name == "lm_head.weight":  # the last weight: one sync done
        with open(os.environ["SYNCS"], "a") as f:
            f.write(json.dumps(SEEN) + "\\n")
"""


def test_a_weight_sink_gets_the_policys_weights_before_each_generation(tmp_path: Path, eager_base: Path) -> None:
    """``rollout.weight_sink`` (an external inference engine's hook) gets every weight of the policy, by its HF name,
    before each of the 3 steps' generation: the starting weights first, then each step's (they change)."""
    from transformers import AutoModelForCausalLM

    (tmp_path / "sink_functions.py").write_text(SINK)
    out, syncs = tmp_path / "run", tmp_path / "syncs.jsonl"
    options = ["--set=training.max_steps=3", '--set=rollout.backend="function"',
               '--set=rollout.function="sink_functions:complete"', '--set=rollout.weight_sink="sink_functions:sink"']  # fmt: skip
    done = subprocess.run(_train(out, *options, base=eager_base), capture_output=True, text=True, timeout=600,
                          env=_env(SYNCS=str(syncs), PYTHONPATH=str(tmp_path)), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = [json.loads(line) for line in syncs.read_text().splitlines()]
    start = AutoModelForCausalLM.from_pretrained(eager_base).state_dict()
    assert len(seen) == 3 and all(list(s) == list(start) for s in seen)
    assert seen[0] == pytest.approx({k: float(v.double().sum()) for k, v in start.items()}, rel=1e-9)
    assert seen[1] != seen[0] and seen[2] != seen[1]


ASYNC_REWARDS = '''
import asyncio

import numpy as np

STARTED = {}


async def judged(completions, target, log_metric, **_):
    """An async judge returning numpy that waits for the other one to start (they run together)."""
    STARTED.setdefault("judged", asyncio.Event()).set()
    await asyncio.wait_for(STARTED.setdefault("passed", asyncio.Event()).wait(), timeout=60)
    log_metric("judge/calls", 1.0)
    return np.array([-abs(len(c) - t) / t for c, t in zip(completions, target)])


async def passed(completions, **_):
    STARTED.setdefault("passed", asyncio.Event()).set()
    await asyncio.wait_for(STARTED.setdefault("judged", asyncio.Event()).wait(), timeout=60)
    return [len(c) % 2 == 0 for c in completions]
'''


def test_async_reward_functions_returning_numpy_and_bools_train(tmp_path: Path, eager_base: Path) -> None:
    """A user's reward module of two ``async def`` functions that each wait for the other to start (run together on
    one loop, as TRL gathers them), one returning a numpy array and calling ``log_metric``, the other bools: a
    1-process job trains 2 steps and logs TRL's reward metrics and the function's own."""
    (tmp_path / "async_rewards.py").write_text(ASYNC_REWARDS)
    out = tmp_path / "run"
    options = ["--set=training.max_steps=2", '--set=rewards.functions=["async_rewards:judged", "async_rewards:passed"]',
               "--set=rewards.weights=[1.0, 0.5]", "--set=grpo.beta=0.0", "--set=launch.nproc_per_node=1",
               "--set=training.per_device_train_batch_size=8", "--set=training.logging_steps=1"]  # fmt: skip
    done = subprocess.run(_train(out, *options, base=eager_base), capture_output=True, text=True,
                          env=_env(PYTHONPATH=str(tmp_path)), timeout=600, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [r for r in read_history(out / "history.jsonl") if "loss" in r]
    assert len(records) == 2
    for record in records:
        assert record["judge/calls"] == 1.0 and 0.0 <= record["rewards/passed/mean"] <= 1.0
        assert record["rewards/judged/mean"] <= 0.0 and math.isfinite(record["reward"])


BROKEN = """
def complete(prompts):
    return [[40 + (i % 7)] * (2 + i % 5) for i in range(len(prompts))]


def grade(completions, **_):
    return [score(c) for c in completions]


def score(completion):
    return FAILS["reward"] / (1 + len(completion))


def fails_to_complete(prompts):
    return [FAILS["rollout"] for _ in prompts]


def fails_to_sink(name, tensor):
    FAILS["sink"]


FAILS = {}
"""
"""User code on both ranks that raises a KeyError at step 1 where ``FAILS`` lacks its key: the reward function (two
frames deep), the rollout function or the weight sink."""

USER_CODE = {
    "reward": ['--set=rewards.functions=["broken:grade"]', "--set=rewards.weights=[1.0]"],
    "rollout": ['--set=rollout.backend="function"', '--set=rollout.function="broken:fails_to_complete"'],
    "sink": ['--set=rollout.backend="function"', '--set=rollout.function="broken:complete"',
             '--set=rollout.weight_sink="broken:fails_to_sink"'],
}  # fmt: skip
FRAMES = {
    "reward": [
        ":7 in grade: return [score(c) for c in completions]",
        ":11 in score: return FAILS['reward'] / (1 + len(completion))",
    ],
    "rollout": [":15 in fails_to_complete: return [FAILS['rollout'] for _ in prompts]"],
    "sink": [":19 in fails_to_sink: FAILS['sink']"],
}
"""The lines of broken.py the terminal shows, outermost first (after the file's path)."""


@pytest.mark.parametrize("where", list(USER_CODE))
def test_user_code_that_fails_on_two_processes_is_told_once_with_its_own_frames(
    tmp_path: Path, eager_base: Path, where: str
) -> None:
    """A reward function, rollout function or weight sink that raises on both of 2 processes: exit 1, and the
    terminal holds one account of it in at most 8 lines — the function and the rank, its frames in the user's module
    (file:line and the code), where the whole log is — and no traceback; that rank's log holds Python's whole
    traceback. The reward's case, corrected, runs as the same command: the failed run left nothing that refuses it."""
    (tmp_path / "broken.py").write_text(BROKEN.replace("FAILS['", 'FAILS["').replace("']", '"]'))
    out = tmp_path / "run"
    command = _train(out, "--nproc-per-node=2", "--set=training.max_steps=1", *USER_CODE[where], base=eager_base)
    done = subprocess.run(command, capture_output=True, text=True, env=_env(PYTHONPATH=str(tmp_path)), timeout=600,
                          cwd=tmp_path)  # fmt: skip
    terminal = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 1, done.stderr[-3000:]
    assert len(terminal) <= 8, "\n".join(terminal)
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in terminal if line.startswith("dsbuild: error: ")]
    assert len(errors) == 1 and errors[0].startswith("dsbuild: error: training failed on local rank "), terminal
    assert f"raised KeyError: '{where}'" in errors[0], errors[0]
    for frame in FRAMES[where]:
        shown = f"  {tmp_path / 'broken.py'}{frame.replace(chr(39), chr(34))}"
        assert any(line.startswith(shown) for line in terminal), terminal
    log = Path(terminal[-1].split("the whole log: ")[1].split(";")[0])
    assert "Traceback (most recent call last)" in log.read_text() and str(tmp_path / "broken.py") in log.read_text()
    if where == "reward":
        (tmp_path / "broken.py").write_text(BROKEN.replace("FAILS = {}", "FAILS = {'reward': 1.0}"))
        again = subprocess.run(command, capture_output=True, text=True, env=_env(PYTHONPATH=str(tmp_path)),
                               timeout=600, cwd=tmp_path)  # fmt: skip
        assert again.returncode == 0, again.stderr[-3000:]
        assert sorted(_losses(out)) == [1]


PASSES = ["--set=grpo.num_iterations=2", "--set=grpo.steps_per_generation=2"]
"""One generation batch (16 sampled completions, 4 prompts) feeds 4 optimizer steps: 2 micro-batches, each twice."""


def test_a_run_resumed_inside_a_generation_batch_trains_as_the_uninterrupted_one(
    tmp_path: Path, eager_base: Path
) -> None:
    """A checkpoint after step 1 of a generation batch that feeds steps 1-4 keeps the batch (completions, advantages,
    the old and the reference's log-probs: the policy that made them has stepped since), and ``--resume`` trains
    steps 2-4 on it and steps 5-6 on the next one, sampled from the restored RNG: the uninterrupted run's records."""
    reference = tmp_path / "reference"
    six = "--set=training.max_steps=6"
    done = subprocess.run(_train(reference, *PASSES, six, base=eager_base), capture_output=True, text=True,
                          env=_env(), timeout=600, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "stopped"
    first = subprocess.run(_train(out, *PASSES, "--set=training.max_steps=1", base=eager_base), capture_output=True,
                           text=True, env=_env(), timeout=600, cwd=tmp_path)  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    state = json.loads((out / "checkpoints" / "global_step1" / manifest.RANK_STATE.format(rank=0)).read_text())
    assert state["rollout"]["generation"] is not None and state["rollout"]["num_tokens"] > 0
    resumed = subprocess.run(_train(out, *PASSES, six, "--resume", base=eager_base), capture_output=True, text=True,
                             env=_env(), timeout=600, cwd=tmp_path)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = [r for r in read_history(out / "history.jsonl") if "loss" in r]
    expected = [r for r in read_history(reference / "history.jsonl") if "loss" in r]
    assert [r["step"] for r in got] == [r["step"] for r in expected] == [1, 2, 3, 4, 5, 6]
    assert "reward" in expected[0] and "reward" not in expected[1] and "reward" in expected[4]
    for mine, theirs in zip(got, expected, strict=True):
        assert sorted(mine) == sorted(theirs)
        for name in theirs:
            if name not in ("samples_per_sec", "tokens_per_sec", "epoch"):
                assert mine[name] == pytest.approx(theirs[name], rel=1e-5, abs=1e-7), (name, mine["step"])
