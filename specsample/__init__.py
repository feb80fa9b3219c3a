"""The harness under one import name: ``specsample.reference``, ``specsample.kernels`` and the rest.

The repository's folders are this package's subpackages: ``specsample.kernels`` is ``kernels/``.
An installed wheel holds them under ``specsample/``; in a clone (run from its root, or installed
editable) this package's search path is the repository root, which gives the same mapping. The
project installs no other top-level name, so nothing it installs shadows another package (Hugging
Face's ``kernels``, say) or is shadowed by one.
"""

import os

_HERE = os.path.dirname(os.path.abspath(__file__))
if not os.path.isdir(os.path.join(_HERE, "reference")):  # a clone: the subpackages are its folders
    __path__ = [os.path.dirname(_HERE)]
