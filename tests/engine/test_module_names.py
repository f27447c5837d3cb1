"""The name a module made by a replacement takes.

A new module takes the name of the module it replaces (a builder's first module input, else the
root's) when nothing calls that name after the rewrite. A matched node that the rewrite keeps, or a
replacement call that calls the matched module again, still calls the name: the new module then
takes another name, or the kept node would compute with the new module (a fold of conv and batch norm
answered where the rule asked for the plain conv).
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import fx, nn

import fxrules


class ConvBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x))


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = ConvBn().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn.weight.uniform_(0.5, 2.0)
    return model


def _rule(replacement: str) -> fxrules.RuleSet:
    return fxrules.parse_rules(f"""
rule fold [approx]:
    call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn
    where not bn.training
    -> {replacement}
""", source="names.fxr")


PLAIN_CONV_KEPT = {
    # the replacement reads the matched conv node by name: it stays, calling `conv`
    "by name, after": "call_function torch.add(conv, call_module fxrules.builders.fold_conv_bn(conv, bn)($x))",
    "by name, before": "call_function torch.add(call_module fxrules.builders.fold_conv_bn(conv, bn)($x), conv)",
    "by name, shared": "call_function torch.add(call_module fxrules.builders.fold_conv_bn(conv, bn)($x) as f, "
                       "call_function torch.mul(conv, f))",
    # the replacement calls the matched conv's module again (the transaction keeps the matched node)
    "called again": "call_function torch.add(call_module conv($x), call_module fxrules.builders.fold_conv_bn(conv, bn)($x))",
    "called again, after": "call_function torch.add(call_module fxrules.builders.fold_conv_bn(conv, bn)($x), "
                           "call_module conv($x))",
    # a new node calling the conv's module on another input
    "called again on a new value": "call_function torch.add(call_module conv(call_function torch.neg($x)), "
                                   "call_module fxrules.builders.fold_conv_bn(conv, bn)($x))",
    "called again on a new value, after": "call_function torch.add(call_module fxrules.builders.fold_conv_bn(conv, bn)($x), "
                                          "call_module conv(call_function torch.neg($x)))",
}


def _expected(model: nn.Module, name: str, x: torch.Tensor) -> torch.Tensor:
    folded = model.bn(model.conv(x))
    if name == "by name, shared":
        return folded + model.conv(x) * folded
    if name == "called again on a new value":
        return model.conv(-x) + folded
    if name == "called again on a new value, after":
        return folded + model.conv(-x)
    return model.conv(x) + folded


@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
@pytest.mark.parametrize("name", sorted(PLAIN_CONV_KEPT))
def test_a_kept_or_recalled_module_keeps_its_name_and_module(name, inplace):
    model = _model()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = _expected(model, name, x)
    gm = fx.symbolic_trace(model)
    result = fxrules.apply_rules(gm, _rule(PLAIN_CONV_KEPT[name]), inplace=inplace)
    assert result.counts == {"fold": 1}
    out = result.module
    assert out.get_submodule("conv") is model.conv  # still the plain conv, under its own name
    conv_callers = [n for n in out.graph.nodes if n.op == "call_module" and n.target == "conv"]
    assert conv_callers, out.code
    fused = [n.target for n in out.graph.nodes if n.op == "call_module" and n.target != "conv"]
    assert len(fused) == 1 and isinstance(out.get_submodule(fused[0]), nn.Conv2d)
    assert out.get_submodule(fused[0]) is not model.conv
    with torch.no_grad():
        torch.testing.assert_close(out(x), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
def test_the_folded_module_takes_the_conv_name_when_nothing_else_calls_it(inplace):
    model = _model()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
    gm = fx.symbolic_trace(model)
    result = fxrules.apply_rules(gm, _rule("call_module fxrules.builders.fold_conv_bn(conv, bn)($x)"), inplace=inplace)
    out = result.module
    assert [n.target for n in out.graph.nodes if n.op == "call_module"] == ["conv"]
    assert out.conv is not model.conv and not hasattr(out, "bn")
    with torch.no_grad():
        torch.testing.assert_close(out(x), expected, rtol=1e-4, atol=1e-5)


class ConvUsedTwice(nn.Module):
    """The same conv module called twice: only one call is matched."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        return self.bn(self.conv(x)) + self.conv(x * 2)


