"""The checkpoint manifest: what a complete, verified dsbuild checkpoint is, read without torch.

A checkpoint is DeepSpeed's own folder (``save_dir/TAG/``: model and optimizer states) plus:

- ``dsbuild_rank{R}.json`` per process: its data position and RNG states, as JSON (no pickle),
  and the size and digest (XXH3-128; SHA-256 in older checkpoints) of every file that process wrote;
- ``manifest.json``, written last by rank 0 once every process has written its files: the files
  with their sizes and digests, the versions that wrote them, and the facts that decide what the
  checkpoint means (world size, ZeRO stage, batch sizes, data, seed, model, LoRA);
- ``latest`` (DeepSpeed's pointer) moves to the new tag only after its manifest is written.

Every file is renamed into place atomically but not flushed to disk with ``fsync`` (DeepSpeed does not
flush its files either): what a crash or a power loss leaves short or stale fails verification against
the manifest, and the resume falls back to an older checkpoint that verifies.

``verify`` checks a checkpoint against its manifest, ``list_checkpoints`` lists a folder
(``dsbuild checkpoints``), ``pick`` chooses what a resume loads: the newest checkpoint that
verifies, after refusing a run whose facts changed. Loading the tensors is ``dsbuild.session``'s.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import attrs

from .._util.atomic import write_atomic
from ..env.versions import installed
from ..errors import CheckpointError
from ..version import VERSION

__all__ = [
    "DIGEST",
    "DIGESTS",
    "FORMAT",
    "LATEST",
    "MANIFEST",
    "RANK_STATE",
    "CheckpointInfo",
    "RunFacts",
    "candidates",
    "canonical",
    "check_files",
    "entry_digest",
    "expected_files",
    "file_digest",
    "fingerprint",
    "hasher",
    "last_complete",
    "list_checkpoints",
    "pick",
    "prune",
    "rank_entry",
    "rank_files",
    "read_json",
    "read_latest",
    "read_rank_state",
    "remove_failed",
    "sha256_file",
    "verify",
    "verify_rank",
    "write_latest",
    "write_manifest",
    "write_rank_state",
]

FORMAT: Final = "dsbuild-checkpoint/1"

DIGESTS: Final = ("xxh3_128", "sha256")
"""The digests a manifest entry may carry, each under its own name (``{"size": ..., "xxh3_128": ...}``): a manifest
written before xxh3_128 (``sha256``) still verifies."""
DIGEST: Final = "xxh3_128"
"""What new checkpoints are hashed with. The manifest guards against damage (a truncated or partial copy, bit rot),
not forgery: whoever can rewrite a file can rewrite the manifest beside it, and the weights-only load is the guard
against code. XXH3-128 finds damage as surely as SHA-256 at many times its speed; ``Session(checkpoint_digest=
"sha256")`` keeps SHA-256."""


LATEST: Final = "latest"
"""DeepSpeed's pointer file: the tag ``load_checkpoint(path)`` loads when no tag is given."""


MANIFEST: Final = "manifest.json"


RANK_STATE: Final = "dsbuild_rank{rank}.json"


_MAX_JSON: Final = 64 * 2**20
"""A manifest or rank file larger than this is not one of ours (read nothing bigger)."""


_CHUNK: Final = 2**20


# -- the facts that decide what a checkpoint means ---------------------------------------------


