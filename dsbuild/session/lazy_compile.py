"""DeepSpeed's Muon kernels compiled at their first call, not at every engine start.

Every ZeRO engine imports DeepSpeed's Muon optimizer, whatever its optimizer (``is_zero_supported_optimizer``,
``DeepSpeedZeroOptimizer_Stage3.__init__``, ``BF16_Optimizer``, ZeRO-1/2's ``average_tensor``), and that module
decorates three functions with ``@compiler.compile()``, which is ``torch.compile``. Wrapping a function in
``torch.compile`` imports ``torch._dynamo`` and inductor (about 2.5 s and 110 MiB on their own, torch 2.13, CPU);
transformers' ``masking_utils`` imports ``torch._dynamo`` anyway while a model is built, and what the wrapping adds
after it is about 1 s and 30-45 MiB in each process, paid by every rank of every run that never calls Muon
(benchmarks/README.md, start-up). ``torch.compile`` compiles at a function's first call anyway;
dsbuild moves the wrapping there too: ``deepspeed.runtime.compiler.compile`` returns a decorator that wraps the
function in ``torch.compile`` (with the same arguments) when it is first called, and calls the compiled function from
then on. A Muon run compiles the same functions at the same moment; the others never import the compiler. Where
DeepSpeed's ``compiler.compile`` is not the plain ``torch.compile`` this was written against, nothing is changed.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["install"]


def _on_first_call(fn: Callable[..., Any], options: dict[str, Any]) -> Callable[..., Any]:
    """``fn``, wrapped in ``torch.compile(fn, **options)`` when it is first called."""
    import torch

    compiled: list[Callable[..., Any]] = []
    lock = threading.Lock()

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not compiled:
            with lock:
                if not compiled:
                    compiled.append(torch.compile(fn, **options))
        return compiled[0](*args, **kwargs)

    return call


def install() -> None:
    """Make DeepSpeed's ``compiler.compile()`` wrap at the first call (once per process; before Muon is imported)."""
    try:
        import torch
        from deepspeed.runtime import compiler
    except ImportError:
        return
    original = compiler.compile
    if getattr(original, "dsbuild_lazy", False) or not hasattr(torch, "compile") or original() is not torch.compile:
        return

    def compile() -> Callable[..., Any]:  # noqa: A001  # DeepSpeed's name
        def decorate(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
            if fn is None:  # compile()(mode=...) used as a decorator factory, as torch.compile allows
                return lambda f: _on_first_call(f, options)
            return _on_first_call(fn, options)

        return decorate

    compile.dsbuild_lazy = True  # type: ignore[attr-defined]
    compiler.compile = compile
