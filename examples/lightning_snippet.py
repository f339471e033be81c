"""Lightning: hand a dsbuild config to ``DeepSpeedStrategy``.

Run: python examples/lightning_snippet.py [--world-size 8]

Lightning takes the ds_config as a dict (``DeepSpeedStrategy(config=...)``) and,
unlike the HF Trainer, fills no ``"auto"`` values: resolve them with dsbuild
first, from the same training arguments your LightningModule uses. The config
part runs anywhere; the Lightning part needs ``pip install lightning`` (and a
GPU to train: Lightning's DeepSpeed strategy runs on CUDA devices).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from dsbuild import AUTO, Config, Training


def lightning_config(world_size: int) -> dict[str, Any]:
    """The ds_config for Lightning: ZeRO-2, bf16, AdamW with warmup + decay, every value resolved and checked."""
    training = Training(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        learning_rate=2e-5,
        weight_decay=0.01,
        warmup_steps=100,
        max_steps=2_000,
        bf16=True,
    )
    cfg = (
        Config.zero(2)
        .bf16(enabled=AUTO)
        .adamw(lr=AUTO, weight_decay=AUTO)
        .warmup_decay_lr(min_lr=AUTO, max_lr=AUTO, warmup_steps=AUTO, total_steps=AUTO)
        .batch(micro=AUTO, grad_accum=AUTO)
        .clip_grad(1.0)
    )
    resolved = cfg.resolve(world_size=world_size, training=training)
    resolved.check(world_size=world_size, resolved=True)
    return resolved.to_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=8, help="GPUs in the run")
    args = parser.parse_args()
    config = lightning_config(args.world_size)
    print(json.dumps(config, indent=2))

    try:
        import lightning as L
        from lightning.pytorch.strategies import DeepSpeedStrategy
    except ImportError:
        print("Lightning is not installed (pip install lightning): the config above is what DeepSpeedStrategy takes.")
        return

    strategy = DeepSpeedStrategy(config=config)
    # The optimizer and schedule come from the config: DeepSpeed builds them, so the
    # LightningModule's configure_optimizers may return nothing.
    trainer = L.Trainer(
        accelerator="gpu", devices=args.world_size, strategy=strategy, precision="bf16-mixed", max_steps=2_000
    )
    print(f"ready: {type(trainer.strategy).__name__} with ZeRO stage {config['zero_optimization']['stage']}")
    # trainer.fit(MyLightningModule(), train_dataloaders=...)   # on a machine with the GPUs


if __name__ == "__main__":
    main()
