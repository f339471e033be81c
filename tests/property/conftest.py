"""Hypothesis profiles: "ci" (the default: 100 examples, no deadline) and "dev" (quick, for editing).

Choose one with ``HYPOTHESIS_PROFILE=dev pytest tests/property``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=20, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
