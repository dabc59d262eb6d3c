"""A built model's module tree, walked once per model.

A trace asks for the tree several times (the recorder's module names, parameters and buffers, the FLOP identity's
parameter names and owners, the output head's path), and torch's recursive generators (`named_modules`,
`named_parameters`) cost about as much as the forward of a deduplicated step (a DeepSeek-V3 step walked its 15k
modules five times). The tree of a built model does not change after it is built; its tensors may (a model can
convert a buffer on its first call), so parameters and buffers are read from the cached modules on each call, in
the order and with the deduplication torch's own walks give (torch/nn/modules/module.py `_named_members`).
"""
from __future__ import annotations

from functools import cached_property

import torch


class ModuleTree:
    """Held by the built model it walks (tracer/build.py BuiltModel.tree)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.modules: tuple = tuple(model.named_modules())   # (path, module): each module once, torch's order

    @cached_property
    def every_path(self) -> tuple:
        """(path, module) with a shared module under each of its paths: named_modules(remove_duplicate=False)."""
        return tuple(self.model.named_modules(remove_duplicate=False))

    @cached_property
    def by_path(self) -> dict:
        """path -> module, as get_submodule resolves it."""
        return dict(self.every_path)

    @cached_property
    def paths(self) -> dict:
        """id(module) -> its first path."""
        return {id(m): name for name, m in self.modules}

    def named_parameters(self, remove_duplicate: bool = True) -> list:
        """model.named_parameters(remove_duplicate=...)."""
        return _members(self.modules if remove_duplicate else self.every_path, "_parameters", remove_duplicate)

    def parameters(self) -> list:
        return [p for _, p in self.named_parameters()]

    def buffers(self) -> list:
        return [b for _, b in _members(self.modules, "_buffers", True)]


def _members(modules, kind: str, remove_duplicate: bool) -> list:
    seen, out = set(), []
    for prefix, module in modules:
        for key, value in getattr(module, kind).items():
            if value is None or id(value) in seen:
                continue
            if remove_duplicate:
                seen.add(id(value))
            out.append((prefix + ("." if prefix else "") + key, value))
    return out


__all__ = ["ModuleTree"]
