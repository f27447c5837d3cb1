"""fxrules.tools.saving: what save_module writes, what load_saved accepts and refuses (in process).

The round trip through a fresh interpreter and the CLI is tested in test_cli_apply.py.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import fx, nn

import fxrules
from fxrules.tools.saving import FILES, SaveError, load_saved, save_module


@fx.wrap
def scaled_softsign(x, scale: float):
    """A plain function: traced as a call_function node whose target module.py must import."""
    return scale * x / (1 + x.abs())


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("shift", torch.full((4,), 0.5))
        self.register_buffer("scratch", torch.zeros(4), persistent=False)

    def forward(self, x):
        return self.lin(x) + self.shift + self.scratch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), nn.Dropout(0.2), Block())
        self.gain = nn.Parameter(torch.tensor(1.5))

    def forward(self, x, y):
        z = scaled_softsign(self.blocks(x), math.pi) * self.gain
        c = torch.tensor([1.0, 2.0, 3.0, 4.0])  # a tensor constant: traced to a get_attr
        return {"z": z + c, "pair": (y.relu(), float("inf"))}


def _rewrite(model: nn.Module):
    rules = fxrules.parse_rules("rule remove_dropout [exact]:\n"
                                "    call_module Dropout($x) as d where not d.training -> $x\n")
    return fxrules.apply_rules(model, rules).module


def test_round_trip_keeps_code_weights_buffers_and_outputs(tmp_path):
    torch.manual_seed(0)
    module = _rewrite(Net().eval())
    save_module(module, tmp_path / "saved", info={"note": "test"})
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == sorted(FILES)
    loaded = load_saved(tmp_path / "saved")
    assert isinstance(loaded, fx.GraphModule) and type(loaded).__name__ == "Net"
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    expected, got = module(x, y), loaded(x, y)
    assert torch.equal(expected["z"], got["z"]) and torch.equal(expected["pair"][0], got["pair"][0])
    assert got["pair"][1] == float("inf")
    assert loaded.training is False
    assert {k: v.shape for k, v in loaded.state_dict().items()} == {k: v.shape for k, v in module.state_dict().items()}
    code = (tmp_path / "saved" / "module.py").read_text()
    assert "from tests.tools.test_saving import scaled_softsign" in code and "self.blocks" in code
    assert "Dropout" not in code and "getattr(self.blocks, \"1\")" not in code
    manifest = json.loads((tmp_path / "saved" / "manifest.json").read_text())
    assert manifest["class_name"] == "Net" and manifest["info"] == {"note": "test"} and manifest["version"] == 1
    # the loaded module is a graph module like any other: rules apply to it again
    again = _rewrite(loaded)
    assert torch.equal(again(x, y)["z"], expected["z"])


def test_an_existing_directory_keeps_other_files(tmp_path):
    (tmp_path / "README").write_text("mine\n")
    module = _rewrite(Net().eval())
    save_module(module, tmp_path)
    assert (tmp_path / "README").read_text() == "mine\n"
    save_module(module, tmp_path)  # and saving twice overwrites our own files
    assert load_saved(tmp_path) is not None


def test_unpicklable_submodule_is_refused_by_name(tmp_path):
    class Local(nn.Module):  # defined in a function: pickle cannot name it
        def forward(self, x):
            return x + 1

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Local()

        def forward(self, x):
            return self.inner(x)

    tracer = fx.Tracer()
    tracer.is_leaf_module = lambda m, name: isinstance(m, Local) or fx.Tracer.is_leaf_module(tracer, m, name)
    module = fx.GraphModule(Holder(), tracer.trace(Holder()))
    with pytest.raises(SaveError, match=r"cannot save self\.inner \(Local\): it does not pickle"):
        save_module(module, tmp_path / "x")
    assert not (tmp_path / "x").exists()  # nothing written


def test_only_graph_modules_are_saved(tmp_path):
    with pytest.raises(SaveError, match="only save a torch.fx.GraphModule, not Linear"):
        save_module(nn.Linear(2, 2), tmp_path)


def test_load_refuses_what_is_not_a_saved_module(tmp_path):
    with pytest.raises(SaveError, match="holds no saved module"):
        load_saved(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(SaveError, match="cannot read"):
        load_saved(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(SaveError, match="not an fxrules saved-module manifest"):
        load_saved(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "fxrules-saved-module", "version": 99}))
    with pytest.raises(SaveError, match="format version 99; this fxrules reads version 1"):
        load_saved(tmp_path)


def test_export_guard_is_dropped_and_named(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    x = torch.randn(2, 4)
    module = fxrules.apply_rules(torch.export.export(model, (x,)), fxrules.parse_rules(
        "rule keep [exact]:\n    call_module Identity($x) -> $x\n")).module
    assert any(n.target == "_guards_fn" for n in module.graph.nodes if n.op == "call_module")
    save_module(module, tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["dropped"] == ["_guards_fn (torch.export input guard)"]
    assert torch.equal(load_saved(tmp_path)(x), module(x))
    # the module given is not changed by saving
    assert any(n.target == "_guards_fn" for n in module.graph.nodes if n.op == "call_module")
