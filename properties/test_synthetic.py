"""`reference.synthetic`: base rate and decay hit a target mean acceptance; rate conversions invert."""

from __future__ import annotations

import numpy as np
import pytest

from specsample.reference.synthetic import (
    MIN_DECAY,
    conditional_from_unconditional,
    conditional_rates,
    mean_joint_acceptance,
    synthetic_params,
)


@pytest.mark.parametrize("num_drafts", [1, 2, 3, 4, 5, 7, 10])
def test_params_hit_every_target(num_drafts: int) -> None:
    """For targets 0, 0.01, ..., 1 the mean joint acceptance equals the target within 1e-9."""
    for target in np.round(np.arange(0.0, 1.0001, 0.01), 2):
        base, decay = synthetic_params(float(target), num_drafts)
        assert 0.0 <= base <= 1.0
        assert MIN_DECAY <= decay <= 1.0
        assert abs(mean_joint_acceptance(base, decay, num_drafts) - target) < 1e-9, (target, base, decay)


@pytest.mark.parametrize("num_drafts", [2, 5, 10])
def test_decay_is_the_smallest_that_keeps_base_at_most_one(num_drafts: int) -> None:
    """Decay stays at 0.85 while a base <= 1 suffices, and is no larger than needed beyond that."""
    reachable = mean_joint_acceptance(1.0, MIN_DECAY, num_drafts)
    assert synthetic_params(reachable * 0.99, num_drafts)[1] == MIN_DECAY
    _, decay = synthetic_params(min(1.0, reachable + 0.05), num_drafts)
    assert decay > MIN_DECAY
    assert mean_joint_acceptance(1.0, decay * (1 - 1e-6), num_drafts) < reachable + 0.05


def test_conditional_rates_give_the_joint_rates() -> None:
    """The product of the first i + 1 conditional rates is base**(i+1) * decay**(i(i+1)/2)."""
    base, decay = 0.9, 0.87
    rates = conditional_rates(base, decay, 6)
    i = np.arange(6)
    np.testing.assert_allclose(np.cumprod(rates), base ** (i + 1) * decay ** (i * (i + 1) / 2), rtol=1e-14)
    np.testing.assert_allclose(conditional_from_unconditional(np.cumprod(rates)), rates, rtol=1e-14)


def test_unconditional_conversion_edges() -> None:
    """A zero joint rate makes every later conditional rate 0; bad rates raise naming the argument."""
    np.testing.assert_array_equal(conditional_from_unconditional([0.5, 0.0, 0.0]), [0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"^joint "):
        conditional_from_unconditional([0.5, 0.6])
    with pytest.raises(ValueError, match=r"^mean_acceptance "):
        synthetic_params(1.5, 3)
    with pytest.raises(ValueError, match=r"^num_drafts "):
        synthetic_params(0.5, 0)
