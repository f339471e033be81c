"""One rank of a multi-process Session run, started by the tests under torchrun.

    python -m torch.distributed.run --nproc_per_node 2 --master_port PORT \
        tests/integration/_session_worker.py OUT_DIR

ZeRO-3 from an HF-style "auto" preset: the batch sizes come from the real world
size. Trains a few optimizer steps, evaluates (and an odd evaluation set one sample at a time), saves a checkpoint
and the model,
and rank 0 writes ``OUT_DIR/result.json`` for the test to read.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from _session_common import TokenData, tiny_llama

from dsbuild import Config
from dsbuild.resolve.training import Training
from dsbuild.session import Session


def main(out: Path) -> None:
    training = Training(
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        learning_rate=1e-2,
        max_steps=3,
        warmup_steps=1,
        seed=3,
        logging_steps=1,
    )
    s = Session.from_pretrained(tiny_llama(), Config.preset("hf_zero3"), training=training, output_dir=out)
    history = s.fit(TokenData(24), eval_data=TokenData(4, seed=9))
    # 5 samples one at a time on 2 processes: the last round's second is a filler, which the HF Trainer's evaluation
    # (gather_for_metrics) leaves out: the mean is each sample's loss once.
    odd = TokenData(5, seed=13)
    whole = s.evaluate(odd, batch_size=1)
    singles = [s.evaluate([odd[i]], batch_size=1)["eval_loss"] for i in range(len(odd))]
    s.save_checkpoint()
    s.save_model(out / "model")
    if s.is_main_process:
        result = {
            "world_size": s.world_size,
            "rank": s.rank,
            "history": history,
            "train_batch_size": s.engine.train_batch_size(),
            "global_step": s.global_step,
            "rendezvous": f"{os.environ['MASTER_ADDR']}_{os.environ['MASTER_PORT']}",
            "odd": whole,
            "singles": singles,
        }
        (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    from dsbuild.session import distributed

    distributed.close_gloo()  # before the interpreter's finalization, where gloo can abort ("terminate called ...")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # and no finalization at all, as the other workers: the result is written; an abort would fail the test
