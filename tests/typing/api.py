"""Real usage of the public API, checked by mypy (strict) in the test suite: what users' editors and type checkers see.

Not collected by pytest (no test functions); ``tests/unit/test_tooling.py`` runs mypy over it.
"""

from __future__ import annotations

from pathlib import Path

import dsbuild
from dsbuild import AUTO, Config, ConfigError, Training
from dsbuild.validate import Diagnostic


def build() -> Config:
    cfg = (
        Config.zero(3)
        .offload_cpu()
        .bf16()
        .adamw(lr=2e-5, weight_decay=0.01)
        .warmup_decay_lr(warmup_steps=AUTO, total_steps=AUTO)
        .batch(micro=2, grad_accum=8)
        .clip_grad(1.0)
        .comm_dtype("fp32")
    )
    return cfg.zero_options(overlap_comm=True).set(steps_per_print=10)


def every_knob_is_a_keyword() -> Config:
    # 1e9 for an integer knob is read as the integer; sections take a table.
    cfg = Config.zero(3).zero_options(
        stage3_max_live_parameters=1e9, offload_optimizer={"device": "cpu"}, zero_quantized_weights=True
    )
    return cfg.fp16(loss_scale=0, initial_scale_power=16).warmup_lr(warmup_steps=100, max_lr=1e-3)


def misspellings_and_wrong_types_are_flagged() -> None:
    # Each line is an error mypy reports (strict mode flags an ignore that is not needed, so these stay checked).
    Config.zero_options(overlap_com=True)  # type: ignore[arg-type]
    Config.zero_options(overlap_comm="yes")  # type: ignore[arg-type]
    Config.fp16(loss_scal=0)  # type: ignore[arg-type]


def round_trip(cfg: Config, out: Path) -> Config:
    d: dict[str, object] = cfg.to_dict()
    assert Config.from_dict(d) == cfg
    cfg.to_json(out / "ds_config.json")
    cfg.to_toml(out / "mine.toml")
    loaded: Config = Config.load(out / "mine.toml")
    return loaded


def presets() -> Config:
    names: dict[str, str] = dsbuild.presets()
    assert "zero3" in names
    return Config.preset("zero3_offload")


def check_and_resolve(cfg: Config) -> Config:
    found: list[Diagnostic] = cfg.validate(world_size=8)
    for d in found:
        print(d.path, d.severity, d.message, d.hint)
    try:
        cfg.check(target="hf")
    except ConfigError as e:
        for problem in e.problems:
            print(problem.path, problem.message)
    resolved: Config = cfg.resolve(
        world_size=8, training=Training(learning_rate=2e-5, bf16=True), hidden_size=4096, total_steps=1000
    )
    for line in resolved.explain():
        print(line.path, line.value, line.origin)
    return resolved


def hashable(cfg: Config) -> dict[Config, str]:
    return {cfg: "seen"}
