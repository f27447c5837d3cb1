"""Effects, values as of the match point, aliasing, subclasses (issue 20).

Each class has a deliberately wrong rule that the engine refuses (its stable code asserted),
the model's outputs kept, and the sound cases that still rewrite.
"""

from __future__ import annotations

import copy
import operator
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import fxrules
from fxrules.engine import aliasing
from fxrules.engine.aliasing import Aliasing
from fxrules.engine.matcher import computes_as
from fxrules.engine.planner import Effects
from fxrules.engine.refusals import MissCode, RefusalCode

RULES = Path(__file__).resolve().parents[2] / "rules"

CALLS: list = []


def record(x):
    """A function with a global side effect, traced as one call_function node."""
    CALLS.append(x.shape)
    return x.sum()


fx.wrap("record")


def rules(text: str) -> fxrules.RuleSet:
    return fxrules.parse_rules(text, source="effects.fxr")


def codes(result) -> list:
    return [r.code for r in result.report.rejected]


def same(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return all(same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)


# ---------------------------------------------------------------------------
# Effects: unknown callables
# ---------------------------------------------------------------------------


class Records(nn.Module):
    def forward(self, x):
        r = record(x)
        return x + r * 0


def test_a_wrapped_function_left_unused_by_a_rewrite_survives():
    result = fxrules.apply_rules(Records(), rules(
        "rule drop [changes]: call_function operator.add($x, call_function operator.mul($y, 0)) -> $x"))
    assert result.counts == {"drop": 1}
    assert record in [n.target for n in result.module.graph.nodes]  # dead, and kept: it has an effect
    CALLS.clear()
    result.module(torch.ones(3))
    assert CALLS == [torch.Size([3])]


def test_which_calls_are_known_pure():
    graph = fx.Graph()
    x = graph.placeholder("x")
    nodes = {
        "relu": graph.call_function(torch.relu, (x,)),
        "F.relu": graph.call_function(F.relu, (x,)),
        "add": graph.call_function(operator.add, (x, 1)),
        "aten": graph.call_function(torch.ops.aten.relu.default, (x,)),
        "method": graph.call_method("sum", (x,)),
        "record": graph.call_function(record, (x,)),
        "print": graph.call_function(print, (x,)),
        "unknown method": graph.call_method("update", (x,)),
        "add_": graph.call_method("add_", (x, 1)),
    }
    effects = Effects({}.get)
    found = {name: effects.side_effect(node) for name, node in nodes.items()}
    assert found["relu"] is found["F.relu"] is found["add"] is found["aten"] is found["method"] is None
    assert "cannot prove pure" in found["record"] and "cannot prove pure" in found["unknown method"]
    assert found["print"] == "%print_1 calls print, which has a side effect"
    assert found["add_"] == "%add__1 modifies its input in place" or "modifies its input in place" in found["add_"]
    assert effects.mutated_inputs(nodes["record"]) == [x]  # an unknown call may write what it is passed
    assert effects.declared_writes(nodes["record"]) == []  # ... but declares nothing


class Leaf(nn.Module):
    def forward(self, x):
        return x * 2


class LeafTracer(fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, Leaf) or super().is_leaf_module(m, qualname)


def test_a_user_leaf_module_is_unknown_and_kept_when_unused():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.leaf = Leaf()

        def forward(self, x):
            return x + self.leaf(x) * 0

    result = fxrules.apply_rules(M(), rules(
        "rule drop [changes]: call_function operator.add($x, call_function operator.mul($y, 0)) -> $x"),
        tracer=LeafTracer())
    assert result.counts == {"drop": 1}
    assert [n.target for n in result.module.graph.nodes if n.op == "call_module"] == ["leaf"]


# ---------------------------------------------------------------------------
# Effects: random draws
# ---------------------------------------------------------------------------


class DropoutThenRandom(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(x) + torch.rand_like(x)


def seeded_call(module, x, seed=0):
    torch.manual_seed(seed)
    return module(x)


def test_removing_a_train_mode_dropout_is_refused_under_approx_and_outputs_kept():
    model = DropoutThenRandom().train()
    result = fxrules.apply_rules(model, rules("rule wrong [approx]: call_module Dropout($x) -> $x"))
    assert result.counts == {} and codes(result) == [RefusalCode.CHANGES_RANDOM_DRAWS]
    x = torch.randn(4, 8)
    assert torch.equal(seeded_call(result.module, x), seeded_call(model, x))


def test_eval_mode_dropout_draws_nothing_and_is_removed():
    model = DropoutThenRandom().eval()
    result = fxrules.apply_rules(model, fxrules.load_rules(RULES / "cleanup" / "dropout.fxr"))
    assert result.counts == {"remove_dropout": 1}
    x = torch.randn(4, 8)
    assert torch.equal(seeded_call(result.module, x), seeded_call(model, x))


def test_changes_may_change_random_draws():
    result = fxrules.apply_rules(DropoutThenRandom().train(),
                                 rules("rule r [changes]: call_module Dropout($x) -> $x"))
    assert result.counts == {"r": 1}


def random_unused() -> fx.GraphModule:
    """``x + aten.rand_like(x) * 0`` and a second draw after it (torch calls ``aten.rand_like`` pure:
    left unused, it would be erased; torch.fx keeps ``torch.rand_like`` itself)."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    drawn = graph.call_function(torch.ops.aten.rand_like.default, (x,))
    added = graph.call_function(operator.add, (x, graph.call_function(operator.mul, (drawn, 0))))
    graph.output((added, graph.call_function(torch.ops.aten.rand_like.default, (x,))))
    return fx.GraphModule(nn.Module(), graph)


def test_a_random_input_the_rewrite_would_leave_unused_is_refused():
    text = "rule r [{}]: call_function operator.add($x, call_function operator.mul($y, 0)) -> $x"
    model = random_unused()
    result = fxrules.apply_rules(model, rules(text.format("approx")))
    assert codes(result) == [RefusalCode.CHANGES_RANDOM_DRAWS] and result.report.rejected[0].nodes == ("rand_like_default",)
    x = torch.randn(3)
    assert same(seeded_call(result.module, x), seeded_call(model, x))
    changed = fxrules.apply_rules(model, rules(text.format("changes")))
    assert changed.counts == {"r": 1}
    assert not same(seeded_call(changed.module, x)[1], seeded_call(model, x)[1])  # what [approx] refused


def _sigmoid_times_zero() -> fx.GraphModule:
    """``x + sigmoid(x) * 0``: nothing in it draws random numbers."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    scaled = graph.call_function(operator.mul, (graph.call_function(torch.sigmoid, (x,)), 0))
    graph.output(graph.call_function(operator.add, (x, scaled)))
    return fx.GraphModule(nn.Module(), graph)


DROP_ZERO = "rule b_drop_zero [approx]: call_function operator.add($x, call_function operator.mul($y, 0)) -> $x\n"


def test_a_random_input_made_by_an_earlier_rewrite_of_the_run_is_still_refused():
    """The planner skips its walk for inputs left unused while no node of the graph draws random numbers
    (Effects.random_nodes, found once per run); a draw that an earlier rewrite of the same run creates joins
    that set, so the later [approx] match that would leave it unused is refused as on a graph that had it."""
    text = ("rule a_make_draw [changes]: call_function torch.sigmoid($y) -> "
            "call_function torch.ops.aten.rand_like.default($y)\n" + DROP_ZERO)
    result = fxrules.apply_rules(_sigmoid_times_zero(), rules(text))
    assert result.counts == {"a_make_draw": 1}
    assert codes(result) == [RefusalCode.CHANGES_RANDOM_DRAWS] and result.report.rejected[0].nodes == ("rand_like_default",)
    assert [n.target for n in result.module.graph.nodes if n.op == "call_function"] == \
        [torch.ops.aten.rand_like.default, operator.mul, operator.add]


def test_without_random_draws_the_unused_inputs_are_not_walked(monkeypatch):
    """The fast path itself: on a graph with no random draw the walk for unused inputs does not run,
    and the rewrite is made; with one, it runs (and refuses, as above)."""
    from fxrules.engine import planner

    walked = []
    original = planner._left_unused
    monkeypatch.setattr(planner, "_left_unused", lambda *a: walked.append(1) or original(*a))
    result = fxrules.apply_rules(_sigmoid_times_zero(), rules(DROP_ZERO))
    assert result.counts == {"b_drop_zero": 1} and walked == []
    result = fxrules.apply_rules(random_unused(), rules(DROP_ZERO))
    assert codes(result) == [RefusalCode.CHANGES_RANDOM_DRAWS] and walked == [1]


def test_the_one_walk_finds_what_each_node_says():
    """Effects._scan (the run's one walk for writers, module writers and random draws) agrees, node by
    node, with mutated_inputs, _module_entry and draws_random on a graph with every kind of node."""
    class Unknown(nn.Module):
        def forward(self, x):
            return x * 2

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.relu_ = nn.ReLU(inplace=True)
            self.relu = nn.ReLU()
            self.bn = nn.BatchNorm1d(4)  # train mode: updates its statistics
            self.drop = nn.Dropout(0.5)  # train mode: draws
            self.unknown = Unknown()
            self.hooked = nn.Linear(4, 4)
            self.hooked.register_forward_hook(lambda m, a, out: None)
            self.eval_drop = nn.Dropout(0.5).eval()

        def forward(self, x):
            y = self.relu(x + 1)
            y = self.relu_(y * 2)
            y = self.bn(y)
            y = self.drop(y) + self.eval_drop(y)
            y = self.unknown(y) + self.hooked(y)
            z = y.clone()
            z.add_(1)
            w = torch.sigmoid(y, out=torch.empty_like(y))
            r = F.dropout(y, 0.3, True) + F.dropout(y, 0.3, False) + torch.rand_like(y) + y.bernoulli()
            return F.relu(z, inplace=True) + F.gelu(w) + r + torch.empty_like(y).uniform_()

    class KeepUnknown(fx.Tracer):
        def is_leaf_module(self, m, qualname):
            return isinstance(m, Unknown) or super().is_leaf_module(m, qualname)

    model = Model().train()
    model.eval_drop.eval()
    gm = fx.GraphModule(model, KeepUnknown().trace(model))
    from fxrules.engine.transaction import Workpiece

    work = Workpiece(gm.graph, gm, class_name="Model")
    effects = work.effects
    writers = effects.writers(gm.graph)
    module_writers = set(effects._writers[1])
    drawing = effects.random_nodes(gm.graph)
    reference = Effects(work.module_of, work.attr_of)
    calls = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]
    assert list(writers) == [n for n in calls if reference.mutated_inputs(n)]
    assert module_writers == {n for n in calls if n.op == "call_module" and reference._module_entry(n)[1]}
    assert list(drawing) == [n for n in calls if reference.draws_random(n)]
    names = lambda found: sorted(n.name for n in found)  # noqa: E731
    assert names(writers) == ["add_", "relu_", "relu_1", "sigmoid", "uniform_", "unknown"]
    assert names(module_writers) == ["bn", "hooked"]  # Unknown holds no tensor: its call writes none itself
    assert names(drawing) == ["bernoulli", "drop", "dropout", "rand_like", "uniform_"]


def test_a_replacement_that_adds_a_random_draw_is_refused():
    class M(nn.Module):
        def forward(self, x):
            return torch.relu(x)

    # the checker refuses it first (random-state, tests/security/test_introduced.py); the engine's own
    # refusal is for rule sets that skipped the checker
    with pytest.raises(fxrules.RuleFileError) as info:
        rules("rule r [approx]: call_function torch.relu($x) -> call_function F.dropout(call_function F.relu($x), 0.5, True)")
    assert [d.code for d in info.value.diagnostics] == ["random-state"]


# ---------------------------------------------------------------------------
# Effects: hooks
# ---------------------------------------------------------------------------


class Doubler(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5).eval()

    def forward(self, x):
        return self.drop(x)


@pytest.mark.parametrize("kind", ["forward", "forward_pre"])
def test_a_module_with_hooks_is_not_removed(kind):
    model = Doubler().eval()
    if kind == "forward":
        model.drop.register_forward_hook(lambda module, args, output: output * 2)
    else:
        model.drop.register_forward_pre_hook(lambda module, args: (args[0] * 2,))
    result = fxrules.apply_rules(model, fxrules.load_rules(RULES / "cleanup" / "dropout.fxr"))
    assert result.counts == {} and codes(result) == [RefusalCode.MODULE_HAS_HOOKS]
    x = torch.randn(2, 3)
    assert torch.equal(result.module(x), model(x)) and torch.equal(model(x), x * 2)


def test_global_module_hooks_refuse_module_rewrites():
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, output: None)
    try:
        result = fxrules.apply_rules(Doubler().eval(), fxrules.load_rules(RULES / "cleanup" / "dropout.fxr"))
        assert codes(result) == [RefusalCode.MODULE_HAS_HOOKS]
        assert "global forward_hooks" in result.report.rejected[0].reason
    finally:
        handle.remove()
    assert fxrules.apply_rules(Doubler().eval(), fxrules.load_rules(RULES / "cleanup" / "dropout.fxr")).counts == {
        "remove_dropout": 1}


