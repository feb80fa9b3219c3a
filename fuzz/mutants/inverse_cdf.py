"""Inverse-CDF sampling, the way the mutants that plant a residual-sampling bug draw a token."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def inverse_cdf(cdf: npt.NDArray[np.float64], uniforms: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """The first token whose cumulative weight exceeds ``u``, per row; the last token past the total."""
    u = np.asarray(uniforms, dtype=np.float64)[:, None]
    return np.minimum((cdf <= u).sum(axis=-1), cdf.shape[-1] - 1).astype(np.int64)
