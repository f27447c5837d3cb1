"""Snapshots of a caller's model, to show a run left it exactly as it was (test_safety, test_faults)."""

from __future__ import annotations

import torch
from torch import fx, nn


def snapshot_module(model: nn.Module) -> dict:
    """Everything about a module that a rewrite could touch."""
    snap = {
        "modules": [(name, type(m), id(m), m.training) for name, m in model.named_modules(remove_duplicate=False)],
        "params": [(name, id(p), p.requires_grad) for name, p in model.named_parameters(remove_duplicate=False)],
        "buffers": [(name, id(b)) for name, b in model.named_buffers(remove_duplicate=False)],
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "dicts": [(name, sorted(m.__dict__)) for name, m in model.named_modules(remove_duplicate=False)],
        "hooks": [(name, len(m._forward_hooks), len(m._forward_pre_hooks))
                  for name, m in model.named_modules(remove_duplicate=False)],
    }
    if isinstance(model, fx.GraphModule):
        snap["code"] = model.code
        snap["graph"] = str(model.graph)
        snap["nodes"] = [(n.name, n.op, str(n.target), sorted(n.meta)) for n in model.graph.nodes]
    else:
        snap["code"] = fx.symbolic_trace(model).code
    return snap


def snapshot_program(ep: torch.export.ExportedProgram) -> dict:
    """An ExportedProgram: its graph, signature, node metadata keys, state (values and identity)."""
    return {
        "graph": str(ep.graph),
        "code": ep.graph_module.code,
        "signature": str(ep.graph_signature),
        "meta": [(n.name, sorted(n.meta)) for n in ep.graph.nodes],
        "state": {k: v.detach().clone() for k, v in ep.state_dict.items()},
        "ids": {k: id(v) for k, v in ep.state_dict.items()},
        "module": snapshot_module(ep.graph_module),
    }


def assert_same_snapshot(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key in before:
        if key == "state":
            assert before[key].keys() == after[key].keys()
            for name in before[key]:
                assert torch.equal(before[key][name], after[key][name]), f"{name} changed"
        elif key == "module":
            assert_same_snapshot(before[key], after[key])
        else:
            assert before[key] == after[key], f"{key} changed"
