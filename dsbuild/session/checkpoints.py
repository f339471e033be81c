"""Saving and resuming a Session's checkpoints: DeepSpeed's files, verified, with the run's facts (``dsbuild.outputs.manifest``).

``save``: every process writes its files (DeepSpeed's, hashed as they are written; its own
position and RNG states as JSON), then rank 0 writes the manifest and only then moves ``latest``.
A failure (a full disk) removes the incomplete folder and names the last complete checkpoint.

``load``: the newest checkpoint that verifies (or the one asked for), refused when the run's
facts changed; DeepSpeed's files are read weights-only and checked as they are read, and every
process takes the same decision about a damaged checkpoint.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, SessionError
from ..outputs import manifest
from . import async_save, distributed, universal, weights_only

__all__ = ["load", "position_state", "require_shared", "save"]

logger = logging.getLogger("dsbuild")


def position_state(engine: Any, position: Any) -> dict[str, Any]:
    """This process's place in training, all JSON: its steps, its data position (``batches.DataPosition``, a
    rollout's state included), and its RNG states."""
    return {
        "global_step": int(engine.global_steps),
        "micro_steps": int(engine.micro_steps),
        "epoch": position.epoch,
        "batch_in_epoch": position.batch_in_epoch,
        "epoch_rng": weights_only.encode_tensor(position.epoch_rng),
        "rng": weights_only.rng_state(),
        "rollout": position.rollout,
        "num_tokens": position.tokens,
    }


def save(
    engine: Any,
    save_dir: Path,
    tag: str,
    *,
    position: dict[str, Any],
    facts: manifest.RunFacts,
    frozen_excluded: bool,
    keep_last: int | None,
) -> str:
    """Collective: checkpoint ``tag`` of ``engine`` in ``save_dir``, with this process's ``position``; the tag."""
    rank = distributed.rank()
    # Who writes the manifest: rank 0 into the one folder all share; with node-local storage (checkpoint.
    # use_node_local_storage, HF's save_on_each_node) each node's first process, into its node's folder.
    node_local = bool(engine.use_node_local_storage())
    main = distributed.local_rank() == 0 if node_local else rank == 0
    tag_dir = save_dir / tag
    writer = weights_only.install(engine)
    if main:
        async_save.remove_partials(save_dir)  # what an asynchronous save killed mid-write left
    if main and (tag_dir / manifest.MANIFEST).exists():
        (tag_dir / manifest.MANIFEST).unlink()  # being rewritten: incomplete until its new manifest
        shutil.rmtree(tag_dir / universal.FOLDER, ignore_errors=True)  # converted from what is being replaced
    distributed.barrier()
    writer.begin()
    try:
        engine.save_checkpoint(
            str(save_dir),
            tag=tag,
            save_latest=False,  # written below, once the checkpoint is complete
            exclude_frozen_parameters=frozen_excluded,  # LoRA: the frozen base is not training state
        )
        root = str(tag_dir.resolve())
        files = {
            Path(path).relative_to(root).as_posix(): {"size": size, writer.digest: digest}
            for path, (size, digest) in writer.written.items()
            if path.startswith(root + os.sep)
        }
        state = {**position, "rank": rank, "files": files}
        manifest.write_rank_state(tag_dir, rank, state)
        share = manifest.rank_entry(tag_dir, rank, state, writer.digest)
    except OSError as e:
        raise _save_failed(save_dir, tag, e, main) from None
    # Every rank's files are on disk; what each wrote reaches the manifest's writers through the process group, so
    # no process reads another's files (which, without a shared disk, are on another node).
    shares = distributed.all_objects((distributed.node_rank(), share))
    if main:
        node = distributed.node_rank()
        here = {r: s for r, (n, s) in enumerate(shares) if not node_local or n == node}
        try:
            manifest.write_manifest(
                tag_dir,
                tag=tag,
                step=int(engine.global_steps),
                world_size=distributed.world_size(),
                facts=facts,
                digest=writer.digest,
                shares=here,
            )
            manifest.write_latest(save_dir, tag)
        except OSError as e:
            raise _save_failed(save_dir, tag, e, main) from None
        if keep_last:
            manifest.prune(save_dir, keep_last)
    distributed.barrier()
    return tag