# ---------------------------------------------------------------------------
# Subclasses
# ---------------------------------------------------------------------------


class ChecksInput(nn.BatchNorm2d):
    def _check_input_dim(self, input):
        raise ValueError("never 4-D")


class OwnForward(nn.BatchNorm2d):
    def forward(self, x):
        return super().forward(x) * 2


class Describes(nn.BatchNorm2d):
    def describe(self):
        return "a batch norm"


class EpsProperty(nn.BatchNorm2d):
    @property
    def momentum_now(self):
        return self.momentum

    @momentum_now.setter
    def momentum_now(self, value):
        self.momentum = value


class EpsDefault(nn.BatchNorm2d):
    eps = 0.5  # the name of the instance's own state: not matched (the instance's value wins, but it is not checked)


class Constructs(nn.BatchNorm2d):
    def __init__(self, n):
        super().__init__(n, eps=1e-3)

    def extra_repr(self):
        return "constructed"


class BatchNormLeaves(fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, nn.BatchNorm2d) or super().is_leaf_module(m, qualname)


@pytest.mark.parametrize("cls, matches", [
    (nn.BatchNorm2d, True), (Describes, True), (Constructs, True),
    (ChecksInput, False), (OwnForward, False), (EpsProperty, False), (EpsDefault, False),
], ids=lambda v: v.__name__ if isinstance(v, type) else str(v))
def test_a_module_pattern_matches_a_subclass_only_when_it_overrides_nothing_used(cls, matches):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = cls(4)

        def forward(self, x):
            return self.bn(self.conv(x))

    model = M().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
    library = fxrules.load_rules(RULES / "fold" / "conv_bn.fxr")
    result = fxrules.apply_rules(model, library, tracer=BatchNormLeaves())
    assert bool(result.counts) is matches
    if not matches:
        misses = fxrules.explain(model, library.select(names=["fold_conv2d_bn"]), tracer=BatchNormLeaves())
        assert [m.code for m in misses] == [MissCode.TARGET_MISMATCH]
    x = torch.randn(2, 3, 8, 8)
    if cls is ChecksInput:
        with pytest.raises(ValueError):
            result.module(x)  # still the subclass, still checking
    else:
        torch.testing.assert_close(result.module(x), model(x))


