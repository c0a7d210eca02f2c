"""Benchmarks against named baselines; results in docs/benchmarks.md."""