@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
def test_a_module_called_outside_the_match_keeps_its_name(inplace):
    torch.manual_seed(0)
    model = ConvUsedTwice().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
    x = torch.randn(2, 3, 5, 5)
    with torch.no_grad():
        expected = model(x)
    result = fxrules.apply_rules(fx.symbolic_trace(model), _rule("call_module fxrules.builders.fold_conv_bn(conv, bn)($x)"),
                                 inplace=inplace)
    out = result.module
    assert result.counts == {"fold": 1}
    assert out.get_submodule("conv") is model.conv
    with torch.no_grad():
        torch.testing.assert_close(out(x), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("read", ["conv", "conv.weight"])
@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
def test_a_module_read_by_get_attr_keeps_its_name(read, inplace):
    """A get_attr node reading the conv module itself (a hand-built graph passing the module on), or a
    tensor inside it, keeps reading the plain conv: the folded module takes another name."""
    import operator

    model = _model()
    gm = fx.symbolic_trace(model)
    graph = gm.graph
    output = next(n for n in graph.nodes if n.op == "output")
    bn = output.args[0]
    with graph.inserting_before(output):
        value = graph.get_attr(read)
        if read == "conv":
            value = graph.call_function(getattr, (value, "weight"))
        total = graph.call_function(operator.add, (bn, graph.call_method("sum", (value,))))
    output.args = (total,)
    gm.recompile()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = gm(x)
    result = fxrules.apply_rules(gm, _rule("call_module fxrules.builders.fold_conv_bn(conv, bn)($x)"), inplace=inplace)
    assert result.counts == {"fold": 1}
    if read == "conv":
        assert result.module.get_submodule("conv") is model.conv
    else:  # the copy keeps what the graph reads: the weight, under its path
        assert torch.equal(result.module.get_parameter("conv.weight"), model.conv.weight)
    with torch.no_grad():
        torch.testing.assert_close(result.module(x), expected, rtol=1e-4, atol=1e-5)


def test_a_caller_left_after_a_name_was_taken_fails_the_run():
    """The check after each rewrite: a node other than the rewrite's own that still calls a name the new
    module took is an internal error (the run is undone), never a model silently computing otherwise."""
    from fxrules.engine.transaction import Workpiece, _check_name_taken

    gm = fx.symbolic_trace(_model())
    work = Workpiece(gm.graph, gm, class_name="ConvBn")
    conv = next(n for n in gm.graph.nodes if n.target == "conv")
    work.take_name("conv", nn.Identity())
    with pytest.raises(RuntimeError, match="still calls `conv`"):
        _check_name_taken(work, "conv", [])
    _check_name_taken(work, "conv", [conv])  # a node the rewrite made may call it
    with gm.graph.inserting_after(conv):
        weight = gm.graph.get_attr("conv.weight")
    work.created(weight)
    with pytest.raises(RuntimeError, match="still reads `conv`"):
        _check_name_taken(work, "conv", [conv])


# ---------------------------------------------------------------------------
# Where a new module lives: the replaced module's training mode (device and dtype: test_builders)
# ---------------------------------------------------------------------------


class CountsTrain(nn.Linear):
    calls = 0

    def train(self, mode: bool = True):
        CountsTrain.calls += 1
        return super().train(mode)


@pytest.mark.parametrize("reference_training", [False, True])
def test_a_new_module_takes_the_replaced_modules_training_mode(reference_training):
    from fxrules.engine.transaction import _place_like

    reference = nn.Linear(2, 2).train(reference_training)
    for module in (nn.Linear(2, 2).train(True), nn.Linear(2, 2).train(False),
                   nn.Sequential(nn.Linear(2, 2), nn.Dropout()).train(not reference_training),
                   nn.Sequential(nn.Linear(2, 2).train(not reference_training)).train(reference_training)):
        placed = _place_like(module, reference, training=not reference_training)
        assert all(m.training is reference_training for m in placed.modules())
    placed = _place_like(nn.Sequential(nn.Dropout()).train(not reference_training), None, reference_training)
    assert all(m.training is reference_training for m in placed.modules())
    counted = CountsTrain(2, 2).train(reference_training)
    CountsTrain.calls = 0
    _place_like(counted, reference, training=False)
    assert CountsTrain.calls == 1  # a class with its own train is always asked


# ---------------------------------------------------------------------------
# kept_nodes' shortcut for replacements that only call modules the rule makes
# ---------------------------------------------------------------------------


class ReluTwice(nn.Module):
    def forward(self, y):
        r = torch.relu(y)
        return r + r


def _matches(model: nn.Module, rules: fxrules.RuleSet) -> list:
    from fxrules.engine.matcher import GraphView, match_program
    from fxrules.engine.program import compile_rules

    gm = fx.symbolic_trace(model)
    modules = dict(gm.named_modules())
    compiled = compile_rules(rules)
    found = []
    for node in gm.graph.nodes:
        for program in compiled.programs:
            result = match_program(program, node, GraphView(modules.get), explain=False)
            if hasattr(result, "roots"):
                found.append(result)
    return found


@pytest.mark.parametrize("model, text, kept", [
    (_model(), "call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn -> "
               "call_module fxrules.builders.fold_conv_bn(conv, bn)($x)", set()),
    # $x binds the matched relu: the replacement reads it, so it stays
    (ReluTwice(), "call_function operator.add(call_function torch.relu($y) as r, $x) -> "
                  "call_module Identity{}($x)", {"relu"}),
    (ReluTwice(), "call_function operator.add(call_function torch.relu($y) as r, $x) -> "
                  "call_module Identity{}($y)", set()),
])
def test_the_shortcut_agrees_with_the_prediction(model, text, kept, monkeypatch):
    from fxrules.engine import planner

    rules = fxrules.parse_rules(f"rule r [changes]: {text}", source="kept.fxr")
    matches = _matches(model, rules)
    assert matches and all(m.program.new_calls_only for m in matches)
    for match in matches:
        fast = planner.kept_nodes(match)
        with monkeypatch.context() as patched:
            patched.setattr(planner, "_captures_matched", lambda match: True)  # always the full prediction
            full = planner.kept_nodes(match)
        assert fast.nodes == full.nodes and {n.name for n in fast.nodes} == kept


def test_a_captured_matched_node_is_kept_by_a_new_module_call():
    """The rewrite agrees: the relu the replacement reads through $x stays; the add is replaced."""
    rules = fxrules.parse_rules("rule r [changes]: call_function operator.add(call_function torch.relu($y) as r, $x)"
                                " -> call_module Identity{}($x)", source="kept.fxr")
    y = torch.randn(4)
    result = fxrules.apply_rules(fx.symbolic_trace(ReluTwice()), rules)
    assert result.counts == {"r": 1}
    torch.testing.assert_close(result.module(y), torch.relu(y))
    assert [n.op for n in result.module.graph.nodes] == ["placeholder", "call_function", "call_module", "output"]


# ---------------------------------------------------------------------------
# The builder contract: a builder returns a new module
# ---------------------------------------------------------------------------


def _builder_rule(builder: str) -> fxrules.RuleSet:
    return fxrules.parse_rules(f"""
rule fold [approx]:
    call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn
    where not bn.training
    -> call_module tests.helpers_builders.{builder}(conv, bn)($x)
""", source="contract.fxr", allow_imports=["tests"])


@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
@pytest.mark.parametrize("builder, shared", [
    ("sequential_of_inputs", "the module `conv` (as a submodule)"),
    ("first_input", "the module `conv` itself"),
    ("sharing_weight", "a tensor's storage with the module `conv`"),
    ("sharing_weight_view", "a tensor's storage with the module `conv`"),
])
def test_a_builder_returning_the_models_own_modules_or_tensors_fails_the_run(builder, shared, inplace):
    """Setting the new module's training mode would have put the model's eval-mode batch norm in training
    mode (nn.Sequential(conv, bn), the conv in training mode): the caller's model changed, and the result
    computed with batch statistics. The run fails, naming the builder and what it shares; nothing changes."""
    model = _model()
    model.conv.train()  # a conv computes the same in both modes; the batch norm is in eval mode
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
    gm = fx.symbolic_trace(model)
    code = gm.code
    with pytest.raises(fxrules.RewriteError, match=rf"contract.fxr:\d+: rule `fold` failed at node %bn: .*builder "
                                                   rf"tests.helpers_builders.{builder} returned a module that shares "
                                                   rf"{re.escape(shared)}"):
        fxrules.apply_rules(gm, _builder_rule(builder), inplace=inplace)
    assert model.bn.training is False and model.conv.training is True
    assert gm.code == code and gm.bn is model.bn and gm.conv is model.conv
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)


