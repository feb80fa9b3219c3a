"""The harness under one import name: ``specsample.reference``, ``specsample.kernels`` and the rest.

The repository's folders are this package's subpackages: ``specsample/kernels`` is a relative symlink
to ``kernels/``, one per folder, so Python and static tools (import-linter, editors) find
``specsample.kernels`` on disk. An installed wheel holds the folders themselves under ``specsample/``.
The project installs no other top-level name, so nothing it installs shadows another package (Hugging
Face's ``kernels``, say) or is shadowed by one.
"""