def test_computes_as_compares_class_dictionaries():
    assert computes_as(Describes, nn.BatchNorm2d) and computes_as(Constructs, nn.BatchNorm2d)
    assert not computes_as(ChecksInput, nn.BatchNorm2d)  # _BatchNorm's method
    assert not computes_as(OwnForward, nn.BatchNorm2d)
    assert computes_as(ChecksInput, ChecksInput)


# ---------------------------------------------------------------------------
# Values as of the match point
# ---------------------------------------------------------------------------


def written_buffer(write) -> fx.GraphModule:
    """``write(graph, b)`` somewhere in a graph that returns ``x + b``."""
    root = nn.Module()
    root.register_buffer("b", torch.zeros(3))
    graph = fx.Graph()
    x = graph.placeholder("x")
    write(graph, graph.get_attr("b"))
    graph.output(graph.call_function(torch.add, (x, graph.get_attr("b"))))
    return fx.GraphModule(root, graph)


WRITES = {
    "add_": lambda g, b: g.call_method("add_", (b, 1)),
    "through a view": lambda g, b: g.call_method("add_", (g.call_method("view", (b, -1)), 1)),
    "through a view of a view": lambda g, b: g.call_method(
        "fill_", (g.call_method("unsqueeze", (g.call_method("view", (b, -1)), 0)), 1.0)),
    "aten.copy_": lambda g, b: g.call_function(torch.ops.aten.copy_.default,
                                               (b, g.call_function(torch.ops.aten.ones.default, ([3],)))),
    "getitem": lambda g, b: g.call_method("zero_", (g.call_function(operator.getitem, (b, 0)),)),
    "a split piece": lambda g, b: g.call_method(
        "add_", (g.call_function(operator.getitem, (g.call_method("split", (b, 1)), 2)), 1)),
}

ADD_ZERO = "rule wrong [approx]: call_function torch.add($x, get_attr $b) where {} -> $x"


