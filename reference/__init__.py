"""The specification: the contract, the exact float64 law, the reference sampler, Philox, synthetic rates.

float64, CPU only; never imports triton or `kernels`.
"""
