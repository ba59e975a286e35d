"""The `tiergate` command: the composition root. Only it wires the benchmarks and the data sets
(lazily) into the parts that serve; nothing else imports this package."""

# First, before anything imports torch: its OpenMP runtime reads the policy once, at load.
from gateway.cli import omp_wait_policy  # noqa: F401,I001
from gateway.cli.main import main

__all__ = ["main"]
