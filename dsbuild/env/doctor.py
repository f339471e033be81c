"""``dsbuild doctor``: is this environment ready to train, and for this config?

``report()`` looks at the installed packages, the accelerator DeepSpeed picks
and the C++/CUDA ops a config needs (prebuilt, or compilable here just in
time), and returns checks with a status and, when something is wrong, the
fix. torch and DeepSpeed are imported inside ``report()`` only; importing this
module stays instant.
"""

from __future__ import annotations

import contextlib
import io
import os
import platform
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import attrs

from ..config import AUTO, ConfigFields
from .build_locks import extensions_root, stale_locks
from .tested import OLDEST, STACK, TESTED, known_bad, release_verdict
from .versions import installed

__all__ = ["Check", "DoctorReport", "needed_ops", "render_report", "report"]

Status = Literal["ok", "warn", "fail"]

_PURPOSE = {
    "deepspeed": "the engine",
    "transformers": "HF models and Trainer-style resolution",
    "peft": "LoRA",
    "datasets": "a job's data",
    "accelerate": "the HF Trainer",
}

# op name -> DeepSpeed op builder class name
_BUILDERS = {
    "cpu_adam": "CPUAdamBuilder",
    "cpu_adagrad": "CPUAdagradBuilder",
    "cpu_lion": "CPULionBuilder",
    "async_io": "AsyncIOBuilder",
    "fused_adam": "FusedAdamBuilder",
    "fused_lamb": "FusedLambBuilder",
    "fused_lion": "FusedLionBuilder",
    "shm_comm": "ShareMemCommBuilder",
}

_NOT_COMPATIBLE_FIX = {
    "async_io": "apt-get install libaio-dev (yum install libaio-devel), then run again: DeepSpeed compiles "
    "async_io on first use",
    "cpu_adam": "CPU Adam needs a C++ compiler (and, for a CUDA accelerator, the CUDA toolkit matching torch's build)",
}


@attrs.frozen
class Check:
    """One thing looked at, with what was found and, unless it is ok, what to do."""

    name: str
    """What was checked: ``torch``, ``accelerator``, ``op cpu_adam``, ..."""
    status: Status
    """``"ok"``, ``"warn"`` (works, but not as you may expect) or ``"fail"`` (will not work)."""
    detail: str
    """What was found, e.g. ``2.13.0+cpu (CPU build)``."""
    fix: str | None = None
    """What to do about a warn or fail."""


