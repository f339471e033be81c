"""Resolving ``"auto"`` as the HF Trainer would: the one fill table (``hf_table``), DeepSpeed's batch triangle
(``batch``), the HF training arguments (``training``), resolution with provenance (``resolution``), where each value
came from (``explain``), and the config of an engine without an optimizer made from a training one (``inference``)."""
