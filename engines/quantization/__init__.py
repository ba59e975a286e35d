"""Weight quantization: INT8 per channel, INT4 group-wise (round-to-nearest), FP8 e4m3 storage.

Each method turns the decoder's Linear layers into a quantized module with the same
call signature; embeddings, norms and the LM head stay in the model dtype.
"""

from engines.quantization.methods import ARTIFACT_METHODS, CALIBRATED_METHODS, INT4_GROUP_SIZES, LAYER_METHODS

__all__ = ["ARTIFACT_METHODS", "CALIBRATED_METHODS", "INT4_GROUP_SIZES", "LAYER_METHODS", "quantize_model",
           "weight_bytes"]

_APPLY = ("quantize_model", "weight_bytes")


def __getattr__(name: str):
    # The quantizing code pulls in torch and the model; it loads on first use, so that the method
    # names (the CLI's argument choices, the engine's settings checks) import without it.
    if name in _APPLY:
        from engines.quantization import apply
        return getattr(apply, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
