"""``Persist``: what a ``Session`` keeps of its run — checkpoints that resume exactly (verified, weights-only) and the
trained model in Hugging Face format. ``Session`` has the engine and the run's folders these use."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SessionError
from ..outputs import history, manifest
from ..outputs.run_folder import RunFolder
from . import async_save, batches, checkpoints, distributed, export, loop, weights_only
from .offload import at_home

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

__all__ = ["Persist"]


class Persist:
    """Checkpoints and export, on the engine and folders of the ``Session`` it is part of."""

    output_dir: Path | None
    position: batches.DataPosition
    keep_last: int | None
    last_saved: str | None
    hooks: loop.Hooks
    tokenizer: Any
    training: Any
    _saves: async_save.AsyncSaves | None = None
    """The asynchronous saves (``training.async_save``), made at the first."""

    @property
    def engine(self) -> DeepSpeedEngine:
        raise NotImplementedError  # the Session's

    @property
    def model(self) -> Any:
        raise NotImplementedError  # the Session's

    @property
    def history_path(self) -> Path | None:
        """``output_dir/history.jsonl``, or ``None`` without an output directory."""
        return self.output_dir / history.HISTORY if self.output_dir is not None else None

    @property
    def run_facts(self) -> manifest.RunFacts:
        raise NotImplementedError  # the Session's

    @property
    def is_main_process(self) -> bool:
        raise NotImplementedError  # the Session's

    def _checkpoint_dir(self, path: str | os.PathLike[str] | None) -> Path:
        if path is not None:
            return Path(path)
        if self.output_dir is None:
            raise SessionError("no checkpoint directory: pass a path, or output_dir= to the Session")
        return RunFolder(self.output_dir).checkpoints

    @at_home
    @distributed.quietly
    def save_checkpoint(self, path: str | os.PathLike[str] | None = None, tag: str | None = None) -> str:
        """Collective: save engine, optimizer, scheduler, data position and RNG states, verified (a manifest of
        digests, XXH3-128 by default: ``checkpoint_digest``, written last); keep the ``keep_last`` newest; the tag."""
        engine = self.engine
        tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
        position = checkpoints.position_state(engine, self.position)
        if self.training is not None and self.training.async_save:  # staged now, written in the background
            self._saves = self._saves or async_save.AsyncSaves()
            self.finish_saving(waiting=tag)
            self._saves.start(engine, self._checkpoint_dir(path), tag, position=position, facts=self.run_facts,
                              frozen_excluded=export.is_peft(self.model), keep_last=self.keep_last)  # fmt: skip
            self.last_saved = tag
            return tag
        self.finish_saving(waiting=tag)
        checkpoints.save(engine, self._checkpoint_dir(path), tag, position=position, facts=self.run_facts,
                         frozen_excluded=export.is_peft(self.model), keep_last=self.keep_last)  # fmt: skip
        self.last_saved = tag
        if self.hooks.after_save is not None:
            self.hooks.after_save(self._checkpoint_dir(path) / tag)
        return tag

    @property
    def saving(self) -> async_save.AsyncSaves | None:
        """The asynchronous saves while one is in flight (``training.async_save``), else ``None``."""
        return self._saves if self._saves is not None and self._saves.flight is not None else None

    @distributed.quietly
    def finish_saving(self, *, waiting: str | None = None) -> str | None:
        """Collective: wait for the checkpoint being written in the background (``training.async_save``) and make it
        count (its manifest written, ``latest`` moved); its tag, or ``None`` when none is in flight."""
        if self._saves is None:
            return None
        return self._saves.finish(waiting=waiting, after_save=self.hooks.after_save)

    def close(self) -> None:
        """Collective: the end of a session: a checkpoint still being written in the background is waited for and
        made to count (``finish_saving``). Call it when a loop of your own ends; ``fit`` waits at its end itself."""
        self.finish_saving()

    @at_home
    @distributed.quietly
    def load_checkpoint(self, path: str | os.PathLike[str] | None = None, tag: str | None = None) -> dict[str, Any]:
        """Collective: restore a verified checkpoint (without ``tag``, the newest that verifies; a run whose facts
        changed is refused, weights-only, into a session that has not stepped); the next ``fit``/``step`` continues it
        exactly. Returns ``tag``, ``global_step``, ``epoch``, ``batch_in_epoch``, ``micro_batches`` (where a loop of
        your own continues) and ``skipped`` (damaged checkpoints passed over); docs/session.md."""
        engine = self.engine
        self.finish_saving()  # a checkpoint still being written counts first (it may be the one to load)
        name, state, skipped = checkpoints.load(engine, self._checkpoint_dir(path), tag, facts=self.run_facts,
                                                module_strict=not export.is_peft(self.model))  # fmt: skip
        engine.micro_steps = int(state["micro_steps"])  # DeepSpeed restores global_steps, not micro_steps
        self.position = batches.DataPosition(
            int(state.get("epoch", 0)), int(state.get("batch_in_epoch", 0)), weights_only.decode_tensor(state.get("epoch_rng")),
            state.get("rollout"), int(state.get("num_tokens", 0)),
        )  # fmt: skip
        if state.get("rng") is not None:  # none for a rank the saved run did not have (another world size)
            weights_only.set_rng_state(state["rng"])
        self.last_saved = name
        if path is None and self.is_main_process and self.history_path is not None:
            history.cut_after(self.history_path, int(state["global_step"]))
        return {"tag": name, "global_step": int(state["global_step"]), "epoch": self.position.epoch,
                "batch_in_epoch": self.position.batch_in_epoch, "micro_batches": engine.micro_steps,
                "skipped": skipped}  # fmt: skip

    @at_home
    @distributed.quietly
    def save_model(self, path: str | os.PathLike[str] | None = None, merge_lora: bool = False) -> Path:
        """Collective: rank 0 writes the trained model to ``path`` in HF format (safetensors).

        Under ZeRO-3 the 16-bit weights are gathered first. A LoRA model writes its adapters (loadable with
        ``PeftModel.from_pretrained``; with their base in ``path/base`` when it was built from a config), or with
        ``merge_lora=True`` the full model with the adapters merged. The tokenizer is saved alongside when the session
        has one. Default path: ``output_dir/model``.
        """
        if path is None:
            if self.output_dir is None:
                raise SessionError("no model directory: pass a path, or output_dir= to the Session")
            path = RunFolder(self.output_dir).model
        export.save_hf(self.engine, self.model, Path(path), merge_lora=merge_lora, tokenizer=self.tokenizer)
        return Path(path)
