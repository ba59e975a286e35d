"""Benchmarks, datasets and evaluation: an optional extra that the serving path never imports."""
