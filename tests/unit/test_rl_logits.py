"""``dsbuild.rl.logits``: what TRL reads from a policy's logits beside the log-probs, from the same forward."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dsbuild.rl.logits import by_token, logits_read, logits_stats

pytestmark = pytest.mark.train


@given(arrays(np.float32, (2, 3, 7), elements=st.floats(-20, 20, width=32)), st.sampled_from([0.5, 1.0, 1.7]))
@settings(max_examples=50)
def test_logits_stats_are_trls_of_the_logits_over_temperature(logits: np.ndarray, temperature: float) -> None:
    """Entropy as TRL's ``entropy_from_logits`` of the logits ÷ temperature, their mean and the first argmax."""
    from trl.trainer.utils import entropy_from_logits

    z = torch.from_numpy(logits) / temperature
    entropy, mean, top = logits_stats(torch.from_numpy(logits), temperature)
    torch.testing.assert_close(entropy, entropy_from_logits(z), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean, z.mean(dim=-1))
    assert torch.equal(top, z.argmax(dim=-1))


def test_logits_read_lays_each_forward_out_as_the_log_probs() -> None:
    """Two forwards of a batch's rows, read from the output head: column t holds what the logits at t - 1 say of
    token t; the hook is gone afterwards, and a model without a head gives nothing to lay out."""
    head = torch.nn.Linear(4, 5)
    model = SimpleNamespace(get_output_embeddings=lambda: head)
    hidden = torch.randn(3, 6, 4)
    with logits_read(SimpleNamespace(engine=SimpleNamespace(module=model))) as stats:
        head(hidden[:2])
        head(hidden[2:])
    head(hidden)  # outside: not read
    entropy, mean, top = by_token(stats, 3)  # type: ignore[misc]
    whole = logits_stats(head(hidden))
    assert torch.equal(entropy[:, 0], torch.zeros(3)) and torch.allclose(entropy[:, 1:], whole[0][:, :-1])
    assert torch.allclose(mean[:, 1:], whole[1][:, :-1]) and torch.equal(top[:, 1:], whole[2][:, :-1])
    assert by_token(stats, 4) is None and by_token([], 3) is None
