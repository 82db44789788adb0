"""Benchmarks of cirron's hot path against baselines measured in the same run."""
