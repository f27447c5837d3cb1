"""The engine's shortcuts change nothing but the time.

* ``copy_graph`` makes what ``copy.deepcopy(graph)`` makes (names, arguments, metadata,
  the names later nodes get);
* the pre-check before matching (``Program.requires`` / ``may_match``) skips exactly the
  attempts that would fail: with it disabled, every report and every graph is the same;
* the index of module callers used to reuse a replaced module's name gives the names the
  graph scan gave.
"""

from __future__ import annotations

import ast
import copy
import operator

import pytest
from hypothesis import given
from hypothesis import strategies as st
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.testing import assert_close

import fxrules
from fxrules import zoo
import fxrules.engine.driver as engine
from fxrules.engine.transaction import copy_graph


def seeded(build, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.1)
        self.bias = nn.Parameter(torch.randn(8))

    def forward(self, x):
        y = self.fc(self.norm(x))
        y = torch.matmul(y, y.transpose(0, 1)) @ y
        y = torch.relu(torch.relu(y)) + self.bias
        y = F.softmax(y, dim=-1) + x.sum(dim=1, keepdim=True)
        return x + self.drop(y.transpose(0, 1).transpose(0, 1))


class Net(nn.Module):
    def __init__(self, depth: int = 3):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(depth))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _node_facts(graph: fx.Graph) -> list:
    return [(n.name, n.op, n.target, n.type, repr(n.args), repr(n.kwargs), type(n.args), type(n.kwargs),
             [u.name for u in n.users], dict(n.meta)) for n in graph.nodes]


@pytest.mark.parametrize("build", [lambda: Net(), lambda: zoo.deep_cnn(3)])
def test_copy_graph_is_what_deepcopy_makes(build):
    gm = fx.symbolic_trace(seeded(build).eval())
    for node in gm.graph.nodes:
        node.meta["mark"] = [node.name]  # shallow-copied: the same list object in both copies
    original = _node_facts(gm.graph)
    ours, theirs = copy_graph(gm.graph), copy.deepcopy(gm.graph)
    assert _node_facts(ours) == _node_facts(theirs) == original
    assert ours.python_code("self").src == theirs.python_code("self").src
    for a, b, o in zip(ours.nodes, theirs.nodes, gm.graph.nodes):
        assert a is not o and a.graph is ours
        assert a.meta is not o.meta and a.meta["mark"] is o.meta["mark"]
        assert a._sort_key == b._sort_key
    assert len(ours.nodes) == len(theirs.nodes)
    ours.lint()
    for op in ("placeholder", "call_method", "call_module", "get_attr", "output"):
        assert [n.name for n in ours.find_nodes(op=op)] == [n.name for n in theirs.find_nodes(op=op)]
    for target in {n.target for n in gm.graph.nodes if n.op == "call_function"}:
        assert [n.name for n in ours.find_nodes(op="call_function", target=target)] == \
            [n.name for n in theirs.find_nodes(op="call_function", target=target)]
    # nodes created later get the same names in both copies
    for graph in (ours, theirs):
        with graph.inserting_before(graph.output_node()):
            first = next(n for n in graph.nodes if n.op == "placeholder")
            graph.call_function(torch.relu, (first,))
            graph.call_method("transpose", (first, 0, 1))
    assert [n.name for n in ours.nodes] == [n.name for n in theirs.nodes]
    assert sorted(n.name for n in ours.find_nodes(op="call_function", target=torch.relu)) == \
        sorted(n.name for n in theirs.find_nodes(op="call_function", target=torch.relu))
    # and the original graph is untouched
    assert _node_facts(gm.graph) == original


NEAR_MISSES = "\n".join(
    f"rule near_{name}:\n    call_function torch.matmul(call_function torch.{name}($x), $y) -> "
    f"call_function torch.matmul($x, $y)\n"
    f"rule near_add_{name}:\n    call_function operator.add($x, call_function torch.{name}($y)) -> "
    f"call_function operator.add($x, $y)\n"
    for name in ("sin", "cos", "exp", "tanh", "sigmoid", "erf"))

