"""Installed next to Hugging Face's `kernels`, the project shadows nothing and nothing shadows it.

Run from outside the repository (tox's `coexist` environment does), so only installed names resolve.
"""

import numpy as np

import kernels  # Hugging Face's, imported before ours on purpose
import specsample.kernels
from specsample.kernels import registry
from specsample.properties.checks import run_checks
from specsample.reference.contract import RequestData, make_batch

assert "site-packages" in kernels.__file__ and hasattr(kernels, "get_kernel"), kernels.__file__
assert specsample.kernels.__file__ != kernels.__file__, specsample.kernels.__file__
rng = np.random.default_rng(0)
batch = make_batch([RequestData(rng.normal(size=(3, 40)), [1, 2], rng.normal(size=(2, 40)), seed=5)])
verdicts = run_checks(registry.get("triton"), batch, checks=("invariants", "coupled"), num_samples=4)
assert [v.check for v in verdicts] == ["invariants", "coupled"] and all(v.passed for v in verdicts), verdicts
print(f"OK: kernels is {kernels.__file__}; specsample.kernels is {specsample.kernels.__file__}")
