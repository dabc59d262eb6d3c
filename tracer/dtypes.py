"""Dtype tables shared by the tracer and the cost model (no torch needed to read them)."""

TORCH_DTYPE_NAMES = ("bf16", "fp16", "fp32")
# weight formats priced from a bf16 trace with narrower weight bytes: the graph is the same
# mxfp4 (OCP microscaling, gpt-oss): 4-bit values and one 8-bit exponent per 32, 4.25 bits a weight
# int8_wo: 8-bit integer weights with bf16 activations (GPTQ/AWQ 8-bit, compressed-tensors W8A16)
QUANTIZED_DTYPES = {"fp8": 1, "fp8_block": 1, "int8": 1, "int8_wo": 1, "fp4": 0.5, "int4": 0.5, "mxfp4": 0.53125}
# the matrix-unit dtype a quantized GEMM runs at: W8A8 fp8/int8 and native fp4; int4 weights are dequantized to bf16.
# fp8 is per-tensor scaled; fp8_block carries 128x128 block scales (DeepSeek-V3's format)
# mxfp4: HF and Hopper-class engines multiply dequantized weights in bf16 (cost/op_formats.py decides per device)
GEMM_COMPUTE_DTYPE = {"fp8": "fp8", "fp8_block": "fp8", "int8": "int8", "fp4": "fp4", "int4": "bf16",
                     "int8_wo": "bf16", "mxfp4": "bf16"}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "fp8_block": 1, "int8": 1, "fp4": 0.5, "int4": 0.5,
               "int8_wo": 1, "mxfp4": 0.53125}
