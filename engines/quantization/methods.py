"""Names of the weight-quantization methods and the INT4 group sizes.

Plain tuples with no torch behind them: the CLI builds its argument choices from them and
the engine's settings check a name against them before any quantizing code is imported.
"""

# Methods that swap each decoder Linear for a quantized one on its own, with no data.
LAYER_METHODS = ("int8", "int4-rtn", "fp8", "w8a8", "w4a8")
# Methods that fit each layer to the activations calibration text produces.
CALIBRATED_METHODS = ("int4-awq", "int4-gptq")
# Methods that read the source GGUF's own quantized blocks (no data, no second rounding).
GGUF_METHODS = ("int4-gguf", "w4a8-gguf")
# Every method a quantized artifact can be built with: the tier schema (policies/tier_config.py)
# and `tiergate quantize` list these.
ARTIFACT_METHODS = ("int8", "int4-rtn", "int4-awq", "int4-gptq", "fp8", "int4-gguf", "w8a8", "w4a8", "w4a8-gguf")
# The layer method whose kernel each artifact's layers run (what a speed probe has to time):
# calibration changes the values of INT4 weights, not the kernel that multiplies them; a GGUF's
# Q4_K blocks run the INT4 kernel too (its other tensors go to int8: the probe times the INT4 one).
LAYER_METHOD_OF = {"int8": "int8", "int4-rtn": "int4-rtn", "int4-awq": "int4-rtn", "int4-gptq": "int4-rtn",
                   "fp8": "fp8", "int4-gguf": "int4-rtn", "w8a8": "w8a8", "w4a8": "w4a8", "w4a8-gguf": "w4a8"}
# Input channels that share one INT4 scale and zero (round-to-nearest, AWQ and GPTQ alike).
INT4_GROUP_SIZES = (32, 64, 128, 256)
# Methods whose group size is fixed, whatever the caller asks: the file's (Q4_K: groups of 32),
# or the block of the int8 activations they multiply (w4a8).
FIXED_GROUP_SIZES = {"int4-gguf": 32, "w4a8": 32, "w4a8-gguf": 32}


def effective_group_size(method: str, group_size: int) -> int:
    return FIXED_GROUP_SIZES.get(method, group_size)
