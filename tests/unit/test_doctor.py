"""dsbuild.env.doctor: versions, the accelerator, the ops a config needs, and the one-screen report (real packages)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from typing import Any

import pytest

from dsbuild import Config
from dsbuild.env import doctor
from dsbuild.env.doctor import Check, DoctorReport, needed_ops, render_report, report
from dsbuild.env.tested import OLDEST, TESTED
from dsbuild.env.versions import version_tuple

pytestmark = pytest.mark.procs


def _builder(class_name: str) -> Any:
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().create_op_builder(class_name)


def _compatible(class_name: str) -> bool:
    builder = _builder(class_name)
    return builder is not None and bool(doctor._compatible(builder))


@pytest.fixture(scope="module")
def plain() -> DoctorReport:
    return report()


# -- the environment ------------------------------------------------------------------


@pytest.mark.train
def test_report_lists_the_installed_versions(plain: DoctorReport) -> None:
    """Python, torch, deepspeed, transformers, peft and accelerate are reported at their installed versions."""
    import platform

    assert plain.check("python").detail.startswith(platform.python_version())
    for name in ("torch", "deepspeed", "transformers", "peft", "accelerate"):
        version = importlib.metadata.version(name)
        assert plain.versions[name] == version
        assert plain.check(name).detail.startswith(version), name
        assert plain.check(name).status == "ok", plain.check(name)


@pytest.mark.train
def test_torch_build_is_named(plain: DoctorReport) -> None:
    """The torch check says which build it is: CPU, CUDA x.y or ROCm x.y."""
    import torch

    detail = plain.check("torch").detail
    if getattr(torch.version, "hip", None):
        assert f"(ROCm {torch.version.hip} build)" in detail
    elif torch.version.cuda:
        assert f"(CUDA {torch.version.cuda} build)" in detail
    else:
        assert "(CPU build)" in detail


@pytest.mark.train
def test_accelerator_is_the_one_deepspeed_uses(plain: DoctorReport) -> None:
    """The accelerator check names DeepSpeed's accelerator and its device count; on a machine without GPU, cpu."""
    import torch
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    detail = plain.check("accelerator").detail
    count = accelerator.device_count()
    assert detail.startswith(f"{accelerator.device_name()} ({count} device")
    if not torch.cuda.is_available():
        assert detail.startswith("cpu (")


def test_jit_toolchain_is_reported(plain: DoctorReport) -> None:
    """The C++ compiler and ninja that JIT compilation needs are looked up and named."""
    check = plain.check("jit toolchain")
    compiler, ninja = doctor._toolchain()
    assert check.status == ("ok" if compiler and ninja else "warn")
    assert check.detail.startswith(f"c++: {compiler or 'missing'}, ninja: {ninja or 'missing'}")


@pytest.mark.train
def test_without_config_ops_are_informative(plain: DoctorReport) -> None:
    """Without a config, cpu_adam and async_io are reported; one that cannot work here is a warning, not a failure."""
    for op, class_name in (("cpu_adam", "CPUAdamBuilder"), ("async_io", "AsyncIOBuilder")):
        check = plain.check(f"op {op}")
        assert check.status in ("ok", "warn")
        if not _compatible(class_name):
            assert check.status == "warn" and check.fix
    assert plain.ok == all(c.status != "fail" for c in plain.checks)


@pytest.mark.train
def test_cpu_adam_compiles_here_when_a_compiler_is_present(plain: DoctorReport) -> None:
    """On this CPU machine cpu_adam is compatible and, with a compiler and ninja, ok to JIT-compile."""
    compiler, ninja = doctor._toolchain()
    if not (compiler and ninja and _compatible("CPUAdamBuilder")):
        pytest.skip("no C++ toolchain or cpu_adam not compatible here")
    check = plain.check("op cpu_adam")
    assert check.status == "ok"
    assert check.detail.startswith(("prebuilt into DeepSpeed", "not prebuilt, "))


# -- with a config ----------------------------------------------------------------------


@pytest.mark.train
def test_cpu_offload_config_needs_cpu_adam() -> None:
    """A config offloading the optimizer to CPU checks cpu_adam, saying which key needs it."""
    r = report(Config.zero(2).offload_cpu().bf16().adamw(lr=1e-4))
    check = r.check("op cpu_adam")
    assert check.detail.endswith("; needed by zero_optimization.offload_optimizer.device = cpu")
    assert check.status == ("ok" if _compatible("CPUAdamBuilder") and all(doctor._toolchain()) else "fail")
    with pytest.raises(KeyError, match="no check 'op async_io'"):
        r.check("op async_io")


