"""Kernel models of serving engines (vLLM, SGLang, TensorRT-LLM), one module per kernel class, each a small
formula with a few fitted parameters per device and engine (see `calibration.EngineCalibration`)."""
from .attention import (DecodeAttentionParams, PrefillAttentionParams, decode_attention_time, prefill_attention_time,
                        prefill_tiles)
from .calibration import GEMM_FORMATS, KV_FORMATS, MOE_FORMATS, EngineCalibration, parse_calibration
from .collective import IMPLEMENTATIONS, CollectiveCurve, allreduce_time, nearest_curve
from .common import Times
from .gemm import GemmParams, gemm_time, host_issue_s
from .moe import MoeParams, moe_time
from .routing import ROUTINGS, RoutingStats, routing_stats
from .stream import StreamParams, quant_time, stream_time

__all__ = ["GEMM_FORMATS", "IMPLEMENTATIONS", "KV_FORMATS", "MOE_FORMATS", "ROUTINGS", "CollectiveCurve", "DecodeAttentionParams",
           "EngineCalibration", "GemmParams", "MoeParams", "PrefillAttentionParams", "RoutingStats", "StreamParams",
           "Times", "allreduce_time", "decode_attention_time", "gemm_time", "host_issue_s", "moe_time", "nearest_curve",
           "parse_calibration", "prefill_attention_time", "prefill_tiles", "quant_time", "routing_stats", "stream_time"]
