"""Hypothesis strategies, the statistics engine, the checks, and the pytest suite."""
