"""``training.async_save``'s memory said, not discovered: the copy each process's checkpoint takes in CPU memory,
by ZeRO stage (``planner.checkpoint_copy``), in ``dsbuild plan``'s CPU column, and refused before launch where it
does not fit; and the one combination it cannot run with (DeepSpeed's own ``checkpoint.writer``) refused by key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dsbuild import ConfigError
from dsbuild.cli import main
from dsbuild.job import load_job
from dsbuild.planner import MIXED_ADAM, plan, staging, with_staging
from dsbuild.planner.checkpoint_copy import refusal
from dsbuild.run import checks

B7 = 7 * 10**9


def test_the_copy_is_what_each_process_writes_at_each_stage() -> None:
    """7B, bf16 + AdamW, 8 processes on one node: ZeRO-0 rank 0 writes 2 + 12 bytes a parameter; ZeRO-1/2 the whole
    16-bit weights on rank 0 and 12/8 bytes of fp32 master weights and moments on each; ZeRO-3 only the shards."""
    assert staging(0, B7, 8, 8, MIXED_ADAM).per_rank == 14 * B7
    one = staging(1, B7, 8, 8, MIXED_ADAM)
    assert (one.per_rank, one.per_node) == (2 * B7 + 12 * B7 // 8, 2 * B7 + 12 * B7)
    assert staging(2, B7, 8, 8, MIXED_ADAM) == one
    three = staging(3, B7, 8, 8, MIXED_ADAM)
    assert (three.per_rank, three.per_node) == (12 * B7 // 8, 12 * B7)
    assert staging(3, B7, 16, 8, MIXED_ADAM).per_node == 12 * B7 // 2  # two nodes: each holds half


def test_plan_counts_the_copy_in_the_cpu_column_and_picks_again() -> None:
    """Every row's CPU figure grows by its stage's copy per node; with a CPU budget the copy must fit (a row without
    offload too), the pick moves to a row whose copy fits, and a note says each stage's figure."""
    before = plan(params="7B", gpus_per_node=8, gpu_memory="80GiB", cpu_memory="100GiB")
    after = with_staging(before, B7)
    for old, new in zip(before.rows, after.rows, strict=True):
        assert new.cpu_bytes_per_node == old.cpu_bytes_per_node + staging(old.stage, B7, 8, 8).per_node
    zero0 = after.row(0)
    assert zero0.cpu_bytes_per_node > 100 * 2**30 and not zero0.fits
    assert after.recommended_row is not None and after.recommended_row.stage == 3
    assert any(note.startswith("training.async_save: each process's checkpoint is copied") for note in after.notes)


def test_a_copy_larger_than_the_memory_available_is_refused_with_both_figures() -> None:
    """The refusal names the node's copy, rank 0's and what is available; a copy that fits, or an unknown amount of
    memory, is no refusal."""
    copy = staging(1, B7, 8, 8, MIXED_ADAM)
    said = refusal(copy, 64 * 2**30)
    assert said is not None
    assert "each checkpoint is copied into CPU memory before it is written: 91.27 GiB on this node" in said
    assert "(22.82 GiB on rank 0), and 64.00 GiB is available" in said
    assert refusal(copy, 200 * 2**30) is None and refusal(copy, None) is None


def test_dsbuild_train_refuses_before_launch_a_copy_that_does_not_fit(
    tiny_job: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """launch_checks (dsbuild train before launch, dsbuild validate) refuses training.async_save by its key when the
    node has less available than the copy, and says nothing when it has enough."""
    job = load_job(tiny_job(training={"async_save": True}))
    monkeypatch.setattr("dsbuild.planner.checkpoint_copy.available_memory", lambda: 1024)
    found = checks.staging_problems(job, 1)
    assert [(d.path, d.severity) for d in found] == [("training.async_save", "error")]
    assert "and 1 KiB is available" in found[0].message and "training.async_save = false" in (found[0].hint or "")
    monkeypatch.setattr("dsbuild.planner.checkpoint_copy.available_memory", lambda: 2**40)
    assert checks.staging_problems(job, 1) == []


def test_async_save_with_deepspeed_s_writer_is_refused_by_key(tiny_job: Callable[..., Path]) -> None:
    """DeepSpeed's checkpoint.writer and dsbuild's background save would both write the files: the job is refused as
    it is read (dsbuild validate, dsbuild train), under training.async_save, saying to choose one."""
    path = tiny_job(training={"async_save": True}, extra='\n[strategy.overrides.checkpoint.writer]\ntype = "python"\n')
    with pytest.raises(ConfigError) as e:
        load_job(path)
    assert "training.async_save: not with [strategy] checkpoint.writer" in str(e.value)


def test_dsbuild_plan_of_a_job_that_saves_in_the_background(
    tiny_job: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """dsbuild plan --model JOB, the job with training.async_save = true: the note with each stage's copy."""
    assert main(["plan", "--model", str(tiny_job(training={"async_save": True}))]) == 0
    out = capsys.readouterr().out
    assert "training.async_save: each process's checkpoint is copied into CPU memory" in " ".join(out.split())
