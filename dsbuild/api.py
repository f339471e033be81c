"""``Config``: the ds_config as one frozen object: its fields, the builder, and everything you do with it.

The façade over the layers below: ``ConfigBase`` (``dsbuild.config``) holds the
data and the builder verbs; this class adds the methods that convert, read and
write files, load presets, validate and resolve, each delegating to its module.
Those modules work on ``ConfigBase`` and never import this one, so the package's
imports run one way (see DESIGN.md). They are imported when first used, which
keeps ``import dsbuild`` + building a config a small fraction of ``import deepspeed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .config.builder import ConfigBase

if TYPE_CHECKING:
    from pathlib import Path

    from .resolve.explain import Explanation
    from .resolve.training import Training
    from .validate import Diagnostic

__all__ = ["Config"]


class Config(ConfigBase):
    """A DeepSpeed config (the ds_config dict), typed; ``None`` fields are unset and not written.

    Attributes are the ds_config keys, except the three whose key is also a
    builder verb: ``fp16_config``, ``bf16_config`` and ``optimizer_config`` hold
    the ``fp16``, ``bf16`` and ``optimizer`` sections (the constructor takes
    ``fp16=``, ``bf16=``, ``optimizer=``). Every builder verb returns a new
    ``Config``; ``Config.zero(3)`` is ``Config().zero(3)``.
    """

    __slots__ = ()  # frozen and slotted like every section (ConfigFields is the attrs class)

    # -- the ds_config dict --------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The ds_config dict: DeepSpeed's exact keys, only what is set, ``AUTO`` as ``"auto"``."""
        from .io.convert import to_dict

        return to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, strict: bool = True) -> Config:
        """Read a ds_config dict (aliases and legacy keys too); ``strict=False`` keeps going past unknown keys."""
        from .io.convert import from_dict

        return from_dict(data, strict=strict, cls=cls)

    # -- files and presets ---------------------------------------------------

    def to_json(self, path: str | Path) -> Path:
        """Write the ds_config as JSON (atomically)."""
        from .io.config_files import write_json

        return write_json(self, path)

    def to_toml(self, path: str | Path) -> Path:
        """Write the ds_config as TOML (atomically)."""
        from .io.config_files import write_toml

        return write_toml(self, path)

    @classmethod
    def from_json(cls, path: str | Path, *, strict: bool = True) -> Config:
        """Read a JSON ds_config file."""
        from .io.config_files import read_json

        return read_json(path, strict=strict, cls=cls)

    @classmethod
    def from_toml(cls, path: str | Path, *, strict: bool = True) -> Config:
        """Read a TOML config file (``extends`` and ``description`` understood)."""
        from .io.config_files import read_toml

        return read_toml(path, strict=strict, cls=cls)

    @classmethod
    def load(cls, path: str | Path, *, strict: bool = True) -> Config:
        """Read a config file by its suffix: ``.json``, ``.toml``, ``.yaml``/``.yml``."""
        from .io.config_files import load

        return load(path, strict=strict, cls=cls)

    @classmethod
    def preset(cls, name: str) -> Config:
        """A packaged preset by name, e.g. ``Config.preset("zero3_offload")``."""
        from .io.config_files import read_preset

        return read_preset(name, cls=cls)

    # -- checking and resolving ----------------------------------------------

    def validate(
        self, *, world_size: int | None = None, target: str = "auto", resolved: bool = False
    ) -> list[Diagnostic]:
        """Every problem found, as diagnostics (errors first, then warnings) with dotted key paths.

        ``target="hf"`` for a config handed to the HF Trainer / Accelerate (they fill its ``"auto"``),
        ``"deepspeed"`` for one handed to DeepSpeed as it is; ``"auto"`` (the default) judges a config holding
        ``"auto"`` for the HF Trainer and any other for DeepSpeed. ``resolved=True`` makes any ``"auto"`` left an
        error.
        """
        from .validate import validate

        return validate(self, world_size=world_size, target=target, resolved=resolved)

    def check(self, *, world_size: int | None = None, target: str = "auto", resolved: bool = False) -> Config:
        """Raise one ``ConfigError`` listing every error; return the config when there is none."""
        from .validate import check

        check(self, world_size=world_size, target=target, resolved=resolved)
        return self

    def resolve(
        self,
        *,
        world_size: int = 1,
        training: Training | Any | None = None,
        model: Any | None = None,
        hidden_size: int | None = None,
        total_steps: int | None = None,
    ) -> Config:
        """Fill every ``AUTO`` as the HF Trainer would, apply the batch triangle, and check for conflicts."""
        from .resolve.resolution import resolve

        return resolve(
            self,
            world_size=world_size,
            training=training,
            model=model,
            hidden_size=hidden_size,
            total_steps=total_steps,
        )

    def explain(self) -> list[Explanation]:
        """Each key's value and where it came from (after ``resolve``)."""
        from .resolve.explain import explain

        return explain(self)

    def for_inference(
        self, offload: bool = False, *, hidden_size: int | None = None, stage: int | None = None
    ) -> Config:
        """The config of a DeepSpeed engine without an optimizer (an RL reference, reward or EMA model) made from this
        training config, for ``deepspeed.initialize(model=..., config=...)``.

        - ZeRO stage 3 stays 3; stages 1 and 2 become 0: DeepSpeed asserts ``"zero stage {} requires an optimizer"``;
          ``stage`` (0 or 3) gives the engine its own (a reward model whole on each process, or partitioned).
        - ``offload=True`` sets ``zero_optimization.offload_param`` to ``{device: cpu, pin_memory: true}``; below
          stage 3 it raises ``InvalidValueError`` (DeepSpeed ignores it there).
        - ``hidden_size`` (the inference model's ``config.hidden_size``) fills the ``"auto"`` ZeRO buckets as the
          HF Trainer would; without it they stay for ``resolve(model=...)``.
        - ``optimizer``, ``scheduler``, ``zero_optimization.offload_optimizer`` and the other keys only an optimizer
          step reads are removed; DeepCompile is turned off.
        - the precision, the batch sizes, AutoTP (``tensor_parallel``) and ``gradient_clipping`` are kept.

        The keys it writes say so in ``explain()``; ``dsbuild.resolve.inference`` holds the rule and each reason.
        """
        from .resolve.inference import for_inference

        return for_inference(self, offload, hidden_size=hidden_size, stage=stage)