MATCHING = """
rule relu_twice:
    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)
rule double_transpose:
    call_method transpose(call_method transpose($x, $a, $b), $a, $b) -> $x
rule no_dropout:
    call_module Dropout($x) as d where not d.training -> $x
rule matmul_of_transpose:
    call_function torch.matmul($y, call_method transpose($x, 0, 1)) -> call_function torch.mm($y, call_method t($x))
rule add_bias:
    call_function operator.add(call_function torch.relu($x), get_attr $b) -> call_function torch.add(call_function torch.relu($x), $b)
"""


def _rules() -> fxrules.RuleSet:
    return fxrules.parse_rules(NEAR_MISSES + MATCHING, "speed.fxr")


def _summary(result: fxrules.RewriteResult) -> tuple:
    report = result.report
    return (report.applied, report.rejected, report.nodes_before, report.nodes_after, result.module.code)


def _without_pre_check(monkeypatch) -> None:
    """Rules compiled from now on have no pre-check: every candidate node is matched in full (the rule
    sets checked before are forgotten: parse_rules would give them again, compiled already)."""
    import fxrules.engine.program as program
    from fxrules.lang.load import CHECKED

    monkeypatch.setattr(program, "_requires", lambda root: ())
    CHECKED.clear()


def test_the_pre_check_changes_no_result(monkeypatch):
    model = seeded(Net).eval()
    gm = fx.symbolic_trace(model)
    rules = _rules()
    fast = fxrules.apply_rules(gm, rules)
    found_fast = fxrules.find_matches(gm, rules)
    assert fast.report.applied  # the matching rules do fire
    _without_pre_check(monkeypatch)
    rules = _rules()  # compiled afresh, with no pre-check
    slow = fxrules.apply_rules(gm, rules)
    assert _summary(fast) == _summary(slow)
    assert found_fast == fxrules.find_matches(gm, rules)
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert_close(fast.module(x), model(x))


def test_the_pre_check_skips_near_misses(monkeypatch):
    attempts: list = []
    real = engine.match_program

    def counting(program, node, view, **kwargs):
        attempts.append(program.name)
        return real(program, node, view, **kwargs)

    monkeypatch.setattr(engine, "match_program", counting)
    monkeypatch.setattr(engine, "direct_matcher", lambda program: None)  # every attempt through match_program
    gm = fx.symbolic_trace(seeded(Net).eval())
    fxrules.apply_rules(gm, _rules())
    assert attempts and not [a for a in attempts if a.startswith("near_")]
    # without the pre-check, every matmul and + node is tried against each near miss
    attempts.clear()
    _without_pre_check(monkeypatch)
    fxrules.apply_rules(gm, _rules())
    assert len([a for a in attempts if a.startswith("near_")]) >= 12


def test_explain_still_says_why_near_misses_fail():
    gm = fx.symbolic_trace(seeded(Net).eval())
    misses = fxrules.explain(gm, _rules(), rule="near_sin")
    assert misses
    assert all("expected" in m.reason or "argument" in m.reason for m in misses), [m.reason for m in misses]
    assert all(m.code != "pattern-mismatch" for m in misses), [m.code for m in misses]  # a specific code each
    assert any("torch.sin" in m.reason or "sin" in m.reason for m in misses)


def test_no_pre_check_where_matching_reads_module_attributes():
    rules = fxrules.parse_rules(
        "rule r:\n    call_module ReLU(call_module Linear{bias=True}($x)) -> call_module ReLU($x)\n"
        "rule s:\n    call_module ReLU(call_module Linear($x)) -> call_module ReLU($x)\n", "attrs.fxr")
    from fxrules.engine.program import compile_rules

    programs = {p.name: p for p in compile_rules(rules).programs}
    assert programs["r"].requires == ()
    assert len(programs["s"].requires) == 1


