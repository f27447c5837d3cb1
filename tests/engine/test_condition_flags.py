"""`where name.attr` and `where not name.attr`: conditions.ModuleFlag, the form the driver answers
straight from the module. Whatever the module holds there, the answer (or the refusal, or the error)
must be the Evaluator's; the flag only answers when the value is a plain bool."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

import fxrules
import fxrules.lang.ast as A
from fxrules.engine.conditions import Evaluator, ModuleFlag, module_flag
from fxrules.engine.program import compile_rules

DROP = "call_module Dropout($x) as d"


def _cond(where: str, pattern: str = DROP) -> A.Cond:
    (rule,) = fxrules.parse_rules(f"rule c: {pattern} where {where} -> $x").rules
    (cond,) = rule.ast.conditions
    return cond


@pytest.mark.parametrize("where, expected", [
    ("not d.training", ModuleFlag("d", "training", True)),
    ("d.training", ModuleFlag("d", "training", False)),
    ("d.inplace", ModuleFlag("d", "inplace", False)),
])
def test_the_flag_form_is_recognised(where, expected):
    assert module_flag(_cond(where)) == expected


@pytest.mark.parametrize("where", [
    "d.p > 0.1",  # a comparison
    "not not d.training",  # two nots: left to the evaluator
    "$x.dtype == torch.float32",  # metadata of a capture
    "d.training and d.inplace",
    "d.dtype.is_floating_point",  # a dtype attribute (of an attribute)
])
def test_other_forms_are_left_to_the_evaluator(where):
    assert module_flag(_cond(where)) is None


def test_metadata_and_dtype_attributes_are_never_flags():
    for attr in ("shape", "dtype", "ndim", "itemsize", "is_floating_point", "_private"):
        assert module_flag(A.CAttr(A.CName("d"), attr)) is None


def _call_module_node(module: nn.Module) -> tuple[fx.Node, dict]:
    g = fx.Graph()
    node = g.call_module("m", (g.placeholder("x"),))
    return node, {"m": module}


class _Raising(nn.Module):
    @property
    def flag(self):
        raise RuntimeError("no flag here")


def _values() -> list:
    """What a module may hold under a flag's name: bools, truthy and falsy non-bools, tensors, nothing."""
    return [True, False, 0, 1, None, "yes", torch.tensor(True), torch.tensor([True, False])]


@pytest.mark.parametrize("value", _values(), ids=repr)
@pytest.mark.parametrize("negated", [False, True])
def test_the_flag_agrees_with_the_evaluator_or_defers(value, negated):
    module = nn.Identity()
    object.__setattr__(module, "flag", value) if not isinstance(value, torch.Tensor) else module.register_buffer("flag", value)
    node, modules = _call_module_node(module)
    flag = ModuleFlag("d", "flag", negated)
    cond = A.CAttr(A.CName("d"), "flag")
    cond = A.CUnary("not", cond) if negated else cond
    quick = flag.holds({"d": node}, modules.get)
    evaluator = Evaluator({}, {"d": node}, modules.get, {}.get, {}, None)
    try:
        expected = evaluator.holds(cond)
    except Exception as exc:  # the evaluator's error: the flag must have deferred to it
        assert quick is None, (value, exc)
        return
    if type(value) is bool:
        assert quick is expected is ((not value) if negated else value)
    else:
        assert quick is None  # not a plain bool: the evaluator answers


def test_the_flag_defers_for_other_nodes_missing_modules_and_raising_properties():
    flag = ModuleFlag("d", "flag", False)
    g = fx.Graph()
    x = g.placeholder("x")
    relu = g.call_function(torch.relu, (x,))
    assert flag.holds({"d": relu}, {}.get) is None  # not a module call
    assert flag.holds({}, {}.get) is None  # not bound
    node, _ = _call_module_node(nn.Identity())
    assert flag.holds({"d": node}, {}.get) is None  # no module at the target
    node, modules = _call_module_node(_Raising())
    assert flag.holds({"d": node}, modules.get) is None  # the evaluator reports the raise


def test_programs_carry_one_flag_per_condition():
    rules = fxrules.parse_rules(f"rule c: {DROP} where not d.training where d.p > 0.0 -> $x")
    (program,) = compile_rules(rules).programs
    assert program.flags == (ModuleFlag("d", "training", True), None)


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.d = nn.Dropout(0.5)

    def forward(self, x):
        return self.d(self.lin(x))


def test_a_flag_decides_the_rewrite_as_the_evaluator_would():
    rules = fxrules.parse_rules(f"rule drop: {DROP} where not d.training -> $x")
    model = fx.symbolic_trace(_Model().eval())
    out = fxrules.apply_rules(model, rules)
    assert out.counts.get("drop", 0) and not any(n.op == "call_module" and n.target == "d" for n in out.module.graph.nodes)
    training = fx.symbolic_trace(_Model().eval())
    training.d.train()
    out = fxrules.apply_rules(training, rules)
    assert not out.counts.get("drop", 0)
    assert any(n.op == "call_module" and n.target == "d" for n in out.module.graph.nodes)


def test_a_non_bool_flag_is_judged_by_the_evaluator_in_a_run():
    """`training` set to a truthy int on one module: not a bool, so the evaluator decides (truthy:
    the condition `not d.training` fails), exactly as before the flag form existed."""
    rules = fxrules.parse_rules(f"rule drop: {DROP} where not d.training -> $x")
    model = fx.symbolic_trace(_Model().eval())
    object.__setattr__(model.d, "training", 1)
    out = fxrules.apply_rules(model, rules)
    assert not out.counts.get("drop", 0)
    object.__setattr__(model.d, "training", 0)
    out = fxrules.apply_rules(model, rules)
    assert out.counts.get("drop", 0) == 1