@pytest.mark.train
def test_nvme_config_needs_async_io() -> None:
    """NVMe offload needs async_io; where libaio is missing that is a failure with the install command."""
    r = report(Config.zero(3).offload_nvme("/local_nvme").bf16().adamw(lr=1e-4))
    check = r.check("op async_io")
    assert check.detail.endswith("; needed by zero_optimization.offload_optimizer.device = nvme")
    assert r.check("op cpu_adam")  # the CPU optimizer runs the NVMe-offloaded step
    if _compatible("AsyncIOBuilder"):
        assert check.status == "ok"
    else:
        assert check.status == "fail"
        assert check.detail.startswith("cannot be built here")
        assert check.fix is not None and "apt-get install libaio-dev" in check.fix
        assert not r.ok


@pytest.mark.train
def test_precision_the_accelerator_lacks_fails() -> None:
    """fp16 (or bf16) on an accelerator that lacks it fails with the other precision as the fix."""
    from deepspeed.accelerator import get_accelerator

    r = report(Config.zero(1).fp16())
    check = r.check("fp16")
    if get_accelerator().is_fp16_supported():
        assert check.status == "ok"
    else:
        assert check.status == "fail" and check.fix == "use .bf16() or .fp32() instead"
        assert not r.ok


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (Config(), {}),
        (Config.zero(2), {}),
        (Config.zero(0).adamw(lr=1e-4), {"fused_adam": "optimizer.type = AdamW"}),
        (Config.zero(2).adamw(lr=1e-4, torch_adam=True), {}),
        (Config.zero(1).lamb(lr=1e-3), {"fused_lamb": "optimizer.type = Lamb"}),
        (Config.zero(2).offload_cpu(), {"cpu_adam": "zero_optimization.offload_optimizer.device = cpu"}),
        (
            Config.zero(2).offload_cpu().adagrad(lr=0.1),
            {"cpu_adagrad": "zero_optimization.offload_optimizer.device = cpu"},
        ),
        (Config.zero(3).offload_cpu().lion(lr=1e-4), {"cpu_lion": "zero_optimization.offload_optimizer.device = cpu"}),
        (
            Config.zero(3).offload_nvme("/nvme", optimizer=False).adamw(lr=1e-4),
            {"fused_adam": "optimizer.type = AdamW", "async_io": "zero_optimization.offload_param.device = nvme"},
        ),
        (
            Config.zero(3).offload_nvme("/nvme"),
            {
                "cpu_adam": "zero_optimization.offload_optimizer.device = nvme",
                "async_io": "zero_optimization.offload_optimizer.device = nvme",
            },
        ),
    ],
)
def test_needed_ops(config: Config, expected: dict[str, str]) -> None:
    """The ops a config loads: CPU optimizers for optimizer offload, fused optimizers on device, async_io for NVMe."""
    assert needed_ops(config) == expected


# -- known-bad combinations -----------------------------------------------------------


def _faked(monkeypatch: pytest.MonkeyPatch, **versions: str) -> DoctorReport:
    """``report()`` with the installed versions of ``versions`` faked where doctor reads them (package metadata)."""
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda name: versions.get(name) or real(name))
    return report()


