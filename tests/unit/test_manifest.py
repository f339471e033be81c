"""Checkpoint manifests hash with XXH3-128 (damage, not forgery, is the threat), keep SHA-256 as an option, and a
manifest of SHA-256 digests from an earlier version still verifies; a changed byte is named either way."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import xxhash

from dsbuild.errors import CheckpointError
from dsbuild.outputs import manifest

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


def test_each_rank_checks_its_own_share_and_the_shares_cover_the_checkpoint(tmp_path: Path) -> None:
    """A 2-process checkpoint: rank 1's share is its state and shards, rank 0's its own plus the files no rank lists;
    together every file of the manifest; a flipped byte in rank 1's shard fails rank 1's check, not rank 0's."""
    tag_dir = tmp_path / "global_step2"
    tag_dir.mkdir()
    facts = manifest.RunFacts(world_size=2, zero_stage=3, micro_batch=2, gradient_accumulation=1)
    for rank in (0, 1):
        shard = f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        (tag_dir / shard).write_bytes(bytes([rank]) * 4096)
        entry = {"size": 4096, "xxh3_128": manifest.file_digest(tag_dir / shard)}
        manifest.write_rank_state(tag_dir, rank, {"rank": rank, "files": {shard: entry}})
    (tag_dir / "zero_to_fp32_meta.json").write_text("{}")  # written around DeepSpeed's engine: nobody lists it
    found = manifest.write_manifest(tag_dir, tag="global_step2", step=2, world_size=2, facts=facts)

    shares = [manifest.rank_files(tag_dir, found, rank) for rank in (0, 1)]
    assert shares[1] == ["dsbuild_rank1.json", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert sorted(shares[0] + shares[1]) == sorted(found["files"])
    for rank in (0, 1):
        manifest.verify_rank(tag_dir, found, rank)

    shard = tag_dir / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    data = bytearray(shard.read_bytes())
    data[2048] ^= 0xFF
    shard.write_bytes(bytes(data))
    manifest.verify_rank(tag_dir, found, 0)
    with pytest.raises(CheckpointError, match=r"zero_pp_rank_1_mp_rank_00_optim_states\.pt: its contents differ"):
        manifest.verify_rank(tag_dir, found, 1)
