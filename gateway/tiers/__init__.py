"""Tier clients: in-process engines (embedded.py) and OpenAI-compatible upstreams (upstream.py)."""
