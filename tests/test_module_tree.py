"""The module tree walked once (tracer/module_tree.py) gives what torch's own walks give."""
import torch

from tracer.module_tree import ModuleTree


def _same(a, b):
    return [(n, id(t)) for n, t in a] == [(n, id(t)) for n, t in b]


def _shared_model():
    shared = torch.nn.Linear(4, 4)
    model = torch.nn.ModuleDict({"a": torch.nn.Sequential(shared, torch.nn.LayerNorm(4)), "b": shared,
                                 "head": torch.nn.Linear(4, 8, bias=False), "embed": torch.nn.Embedding(8, 4)})
    model["head"].weight = model["embed"].weight          # tied weights: one tensor under two names
    model["a"][1].register_buffer("scale", torch.ones(4))
    model["a"][1].register_buffer("unset", None)
    return model


def test_walks_match_torch_with_shared_modules_and_tied_weights():
    model = _shared_model()
    tree = ModuleTree(model)
    assert _same(tree.modules, model.named_modules())
    assert _same(tree.every_path, model.named_modules(remove_duplicate=False))
    assert _same(tree.named_parameters(), model.named_parameters())
    assert _same(tree.named_parameters(remove_duplicate=False), model.named_parameters(remove_duplicate=False))
    assert len(tree.named_parameters(remove_duplicate=False)) > len(tree.named_parameters())
    assert [id(p) for p in tree.parameters()] == [id(p) for p in model.parameters()]
    assert [id(b) for b in tree.buffers()] == [id(b) for b in model.buffers()]
    assert all(tree.by_path[path] is model.get_submodule(path) for path, _ in tree.every_path if path)
    assert tree.paths[id(model["b"])] == "a.0"             # a shared module's first path, as named_modules


def test_tensors_are_read_from_the_modules_each_time():
    model = _shared_model()
    tree = ModuleTree(model)
    tree.buffers()
    model["a"][1].scale = torch.zeros(4)                   # a model converting a buffer on its first call
    assert [id(b) for b in tree.buffers()] == [id(b) for b in model.buffers()]


def test_a_built_model_tree_matches_torch():
    from tracer.build import build_model
    from tracer.model_source import resolve_model
    from tracer.trace import prepare
    prepare()     # tracecost's attention and experts implementations, which the build names
    built = build_model(resolve_model("llama-3.2-1b"))
    model = built.model
    assert _same(built.tree.named_parameters(remove_duplicate=False), model.named_parameters(remove_duplicate=False))
    assert _same(built.tree.named_parameters(), model.named_parameters())
    assert [id(b) for b in built.tree.buffers()] == [id(b) for b in model.buffers()]