@attrs.frozen
class DoctorReport:
    """Every check, in order: environment, accelerator, ops, and the config's needs."""

    checks: tuple[Check, ...]
    """The checks."""
    versions: dict[str, str | None] = attrs.field(factory=dict)
    """Installed version of each package looked at (``None``: not installed)."""

    @property
    def ok(self) -> bool:
        """No check failed (warnings allowed)."""
        return all(c.status != "fail" for c in self.checks)

    def check(self, name: str) -> Check:
        """The check called ``name``."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r}; checks: {', '.join(c.name for c in self.checks)}")


def report(config: ConfigFields | None = None) -> DoctorReport:
    """Check the environment (and, given a config, what it needs); imports torch and DeepSpeed here."""
    checks: list[Check] = []
    versions: dict[str, str | None] = {name: _version(name) for name in ("dsbuild", *STACK)}
    checks.append(Check("python", "ok", f"{platform.python_version()} ({sys.executable})"))
    checks.append(Check("dsbuild", "ok", versions["dsbuild"] or "not installed (running from a checkout)"))

    torch = _import("torch")
    checks.append(_torch_check(torch, versions["torch"]))
    for name in STACK[1:]:
        checks.append(_package_check(name, versions[name], required=name == "deepspeed"))
    for row in known_bad(versions):
        checks.append(Check(f"known issue: {row.package} {versions[row.package]}", row.severity, row.what, row.fix))

    accelerator = None
    if torch is not None and versions["deepspeed"] is not None:
        accelerator, check = _accelerator_check()
        checks.append(check)
    checks.append(_toolchain_check())
    checks.append(_build_locks_check())

    if accelerator is not None:
        wanted = needed_ops(config) if config is not None else {"cpu_adam": "", "async_io": ""}
        if _safe(accelerator.device_name, "") == "cpu":  # DeepSpeed's CPU accelerator: its collectives use it
            wanted["shm_comm"] = "every run on the cpu accelerator (DeepSpeed's communication backend loads it)"
        for op, why in wanted.items():
            checks.append(_op_check(accelerator, op, why, required=config is not None))
        if config is not None:
            checks.extend(_precision_checks(accelerator, config))
    return DoctorReport(tuple(checks), versions)


def _build_locks_check() -> Check:
    """Op builds killed mid-compile leave their lock: DeepSpeed then waits for it forever, silently."""
    stale = stale_locks()
    if not stale:
        return Check("op build locks", "ok", f"none left over in {extensions_root()}")
    paths = " ".join(str(p) for p in stale)
    return Check(
        "op build locks",
        "fail",
        f"left by a build that is no longer running: {paths}",
        f"rm {paths} (DeepSpeed would wait for it forever)",
    )


# -- packages ---------------------------------------------------------------------


def _version(distribution: str) -> str | None:
    return installed(distribution)


def _import(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError:
        return None


def _too_old(name: str, version: str) -> str:
    return f"{version}: older than {OLDEST[name]}, the oldest release dsbuild was tested with"


def _against_tested(name: str, detail: str) -> str:
    """``detail`` with where the installed release stands against the tested set."""
    version = detail.split(" ", 1)[0]
    if release_verdict(name, version) == "tested":
        return f"{detail}, tested"
    return f"{detail}, untested (the tested set has {TESTED[name]}; the oldest tested is {OLDEST[name]})"


def _package_check(name: str, version: str | None, *, required: bool) -> Check:
    minimum = OLDEST[name]
    install = f"pip install '{name}>={minimum}'"
    if version is None:
        if required:
            return Check(name, "fail", "not installed", install)
        return Check(name, "warn", f"not installed (needed for {_PURPOSE[name]})", install)
    if release_verdict(name, version) == "too old":
        return Check(
            name, "fail" if required else "warn", _too_old(name, version), f"pip install -U '{name}>={minimum}'"
        )
    return Check(name, "ok", _against_tested(name, version))


def _nvidia_gpu_present() -> bool:
    """An NVIDIA driver is loaded here (whether or not torch can use it)."""
    return Path("/proc/driver/nvidia/gpus").is_dir() or Path("/dev/nvidia0").exists()


def _torch_check(torch: Any, version: str | None) -> Check:
    if torch is None or version is None:
        return Check("torch", "fail", "not installed", "pip install torch (the CUDA build for NVIDIA GPUs)")
    cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
    build = f"ROCm {hip} build" if hip else f"CUDA {cuda} build" if cuda else "CPU build"
    detail = f"{version} ({build})"
    if release_verdict("torch", version) == "too old":
        return Check(
            "torch", "fail", f"{_too_old('torch', version)} ({build})", f"pip install -U 'torch>={OLDEST['torch']}'"
        )
    if not cuda and not hip and _nvidia_gpu_present():
        return Check(
            "torch",
            "warn",
            f"{detail}, but this machine has an NVIDIA GPU: DeepSpeed will train on the CPU",
            "install a CUDA build of torch, e.g. pip install torch --index-url https://download.pytorch.org/whl/cu126",
        )
    if cuda and _nvidia_gpu_present() and not _safe(torch.cuda.is_available, False):
        return Check(
            "torch",
            "warn",
            f"{detail}, but torch cannot use the NVIDIA GPU here",
            "update the NVIDIA driver to one that supports CUDA "
            + str(cuda)
            + ", or install a torch build for your driver",
        )
    return Check("torch", "ok", _against_tested("torch", detail))


def _safe(fn: Callable[[], Any], default: Any) -> Any:
    try:
        return fn()
    except Exception:
        return default


# -- accelerator and ops ------------------------------------------------------------


def _accelerator_check() -> tuple[Any, Check]:
    try:
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        name = accelerator.device_name()
        count = _safe(accelerator.device_count, 0)
    except Exception as err:  # DeepSpeed's accelerator detection itself failed: report it, don't crash
        return None, Check(
            "accelerator", "fail", f"DeepSpeed cannot pick an accelerator: {err}", "run ds_report for details"
        )
    chosen = f"DS_ACCELERATOR={os.environ['DS_ACCELERATOR']}" if os.environ.get("DS_ACCELERATOR") else "detected"
    detail = f"{name} ({count} device{'s' if count != 1 else ''}, {chosen})"
    if name == "cpu" and _nvidia_gpu_present():
        return accelerator, Check(
            "accelerator",
            "warn",
            f"{detail}, but this machine has an NVIDIA GPU",
            "install a CUDA build of torch, and unset DS_ACCELERATOR=cpu if it is set",
        )
    return accelerator, Check("accelerator", "ok", detail)


def _toolchain() -> tuple[str | None, str | None]:
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++") or shutil.which("clang++")
    ninja = shutil.which("ninja")
    if ninja is None:
        with contextlib.suppress(ImportError):
            import ninja as ninja_package  # the PyPI wheel ships the binary

            ninja = str(Path(ninja_package.BIN_DIR) / "ninja")
    return compiler, ninja


def _toolchain_check() -> Check:
    compiler, ninja = _toolchain()
    missing = [what for what, found in (("a C++ compiler", compiler), ("ninja", ninja)) if found is None]
    detail = f"c++: {compiler or 'missing'}, ninja: {ninja or 'missing'}"
    if missing:
        fix = " and ".join(
            {"a C++ compiler": "apt-get install g++ (or build-essential)", "ninja": "pip install ninja"}[m]
            for m in missing
        )
        return Check("jit toolchain", "warn", f"{detail}: ops that are not prebuilt cannot be compiled", fix)
    return Check("jit toolchain", "ok", f"{detail} (ops not prebuilt are compiled on first use)")


def needed_ops(config: ConfigFields) -> dict[str, str]:
    """The DeepSpeed ops ``config`` will load, each with why (the dotted key that asks for it)."""
    ops: dict[str, str] = {}
    zero = config.zero_optimization
    stage = zero.stage if zero is not None and isinstance(zero.stage, int) else 0
    opt_device = _device(zero.offload_optimizer if zero is not None else None) if stage >= 1 else "none"
    param_device = _device(zero.offload_param if zero is not None else None) if stage == 3 else "none"
    optimizer = config.optimizer_config
    kind = str(optimizer.type).lower() if optimizer is not None and optimizer.type is not None else None
    params: Any = getattr(optimizer, "params", None)
    torch_adam = bool(
        getattr(params, "torch_adam", False) if not isinstance(params, dict) else params.get("torch_adam")
    )

    if opt_device in ("cpu", "nvme"):
        why = f"zero_optimization.offload_optimizer.device = {opt_device}"
        op = {"adagrad": "cpu_adagrad", "lion": "cpu_lion"}.get(kind or "", "cpu_adam")
        if kind in (None, "adam", "adamw", "adagrad", "lion"):
            ops[op] = why
    elif kind in ("adam", "adamw") and not torch_adam:
        ops["fused_adam"] = f"optimizer.type = {optimizer.type if optimizer else kind}"
    elif kind == "lamb":
        ops["fused_lamb"] = "optimizer.type = Lamb"
    elif kind == "lion":
        ops["fused_lion"] = "optimizer.type = Lion"
    if "nvme" in (opt_device, param_device):
        key = "offload_optimizer" if opt_device == "nvme" else "offload_param"
        ops["async_io"] = f"zero_optimization.{key}.device = nvme"
    return ops


def _device(section: Any) -> str:
    device = getattr(section, "device", None)
    return "none" if device is None or device is AUTO else str(device)


def _op_check(accelerator: Any, op: str, why: str, *, required: bool) -> Check:
    name = f"op {op}"
    needed = f"; needed by {why}" if why else ""
    bad: Status = "fail" if required else "warn"
    builder = _safe(lambda: accelerator.create_op_builder(_BUILDERS[op]), None)
    accel_name = _safe(accelerator.device_name, "this")
    if builder is None or getattr(builder, "name", None) == "deepspeed_not_implemented":
        return Check(name, bad, f"not available on the {accel_name} accelerator{needed}", _unavailable_fix(op))
    if _prebuilt(op, accelerator):
        return Check(name, "ok", f"prebuilt into DeepSpeed{needed}")
    compatible = _compatible(builder)
    if not compatible:
        fix = _NOT_COMPATIBLE_FIX.get(op, "run ds_report to see what the op is missing")
        return Check(name, bad, f"cannot be built here{needed}", fix)
    compiler, ninja = _toolchain()
    if compiler is None or ninja is None:
        missing = " and ".join(w for w, f in (("a C++ compiler", compiler), ("ninja", ninja)) if f is None)
        return Check(
            name,
            bad,
            f"not prebuilt, and {missing} missing to compile it{needed}",
            "apt-get install g++ and pip install ninja, or reinstall DeepSpeed with DS_BUILD_OPS=1",
        )
    when = (
        "a cached build is reused"
        if _cached_build(builder.name)
        else "compiles on first use (one to a few minutes, once per machine)"
    )
    return Check(name, "ok", f"not prebuilt, {when}{needed}")


def _unavailable_fix(op: str) -> str:
    if op in ("fused_lamb", "fused_lion"):
        return "use AdamW, or train on a CUDA/ROCm accelerator"
    return "DeepSpeed has no such op for this accelerator: drop the option that needs it"


def _prebuilt(op: str, accelerator: Any) -> bool:
    try:
        from deepspeed.git_version_info import accelerator_name, installed_ops
    except ImportError:
        return False
    return bool(installed_ops.get(op, False)) and accelerator_name == getattr(accelerator, "_name", None)


def _compatible(builder: Any) -> bool:
    """``builder.is_compatible()``, with what it prints kept off the screen."""
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            return bool(builder.is_compatible(False))
    except Exception:
        return False


def _cached_build(name: str) -> bool:
    """A JIT build of op ``name`` already sits in torch's extensions directory."""
    try:
        import torch
        from torch.utils.cpp_extension import get_default_build_root
    except ImportError:
        return False
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        hip, cuda = getattr(torch.version, "hip", None), torch.version.cuda
        accel = f"rocm{hip.replace('.', '')}" if hip else f"cu{cuda.replace('.', '')}" if cuda else "cpu"
        folder = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}_{accel}"
        root = os.path.join(get_default_build_root(), folder)
    return (Path(root) / name / f"{name}.so").is_file()


