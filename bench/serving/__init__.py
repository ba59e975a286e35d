"""Benchmarks of serving over HTTP: the load generator for any OpenAI URL, and the gateway's own overhead."""
