"""Dtype tables shared by the tracer and the cost model (no torch needed to read them)."""

TORCH_DTYPE_NAMES = ("bf16", "fp16", "fp32")
# weight formats priced from a bf16 trace with narrower weight bytes: the graph is the same
QUANTIZED_DTYPES = {"fp8": 1, "fp8_block": 1, "int8": 1, "fp4": 0.5, "int4": 0.5}
# the matrix-unit dtype a quantized GEMM runs at: W8A8 fp8/int8 and native fp4; int4 weights are dequantized to bf16.
# fp8 is per-tensor scaled; fp8_block carries 128x128 block scales (DeepSeek-V3's format)
GEMM_COMPUTE_DTYPE = {"fp8": "fp8", "fp8_block": "fp8", "int8": "int8", "fp4": "fp4", "int4": "bf16"}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "fp8_block": 1, "int8": 1, "fp4": 0.5, "int4": 0.5}