def _common_tags(load_dir: Path) -> tuple[list[str], list[str]]:
    """Collective: the checkpoints every process has (newest first; each node may have its own folder), and a note
    for each that some processes lack (a node whose files are gone: the placement changed)."""
    everyone = distributed.all_objects(manifest.candidates(load_dir))
    step = {name: number for names in everyone for name in names if (number := _step_of(name)) is not None}
    seen = sorted({name for names in everyone for name in names}, key=lambda n: (step.get(n, -1), n), reverse=True)
    common, notes = [], []
    for name in seen:
        lacking = [rank for rank, names in enumerate(everyone) if name not in names]
        if lacking:
            ranks = ", ".join(map(str, lacking))
            notes.append(f"{load_dir / name}: missing for rank(s) {ranks} (their node holds no such checkpoint)")
        else:
            common.append(name)
    return common, notes


def _step_of(name: str) -> int | None:
    digits = name.removeprefix("global_step")
    return int(digits) if digits.isdigit() else None


def require_shared(folder: Path) -> None:
    """Collective: raise ``CheckpointError`` on every process when some process does not see the files rank 0 writes
    in ``folder`` (a node-local disk): its first checkpoint would fail. Say how to keep node-local checkpoints."""
    rank = distributed.rank()
    marker = folder / f".dsbuild-shared-{os.getpid()}-{rank}"
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        marker.write_text("")
    name = distributed.all_objects(marker.name)[0]
    seen = (folder / name).is_file()
    lacking = [r for r, ok in enumerate(distributed.all_objects(seen)) if not ok]
    distributed.barrier()
    if rank == 0:
        marker.unlink(missing_ok=True)
    if lacking:
        raise CheckpointError(
            f"{folder}: rank(s) {', '.join(map(str, lacking))} do not see the files rank 0 writes there (each node has "
            "its own disk), so the first checkpoint would fail: put the output folder on a filesystem every node "
            "shares, or set training.save_on_each_node = true (DeepSpeed's checkpoint.use_node_local_storage) to keep "
            "each node's checkpoints on its own disk"
        )


def _save_failed(save_dir: Path, tag: str, error: OSError, main: bool) -> CheckpointError:
    reason = "no space left on device" if error.errno == errno.ENOSPC else (error.strerror or str(error))
    where = f" ({error.filename})" if error.filename else ""
    removed = main and manifest.remove_failed(save_dir / tag)
    last = manifest.last_complete(save_dir, but=tag)
    intact = f"the last complete checkpoint is {save_dir / last}" if last else "no earlier checkpoint is complete"
    partial = "its files were removed; " if removed else ""
    return CheckpointError(f"saving checkpoint {tag} in {save_dir} failed: {reason}{where}; {partial}{intact}")


