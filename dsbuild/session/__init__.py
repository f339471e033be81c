"""``Session``: runs DeepSpeed for you, or inside your own loop.

Importing this package imports torch (and, when used, deepspeed, transformers
and peft); ``import dsbuild`` does not import it until ``dsbuild.Session`` is used.
"""

from .session import Session, SessionError, StepOutput

__all__ = ["Session", "SessionError", "StepOutput"]