@pytest.mark.parametrize("write", list(WRITES))
def test_a_condition_reading_a_written_buffer_does_not_pass(write):
    model = written_buffer(WRITES[write])
    x = torch.randn(3)
    expected = model(x)  # runs the write: b is no longer zero
    model.b.zero_()
    for condition in ("is_zero($b)", "not is_zero($b)", "not is_one($b)", "$b[0] == 0", "not ($b[0] == 1)"):
        result = fxrules.apply_rules(model, rules(ADD_ZERO.format(condition)))
        assert result.counts == {}, condition
        misses = fxrules.explain(model, rules(ADD_ZERO.format(condition)))
        assert [m.code for m in misses] == [MissCode.CONDITION_FALSE]
    assert torch.equal(result.module(x), expected)
    # metadata is still known
    assert fxrules.apply_rules(model, rules(ADD_ZERO.format("$b.ndim == 1"))).counts == {"wrong": 1}


def test_the_same_condition_passes_without_the_write():
    model = written_buffer(lambda g, b: None)
    assert fxrules.apply_rules(model, rules(ADD_ZERO.format("is_zero($b)"))).counts == {"wrong": 1}


def test_a_tied_parameter_written_under_another_name_is_written():
    root = nn.Module()
    root.register_buffer("b", torch.zeros(3))
    root.sub = nn.Module()
    root.sub.register_buffer("c", root.b)  # the same tensor under a second name
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.call_method("add_", (graph.get_attr("sub.c"), 1))
    graph.output(graph.call_function(torch.add, (x, graph.get_attr("b"))))
    model = fx.GraphModule(root, graph)
    assert fxrules.apply_rules(model, rules(ADD_ZERO.format("is_zero($b)"))).counts == {}


def test_a_module_tensor_read_through_a_name_is_as_of_the_match_point():
    root = nn.Module()
    root.norm = nn.BatchNorm1d(3).eval()
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.call_method("add_", (graph.get_attr("norm.running_mean"), 1))
    graph.output(graph.call_module("norm", (x,)))
    model = fx.GraphModule(root, graph)
    text = "rule wrong [changes]: call_module BatchNorm1d($x) as n where {} -> $x"
    assert fxrules.apply_rules(model, rules(text.format("is_zero(n.running_mean)"))).counts == {}
    assert fxrules.apply_rules(model, rules(text.format("not is_one(n.running_mean)"))).counts == {}
    assert fxrules.apply_rules(model, rules(text.format("n.running_mean.shape[0] == 3"))).counts == {"wrong": 1}


def test_a_train_mode_norm_updates_its_statistics():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.BatchNorm1d(3)

        def forward(self, x):
            return self.norm(x)

    text = "rule wrong [changes]: call_module BatchNorm1d($x) as n where is_zero(n.running_mean) -> $x"
    result = fxrules.apply_rules(M().train(), rules(text))
    assert result.counts == {}
    assert fxrules.apply_rules(M().eval(), rules(text)).counts == {"wrong": 1}


def test_a_builder_does_not_read_a_written_buffer():
    root = nn.Module()
    root.conv = nn.Conv2d(3, 4, 3)
    root.bn = nn.BatchNorm2d(4).eval()
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.call_method("add_", (graph.get_attr("bn.running_mean"), 1))
    graph.output(graph.call_module("bn", (graph.call_module("conv", (x,)),)))
    model = fx.GraphModule(root, graph)
    result = fxrules.apply_rules(model, fxrules.load_rules(RULES / "fold" / "conv_bn.fxr"))
    assert codes(result) == [RefusalCode.READS_WRITTEN_VALUE]
    x = torch.randn(1, 3, 6, 6)
    expected = model(x)
    model.bn.running_mean.sub_(1)
    assert torch.equal(result.module(x), expected)


def _conv_bn_graph(write: bool) -> fx.GraphModule:
    root = nn.Module()
    root.conv = nn.Conv2d(3, 4, 3)
    root.bn = nn.BatchNorm2d(4).eval()
    graph = fx.Graph()
    x = graph.placeholder("x")
    if write:
        graph.call_method("add_", (graph.get_attr("bn.running_mean"), 1))
    graph.output(graph.call_module("bn", (graph.call_module("conv", (x,)),)))
    return fx.GraphModule(root, graph)


@pytest.mark.parametrize("case", ["eval", "buffer written", "train-mode norm", "global hook", "unknown module"])
def test_nothing_written_is_is_written_for_every_tensor(case):
    """Effects.nothing_written (reads-written-value's fast path) is True exactly when is_written is False
    for every tensor of the model; the refusal is still made whenever something is written."""
    from fxrules.engine.transaction import Workpiece

    gm = _conv_bn_graph(write=case == "buffer written")
    if case == "train-mode norm":
        gm.bn.train()
    if case == "unknown module":
        class Opaque(nn.Module):
            def __init__(self):
                super().__init__()
                self.scale = nn.Parameter(torch.ones(1))

            def forward(self, x):
                return x * self.scale

        gm.add_submodule("opaque", Opaque())
        node = next(n for n in gm.graph.nodes if n.op == "output")
        with gm.graph.inserting_before(node):
            gm.graph.call_module("opaque", (next(iter(gm.graph.nodes)),))
        gm.recompile()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, out: None) \
        if case == "global hook" else None
    try:
        work = Workpiece(gm.graph, gm, class_name="M")
        effects = work.effects
        tensors = [t for m in gm.modules() for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False))]
        written = [effects.is_written(gm.graph, t) for t in tensors]
        assert effects.nothing_written(gm.graph) == (case == "eval") == (not any(written))
        result = fxrules.apply_rules(gm, fxrules.load_rules(RULES / "fold" / "conv_bn.fxr"))
        # the fold's own later refusal (the module is in training mode, so its parameters are trainable)
        # where the builder reads nothing written; reads-written-value where it would
        expected = {"eval": RefusalCode.TRAINABLE_PARAMETER_DROPPED, "unknown module": RefusalCode.TRAINABLE_PARAMETER_DROPPED,
                    "buffer written": RefusalCode.READS_WRITTEN_VALUE, "global hook": RefusalCode.MODULE_HAS_HOOKS}
        assert codes(result) == ([expected[case]] if case in expected else [])  # a train-mode bn: no match
    finally:
        if handle is not None:
            handle.remove()


