"""Checkpoint manifests hash with XXH3-128 (damage, not forgery, is the threat), keep SHA-256 as an option, and a
manifest of SHA-256 digests from an earlier version still verifies; a changed byte is named either way."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import xxhash

from dsbuild import manifest
from dsbuild.errors import CheckpointError

FACTS = manifest.RunFacts(world_size=1, zero_stage=2, micro_batch=2, gradient_accumulation=1)


def checkpoint(tmp_path: Path, digest: str) -> Path:
    """A tag folder as a 1-process save leaves it: DeepSpeed's file, the rank file, then the manifest."""
    tag_dir = tmp_path / "global_step1"
    tag_dir.mkdir()
    (tag_dir / "mp_rank_00_model_states.pt").write_bytes(b"weights" * 1000)
    manifest.write_rank_state(tag_dir, 0, {"rank": 0, "files": {}})
    manifest.write_manifest(tag_dir, tag="global_step1", step=1, world_size=1, facts=FACTS, digest=digest)
    return tag_dir


def test_new_manifests_carry_xxh3_128() -> None:
    """The default digest is XXH3-128, and it is what xxhash computes."""
    assert manifest.DIGEST == "xxh3_128"


@pytest.mark.parametrize("digest", ["xxh3_128", "sha256"])
def test_either_digest_verifies_and_names_a_changed_byte(tmp_path: Path, digest: str) -> None:
    """A checkpoint hashed with either digest verifies; one flipped byte is named with the digest that caught it."""
    tag_dir = checkpoint(tmp_path, digest)
    found = manifest.verify(tag_dir)
    entry = found["files"]["mp_rank_00_model_states.pt"]
    data = (tag_dir / "mp_rank_00_model_states.pt").read_bytes()
    expected = xxhash.xxh3_128(data).hexdigest() if digest == "xxh3_128" else hashlib.sha256(data).hexdigest()
    assert entry == {"size": len(data), digest: expected}
    (tag_dir / "mp_rank_00_model_states.pt").write_bytes(b"X" + data[1:])
    with pytest.raises(CheckpointError) as info:
        manifest.verify(tag_dir)
    assert str(info.value).endswith(f"its contents differ from the manifest's {digest} digest (altered or damaged)")


def test_a_sha256_manifest_of_an_earlier_version_still_verifies(tmp_path: Path) -> None:
    """Entries written as {"size", "sha256"} (dsbuild 0.1) are checked with SHA-256."""
    tag_dir = checkpoint(tmp_path, "sha256")
    written = json.loads((tag_dir / manifest.MANIFEST).read_text())
    assert all(set(entry) == {"size", "sha256"} for entry in written["files"].values())
    assert manifest.verify(tag_dir)["tag"] == "global_step1"


def test_an_unknown_digest_is_refused() -> None:
    """A digest name dsbuild does not know is an error naming the ones it does."""
    with pytest.raises(CheckpointError, match="'xxh3_128', 'sha256'"):
        manifest.hasher("md5")