def _load_universal(
    engine: Any,
    tag_dir: Path,
    found: dict[str, Any],
    facts: manifest.RunFacts,
    module_strict: bool,
    writer: weights_only.VerifyingCheckpointEngine,
    agree: Any,
) -> dict[str, Any]:
    """Collective: load checkpoint ``tag_dir``, saved at another world size, through its universal form (made by rank
    0); this process's carried-over position. ``CheckpointError`` (damaged) is agreed by every process."""
    then = found.get("run", {})
    world = _saved_world(engine, tag_dir, found, facts)
    problem: str | None = None
    saved: dict[str, Any] = {}
    own = None
    try:  # what every process reads itself: a problem one finds is every process's (none enters the load alone)
        saved = manifest.read_rank_state(tag_dir, 0, found)
        if distributed.rank() < world:
            own = manifest.read_rank_state(tag_dir, distributed.rank(), found)
    except CheckpointError as e:
        problem = str(e)
    agreed = agree(problem)
    if agreed:
        raise CheckpointError(agreed)
    # Before converting: a position this run cannot continue from exactly makes an older checkpoint the one to try.
    position = universal.carried_position(saved, own, then, facts)  # the same verdict on every process
    refused: str | None = None
    if distributed.rank() == 0:
        try:
            universal.convert(tag_dir, found)
        except CheckpointError as e:
            problem = str(e)
        except SessionError as e:
            refused = str(e)
    refused = next((text for text in distributed.all_texts(refused) if text), None)
    if refused:
        raise SessionError(refused)
    agreed = agree(problem)
    if agreed:
        raise CheckpointError(agreed)
    _load_converted(engine, tag_dir, module_strict, writer, agree)
    if distributed.rank() == 0:
        samples = int(position["batch_in_epoch"]) * facts.micro_batch * facts.world_size
        logger.warning("%s", universal.describe(tag_dir, then, facts, samples))
    return position


def _saved_world(engine: Any, tag_dir: Path, found: dict[str, Any], facts: manifest.RunFacts) -> int:
    """The world size a checkpoint to convert was saved at, its shape checked (a manifest is untrusted input), and
    every rank's files here."""
    then = found.get("run", {})
    shape = {key: then.get(key) for key in ("world_size", "micro_batch", "gradient_accumulation")}
    odd = [key for key, value in shape.items() if not (isinstance(value, int) and 0 < value < 2**31)]
    if odd:  # what is not a count says so, on every process alike
        raise CheckpointError(f"{tag_dir / manifest.MANIFEST}: run.{odd[0]} is not a positive integer")
    ranks = found.get("ranks")
    partial = isinstance(ranks, dict) and set(ranks) != {str(r) for r in range(shape["world_size"])}
    if engine.use_node_local_storage() or partial:
        raise SessionError(
            f"{tag_dir}: saved by {shape['world_size']} processes with node-local checkpoints (this folder holds only "
            f"some ranks' files); resuming with {facts.world_size} needs every rank's files: copy each node's "
            f"{tag_dir.name} folder into one shared folder, and resume from there without save_on_each_node"
        )
    return int(shape["world_size"])


def _load_converted(
    engine: Any, tag_dir: Path, module_strict: bool, writer: weights_only.VerifyingCheckpointEngine, agree: Any
) -> None:
    """Collective: the universal form of ``tag_dir`` verified and loaded; a damaged file (``CheckpointError``) and what
    DeepSpeed cannot load (``SessionError``) are every process's."""
    problem: str | None = None
    folder = tag_dir / universal.FOLDER
    converted: dict[str, Any] = {}
    try:
        converted = manifest.verify(folder, hashes=False)  # the contents as they are read
    except CheckpointError as e:
        problem = str(e)
    agreed = agree(problem)
    if agreed:
        raise CheckpointError(agreed)
    writer.expected, writer.verified = manifest.expected_files(folder, converted), set()
    problem = refused = None
    try:
        with universal.loading(engine, writer):
            loaded, _ = engine.load_checkpoint(str(tag_dir), tag=universal.FOLDER, load_module_strict=module_strict)
        if loaded is None:
            refused = f"{folder}: DeepSpeed's universal loader found nothing to load"
    except CheckpointError as e:  # a damaged file: an older checkpoint may do
        problem = str(e)
    except (RuntimeError, OSError, ValueError, KeyError, AssertionError) as e:  # DeepSpeed cannot: no older one can
        said = str(e).splitlines()[0] if str(e) else type(e).__name__
        refused = (
            f"{folder}: DeepSpeed's universal loader failed on it ({said}); resume with the processes that saved it"
        )
    finally:
        writer.expected = None
    agreed = agree(problem)
    if agreed:
        raise CheckpointError(agreed)
    refused = next((text for text in distributed.all_texts(refused) if text), None)
    if refused:
        raise SessionError(refused)


