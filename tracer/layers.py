"""Decoder layers found by structure, grouped into identical layers, and the repeats replayed instead of traced.

The decoder layer list is the ModuleList holding most parameters inside the text decoder (HF's
`get_decoder()` where the model has one): `model.layers`, `transformer.h`, `gpt_neox.layers`,
`transformer.blocks`, `backbone.layers` alike. Layers whose parameters, submodule classes and per-layer
settings match are one group; only the first of a group runs, and every other member returns a fresh copy
of that first member's output (same structure and shapes), so the forward goes on unchanged.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_map

# per-module settings that name a layer rather than change its work
_POSITION_KEYS = re.compile(r"(^|_)(idx|index|id|number|num_layer|layer_id|layer_number|layer_idx)$")
_SCALAR = (bool, int, float, str, type(None))


DEDUP, PROBE, FULL = "dedup", "probe", "full"


@dataclass
class DecoderLayers:
    """The decoder layer list and how a forward runs it: `dedup` traces the first layer of each group and replays
    it for the others; `probe` also traces the second and the last member of every group (the dedup self-test
    compares the two); `full` traces every layer."""
    path: str                        # e.g. "transformer.h"
    layers: torch.nn.ModuleList
    groups: list[list[int]]          # indices of identical layers; the first of each group is traced
    outputs: dict[int, object] = field(default_factory=dict)
    mode: str = DEDUP
    _replay: tuple | None = None

    @property
    def active(self) -> bool:
        """Whether repeated layers are replayed (dedup or probe) rather than all traced."""
        return self.mode != FULL

    @active.setter
    def active(self, value: bool) -> None:
        self.mode = DEDUP if value else FULL

    def traced_groups(self) -> list[list[int]]:
        """Groups as the current mode runs them: the first index of each is traced, the others replay it."""
        if self.mode == FULL:
            return [[i] for i in range(len(self.layers))]
        if self.mode == DEDUP:
            return self.groups
        out = []
        for g in self.groups:
            probes = sorted({g[1], g[-1]}) if len(g) > 1 else []
            out.append([i for i in g if i not in probes])
            out.extend([i] for i in probes)
        return out

    @property
    def replay(self) -> dict[int, int]:
        """Replayed layer -> the traced layer it copies, in the current mode."""
        if self._replay is None or self._replay[0] != self.mode:
            self._replay = (self.mode, {i: g[0] for g in self.traced_groups() for i in g[1:]})
        return self._replay[1]

    def source(self, index: int) -> int | None:
        return self.replay.get(index)


def _param_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_decoder_layers(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList] | None:
    """(path, list) of the decoder's layer list: the ModuleList with most parameters in the text decoder."""
    root = model
    get_decoder = getattr(model, "get_decoder", None)
    if callable(get_decoder):
        try:
            decoder = get_decoder()
        except Exception:  # noqa: BLE001 - some models only implement it for generation
            decoder = None
        if isinstance(decoder, torch.nn.Module):
            root = decoder
    paths = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}
    best = _largest_block_list(root, paths) or (_largest_block_list(model, paths) if root is not model else None)
    return (paths[id(best)], best) if best is not None else None


def _largest_block_list(root: torch.nn.Module, paths: dict) -> torch.nn.ModuleList | None:
    best, best_params = None, 0
    for module in root.modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) < 1 or id(module) not in paths:
            continue
        if not all(any(True for _ in child.parameters()) and not isinstance(child, (torch.nn.Linear, torch.nn.Embedding))
                   for child in module):
            continue
        params = _param_count(module)
        if params > best_params:
            best, best_params = module, params
    return best


def _settings(module: torch.nn.Module) -> tuple:
    """A module's own scalar settings (window, layer type, rope on/off, shared-KV flags...), minus its position."""
    items = []
    for key, value in vars(module).items():
        if key.startswith("_") or key == "training" or _POSITION_KEYS.search(key):
            continue
        if isinstance(value, _SCALAR) or (isinstance(value, tuple) and all(isinstance(v, _SCALAR) for v in value)):
            items.append((key, value))
        elif callable(value) and hasattr(value, "__name__"):   # a swapped forward or kernel function
            items.append((key, getattr(value, "__qualname__", value.__name__)))
    return tuple(sorted(items, key=lambda kv: kv[0]))


def layer_signature(layer: torch.nn.Module, layer_type: str | None) -> tuple:
    params = tuple((n, tuple(p.shape), p.dtype) for n, p in layer.named_parameters())
    modules = tuple((name, type(m).__name__, _settings(m)) for name, m in layer.named_modules())
    return (type(layer).__name__, layer_type, params, modules)


def group_layers(layers: torch.nn.ModuleList, config) -> list[list[int]]:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(text, "layer_types", None) or [None] * len(layers)
    groups: OrderedDict[tuple, list[int]] = OrderedDict()
    for i, layer in enumerate(layers):
        kind = layer_types[i] if i < len(layer_types) else None
        groups.setdefault(layer_signature(layer, kind), []).append(i)
    return list(groups.values())


def _fresh_copy(output):
    """The same structure with new (meta) tensors: what an identical layer would have returned."""
    return tree_map(lambda t: t.new_empty(t.shape) if isinstance(t, torch.Tensor) else t, output)


def install(model: torch.nn.Module, config, dedup: bool) -> DecoderLayers | None:
    """Find the layers, group them, and wrap every layer so a group's repeats replay its first member."""
    found = find_decoder_layers(model)
    if found is None:
        return None
    path, layers = found
    groups = group_layers(layers, config) if dedup else [[i] for i in range(len(layers))]
    state = DecoderLayers(path=path, layers=layers, groups=groups)
    for i, layer in enumerate(layers):
        layer.forward = _wrapped(layer.forward, i, state)
    return state


def _wrapped(forward, index: int, state: DecoderLayers):
    def run(*args, **kwargs):
        source = state.source(index)
        if source is not None and source in state.outputs:
            return _fresh_copy(state.outputs[source])
        out = forward(*args, **kwargs)
        state.outputs[index] = out
        return out
    run.__name__ = getattr(forward, "__name__", "forward")
    return run