def _precision_checks(accelerator: Any, config: ConfigFields) -> list[Check]:
    checks: list[Check] = []
    name = _safe(accelerator.device_name, "this")
    for key, section, probe in (
        ("bf16", config.bf16_config, "is_bf16_supported"),
        ("fp16", config.fp16_config, "is_fp16_supported"),
    ):
        if section is None or section.enabled is not True:
            continue
        if _safe(getattr(accelerator, probe), False):
            checks.append(Check(key, "ok", f"supported by the {name} accelerator; needed by {key}.enabled"))
        else:
            other = "bf16" if key == "fp16" else "fp16"
            checks.append(
                Check(
                    key,
                    "fail",
                    f"the {name} accelerator does not support {key}: DeepSpeed stops at initialize",
                    f"use .{other}() or .fp32() instead",
                )
            )
    return checks


# -- rendering --------------------------------------------------------------------


def render_report(report: DoctorReport) -> str:
    """One screen: a line per check, the fix under each warn and fail, a verdict at the end."""
    width = max((len(c.name) for c in report.checks), default=0)
    lines: list[str] = []
    for c in report.checks:
        lines.append(f"{c.status:<4}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status != "ok":
            lines.append(f"{'':<4}  {'':<{width}}  fix: {c.fix}")
    fails = sum(c.status == "fail" for c in report.checks)
    warns = sum(c.status == "warn" for c in report.checks)
    if fails:
        verdict = f"{fails} problem{'s' if fails != 1 else ''} to fix" + (
            f", {warns} warning{'s' if warns != 1 else ''}" if warns else ""
        )
    else:
        verdict = "ready" + (f" ({warns} warning{'s' if warns != 1 else ''})" if warns else "")
    lines.append(verdict)
    return "\n".join(lines)