# ---------------------------------------------------------------------------
# Aliasing
# ---------------------------------------------------------------------------


def test_bases_follow_schemas_tables_and_unknown_calls():
    graph = fx.Graph()
    x = graph.placeholder("x")
    view = graph.call_method("view", (x, -1))
    piece = graph.call_function(operator.getitem, (graph.call_method("split", (view, 2)), 0))
    aten_view = graph.call_function(torch.ops.aten.view.default, (x, [-1]))
    aten_split = graph.call_function(torch.ops.aten.split.Tensor, (x, 2))
    inplace = graph.call_method("add_", (x, 1))
    fresh = graph.call_function(torch.relu, (x,))
    aten_fresh = graph.call_function(torch.ops.aten.clone.default, (x,))
    unknown = graph.call_function(record, (x,))
    transposed = graph.call_function(getattr, (fresh, "T"))
    shape = graph.call_function(getattr, (fresh, "shape"))
    graph.output((piece, aten_view, aten_split, inplace, unknown, transposed, shape, aten_fresh))
    analysis = Aliasing({}.get, None, lambda m: True)
    assert analysis.bases(view) == (x,) and analysis.bases(aten_view) == (x,) and analysis.bases(aten_split) == (x,)
    assert analysis.bases(inplace) == (x,) and analysis.bases(unknown) == (x,)
    assert analysis.bases(fresh) == () and analysis.bases(aten_fresh) == () and analysis.bases(shape) == ()
    assert analysis.bases(transposed) == (fresh,)
    assert analysis.roots(piece) == {x}
    tree = analysis.storage_tree(piece)
    assert {view, piece, aten_view, aten_split, inplace, unknown} <= set(tree) and fresh not in tree


def test_schema_positions_give_the_nodes_passed_there():
    """What an operator's schema says (the arguments its outputs alias, the ones it writes) is read once
    per target as positions; the nodes are then taken from each call, positionally or by keyword."""
    aten = torch.ops.aten
    assert aliasing.schema_alias_positions(aten.relu.default) == ()
    assert aliasing.schema_write_positions(aten.relu.default) == ()
    assert aliasing.schema_alias_positions(aten.transpose.int) == ((0, "self"),)
    assert aliasing.schema_alias_positions(aten.split.Tensor) == ((0, "self"),)  # Tensor(a -> *)[]
    assert aliasing.schema_write_positions(aten.add_.Tensor) == ((0, "self"),)
    assert aliasing.schema_write_positions(aten._foreach_add_.Scalar) == ((0, "self"),)
    assert aliasing.schema_alias_positions(aten._foreach_add_.Scalar) == ()  # returns nothing
    graph = fx.Graph()
    x, y, z = graph.placeholder("x"), graph.placeholder("y"), graph.placeholder("z")
    out_kw = graph.call_function(aten.add.out, (x, y), {"out": z})
    out_pos = graph.call_function(aten.add.out, (x, y, 1, z))
    foreach = graph.call_function(aten._foreach_add_.Scalar, ([x, y], 1.0))
    written = graph.call_function(aten.add_.Tensor, (y, x))
    transposed = graph.call_function(aten.transpose.int, (written, 0, 1))
    graph.output((out_kw, out_pos, foreach, transposed))
    analysis = Aliasing({}.get, None, lambda m: True)
    assert analysis.bases(out_kw) == (z,) and analysis.bases(out_pos) == (z,)
    assert analysis.bases(foreach) == () and analysis.bases(written) == (y,) and analysis.bases(transposed) == (written,)
    effects = Effects({}.get)
    assert effects.mutated_inputs(out_kw) == [z] and effects.mutated_inputs(out_pos) == [z]
    assert effects.mutated_inputs(foreach) == [x, y] and effects.mutated_inputs(written) == [y]
    assert effects.mutated_inputs(transposed) == []
    assert list(effects.writers(graph)) == [out_kw, out_pos, foreach, written]


class _MulOneThenWrite(nn.Module):
    def __init__(self, write: bool):
        super().__init__()
        self.write = write

    def forward(self, x):
        y = x * 1
        if self.write:
            y.add_(1)
        return y


@pytest.mark.parametrize("write", [False, True])
def test_an_exported_module_s_input_guard_hides_no_later_write(write):
    """``ExportedProgram.module()`` calls its ``_guards_fn`` (a module the engine does not know, so a
    writer of its inputs) at the top of the graph. The checks for a later write are skipped only
    where no writer follows the match: an in-place write after it is still seen."""
    gm = torch.export.export(_MulOneThenWrite(write), (torch.randn(2, 3),)).module()
    assert any(n.op == "call_module" and n.target == "_guards_fn" for n in gm.graph.nodes)
    rule = ("rule mul_one: call_function aten.mul.Tensor($x, 1)\n"
            "    where $x.dtype != torch.bool and $x.is_contiguous()\n    -> $x")
    result = fxrules.apply_rules(gm, fxrules.parse_rules(rule))
    if write:
        assert sum(result.counts.values()) == 0 and codes(result) == [RefusalCode.REPLACED_NODE_MUTATED]
    else:
        assert result.counts == {"mul_one": 1} and codes(result) == []
        x = torch.randn(2, 3)
        assert torch.equal(result.module(x), x)


class MulOneWrittenThroughView(nn.Module):
    def forward(self, x):
        y = x * 1
        y.view(-1)[0:2].fill_(5.0)  # a write to a view of a view of y
        return x, y


class MulOneWrittenThroughPiece(nn.Module):
    def forward(self, x):
        y = x * 1
        first, _ = y.split(1)
        first.zero_()
        return x, y