def test_a_builder_returning_copies_of_its_inputs_is_used():
    model = _model()  # in eval mode: the copies keep it (a new module takes the replaced module's mode)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
    result = fxrules.apply_rules(fx.symbolic_trace(model), _builder_rule("copies_inputs"))
    assert result.counts == {"fold": 1}
    assert model.bn.training is False and model.conv.training is False
    fused = result.module.get_submodule("conv")
    assert isinstance(fused, nn.Sequential) and fused[0] is not model.conv and fused[1] is not model.bn
    with torch.no_grad():
        torch.testing.assert_close(result.module(x), expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# A builder's result: the replaced module's training mode where the mode changes nothing
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
def test_a_builders_eval_mode_norm_keeps_its_mode_when_the_replaced_module_trains(inplace):
    """The conv being replaced is in training mode (a conv computes the same in both), the batch norm in eval
    mode; the builder returns copies of both. The new container and its conv take the conv's mode; the batch
    norm stays in eval mode. Setting the whole result's mode (as before) made it normalise with the batch's
    statistics: other values under [approx], with no refusal."""
    model = _model()
    model.conv.train()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
    result = fxrules.apply_rules(fx.symbolic_trace(model), _builder_rule("copies_inputs"), inplace=inplace)
    assert result.counts == {"fold": 1}
    fused = result.module.get_submodule("conv")
    assert isinstance(fused, nn.Sequential) and fused.training and fused[0].training
    assert fused[1].training is False
    with torch.no_grad():
        torch.testing.assert_close(result.module(x), expected, rtol=1e-5, atol=1e-6)
    assert model.conv.training and not model.bn.training  # the model's own modules are as they were


@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
def test_a_builders_norm_left_in_training_mode_is_put_in_eval_mode(inplace):
    """A builder that constructs a batch norm and forgets ``.eval()``, replacing a conv in eval mode: the
    engine puts it in eval mode, the contract's and the replaced module's (as it did before)."""
    model = _model()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
    result = fxrules.apply_rules(fx.symbolic_trace(model), _builder_rule("fresh_batch_norm_in_training_mode"),
                                 inplace=inplace)
    assert result.counts == {"fold": 1}
    fused = result.module.get_submodule("conv")
    assert not fused.training and not fused[0].training and not fused[1].training
    with torch.no_grad():
        torch.testing.assert_close(result.module(x), expected, rtol=1e-5, atol=1e-6)


def _code_reading_the_mode(cls: type) -> list:
    """The functions ``cls`` has from its classes below ``nn.Module`` (forward and its helpers) whose source
    reads ``training``."""
    import inspect

    found = []
    for base in cls.__mro__:
        if base in (nn.Module, object):
            continue
        for name, value in vars(base).items():
            if inspect.isfunction(value) and "training" in inspect.getsource(value):
                found.append(f"{base.__name__}.{name}")
    return found


def test_mode_independent_modules_never_read_the_training_mode():
    """Each class the engine gives a replaced module's training mode: no function it has from its own classes
    (forward, its helpers) reads ``training``; classes left out do."""
    from fxrules.engine.aliasing import MODE_INDEPENDENT_MODULES

    for cls in MODE_INDEPENDENT_MODULES:
        assert _code_reading_the_mode(cls) == [], cls
    for cls in (nn.BatchNorm2d, nn.Dropout, nn.InstanceNorm2d, nn.RReLU, nn.MultiheadAttention,
                nn.TransformerEncoderLayer):
        assert cls not in MODE_INDEPENDENT_MODULES
        assert _code_reading_the_mode(cls), cls


@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
def test_a_builders_module_that_draws_random_numbers_is_refused(inplace):
    """In a model that trains (frozen), a builder's result holding a new dropout keeps its training mode and
    would draw random numbers where the model drew none: under [approx], refused as changes-random-draws
    (it used to be applied, and the outputs changed). In an eval-mode model the dropout is put in eval mode
    and the fold is applied."""
    model = _model().train().requires_grad_(False)
    model.bn.eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
    gm = fx.symbolic_trace(model)
    code = gm.code
    result = fxrules.apply_rules(gm, _builder_rule("with_new_dropout"), inplace=inplace)
    assert result.counts == {}
    [refused] = result.report.rejected
    assert refused.code == "changes-random-draws"
    assert "builder tests.helpers_builders.with_new_dropout made for %bn draws random numbers (a Dropout in " \
           "training mode); under [approx]" in refused.reason
    assert gm.code == code
    with torch.no_grad():
        torch.testing.assert_close(result.module(x), expected, rtol=0, atol=0)

    [found] = fxrules.find_matches(fx.symbolic_trace(model), _builder_rule("with_new_dropout"))
    assert found.code == "changes-random-draws" and found.rejected == refused.reason  # what apply refuses

    model.eval()
    result = fxrules.apply_rules(fx.symbolic_trace(model), _builder_rule("with_new_dropout"), inplace=inplace)
    assert result.counts == {"fold": 1}
    assert not any(m.training for m in result.module.modules())
    with torch.no_grad():
        torch.testing.assert_close(result.module(x), model(x), rtol=1e-5, atol=1e-6)
