"""Benchmarks behind `tiergate bench ...`: each runs every compared system in one command
and writes JSON with the machine it ran on."""