class InputWrittenThroughViewLater(nn.Module):
    def forward(self, x):
        y = x * 1
        x.view(-1).add_(1)
        return y + 0


class ReadAcrossViewWrite(nn.Module):
    def forward(self, x):
        a = x * 1
        b = torch.neg(a)
        a.view(-1).add_(100)
        return torch.relu(b)


MUL_ONE = "rule wrong: call_function operator.mul($x, 1) -> $x"


@pytest.mark.parametrize("model_class, text, code", [
    (MulOneWrittenThroughView, MUL_ONE, RefusalCode.REPLACED_NODE_MUTATED),
    (MulOneWrittenThroughPiece, MUL_ONE, RefusalCode.REPLACED_NODE_MUTATED),
    (InputWrittenThroughViewLater, MUL_ONE, RefusalCode.ALIAS_MUTATED_LATER),
    (ReadAcrossViewWrite, "rule wrong: call_function torch.relu(call_function torch.neg($a))"
     " -> call_function F.relu(call_function torch.neg($a))", RefusalCode.READS_ACROSS_MUTATION),
], ids=lambda v: v.__name__ if isinstance(v, type) else "")
def test_writes_through_views_are_seen(model_class, text, code):
    model = model_class()
    result = fxrules.apply_rules(model, rules(text))
    assert codes(result) == [code]
    x = torch.randn(2, 3)
    assert same(result.module(x.clone()), model(x.clone()))


def test_a_rewrite_of_a_view_whose_result_is_written_is_refused():
    class M(nn.Module):
        def forward(self, x):
            y = x.reshape(-1).reshape(2, 3)
            y.add_(1)
            return x

    result = fxrules.apply_rules(M(), fxrules.load_rules(RULES / "cleanup" / "reshape.fxr").select(
        names=["reshape_chain"]))
    assert codes(result) == [RefusalCode.REPLACED_NODE_MUTATED]


def test_a_replacement_may_write_a_value_it_made():
    class M(nn.Module):
        def forward(self, x):
            return torch.relu(x * 2), x

    result = fxrules.apply_rules(M(), rules(
        "rule r: call_function torch.relu(call_function operator.mul($x, 2))"
        " -> call_method relu_(call_function operator.mul($x, 2))"))
    assert result.counts == {"r": 1}
    x = torch.randn(3)
    assert same(result.module(x.clone()), M()(x.clone()))


# ---------------------------------------------------------------------------
# Outputs that alias
# ---------------------------------------------------------------------------


def test_an_output_may_not_come_to_alias_a_parameter_or_another_output():
    class Param(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return self.w * 1 + 0, self.w * 1

    class TwoOutputs(nn.Module):
        def forward(self, x):
            return x * 1, x

    for model_class, origin in ((Param, "w"), (TwoOutputs, "x")):
        result = fxrules.apply_rules(model_class(), rules(MUL_ONE))
        refused = [r for r in result.report.rejected if r.code is RefusalCode.OUTPUT_ALIAS_INTRODUCED]
        assert [r.nodes[1] for r in refused] == [origin]


# ---------------------------------------------------------------------------
# clone and detach removal (rules/cleanup/copies.fxr)
# ---------------------------------------------------------------------------


COPIES = RULES / "cleanup" / "copies.fxr"


class CloneThenUse(nn.Module):
    def forward(self, x):
        return torch.relu(x).clone() * 2


class CloneWrittenThroughView(nn.Module):
    def forward(self, x):
        a = torch.relu(x)
        y = a.clone()
        y[:, 0].zero_()
        return a + 0, y + 0


class CloneThenSourceWritten(nn.Module):
    def forward(self, x):
        a = torch.relu(x)
        y = a.clone()
        a.add_(1)
        return a + 0, y + 0


class CloneReturned(nn.Module):
    def forward(self, x):
        return x.clone()


class CloneChannelsLast(nn.Module):
    def forward(self, x):
        return torch.relu(x).clone(memory_format=torch.channels_last) * 1


class CloneTransposed(nn.Module):
    def forward(self, x):
        return torch.relu(x).t().clone() * 1


@pytest.mark.parametrize("model_class, applied, code", [
    (CloneThenUse, True, None),
    (CloneWrittenThroughView, False, RefusalCode.REPLACED_NODE_MUTATED),
    (CloneThenSourceWritten, False, RefusalCode.ALIAS_MUTATED_LATER),
    (CloneReturned, False, RefusalCode.OUTPUT_ALIAS_INTRODUCED),
    (CloneChannelsLast, False, None),
    (CloneTransposed, False, None),
], ids=lambda v: v.__name__ if isinstance(v, type) else "")
def test_clone_removal(model_class, applied, code):
    model = model_class()
    x = torch.randn(2, 3, 4, 4) if model_class is CloneChannelsLast else torch.randn(2, 3)
    result = fxrules.apply_rules(model, fxrules.load_rules(COPIES).select(names=["clone_noop"]),
                                 example_inputs=(x,))
    assert bool(result.counts) is applied
    assert [r.code for r in result.report.rejected] == ([] if code is None else [code])
    out, expected = result.module(x.clone()), model(x.clone())
    assert same(out, expected)
    if model_class is CloneReturned:
        assert out.data_ptr() != x.data_ptr()


def test_detach_removal_only_for_integer_and_bool_tensors():
    class M(nn.Module):
        def forward(self, x):
            return torch.argmax(x, 1).detach() * 2, torch.relu(x).detach() * 2

    x = torch.randn(2, 8)
    result = fxrules.apply_rules(M(), fxrules.load_rules(COPIES).select(names=["detach_int_noop"]),
                                 example_inputs=(x,))
    assert result.counts == {"detach_int_noop": 1}
    assert [n.target for n in result.module.graph.nodes if n.op == "call_method"] == ["detach"]
    assert same(result.module(x), M()(x))


def test_the_private_torch_members_this_reads():
    from fxrules.engine import fxaccess

    aten = torch.ops.aten
    assert fxaccess.is_op_packet(aten.add) and not fxaccess.is_op_packet(aten.add.Tensor)
    assert fxaccess.op_name(aten.dropout.default) == "dropout"
    assert fxaccess.op_draws_random(aten.bernoulli.default) and not fxaccess.op_draws_random(aten.relu.default)
    assert fxaccess.global_hook_kinds() == []
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda module, args: None)
    try:
        assert fxaccess.global_hook_kinds() == ["forward_pre_hooks"]
    finally:
        handle.remove()


