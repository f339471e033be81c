"""``Session``: runs DeepSpeed for you, or inside your own loop.

Importing this package imports torch (and, when used, deepspeed, transformers
and peft); ``import dsbuild`` does not import it until ``dsbuild.Session`` is used.
"""

from ..env.extras import require

require("dsbuild.Session")  # torch, deepspeed, transformers, peft: else the exact pip install

from .building import ready_for_zero_init  # noqa: E402
from .session import Session, SessionError, StepOutput  # noqa: E402
from .weights import WeightSink, full_parameters, stream_to  # noqa: E402

__all__ = ["Session", "SessionError", "StepOutput", "WeightSink", "full_parameters", "ready_for_zero_init", "stream_to"]
