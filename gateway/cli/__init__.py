"""The `tiergate` command: the composition root. Only it wires the benchmarks and the data sets
(lazily) into the parts that serve; nothing else imports this package."""

from gateway.cli.main import main

__all__ = ["main"]
