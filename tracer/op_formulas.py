"""One registry mapping an aten op to its work formula, in the style of torch.utils.flop_counter.

A formula gets the op's args, kwargs and output and returns `Work`. Ops without a formula are
elementwise-like: one vector FLOP per output element. Matrix-like ops MUST have a formula here:
`MATRIX_LIKE` lists every aten op that multiplies matrices, and the recorder reports any of
them that reaches it without one (PyTorch's own FlopCounterMode counts some of these as zero).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch

from .work import GEMM, MATRIX, OTHER, VECTOR, GemmShape

aten = torch.ops.aten


@dataclass(frozen=True)
class Work:
    flops: float
    op_class: str = OTHER
    unit: str = VECTOR
    gemm: GemmShape | None = None
    # bytes read from inputs, when not simply "every input once" (gathers read only their rows)
    bytes_read: float | None = None


FORMULAS: dict = {}


def register(*ops):
    def wrap(fn):
        for op in ops:
            FORMULAS[op] = fn
        return fn
    return wrap


def _shape(t) -> tuple:
    return tuple(t.shape)


def _gemm(m: int, n: int, k: int, batch: int = 1) -> Work:
    return Work(flops=2.0 * batch * m * n * k, op_class=GEMM, unit=MATRIX, gemm=GemmShape(m, n, k, batch))


@register(aten.mm.default, aten.mm.out)
def mm_work(a, b, *args, out=None, **kwargs) -> Work:
    (m, k), (_, n) = _shape(a), _shape(b)
    return _gemm(m, n, k)


@register(aten.addmm.default)
def addmm_work(bias, a, b, *args, out=None, **kwargs) -> Work:
    (m, k), (_, n) = _shape(a), _shape(b)
    return _gemm(m, n, k)


@register(aten.bmm.default)
def bmm_work(a, b, *args, out=None, **kwargs) -> Work:
    (bt, m, k), (_, _, n) = _shape(a), _shape(b)
    return _gemm(m, n, k, bt)


@register(aten.baddbmm.default)
def baddbmm_work(bias, a, b, *args, out=None, **kwargs) -> Work:
    (bt, m, k), (_, _, n) = _shape(a), _shape(b)
    return _gemm(m, n, k, bt)


@register(aten.mv.default, aten.addmv.default)
def mv_work(*args, out=None, **kwargs) -> Work:
    mat = next(a for a in args if isinstance(a, torch.Tensor) and a.dim() == 2)
    m, k = _shape(mat)
    return _gemm(m, 1, k)


@register(aten.dot.default, aten.vdot.default)
def dot_work(a, b, *args, out=None, **kwargs) -> Work:
    return _gemm(1, 1, a.numel())


@register(aten._grouped_mm.default)
def grouped_mm_work(a, b, offs=None, *args, out=None, **kwargs) -> Work:
    # Rows of `a` are split over the groups of `b`; every row meets one [k, n] matrix.
    m, k = _shape(a)[-2:]
    n = _shape(b)[-1]
    groups = _shape(b)[0] if b.dim() == 3 else 1
    return Work(flops=2.0 * m * n * k, op_class=GEMM, unit=MATRIX, gemm=GemmShape(max(1, m // groups), n, k, groups))


@register(aten.convolution.default)
def conv_work(x, w, bias, stride, padding, dilation, transposed, output_padding, groups, *, out=None, **kwargs) -> Work:
    out_numel = prod(_shape(out)) if out is not None else 0
    c_in_per_group = _shape(w)[1]
    kernel = prod(_shape(w)[2:])
    if c_in_per_group == 1 and groups > 1:  # depthwise (short causal convolutions): no matrix product, vector work
        return Work(flops=2.0 * out_numel * kernel)
    return Work(flops=2.0 * out_numel * c_in_per_group * kernel, op_class=GEMM, unit=MATRIX,
                gemm=GemmShape(out_numel // _shape(w)[0], _shape(w)[0], c_in_per_group * kernel))


@register(aten.embedding.default)
def embedding_work(weight, indices, *args, out=None, **kwargs) -> Work:
    row_bytes = weight.shape[-1] * weight.element_size()
    return Work(flops=0.0, bytes_read=indices.numel() * (row_bytes + indices.element_size()))


@register(aten.index_select.default)
def index_select_work(src, dim, index, *args, out=None, **kwargs) -> Work:
    gathered = out.numel() * out.element_size() if out is not None else 0
    return Work(flops=0.0, bytes_read=gathered + index.numel() * index.element_size())


# Ops that multiply matrices. Any of these without a formula above is reported, never dropped.
MATRIX_LIKE = {
    "mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "vdot", "matmul", "linear", "_grouped_mm",
    "_scaled_mm", "_scaled_grouped_mm", "convolution", "einsum", "tensordot", "addbmm", "addr", "outer",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_flash_attention_forward", "_efficient_attention_forward", "_int_mm", "_weight_int8pack_mm",
}

# Ops that only allocate, or only read metadata: no work.
FREE = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias", "lift_fresh",
    "_to_copy_meta_noop", "sym_size", "sym_stride", "sym_numel", "is_same_size", "_has_compatible_shallow_copy_type",
    "resize_", "set_", "record_stream",
}


def op_base_name(func) -> str:
    return func._schema.name.split("::")[-1]


VIEW_LIKE = {"_unsafe_view", "_reshape_alias", "lift_fresh"}


def is_view(func) -> bool:
    """True for ops whose output aliases an input without writing it (views, reshapes): free."""
    if op_base_name(func) in VIEW_LIKE:
        return True
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "norm", "linalg_vector_norm",
              "topk", "sort", "cumsum", "argmax", "argmin", "_softmax", "_log_softmax", "logsumexp", "prod", "all", "any"}


def elementwise_work(func, in_tensors, out_tensors) -> Work:
    numel = sum(t.numel() for t in out_tensors)
    if op_base_name(func) in REDUCTIONS and in_tensors:
        numel = max(numel, max(t.numel() for t in in_tensors))
    return Work(flops=float(numel))


def work_for(func, args, kwargs, out) -> Work | None:
    """The op's work, or None when a matrix-like op has no formula (the caller reports it)."""
    formula = FORMULAS.get(func)
    if formula is not None:
        return formula(*args, out=out, **kwargs)
    if op_base_name(func) in MATRIX_LIKE:
        return None
    outs = out if isinstance(out, (tuple, list)) else (out,)
    ins = [a for a in args if isinstance(a, torch.Tensor)]
    return elementwise_work(func, ins, [t for t in outs if isinstance(t, torch.Tensor)])
