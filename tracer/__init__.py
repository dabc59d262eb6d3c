"""tracecost tracer: exact per-op work of one forward step of a real HF model, on the meta device."""
from .model_source import ModelError, bundled_models, resolve_model
from .trace import trace
from .work import Op, Request, Trace, TraceOptions

__all__ = ["ModelError", "Op", "Request", "Trace", "TraceOptions", "bundled_models", "resolve_model", "trace"]