def test_old_deepspeed_fails_with_the_upgrade(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed older than the oldest tested release is a failure naming the upgrade."""
    check = _faked(monkeypatch, deepspeed="0.15.4").check("deepspeed")
    assert check == Check(
        "deepspeed",
        "fail",
        f"0.15.4: older than {OLDEST['deepspeed']}, the oldest release dsbuild was tested with",
        f"pip install -U 'deepspeed>={OLDEST['deepspeed']}'",
    )


@pytest.mark.train
def test_old_transformers_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers older than the oldest tested release: a warning with the upgrade (the config SDK still works)."""
    r = _faked(monkeypatch, transformers="4.40.2")
    check = r.check("transformers")
    assert check.status == "warn" and check.fix == f"pip install -U 'transformers>={OLDEST['transformers']}'"
    assert r.ok


@pytest.mark.train
def test_a_release_outside_the_tested_set_is_untested_not_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peft newer than the lock's is reported as untested, with the tested release, and is no problem."""
    r = _faked(monkeypatch, peft="99.1.0")
    assert r.check("peft") == Check(
        "peft", "ok", f"99.1.0, untested (the tested set has {TESTED['peft']}; the oldest tested is {OLDEST['peft']})"
    )
    assert r.check("deepspeed").detail == f"{TESTED['deepspeed']}, tested"
    assert r.ok


def test_a_known_bad_release_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 5.24 (zero.Init in your own code breaks) is flagged with what to call before zero.Init."""
    r = _faked(monkeypatch, transformers="5.24.1")
    check = r.check("known issue: transformers 5.24.1")
    assert check.status == "warn" and "zero.Init" in check.detail
    assert check.fix is not None and "ready_for_zero_init" in check.fix
    assert "fix: call dsbuild.session.ready_for_zero_init" in render_report(r)
    assert not [c for c in _faked(monkeypatch, transformers="5.23.0").checks if c.name.startswith("known issue")]


@pytest.mark.train
def test_cpu_torch_on_a_gpu_machine_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU build of torch where an NVIDIA GPU is present: DeepSpeed would train on the CPU; say how to fix it."""
    import torch

    if torch.version.cuda or getattr(torch.version, "hip", None):
        pytest.skip("torch here is a GPU build")
    monkeypatch.setattr(doctor, "_nvidia_gpu_present", lambda: True)
    r = report()
    assert r.check("torch").status == "warn"
    assert "CUDA build of torch" in (r.check("torch").fix or "")
    assert r.check("accelerator").status == "warn"


@pytest.mark.train
def test_missing_toolchain_fails_an_op_that_must_be_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a compiler and ninja, an op that is not prebuilt cannot work: fail, with the install commands."""
    if doctor._prebuilt("cpu_adam", __import__("deepspeed.accelerator").accelerator.get_accelerator()):
        pytest.skip("cpu_adam is prebuilt here")
    if not _compatible("CPUAdamBuilder"):
        pytest.skip("cpu_adam not compatible here")
    monkeypatch.setattr(doctor, "_toolchain", lambda: (None, None))
    r = report(Config.zero(2).offload_cpu())
    assert r.check("jit toolchain").status == "warn"
    check = r.check("op cpu_adam")
    assert check.status == "fail"
    assert check.detail.startswith("not prebuilt, and a C++ compiler and ninja missing to compile it")
    assert check.fix is not None and "pip install ninja" in check.fix


@pytest.mark.parametrize(
    ("version", "expected"),
    [("0.19.8", (0, 19, 8)), ("2.13.0+cpu", (2, 13, 0)), ("4.46.0.dev0", (4, 46, 0)), ("1.0rc1", (1, 0))],
)
def test_version_tuple(version: str, expected: tuple[int, ...]) -> None:
    """Versions compare by their leading numeric parts, local and pre-release tags ignored."""
    assert version_tuple(version) == expected


# -- rendering ----------------------------------------------------------------------------


def test_render_fits_one_screen_with_fixes_under_failures() -> None:
    """One line per check, a 'fix:' line under each warn or fail, a verdict last; under 30 lines."""
    r = report(Config.zero(3).offload_nvme("/local_nvme").bf16().adamw(lr=1e-4))
    text = render_report(r)
    lines = text.splitlines()
    assert len(lines) < 30
    for c in r.checks:
        assert any(line.startswith(f"{c.status:<4}  {c.name}") for line in lines), c
    fixes = [c for c in r.checks if c.status != "ok" and c.fix]
    assert sum("fix: " in line for line in lines) == len(fixes)
    fails = sum(c.status == "fail" for c in r.checks)
    assert lines[-1].startswith(f"{fails} problem") if fails else lines[-1].startswith("ready")


def test_render_verdicts() -> None:
    """The last line says ready, ready with warnings, or how many problems there are."""
    ok = DoctorReport((Check("python", "ok", "3.11"),))
    warn = DoctorReport((Check("python", "ok", "3.11"), Check("peft", "warn", "not installed", "pip install peft")))
    fail = DoctorReport((Check("deepspeed", "fail", "not installed", "pip install deepspeed"),))
    assert render_report(ok) == "ok    python  3.11\nready"
    assert render_report(warn).splitlines()[-1] == "ready (1 warning)"
    assert render_report(fail) == (
        "fail  deepspeed  not installed\n                 fix: pip install deepspeed\n1 problem to fix"
    )
    assert ok.ok and warn.ok and not fail.ok


def test_importing_doctor_is_lazy() -> None:
    """import dsbuild.env.doctor imports neither torch nor deepspeed (report() does, when called)."""
    script = (
        "import sys, dsbuild.env.doctor\n"
        "print(sorted(m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
