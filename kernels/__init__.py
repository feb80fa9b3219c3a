"""Production Triton rejection samplers: jit code in *_kernels.py, a launcher per sampler, a registry."""
