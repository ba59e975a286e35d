"""Speculative decoding: draft sources, verification and rollback."""