class ConvBn(nn.Module):
    def __init__(self, share: bool = False, read_weight: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(4)
        self.share, self.read_weight = share, read_weight

    def forward(self, x):
        y = self.bn(self.conv(x))
        y = self.bn2(self.conv2(y))
        if self.share:
            y = y + self.conv(x)  # the first conv is also called outside the match
        if self.read_weight:
            y = y + self.conv2.weight.sum()  # an attribute inside the second conv is read
        return y


FOLD = """
rule fold:
    call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn where not bn.training
    -> call_module fxrules.builders.fold_conv_bn(conv, bn)($x)
"""


@pytest.mark.parametrize("share,read_weight,reused", [
    (False, False, {"conv", "conv2"}),
    (True, False, {"conv2"}),
    (False, True, {"conv"}),
    (True, True, set()),
])
def test_folded_modules_take_the_conv_name_only_when_nothing_else_uses_it(share, read_weight, reused):
    model = seeded(lambda: ConvBn(share, read_weight)).eval()
    for bn in (model.bn, model.bn2):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    result = fxrules.apply_rules(model, fxrules.parse_rules(FOLD, "fold.fxr"))
    assert result.counts == {"fold": 2}
    folded = [n.target for n in result.module.graph.nodes
              if n.op == "call_module" and n.meta.get("fxrules", {}).get("rule") == "fold"]
    assert len(folded) == 2
    assert {t for t in folded if t in ("conv", "conv2")} == reused
    for target in folded:
        assert type(getattr(result.module, target)) is nn.Conv2d
        assert getattr(result.module, target) not in (model.conv, model.conv2)
    if share:
        assert any(n.op == "call_module" and n.target == "conv" for n in result.module.graph.nodes)
        assert result.module.conv is model.conv  # the outside call still runs the original conv
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert_close(result.module(x), model(x), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------
# Syntax errors: the direct parse gives up, Lark words the diagnostic
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["rule r:\n    call_function torch.relu($x -> $x\n",
                                  "rule r:\n    call_function torch.relu($x) ->\n",
                                  "rule r:\n    call_function torch.relu($x) -> $x )\n",
                                  "rule r: ~\n", "rule\n"])
def test_syntax_errors_still_come_from_lark(text):
    import fxrules.lang.parser as parser
    from fxrules.lang.source import Source

    with pytest.raises(parser.NotDirect):  # the direct loop gives up; Lark's loop words it
        parser.parse_direct(Source("bad.fxr", text))
    with pytest.raises(fxrules.RuleFileError) as caught:
        fxrules.parse_rules(text, "bad.fxr")
    assert "bad.fxr:" in str(caught.value)


def test_checking_pauses_the_garbage_collector_and_restores_it():
    import gc

    import fxrules.lang.load as frontend
    from fxrules.lang.runtime import entered

    seen = []
    real = frontend.parse

    def spy(source):
        seen.append(gc.isenabled())
        return real(source)

    assert gc.isenabled()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("fxrules.lang.load.parse", spy)
        fxrules.parse_rules("rule r:\n    call_function torch.relu(call_function torch.relu($x)) -> $x\n", "a.fxr")
        assert seen == [False] and gc.isenabled()
        with pytest.raises(fxrules.RuleFileError):
            fxrules.parse_rules("rule r:\n    call_function torch.relu(\n", "b.fxr")
        assert gc.isenabled()
        gc.disable()
        try:
            fxrules.parse_rules("rule r:\n    call_function torch.relu($x) -> $x\n", "c.fxr")
            assert not gc.isenabled()  # a caller's choice stays
        finally:
            gc.enable()
    with entered():
        with entered():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_copy_graph_keeps_the_name_table():
    """Names the original handed out stay taken in the copy, even for nodes since erased, and a
    node named `output` keeps the output node's name as it was."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.output = nn.ReLU()

        def forward(self, x):
            y = torch.relu(x)
            return self.output(torch.neg(y))

    gm = fx.symbolic_trace(M())
    neg = next(n for n in gm.graph.nodes if n.target is torch.neg)
    neg.replace_all_uses_with(neg.args[0])
    gm.graph.erase_node(neg)  # `neg` stays taken in the original's namespace
    ours = copy_graph(gm.graph)
    assert [n.name for n in ours.nodes] == [n.name for n in gm.graph.nodes]
    assert ours.output_node().name == gm.graph.output_node().name != "output"
    for graph in (ours, gm.graph):
        with graph.inserting_before(graph.output_node()):
            graph.call_function(torch.neg, (next(iter(graph.nodes)),))
    assert [n.name for n in ours.nodes] == [n.name for n in gm.graph.nodes]
    assert ours.python_code("self").src == gm.graph.python_code("self").src
    ours.lint()


_BIND_TARGETS = [torch.sum, torch.add, torch.transpose, torch.relu, F.gelu, F.softmax, operator.add, torch.matmul,
                 torch.cat, torch.reshape, F.linear, F.dropout, torch.mean, torch.permute,
                 torch.ops.aten.convolution.default, torch.ops.aten.batch_norm.default]


def _bind_signatures():
    import fxrules.engine.signatures as signatures

    found = [s for t in _BIND_TARGETS for s in signatures.for_function(t)]
    found += [signatures.for_module(nn.Linear)[0], signatures.for_module(nn.MultiheadAttention)[0]]
    return found


_SIGNATURES = _bind_signatures()
_PARAM_NAMES = sorted({name for s in _SIGNATURES for name in s.parameters}) + ["not_a_parameter"]


@given(sig=st.sampled_from(_SIGNATURES),
       args=st.lists(st.sampled_from([1, 2.0, None, "x", (1, 2), True]), max_size=7).map(tuple),
       kwargs=st.dictionaries(st.sampled_from(_PARAM_NAMES), st.sampled_from([0, None, False]), max_size=3))
def test_fast_binding_is_what_signature_bind_does(sig, args, kwargs):
    """``signatures.bind`` binds plain signatures itself: the same parameters, in the same order,
    and None exactly where ``inspect.Signature.bind`` raises."""
    import fxrules.engine.signatures as signatures

    try:
        expected = dict(sig.bind(*args, **kwargs).arguments)
    except TypeError:
        expected = None
    got = signatures.bind(sig, args, kwargs)
    assert got == expected
    if got is not None:
        assert list(got) == list(expected)


def _tree(module: nn.Module) -> tuple:
    return ([(name, type(m).__name__, m.training) for name, m in module.named_modules(remove_duplicate=False)],
            [(name, id(p)) for name, p in module.named_parameters(remove_duplicate=False)],
            [(name, id(b)) for name, b in module.named_buffers(remove_duplicate=False)],
            sorted(module.state_dict()))


@pytest.mark.parametrize("build", [lambda: Net(), lambda: zoo.deep_cnn(2), lambda: zoo.transformer()])
def test_commit_builds_the_module_graphmodule_builds(build):
    """The committed module has the tree, parameters, buffers and code ``fx.GraphModule(root, graph)``
    gives, with the same objects; plain tensors read by get_attr become buffers in both."""
    from fxrules.engine.transaction import _assemble

    gm = fx.symbolic_trace(seeded(build).eval())
    gm.register_buffer("plain", torch.ones(3), persistent=False)
    gm.const = torch.zeros(2)  # a plain tensor attribute
    graph = copy_graph(gm.graph)
    with graph.inserting_before(graph.output_node()):
        graph.get_attr("const")
        graph.get_attr("plain")
    root = {n.target: gm.get_submodule(n.target) if n.op == "call_module" else getattr(gm, n.target)
            if "." not in n.target else gm.get_parameter(n.target) if n.target in dict(gm.named_parameters())
            else gm.get_buffer(n.target)
            for n in graph.nodes if n.op in ("call_module", "get_attr")}
    ours = _assemble(root, graph, "Built")
    theirs = fx.GraphModule(root, copy_graph(graph), class_name="Built")
    assert _tree(ours) == _tree(theirs)
    assert ours.code == theirs.code and type(ours).__name__ == "Built"


def test_apply_pauses_the_garbage_collector_and_restores_it(monkeypatch):
    """The copy, rewrite and commit run with the collector held; it is on again afterwards, also
    after a failed run, and a caller who turned it off keeps it off."""
    import gc

    import fxrules.engine.transaction as transaction

    seen = []
    real = transaction.copy_graph

    def spy(graph):
        seen.append(gc.isenabled())
        return real(graph)

    monkeypatch.setattr(engine, "copy_graph", spy)
    gm = fx.symbolic_trace(seeded(Net).eval())
    assert gc.isenabled()
    fxrules.apply_rules(gm, _rules())
    assert seen == [False] and gc.isenabled()
    with pytest.raises(fxrules.RewriteLoopError):
        fxrules.apply_rules(gm, _rules(), max_iterations=0)
    assert gc.isenabled()
    gc.disable()
    try:
        fxrules.apply_rules(gm, _rules())
        assert not gc.isenabled()
    finally:
        gc.enable()


_FIRST_CALL = """
import gc, sys
import torch
import fxrules
from fxrules import zoo
assert "fxrules.engine.driver" not in sys.modules, "the engine is imported by apply_rules, not by fxrules"
model = zoo.mlp()
collections = []
inside = []
gc.callbacks.append(lambda phase, info: phase == "start" and inside and collections.append(info["generation"]))
inside.append(True)
fxrules.{call}(model, fxrules.LIBRARY / "cleanup")
inside.clear()
assert "fxrules.engine.driver" in sys.modules
assert gc.isenabled()
print(collections)
"""


@pytest.mark.parametrize("call", ["apply_rules", "find_matches", "explain"])
def test_a_first_call_imports_the_engine_with_the_collector_paused(call):
    """In a fresh process (what the test is about: the engine not imported yet), the first call of an
    entry point imports the engine inside ``entered()``: no full collection starts during the call (one
    young collection may, as the exit turns the collector on again). Before,
    importing the engine set off the full collection ``import torch`` leaves due (about 55 ms of a
    first apply on a small model); the engine's import alone allocates enough to start one."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FIRST_CALL.replace("{call}", call)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    collections = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    # at most the young collection just after the exit, when the collector is on again
    assert 2 not in collections and len(collections) <= 1, collections


def test_the_commit_check_refuses_a_changed_node_that_reads_out_of_order():
    """What replaced the whole-graph lint: a created or rewired node reading a node that comes after
    it, or one no longer in the graph, is a ModelError naming both."""
    from fxrules.engine.errors import ModelError
    from fxrules.engine.transaction import Workpiece

    gm = fx.symbolic_trace(seeded(Net).eval())
    work = Workpiece(copy_graph(gm.graph), gm, class_name="Net")
    nodes = [n for n in work.graph.nodes if n.op == "call_function"]
    early, late = nodes[0], nodes[-1]
    early.args = (late,) + tuple(early.args[1:])
    work.changed.add(early)
    with pytest.raises(ModelError, match=f"%{early.name} uses %{late.name} before it is computed"):
        work.commit()
    ok = Workpiece(copy_graph(gm.graph), gm, class_name="Net")
    ok.changed.update(ok.graph.nodes)
    ok.commit()  # an untouched graph passes


def test_the_recompile_leaves_the_lookup_table_as_it_was(monkeypatch):
    """The commit recompiles with a quiet view of the graph's find_nodes table (no remove/insert per
    ``_repr_fn`` set): the code is torch's own, the real table is back in place with every node
    under its key, and find_nodes answers as on the input."""
    from fxrules.engine import fxaccess

    _QuietLookupTable = fxaccess._QuietLookupTable
    gm = fx.symbolic_trace(seeded(Net).eval())
    result = fxrules.apply_rules(gm, _rules())
    out = result.module
    table = out.graph._find_nodes_lookup_table
    assert not isinstance(table, _QuietLookupTable)
    assert all(node in table for node in out.graph.nodes)
    plain = fx.GraphModule(out, copy_graph(out.graph))  # torch's own recompile
    assert out.code == plain.code
    for op in ("placeholder", "call_module", "get_attr", "output"):
        assert out.graph.find_nodes(op=op) == [n for n in out.graph.nodes if n.op == op]
    assert out.graph.find_nodes(op="call_function", target=torch.relu) == \
        [n for n in out.graph.nodes if n.op == "call_function" and n.target is torch.relu]
    out.graph.lint()  # lint checks every node is in the table

    # Membership is what the view hides, and only while the code is generated.
    seen = []
    real_python_code = fx.Graph.python_code

    def spy(graph, *args, **kwargs):
        seen.append(type(graph._find_nodes_lookup_table))
        for node in graph.nodes:
            assert node not in graph._find_nodes_lookup_table
        assert graph.find_nodes(op="placeholder") == [n for n in graph.nodes if n.op == "placeholder"]
        return real_python_code(graph, *args, **kwargs)

    monkeypatch.setattr(fx.Graph, "python_code", spy)
    fxrules.apply_rules(gm, _rules())
    assert _QuietLookupTable in seen


@pytest.mark.parametrize("build", [lambda: Net(), lambda: zoo.deep_cnn(2), lambda: zoo.transformer()])
def test_modules_by_path_is_named_modules(build):
    from fxrules.engine.fxaccess import modules_by_path_fast as _modules_by_path

    model = seeded(build)
    model.shared = model.get_submodule(next(n for n, m in model.named_modules() if n and not m._modules))
    model.empty_slot = None
    model._modules["hole"] = None
    expected = dict(model.named_modules(remove_duplicate=False))
    found = _modules_by_path(model)
    assert found.keys() == expected.keys()
    assert all(found[k] is expected[k] for k in expected)


class _PropertyInplace(nn.Module):
    @property
    def inplace(self):
        return True


class _GetattrInplace(nn.Module):
    def __getattr__(self, name):
        if name == "inplace":
            return True
        return super().__getattr__(name)


class _ImpureClass(nn.Module):
    _is_impure = True


def _impure_buffer() -> nn.Module:
    module = nn.Module()
    module.register_buffer("_is_impure", torch.ones(1))
    return module


@pytest.mark.parametrize("build", [lambda: nn.ReLU(inplace=True), nn.ReLU, lambda: nn.Linear(2, 2),
                                   lambda: nn.Dropout(inplace=True), _PropertyInplace, _GetattrInplace,
                                   _ImpureClass, _impure_buffer, lambda: zoo.deep_cnn(1)])
@pytest.mark.parametrize("name", ["inplace", "_is_impure", "training", "weight", "missing"])
def test_module_attribute_lookup_is_getattr(build, name):
    """The planner reads `inplace` and `_is_impure` of every module it checks without going through a
    failing nn.Module.__getattr__; it must answer what getattr answers."""
    from fxrules.engine.planner import _module_attr

    module = build()
    classes: dict = {}
    for _ in range(2):  # the second time from what was remembered of the class
        assert _module_attr(module, name, False) is getattr(module, name, False)
        assert _module_attr(module, name, False, classes) is getattr(module, name, False)
    assert (type(module), name) in classes


@pytest.mark.parametrize("inplace", [False, True], ids=["copying", "inplace"])
@pytest.mark.parametrize("fails", [False, True], ids=["ok", "failed"])
def test_a_run_leaves_nothing_to_the_cyclic_collector(inplace, fails):
    """What a run keeps for its checks (the workpiece, its effects and aliasing, the journal with the
    states and module dictionaries it saved, the modules the rewrite removed) is freed by reference
    counting when the run ends, after a commit or a rollback: none of it is left in reference cycles
    for the collector to find (it once had to traverse and free tens of thousands of such objects
    when apply_rules let it run again). Measured with the collector held over the run and asked after."""
    import gc

    from tests.engine.test_faults import RULES_DIR, conv_bn

    rules = fxrules.load_rules(RULES_DIR).select(names=["remove_dropout", "relu_idempotent", "fold_conv2d_bn"])
    gm = fx.symbolic_trace(conv_bn())
    removed = [gm.get_submodule("bn")]  # the folding removes it (in place: deletes it from gm)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        if fails:
            with pytest.raises(fxrules.RewriteLoopError):
                fxrules.apply_rules(gm, rules, max_iterations=0, inplace=inplace)
        else:
            result = fxrules.apply_rules(gm, rules, inplace=inplace)
            assert result.report.counts.get("fold_conv2d_bn") == 1
            del result
        gc.collect()
        left = {type(o).__module__ + "." + type(o).__qualname__ for o in gc.garbage}
        removed_left = [m for m in removed if any(o is m for o in gc.garbage)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not {name for name in left if name.startswith("fxrules.")}, left
    assert not removed_left
