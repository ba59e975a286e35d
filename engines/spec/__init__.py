"""Speculative decoding: draft sources (n-gram lookup, a draft model, the quantized model
itself), the exact verification rule, adaptive k, inside the batching engine's step."""

from engines.spec.config import SpeculativeConfig

__all__ = ["SpeculativeConfig"]
