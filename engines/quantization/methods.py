"""Names of the weight-quantization methods and the INT4 group sizes.

Plain tuples with no torch behind them: the CLI builds its argument choices from them and
the engine's settings check a name against them before any quantizing code is imported.
"""

# Methods that swap each decoder Linear for a quantized one on its own, with no data.
LAYER_METHODS = ("int8", "int4-rtn", "fp8")
# Methods that fit each layer to the activations calibration text produces.
CALIBRATED_METHODS = ("int4-awq", "int4-gptq")
# Every method a quantized artifact can be built with: the layer methods and the calibrated ones.
ARTIFACT_METHODS = ("int8", "int4-rtn", "int4-awq", "int4-gptq", "fp8")
# Input channels that share one INT4 scale and zero (round-to-nearest, AWQ and GPTQ alike).
INT4_GROUP_SIZES = (32, 64, 128, 256)