def _reapply_lr(engine: Any) -> None:
    """Set the optimizer's learning rate from the loaded scheduler for the step it is at.

    The saved optimizer state holds the rate the old run's schedule set for the next step; a resume with another
    ``max_steps`` has another schedule, whose rate the first resumed step must use. DeepSpeed's schedulers take
    ``step(last_batch_iteration)`` to set the rate of a given iteration without moving on; an unchanged schedule
    sets the same rate again.
    """
    scheduler: Any = getattr(engine, "lr_scheduler", None)
    iteration = getattr(scheduler, "last_batch_iteration", None)
    if isinstance(iteration, int) and iteration >= 0:
        scheduler.step(iteration)
    elif isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):  # the HF Trainer's own schedules
        rates = [
            base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
        ]
        for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate
        scheduler._last_lr = rates


def load(
    engine: Any, load_dir: Path, tag: str | None, *, facts: manifest.RunFacts, module_strict: bool
) -> tuple[str, dict[str, Any], list[str]]:
    """Collective: load a verified checkpoint into ``engine``: its tag, this process's saved position, what was skipped."""
    writer = weights_only.install(engine)
    position: dict[str, Any] = {}

    def attempt(name: str, found: dict[str, Any], changes: list[tuple[str, Any, Any]]) -> None:
        if changes:  # another world size (manifest.reshapes): through DeepSpeed's universal checkpoint
            position.update(_load_universal(engine, load_dir / name, found, facts, module_strict, writer, agree))
            return
        # Every process checks its own share of the files first, and all agree, before any enters DeepSpeed's load:
        # inside it, a process that stopped on a damaged shard would leave the others waiting in a collective.
        problem, checked = None, []
        try:
            # One process has nobody to leave waiting: its files are verified as torch reads them, in one pass.
            if distributed.world_size() > 1:
                checked = manifest.verify_rank(load_dir / name, found, distributed.rank())
        except CheckpointError as e:
            problem = str(e)
        agreed = agree(problem)  # every process names the first damaged file, whichever process found it
        if agreed:
            raise CheckpointError(agreed)
        writer.expected = manifest.expected_files(load_dir / name, found)
        writer.verified = {str((load_dir / name / file).resolve()) for file in checked}  # not hashed twice
        try:
            loaded, _ = engine.load_checkpoint(str(load_dir), tag=name, load_module_strict=module_strict)
            if loaded is None:
                problem = f"{load_dir / name}: DeepSpeed could not load it"
            else:
                position.update(manifest.read_rank_state(load_dir / name, distributed.rank(), found))
        except CheckpointError as e:
            problem = str(e)
        except (RuntimeError, OSError, ValueError, KeyError, AssertionError) as e:
            said = str(e).splitlines()[0] if str(e) else type(e).__name__
            problem = f"{load_dir / name}: DeepSpeed could not load it: {said}"
        finally:
            writer.expected, writer.verified = None, set()
        # Every rank takes the same decision: a file one rank found damaged fails the checkpoint for all.
        if distributed.all_sum([1.0 if problem else 0.0], engine.device)[0]:
            raise CheckpointError(problem or f"{load_dir / name}: damaged (found by another process)")

    def agree(problem: str | None) -> str | None:
        """The first problem any process found with a checkpoint, on every process (so all move on together)."""
        found = [text for text in distributed.all_texts(problem) if text]
        return (problem or found[0]) if found else None

    tags, missing = _common_tags(load_dir) if tag is None else (None, [])
    name, _, skipped = manifest.pick(load_dir, tag, facts, attempt, agree=agree, tags=tags, reshape=True)
    skipped = [*missing, *skipped]
    _reapply_lr(engine)
    if skipped and distributed.rank() == 0:
        for note in skipped:
            logger.warning("skipped a damaged checkpoint: %s", note)
        logger.warning("resuming from %s, the newest checkpoint that verifies", load_dir / name)
    return name, position, skipped