def test_writers_follow_created_and_erased_nodes():
    """Effects.writers (the nodes writing an input in place, found once per run) is kept by the
    workpiece: a new in-place node joins, an erased one leaves; a new module under a new name changes
    no existing node."""
    from fxrules.engine.transaction import Workpiece

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.act = torch.nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(x + 1)

    gm = torch.fx.symbolic_trace(Model())
    work = Workpiece(gm.graph, gm, class_name="Model")
    effects = work.effects
    act = next(n for n in gm.graph.nodes if n.op == "call_module")
    assert list(effects.writers(gm.graph)) == [act]
    name = work.add_module("act", torch.nn.ReLU())
    assert name != "act" and list(effects.writers(gm.graph)) == [act]
    add = next(n for n in gm.graph.nodes if n.op == "call_function")
    with gm.graph.inserting_after(add):
        written = work.new_node("call_method", "add_", (add, 1), {})
    work.created(written)
    assert set(effects.writers(gm.graph)) == {act, written}
    # writes_after: whether some writer follows a node, the last writer remembered as the set changes
    placeholder = next(iter(gm.graph.nodes))
    assert effects.writes_after(placeholder) and effects.writes_after(add) and effects.writes_after(written)
    assert not effects.writes_after(act)  # the writers are add_ (before act) and act: none after act
    work.erase(written)
    assert list(effects.writers(gm.graph)) == [act]
    assert effects.writes_after(add) and not effects.writes_after(act)
    with gm.graph.inserting_after(act):
        later = work.new_node("call_method", "mul_", (act, 2), {})
    work.created(later)
    assert effects.writes_after(act) and not effects.writes_after(later)
    work.erase(later)
    assert not effects.writes_after(act)
    # the same answer as a fresh walk
    fresh = Workpiece(gm.graph, gm, class_name="Model")
    fresh.new_modules.update(work.new_modules)
    assert list(fresh.effects.writers(gm.graph)) == [act]


# ---------------------------------------------------------------------------
# Instance-level overrides: the module object, not its class, replaces code
# ---------------------------------------------------------------------------


def _conv_bn_dropout_relu() -> nn.Module:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Dropout(0.1), nn.ReLU()).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
    return model


OVERRIDES = {
    "forward, a lambda": lambda m: setattr(m[1], "forward", lambda x, f=m[1].forward: f(x) * 2),
    "forward, a bound method": lambda m: setattr(m[2], "forward", types.MethodType(lambda self, x: x + 1, m[2])),
    "_check_input_dim": lambda m: setattr(m[1], "_check_input_dim", lambda x: None),
    "_conv_forward": lambda m: setattr(m[0], "_conv_forward",
                                       lambda x, w, b, f=m[0]._conv_forward: f(x, w * 2, b)),
}


@pytest.mark.parametrize("override", sorted(OVERRIDES))
def test_a_module_whose_instance_overrides_a_method_is_not_matched(override):
    model = _conv_bn_dropout_relu()
    x = torch.randn(1, 3, 8, 8)
    untouched = fxrules.apply_rules(_conv_bn_dropout_relu(), fxrules.load_rules(RULES / "fold", RULES / "cleanup"),
                                    example_inputs=(x,))
    assert untouched.counts == {"fold_conv2d_bn": 1, "remove_dropout": 1}  # the same model without the override
    OVERRIDES[override](model)
    result = fxrules.apply_rules(model, fxrules.load_rules(RULES / "fold", RULES / "cleanup"), example_inputs=(x,))
    overridden = {"forward, a lambda": "fold_conv2d_bn", "_check_input_dim": "fold_conv2d_bn",
                  "_conv_forward": "fold_conv2d_bn", "forward, a bound method": "remove_dropout"}[override]
    assert overridden not in result.counts, result.report
    torch.testing.assert_close(result.module(x), model(x))


def test_a_module_with_an_instance_forward_is_an_unknown_call_to_the_planner():
    """``relu.forward = lambda x: x.relu_()`` writes its input: the planner must not take it for a pure
    ReLU, so `clone(x) -> x` before it is refused (the clone protects the input from that write)."""
    model = nn.Sequential(nn.Identity(), nn.ReLU())
    model[1].forward = lambda x: x.relu_()
    gm = fx.symbolic_trace(model)
    graph = gm.graph
    (ident,) = [n for n in graph.nodes if n.op == "call_module" and n.target == "0"]
    with graph.inserting_after(ident):
        clone = graph.call_method("clone", (ident.args[0],))
    ident.replace_all_uses_with(clone)
    graph.erase_node(ident)
    gm.recompile()
    x = torch.randn(5)
    result = fxrules.apply_rules(gm, fxrules.parse_rules("rule c [exact]: call_method clone($x) -> $x", "c.fxr"),
                                 example_inputs=(x,))
    assert result.counts == {}, result.report
    kept = x.clone()
    result.module(x)
    torch.testing.assert_close(x, kept)  # the input is not written


def test_no_torch_nn_module_keeps_a_class_name_on_its_instance():
    from fxrules.engine.matcher import overridden_on_instance

    for module in (nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Dropout(),
                   nn.LayerNorm(4), nn.MultiheadAttention(8, 2), nn.LSTM(3, 4), nn.Sequential(nn.ReLU())):
        assert not overridden_on_instance(module), type(module)
        assert not overridden_on_instance(copy.deepcopy(module).eval().to(torch.float64))
    compiled = nn.ReLU()
    compiled.compile()
    assert overridden_on_instance(compiled)  # a compiled call runs other code


