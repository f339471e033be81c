"""What a run leaves behind, read and written without torch: the run folder's layout and lock (``run_folder``), a
checkpoint's manifest (``manifest``), ``history.jsonl`` (``history``) and the loss plot (``plot``, drawn in a child
process), so ``dsbuild checkpoints`` and ``dsbuild resume`` need no training stack."""
