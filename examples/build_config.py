"""Build a DeepSpeed config in Python, check it, and write it and every preset as JSON and TOML.

Run: python examples/build_config.py [OUT_DIR]   (default: out/)
"""

from __future__ import annotations

import sys
from pathlib import Path

import dsbuild
from dsbuild import AUTO, Config


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)

    # A ZeRO-3 run with CPU offload, bf16 and AdamW; the schedule's step counts are
    # filled from the run ("auto"), as the HF Trainer would fill them.
    cfg = (
        Config.zero(3)
        .offload_cpu()
        .bf16()
        .adamw(lr=2e-5, weight_decay=0.01)
        .warmup_decay_lr(warmup_steps=AUTO, total_steps=AUTO)
        .batch(micro=2, grad_accum=8)
        .clip_grad(1.0)
    )
    for d in cfg.validate():
        print(f"  {d.severity}: {d}")
    print(f"built   {out / 'zero3_offload_adamw.json'}")
    cfg.to_json(out / "zero3_offload_adamw.json")
    cfg.to_toml(out / "zero3_offload_adamw.toml")

    for name, description in dsbuild.presets().items():
        preset = Config.preset(name)
        # A preset is a strategy without batch sizes (a job or .batch() adds them): checked with one.
        errors = [d for d in preset.batch(micro=1).validate() if d.severity == "error"]
        status = "ok" if not errors else f"{len(errors)} error(s)"
        preset.to_json(out / f"{name}.json")
        preset.to_toml(out / f"{name}.toml")
        print(f"preset  {name:<18} {status:<6} {description}")

    # What DeepSpeed itself reads back from what we wrote.
    assert Config.load(out / "zero3_offload_adamw.json") == cfg
    print(f"wrote {len(list(out.iterdir()))} files to {out}/")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("out"))