def _facts_in_full(effects: Effects, module: nn.Module) -> tuple:
    """What Effects.module_facts answers, each fact asked the long way."""
    from fxrules.engine import aliasing, fxaccess
    from fxrules.engine.matcher import overridden_on_instance

    known = aliasing.module_class_is_known(type(module), computes_as) and not overridden_on_instance(module)
    return (known, tuple(fxaccess.hooked_kinds(module)), getattr(module, "inplace", False) is True,
            bool(getattr(module, "_is_impure", False)), aliasing.module_updates_statistics(module),
            aliasing.module_draws_random(module))


def _flagged_by_member() -> nn.Module:
    module = nn.Linear(2, 2)
    module.register_buffer("inplace", torch.tensor(True))  # a registered member named like the flag
    return module


def _hooked() -> nn.Module:
    module = nn.Linear(2, 2)
    module.register_forward_pre_hook(lambda m, args: None)
    return module


def _overridden() -> nn.Module:
    module = nn.Linear(2, 2)
    module.forward = lambda x: x
    return module


def _impure() -> nn.Module:
    module = nn.Linear(2, 2)
    module._is_impure = True
    return module


class _ImpureClass(nn.Linear):
    _is_impure = True


class _AlwaysInPlaceDropout(nn.Dropout):
    inplace = True  # the class gives the flag a value: its modules are asked in full


class _InPlaceProperty(nn.Dropout):
    @property
    def inplace(self):  # noqa: D401  (a descriptor: only getattr can say)
        return True

    @inplace.setter
    def inplace(self, value):
        pass


def _with(module: nn.Module, **attrs) -> nn.Module:
    for name, value in attrs.items():
        setattr(module, name, value)
    return module


def _stateful_hooked() -> nn.Module:
    module = nn.BatchNorm2d(2).eval()
    module.register_forward_hook(lambda m, args, out: None)
    return module


def _stateful_overridden() -> nn.Module:
    module = nn.Dropout(0.5).eval()
    module.forward = lambda x: x * 2
    return module


def _stateful_flag_member() -> nn.Module:
    module = nn.Dropout(0.5).eval()
    module.register_buffer("_is_impure", torch.tensor(True))
    return module


class _InPlaceReLU(nn.ReLU):
    inplace = True


def _flag_buffer(module: nn.Module) -> nn.Module:
    module.register_buffer("inplace", torch.tensor(False))
    return module


def _hook(module: nn.Module) -> nn.Module:
    module.register_forward_hook(lambda m, args, out: None)
    return module


def _bn_relu(train: bool) -> nn.Module:
    from torch.ao.nn.intrinsic import BNReLU2d
    return BNReLU2d(nn.BatchNorm2d(2), nn.ReLU()).train(train)


@pytest.mark.parametrize("make", [
    lambda: nn.Linear(2, 2), lambda: nn.LayerNorm(2), lambda: nn.ReLU(), lambda: nn.ReLU(inplace=True),
    lambda: nn.BatchNorm1d(2), lambda: nn.BatchNorm1d(2).eval(), lambda: nn.Dropout(0.5), lambda: nn.Dropout(0.5).eval(),
    lambda: nn.Dropout(0.0), _flagged_by_member, _hooked, _overridden, _impure, lambda: _ImpureClass(2, 2),
    lambda: nn.Sequential(nn.Linear(2, 2)), lambda: nn.Module(),
    # norms and dropouts: the class answers part, the module's own state the rest
    lambda: nn.Dropout(0.5, inplace=True), lambda: nn.Dropout(0.5, inplace=True).eval(), lambda: nn.Dropout2d(0.0),
    lambda: _with(nn.Dropout(0.5), inplace=1), lambda: _with(nn.Dropout(0.5), p=0), lambda: nn.AlphaDropout(0.2),
    lambda: nn.RReLU(), lambda: nn.RReLU().eval(), lambda: nn.BatchNorm2d(2, track_running_stats=False),
    lambda: nn.BatchNorm2d(2, momentum=None), lambda: nn.InstanceNorm2d(2, track_running_stats=True),
    lambda: nn.InstanceNorm2d(2), lambda: nn.SyncBatchNorm(2).eval(), lambda: _with(nn.Dropout(0.5).eval(), _is_impure=True),
    lambda: _AlwaysInPlaceDropout(0.5).eval(), lambda: _InPlaceProperty(0.5).eval(), _stateful_hooked,
    _stateful_overridden, _stateful_flag_member, lambda: _bn_relu(True), lambda: _bn_relu(False),
    # `inplace` on a plain module's instance is its own: read from it
    lambda: nn.LeakyReLU(0.1, inplace=True), lambda: nn.Hardtanh(inplace=True), lambda: _with(nn.ReLU(), inplace=1),
    lambda: _with(nn.Linear(2, 2), inplace=True), lambda: _with(nn.ReLU(inplace=True), _is_impure=False),
    lambda: _flag_buffer(nn.Tanh()), lambda: _InPlaceReLU(), lambda: _hook(nn.ReLU(inplace=True))])
def test_module_facts_are_each_fact_asked_in_full(make):
    """Effects.module_facts answers a plain module (its class known and flag-free, the instance overriding
    nothing, without hooks) from its class alone, and a plain norm or dropout from its class and its own
    state; any other module is asked in full. Either way the answers are those of the long way."""
    module = make()
    effects = Effects(lambda target: module)
    assert tuple(effects.module_facts(module)) == _facts_in_full(effects, module)
    assert tuple(effects.facts_in_full(module)) == _facts_in_full(effects, module)
    assert effects.module_facts(module) is effects.module_facts(module)  # once per module object
