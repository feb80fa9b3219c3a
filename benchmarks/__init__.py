"""Latency benchmarks, committed per-GPU baselines, and the performance gate."""
