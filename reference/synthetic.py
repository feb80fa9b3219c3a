"""Rates for synthetic rejection sampling, which forces a chosen acceptance rate (load testing).

Synthetic sampling accepts draft ``i`` with a conditional rate ``c_i = base * decay**i``, so the
joint probability of accepting the first ``i + 1`` drafts is ``base**(i+1) * decay**(i(i+1)/2)``.
`synthetic_params` picks ``(base, decay)`` so that the mean of those joint probabilities over the
``n`` positions equals a target mean acceptance; `conditional_from_unconditional` converts
explicit per-position rates ``P(first i + 1 accepted)`` into the conditional rates the sampler uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

MIN_DECAY = 0.85
_BISECTION_STEPS = 200


def mean_joint_acceptance(base: float, decay: float, num_drafts: int) -> float:
    """The mean over positions ``i < n`` of ``base**(i+1) * decay**(i(i+1)/2)``."""
    i = np.arange(num_drafts, dtype=np.float64)
    return float(np.mean(base ** (i + 1) * decay ** (i * (i + 1) / 2)))


def _bisect_increasing(f: Callable[[float], float], target: float, low: float, high: float) -> float:
    """The smallest ``x`` in ``[low, high]`` with ``f(x) >= target``, for ``f`` non-decreasing."""
    for _ in range(_BISECTION_STEPS):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        if f(middle) >= target:
            high = middle
        else:
            low = middle
    return high


def synthetic_params(mean_acceptance: float, num_drafts: int) -> tuple[float, float]:
    """``(base, decay)`` whose mean joint acceptance over ``num_drafts`` positions is the target.

    ``decay`` is the smallest value ``>= 0.85`` that lets ``base`` stay ``<= 1``; both are found by
    bisection.
    """
    if not 0.0 <= mean_acceptance <= 1.0:
        raise ValueError(f"mean_acceptance is {mean_acceptance}; expected a value in [0, 1]")
    if num_drafts < 1:
        raise ValueError(f"num_drafts is {num_drafts}; expected at least 1")
    if mean_acceptance == 0.0:
        return 0.0, MIN_DECAY
    if mean_joint_acceptance(1.0, MIN_DECAY, num_drafts) >= mean_acceptance:
        decay = MIN_DECAY
    else:
        decay = _bisect_increasing(
            lambda g: mean_joint_acceptance(1.0, g, num_drafts), mean_acceptance, MIN_DECAY, 1.0
        )
    base = _bisect_increasing(
        lambda a: mean_joint_acceptance(a, decay, num_drafts), mean_acceptance, 0.0, 1.0
    )
    return base, decay


def conditional_rates(base: float, decay: float, num_drafts: int) -> npt.NDArray[np.float64]:
    """``[n]`` the conditional acceptance rates ``c_i = base * decay**i``."""
    return base * decay ** np.arange(num_drafts, dtype=np.float64)


def conditional_from_unconditional(joint: Sequence[float] | npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Conditional rates from unconditional ones, ``joint[i] = P(first i + 1 drafts accepted)``.

    ``c_0 = joint[0]`` and ``c_i = joint[i] / joint[i - 1]``; a position after a zero joint rate
    gets rate 0 (it is never reached).
    """
    rates = np.asarray(joint, dtype=np.float64).reshape(-1)
    if rates.size and (np.any(rates < 0) or np.any(rates > 1) or np.any(np.diff(rates) > 0)):
        raise ValueError(f"joint is {rates.tolist()}; expected non-increasing probabilities in [0, 1]")
    previous = np.concatenate([[1.0], rates[:-1]])
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(previous > 0, rates / np.where(previous > 0, previous, 1.0), 0.0)
