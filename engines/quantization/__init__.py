"""Weight quantization: INT8 per channel, INT4 group-wise (round-to-nearest), FP8 e4m3 storage.

Each method turns the decoder's Linear layers into a quantized module with the same
call signature; embeddings, norms and the LM head stay in the model dtype.
"""

from engines.quantization.apply import METHODS, quantize_model, weight_bytes

__all__ = ["METHODS", "quantize_model", "weight_bytes"]