@attrs.frozen
class RunFacts:
    """What must be the same for a checkpoint to mean the same thing when a run resumes it."""

    world_size: int
    zero_stage: int
    micro_batch: int
    gradient_accumulation: int
    seed: int | None = None
    data: str | None = None
    """A fingerprint of the training data (``None``: unknown, not compared)."""
    model: str | None = None
    """A fingerprint of the model's architecture (its config)."""
    lora: str | None = None
    """A fingerprint of the LoRA adapters' config, or ``None`` for full fine-tuning."""

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def changes(self, saved: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
        """``(fact, in the checkpoint, now)`` for every fact that differs (unknown ones are not compared)."""
        out = []
        for a in attrs.fields(RunFacts):
            now, then = getattr(self, a.name), saved.get(a.name)
            comparable = a.name not in ("data", "model", "seed") or (now is not None and then is not None)
            if comparable and now != then:
                out.append((a.name, then, now))
        return out


_WHAT_TO_DO: Final = {
    "world_size": (
        "a resume at another world size converts the checkpoint (DeepSpeed's universal checkpoint) when nothing but "
        "the world size and the batch split changed: keep the other facts"
    ),
    "zero_stage": (
        "use the checkpoint's ZeRO stage (DeepSpeed cannot load its states at another; its universal checkpoint of a "
        "ZeRO-3 run fails to load at ZeRO-2)"
    ),
    "micro_batch": "use the same per_device_train_batch_size (the saved data position counts micro-batches)",
    "gradient_accumulation": "use the same gradient_accumulation_steps (the saved position counts micro-batches)",
    "seed": "use the same seed (the data order and dropout follow it)",
    "data": "train on the same data, or start a new run (another output_dir, or --overwrite)",
    "model": "use the same model config",
    "lora": "use the same LoRA settings (r, alpha, target modules)",
}


def mismatch_error(tag: str, changes: list[tuple[str, Any, Any]]) -> CheckpointError:
    """The refusal of a resume whose facts changed: a side-by-side table and what to do."""
    rows = [("", "checkpoint", "this run"), *((name, _short(then), _short(now)) for name, then, now in changes)]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    table = "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
    todo = "\n".join(f"  - {_WHAT_TO_DO[name]}" for name, _, _ in changes)
    return CheckpointError(
        f"checkpoint {tag} was saved by a different run; resuming it would not continue that run:\n{table}\n{todo}"
    )


def _short(value: Any) -> str:
    text = "-" if value is None else str(value)
    return text if len(text) <= 24 else text[:21] + "..."


def fingerprint(*parts: Any) -> str:
    """A short digest of ``parts`` (``sha256:...``), the same in every process: of their ``canonical`` form, so a set's
    order (which follows the interpreter's hash seed), a mapping's order and ``16`` against ``16.0`` never change it."""
    text = json.dumps(canonical(list(parts)), sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def canonical(value: Any) -> Any:
    """``value`` as plain JSON data that two equal run settings share: mappings with string keys (sorted when
    written), sets and frozensets as sorted lists, tuples as lists, an integral float as an int (``16.0`` is ``16``),
    a non-finite float as its name, an enum as its value, a path as its text; anything else as its ``str``."""
    if isinstance(value, enum.Enum):
        return canonical(value.value)
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return repr(value)
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        return {str(canonical(k)): canonical(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        items = [canonical(v) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


# -- hashing ------------------------------------------------------------------------------------


def hasher(algorithm: str) -> Any:
    """A new ``hashlib``-style object (``update``, ``hexdigest``) for ``algorithm``, one of ``DIGESTS``."""
    if algorithm == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise CheckpointError(f"unknown checkpoint digest {algorithm!r}: expected one of {', '.join(map(repr, DIGESTS))}")


def file_digest(path: Path, algorithm: str = DIGEST) -> str:
    digest = hasher(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return str(digest.hexdigest())


def sha256_file(path: Path) -> str:
    return file_digest(path, "sha256")


def entry_digest(entry: Mapping[str, Any]) -> tuple[str, Any]:
    """``(algorithm, hex digest)`` of a manifest entry, by the first of ``DIGESTS`` it carries."""
    for algorithm in DIGESTS:
        if algorithm in entry:
            return algorithm, entry[algorithm]
    return DIGEST, None


def _hash_all(paths: Sequence[Path], algorithms: Sequence[str]) -> list[str]:
    """The digest of each file, several at once (both digests release the GIL)."""
    if len(paths) <= 1:
        return [file_digest(p, a) for p, a in zip(paths, algorithms, strict=True)]
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        return list(pool.map(file_digest, paths, algorithms))


# -- the files --------------------------------------------------------------------------------------


def read_json(path: Path) -> dict[str, Any]:
    """A small JSON object of ours (a manifest, a rank file), or ``CheckpointError`` naming the file."""
    try:
        if path.stat().st_size > _MAX_JSON:
            raise CheckpointError(f"{path}: too large for a dsbuild checkpoint file")
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a dsbuild checkpoint file")
    return data


def write_rank_state(tag_dir: Path, rank: int, state: Mapping[str, Any]) -> Path:
    return write_atomic(tag_dir / RANK_STATE.format(rank=rank), json.dumps(state) + "\n", durable=False)


def read_rank_state(tag_dir: Path, rank: int, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """This rank's state file, verified against the manifest."""
    name = RANK_STATE.format(rank=rank)
    entry = manifest.get("files", {}).get(name)
    path = tag_dir / name
    if not isinstance(entry, dict):
        raise CheckpointError(
            f"{path}: not in the manifest (was it saved by {manifest.get('run', {}).get('world_size')} processes?)"
        )
    algorithm, digest = entry_digest(entry)
    if file_digest(path, algorithm) != digest:
        raise CheckpointError(f"{path}: {_DIFFERS.format(algorithm=algorithm)}")
    return read_json(path)


def rank_files(tag_dir: Path, manifest: Mapping[str, Any], rank: int) -> list[str]:
    """The files of checkpoint ``tag_dir`` that are process ``rank``'s: its state file and the files it lists, and for
    rank 0 also the files no process lists (written around DeepSpeed's engine). Each file of the manifest is one
    rank's, so the ranks together cover the checkpoint. ``CheckpointError`` names a state file that is unreadable."""
    listed = manifest.get("ranks")
    if isinstance(listed, dict):  # the manifest says whose each file is (every node's own manifest does)
        own = [str(name) for name in listed.get(str(rank), ())] if isinstance(listed.get(str(rank)), list) else []
        if not own:
            raise CheckpointError(f"{tag_dir / MANIFEST}: holds no files of rank {rank} (saved by other processes?)")
        claimed = {str(name) for names in listed.values() if isinstance(names, list) for name in names}
    else:  # a manifest of an earlier version: the ranks' state files say
        own_state = read_rank_state(tag_dir, rank, manifest)
        own = [RANK_STATE.format(rank=rank), *own_state.get("files", {})]
        world = int(manifest.get("run", {}).get("world_size") or 1)
        claimed = set()
        if rank == 0:
            for other in range(world):
                name = RANK_STATE.format(rank=other)
                claimed |= {name, *read_json(tag_dir / name).get("files", {})}
    if own[0] != RANK_STATE.format(rank=rank):
        raise CheckpointError(f"{tag_dir / MANIFEST}: rank {rank}'s files do not start with its state file")
    if rank != min(_ranks_here(manifest, rank)):
        return own
    return [*own, *(name for name in manifest["files"] if name not in claimed)]


def _ranks_here(manifest: Mapping[str, Any], rank: int) -> list[int]:
    """The ranks whose files this manifest lists (every rank, for a folder all ranks share)."""
    listed = manifest.get("ranks")
    if isinstance(listed, dict):
        return sorted(int(r) for r in listed if str(r).isdigit()) or [rank]
    return list(range(int(manifest.get("run", {}).get("world_size") or 1)))


def verify_rank(tag_dir: Path, manifest: Mapping[str, Any], rank: int) -> list[str]:
    """Every file of ``rank``'s share of the checkpoint (``rank_files``) present, of its size and digest (their names),
    else ``CheckpointError`` naming the first that is not. What one process checks before a collective load."""
    names = rank_files(tag_dir, manifest, rank)
    unlisted = [name for name in names if name not in manifest["files"]]
    if unlisted:
        raise CheckpointError(f"{tag_dir / unlisted[0]}: not in the manifest (altered)")
    check_files(tag_dir, {"files": {name: manifest["files"][name] for name in names}}, hashes=True)
    return names


_DIFFERS: Final = "its contents differ from the manifest's {algorithm} digest (altered or damaged)"


def rank_entry(tag_dir: Path, rank: int, state: Mapping[str, Any], digest: str = DIGEST) -> dict[str, Any]:
    """What process ``rank`` tells the manifest's writer of its share, after writing its state file: that file's
    size and digest, and its files (from ``state``), so that the writer needs none of another process's files."""
    path = tag_dir / RANK_STATE.format(rank=rank)
    return {"state": {"size": path.stat().st_size, digest: file_digest(path, digest)}, "files": dict(state["files"])}


def write_manifest(
    tag_dir: Path,
    *,
    tag: str,
    step: int,
    world_size: int,
    facts: RunFacts,
    digest: str = DIGEST,
    shares: Mapping[int, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """After every rank has written: the manifest of ``tag_dir``, atomically. ``shares``: each rank's ``rank_entry``
    (gathered through the process group); the manifest lists those ranks' files, each under its rank, and the files
    here that no rank lists. Without ``shares``, every rank's state file is read from ``tag_dir`` (one folder that
    all ranks share)."""
    if shares is None:
        shares = {}
        for rank in range(world_size):
            path = tag_dir / RANK_STATE.format(rank=rank)
            state = read_json(path)
            shares[rank] = {"state": {"size": path.stat().st_size, digest: file_digest(path, digest)}, **state}
    files: dict[str, dict[str, Any]] = {}
    ranks: dict[str, list[str]] = {}
    for rank, share in sorted(shares.items()):
        name = RANK_STATE.format(rank=rank)
        files[name] = dict(share["state"])
        for file, entry in share.get("files", {}).items():
            files[file] = dict(entry)
        ranks[str(rank)] = [name, *share.get("files", {})]
    # Anything else in the folder (written by DeepSpeed around its checkpoint engine) is hashed here.
    others = [p for p in sorted(tag_dir.rglob("*")) if p.is_file() and _rel(p, tag_dir) not in files]
    others = [p for p in others if p.name != MANIFEST and not p.name.startswith(".")]
    others = [p for p in others if not _STATE_NAME.fullmatch(p.name)]  # another node's rank: not this folder's
    for path, hexdigest in zip(others, _hash_all(others, [digest] * len(others)), strict=True):
        files[_rel(path, tag_dir)] = {"size": path.stat().st_size, digest: hexdigest}
    manifest = {
        "format": FORMAT,
        "tag": tag,
        "global_step": step,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": {"dsbuild": VERSION, "deepspeed": installed("deepspeed"), "torch": installed("torch")},
        "run": facts.to_json(),
        "files": dict(sorted(files.items())),
        "ranks": ranks,
    }
    write_atomic(tag_dir / MANIFEST, json.dumps(manifest, indent=1) + "\n", durable=False)
    return manifest


_STATE_NAME: Final = re.compile(r"dsbuild_rank\d+\.json")


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def read_manifest(tag_dir: Path) -> dict[str, Any]:
    manifest = read_json(tag_dir / MANIFEST)
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{tag_dir / MANIFEST}: not a {FORMAT} manifest")
    return manifest


def check_files(tag_dir: Path, manifest: Mapping[str, Any], *, hashes: bool) -> None:
    """Every file of the manifest present with its size (and, with ``hashes``, its digest); else name the first bad."""
    entries = manifest["files"]
    paths = []
    for name, entry in entries.items():
        path = tag_dir / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            raise CheckpointError(f"{tag_dir / MANIFEST}: lists a file outside the checkpoint: {name!r}")
        if not path.is_file():
            raise CheckpointError(f"{path}: missing")
        size = path.stat().st_size
        if size != entry.get("size"):
            raise CheckpointError(f"{path}: {size} bytes, the manifest says {entry.get('size')} (truncated or altered)")
        paths.append(path)
    if hashes:
        wanted = [entry_digest(entries[_rel(path, tag_dir)]) for path in paths]
        for path, (algorithm, expected), found in zip(
            paths, wanted, _hash_all(paths, [a for a, _ in wanted]), strict=True
        ):
            if found != expected:
                raise CheckpointError(f"{path}: {_DIFFERS.format(algorithm=algorithm)}")


def expected_files(tag_dir: Path, manifest: Mapping[str, Any]) -> dict[str, tuple[int, str, str]]:
    """Absolute path -> (size, algorithm, digest) of the manifest's files, for ``VerifyingCheckpointEngine``."""
    return {
        str((tag_dir / name).resolve()): (entry["size"], *entry_digest(entry))
        for name, entry in manifest["files"].items()
    }


# -- latest, listing, pruning, choosing ------------------------------------------------------------


def write_latest(save_dir: Path, tag: str) -> None:
    """Point ``latest`` at ``tag`` atomically: a reader sees the old tag or the new one, never a torn file."""
    write_atomic(Path(save_dir) / LATEST, tag, durable=False)


def read_latest(save_dir: Path) -> str | None:
    path = Path(save_dir) / LATEST
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    return text if text and "/" not in text and len(text) < 256 else None


@attrs.frozen
class CheckpointInfo:
    """One checkpoint in a folder, as ``dsbuild checkpoints`` lists it."""

    tag: str
    step: int | None
    saved_at: str | None
    size: int
    """Bytes of its files."""
    problem: str | None
    """Why it does not verify, or ``None`` when every file matches its manifest."""
    latest: bool


def candidates(save_dir: Path) -> list[str]:
    """The tags in ``save_dir``, newest first (by the step their manifest records, then by name)."""
    found = []
    if not save_dir.is_dir():
        return []
    for child in save_dir.iterdir():
        if child.is_dir() and not child.name.startswith(".") and _holds_a_checkpoint(child):
            try:
                step = int(read_json(child / MANIFEST).get("global_step", -1))
            except (CheckpointError, TypeError, ValueError):
                step = -1
            found.append((step, child.name))
    return [tag for _, tag in sorted(found, reverse=True)]


_CHECKPOINT_FILES: Final = ("*_model_states.pt", "*_optim_states.pt", "dsbuild_rank*.json")
"""What DeepSpeed and dsbuild write into a checkpoint folder: a folder with none of them (nor a manifest) is not one."""


def _holds_a_checkpoint(folder: Path) -> bool:
    return (folder / MANIFEST).is_file() or any(next(folder.glob(p), None) for p in _CHECKPOINT_FILES)


def verify(tag_dir: Path, *, hashes: bool = True) -> dict[str, Any]:
    """The manifest of a checkpoint whose every file matches it; ``CheckpointError`` naming the first that does not."""
    if not (tag_dir / MANIFEST).is_file():
        raise CheckpointError(f"{tag_dir}: no {MANIFEST} (an interrupted save, or not written by this dsbuild)")
    manifest = read_manifest(tag_dir)
    check_files(tag_dir, manifest, hashes=hashes)
    return manifest


def list_checkpoints(save_dir: Path) -> list[CheckpointInfo]:
    """Every checkpoint in ``save_dir``, newest first, each fully verified."""
    latest = read_latest(save_dir)
    out = []
    for tag in candidates(save_dir):
        tag_dir = save_dir / tag
        size = sum(p.stat().st_size for p in tag_dir.rglob("*") if p.is_file())
        try:
            manifest = verify(tag_dir)
            step, saved, problem = manifest.get("global_step"), manifest.get("saved_at"), None
        except CheckpointError as e:
            step, saved, problem = None, None, str(e)
        out.append(CheckpointInfo(tag, step, saved, size, problem, tag == latest))
    return out


def prune(save_dir: Path, keep: int) -> list[str]:
    """Delete all but the ``keep`` newest verified checkpoints (never the one ``latest`` names); the deleted tags."""
    latest = read_latest(save_dir)
    complete = [tag for tag in candidates(save_dir) if (save_dir / tag / MANIFEST).is_file()]
    old = [tag for tag in complete[keep:] if tag != latest]
    for tag in old:
        shutil.rmtree(save_dir / tag, ignore_errors=True)
    return old


def last_complete(save_dir: Path, *, but: str | None = None) -> str | None:
    """The newest checkpoint with a manifest (other than ``but``), for messages; ``None`` when there is none."""
    return next((t for t in candidates(save_dir) if t != but and (save_dir / t / MANIFEST).is_file()), None)


def remove_failed(tag_dir: Path) -> bool:
    """Remove the folder of a save that failed (its manifest first, so it can never pass for complete)."""
    if not tag_dir.is_dir():
        return False
    (tag_dir / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(tag_dir, ignore_errors=True)
    return True


RESHAPES: Final = frozenset({"world_size", "micro_batch", "gradient_accumulation"})
"""The facts a resume may change when the world size changes: the checkpoint is converted (a universal checkpoint)
and the data position carried over as a count of samples."""


def reshapes(changes: Sequence[tuple[str, Any, Any]]) -> bool:
    """Whether a resume with these ``changes`` goes through a universal checkpoint (else it is refused)."""
    names = {name for name, _, _ in changes}
    return "world_size" in names and names <= RESHAPES


def pick(
    save_dir: Path,
    tag: str | None,
    facts: RunFacts,
    attempt: Callable[[str, dict[str, Any], list[tuple[str, Any, Any]]], None],
    *,
    agree: Callable[[str | None], str | None] = lambda problem: problem,
    tags: Sequence[str] | None = None,
    reshape: bool = False,
) -> tuple[str, dict[str, Any], list[str]]:
    """Load a checkpoint with ``attempt(tag, manifest, changes)``: ``tag``, else the newest that verifies.

    ``tags``: the checkpoints to try, newest first (default: those in ``save_dir``); ``agree``: turns one
    process's problem with a checkpoint into the decision all processes take. A run whose facts differ from the
    checkpoint's is refused (``mismatch_error``), not fallen back from, unless ``reshape`` and only the world size
    and batch split changed (``reshapes``): then ``changes`` says what ``attempt`` must convert. A damaged checkpoint
    (a file missing, truncated, altered, or refused by the weights-only loader) is skipped for the next older one,
    and said so. Returns the tag, its manifest and the notes on what was skipped.
    """
    tags = [tag] if tag is not None else (list(tags) if tags is not None else candidates(save_dir))
    if not tags:
        raise CheckpointError(f"{save_dir}: no checkpoint to resume from")
    notes: list[str] = []
    for name in tags:
        tag_dir = save_dir / name
        problem, manifest = None, {}
        try:
            manifest = verify(tag_dir, hashes=False)  # sizes now; the contents as they are loaded
        except CheckpointError as e:
            problem = str(e)
        problem = agree(problem)  # with several processes: all take the same decision (each node has its folder)
        if problem:
            notes.append(problem)
            continue
        changes = facts.changes(manifest.get("run", {}))
        if changes and not (reshape and reshapes(changes)):
            raise mismatch_error(name, changes)
        try:
            attempt(name, manifest, changes)
        except CheckpointError as e:
            notes.append(str(e))
            continue
        return name, manifest, notes
    skipped = "\n".join(f"  {note}" for note in notes)
    raise CheckpointError(f"{save_dir}: no checkpoint verifies:\n{skipped}")
