"""Benchmarks of one embedded engine (no HTTP): decode, offline batching, prefix cache, speculation, the ladder."""
