"""Resuming at another world size: DeepSpeed's universal checkpoint, made and loaded by dsbuild.

A checkpoint's ZeRO shards are cut for the processes that saved it. When a run resumes with another
number of processes (a requeued job on fewer nodes, a move from 2 GPUs to 8), or splits the same
samples into other micro-batches and accumulation steps, rank 0 converts the checkpoint with
DeepSpeed's ``ds_to_universal`` (with ``--inject_missing_state``: an HF model carries no
universal-checkpoint info of its own) into ``<tag>/universal``, beside the checkpoint's own files,
with a manifest of its own; then every process loads it with DeepSpeed's universal loader
(``checkpoint.load_universal``). Every file read on the way, the checkpoint's and the conversion's,
is read weights-only and checked against its manifest (``weights_only.routed``). The data position
is carried over as a count of samples, so no sample is trained twice or skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from ..errors import CheckpointError, SessionError
from ..outputs import manifest
from . import weights_only

__all__ = ["FOLDER", "carried_position", "convert", "describe", "loading"]

FOLDER: Final = "universal"
"""Where a checkpoint's universal form is kept: ``<tag>/universal`` (removed with its checkpoint)."""


def convert(tag_dir: Path, found: Mapping[str, Any]) -> Path:
    """The universal form of checkpoint ``tag_dir`` (whose manifest is ``found``), verified; made once, by one process.

    ``CheckpointError``: a file of the checkpoint is damaged (another checkpoint may do); ``SessionError``: DeepSpeed
    could not convert it.
    """
    target = tag_dir / FOLDER
    if target.is_dir():
        try:
            manifest.verify(target)
            return target
        except CheckpointError:
            shutil.rmtree(target, ignore_errors=True)  # a conversion cut short, or damaged since: made again
    work = tag_dir / f".{FOLDER}-partial"  # one name: a conversion cut short is replaced, not left beside
    shutil.rmtree(work, ignore_errors=True)
    try:
        _convert_into(work, tag_dir, found)
        work.rename(target)
    except CheckpointError:
        raise
    except Exception as e:  # DeepSpeed's converter fails in many ways (an assertion, a full disk, an odd file)
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SessionError(
            f"{tag_dir}: DeepSpeed's ds_to_universal could not convert it for another world size: {reason}; resume "
            "with the processes that saved it"
        ) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)  # whatever did not become ``target``
        (tag_dir / "latest_universal").unlink(missing_ok=True)  # ds_to_universal writes it beside its output
    return target


def _convert_into(work: Path, tag_dir: Path, found: Mapping[str, Any]) -> None:
    from deepspeed.checkpoint import ds_to_universal

    args = argparse.Namespace(
        input_folder=str(tag_dir),
        output_folder=str(work),
        num_extract_workers=1,  # no process pool forked from a process inside a process group
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )
    checker = weights_only.VerifyingCheckpointEngine(None)
    checker.expected = manifest.expected_files(tag_dir, found)  # every source file checked as it is read
    checker.scratch = str(work.resolve())  # and its own intermediate files read back weights-only
    with (
        weights_only.routed(checker),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        ds_to_universal.main(args)
    # The converter copies some of the checkpoint's files as they are: each must be the one the manifest lists, or it
    # would enter the universal manifest unchecked.
    for path in sorted(work.iterdir()):
        source = tag_dir / path.name
        if path.is_file() and source.is_file():
            entry = found["files"].get(path.name)
            if not isinstance(entry, dict):
                raise CheckpointError(f"{source}: not in the checkpoint's manifest, so it is not converted")
            algorithm, digest = manifest.entry_digest(entry)
            if manifest.file_digest(path, algorithm) != digest:
                raise CheckpointError(f"{source}: its contents differ from the manifest's {algorithm} digest")
    facts = manifest.RunFacts(**{k: v for k, v in found.get("run", {}).items() if k in _FACTS})
    manifest.write_manifest(
        work,
        tag=f"{found.get('tag', tag_dir.name)}/{FOLDER}",
        step=int(found.get("global_step", 0)),
        world_size=facts.world_size,
        facts=facts,
        shares={},  # no rank wrote here: every file is listed as this process hashes it
    )


_FACTS: Final = {a.name for a in attrs.fields(manifest.RunFacts)}


@contextlib.contextmanager
def loading(engine: Any, writer: weights_only.VerifyingCheckpointEngine) -> Any:
    """DeepSpeed's universal loader for one ``engine.load_checkpoint`` (``checkpoint.load_universal`` is read at load
    time only), with every ``torch.load`` of it weights-only and verified through ``writer``."""
    config = engine._config
    before = config.load_universal_checkpoint
    config.load_universal_checkpoint = True
    try:
        with weights_only.routed(writer):
            yield
    finally:
        config.load_universal_checkpoint = before


def carried_position(
    saved: Mapping[str, Any], own: Mapping[str, Any] | None, then: Mapping[str, Any], now: manifest.RunFacts
) -> dict[str, Any]:
    """This process's position in a run that resumes at another world size or batch split: the saved run's place in
    its data (``saved``: rank 0's state) as a count of samples, in this run's micro-batches; this process's RNG states
    when the saved run had a process of its rank (``own``), else none (the seeded ones stay)."""
    per_then = int(then["micro_batch"]) * int(then["world_size"])  # checked positive integers (checkpoints.py)
    per_now = now.micro_batch * now.world_size
    counts = {key: saved.get(key, 0) for key in ("global_step", "batch_in_epoch", "epoch")}
    odd = [key for key, value in counts.items() if not (isinstance(value, int) and 0 <= value < 2**62)]
    if odd:
        raise CheckpointError(f"rank 0's saved state: {odd[0]} is not a count ({counts[odd[0]]!r})")
    samples = counts["batch_in_epoch"] * per_then
    if samples % per_now:  # an older checkpoint may be at a position that divides
        raise CheckpointError(
            f"the checkpoint is {samples} samples into epoch {saved.get('epoch', 0)}, not a whole number of this run's "
            f"micro-batches ({now.micro_batch} samples x {now.world_size} processes): choose a "
            "per_device_train_batch_size and process count whose product divides it"
        )
    step = counts["global_step"]
    return {
        **saved,
        "batch_in_epoch": samples // per_now,
        "micro_steps": step * now.gradient_accumulation,
        "rng": own.get("rng") if own is not None else None,
    }


def describe(tag_dir: Path, then: Mapping[str, Any], now: manifest.RunFacts, samples: int) -> str:
    """What a resume at another world size did, in one line."""

    def split(world: Any, micro: Any, accumulation: Any) -> str:
        return f"{world} process(es) x micro-batch {micro} x {accumulation} accumulation step(s)"

    old = split(then.get("world_size"), then.get("micro_batch"), then.get("gradient_accumulation"))
    new = split(now.world_size, now.micro_batch, now.gradient_accumulation)
    text = (
        f"{tag_dir.name} was saved by {old}; this run has {new}: converted it with DeepSpeed's universal checkpoint "
        f"into {tag_dir / FOLDER} and resumed {samples} samples into its epoch"
    )
    try:
        before = int(then["world_size"]) * int(then["micro_batch"]) * int(then["gradient_accumulation"])
    except (KeyError, TypeError, ValueError):
        return text
    after = now.world_size * now.micro_batch * now.gradient_accumulation
    if before == after:
        return text
    keep = before // (now.world_size * now.micro_batch) if before % (now.world_size * now.micro_batch) == 0 else None
    fix = f"; gradient_accumulation_steps = {keep} keeps it" if keep else ""
    return f"{text}. The global batch is now {after} samples per optimizer step, not {before}{fix}"
