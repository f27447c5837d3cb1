"""apply_rules(..., inplace=True): the caller's GraphModule rewritten in place, all or nothing.

A successful in-place run gives what a copying run gives (the same report, code, outputs and
state_dict keys) in the caller's own module. A failed one, at any stage (example inputs that do
not run, a condition or builder raising, the iteration cap, a KeyboardInterrupt, placing the new
modules, the recompile), leaves the module exactly as it was: compared with a deep snapshot of
its graph (nodes in order, names, arguments, users in order, metadata dictionaries and their
values by identity, the name table, the lookup table), module tree (modules, parameters and
buffers by identity and in order) and code. The copying versions are in test_faults.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn
from torch.testing import assert_close

import fxrules
import fxrules.engine.transaction as transaction
from fxrules.engine import codegen, fxaccess
import tests.helpers_builders as helpers
from fxrules import zoo
from tests.engine import test_faults as faults
from tests.engine.test_faults import RULES_DIR, PicksyBatch, boom_rules, conv_bn, randn, seeded
from tests.model_snapshots import assert_same_snapshot, snapshot_module


# ---------------------------------------------------------------------------
# a deep snapshot
# ---------------------------------------------------------------------------


def _arg(value):
    if isinstance(value, fx.Node):
        return ("node", value.name, id(value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_arg(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _arg(v)) for k, v in value.items()))
    return ("value", repr(value))


def deep_snapshot(gm: fx.GraphModule) -> dict:
    """Everything a rewrite of ``gm`` in place could touch, objects by identity where they are kept."""
    graph = gm.graph
    nodes = []
    for node in graph.nodes:
        nodes.append((id(node), node.name, node.op, id(node.target), repr(node.target), _arg(node.args),
                      _arg(node.kwargs), node.type, id(node.meta), [(k, id(v)) for k, v in node.meta.items()],
                      [(u.name, id(u)) for u in node.users], [n.name for n in node.all_input_nodes],
                      node._sort_key, node._erased))
    namespace = graph._graph_namespace
    # what find_nodes answers from (each answer is sorted by position, so the order within is free)
    table = {(op, id(target)): {n.name for n in found}
             for (op, target), found in graph._find_nodes_lookup_table.table.items() if found}
    snap = {
        "nodes": nodes,
        "len": len(graph.nodes),
        "used_names": set(namespace._used_names),
        "base_count": dict(namespace._base_count),
        "obj_to_name": {id(k): v for k, v in namespace._obj_to_name.items()},
        "table": table,
        "graph_id": id(graph),
        "module": snapshot_module(gm),
        "stores": [(name, list(m._modules.items()), list(m._parameters.items()), list(m._buffers.items()))
                   for name, m in gm.named_modules(remove_duplicate=False)],
        "code": gm.code,
        "instance": {k: id(v) for k, v in gm.__dict__.items()},
        "class": {k: id(v) for k, v in vars(type(gm)).items() if k in ("forward", "__call__", "_wrapped_call")},
    }
    return snap


def assert_same_deep(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key in before:
        if key == "module":
            assert_same_snapshot(before[key], after[key])
        elif key == "nodes":
            assert len(before[key]) == len(after[key]), "node count changed"
            for a, b in zip(before[key], after[key]):
                assert a == b, f"node {a[1]} changed:\n{a}\n{b}"
        else:
            assert before[key] == after[key], f"{key} changed"


def fault_rules(rule: str) -> fxrules.RuleSet:
    return boom_rules().select(names=["remove_dropout", "relu_idempotent", rule])


def traced_conv_bn() -> fx.GraphModule:
    return fx.symbolic_trace(conv_bn())


def same_as_untouched(gm: fx.GraphModule, rules: fxrules.RuleSet, expected_counts: dict) -> None:
    """After a rollback the module behaves as an untouched twin: a copying run on each gives the same
    code and names (the name table was given back too), and an in-place run works."""
    twin = traced_conv_bn()
    mine, theirs = fxrules.apply_rules(gm, rules), fxrules.apply_rules(twin, rules)
    assert mine.module.code == theirs.module.code
    assert mine.report.applied == theirs.report.applied
    result = fxrules.apply_rules(gm, rules, inplace=True)
    assert result.module is gm and result.counts == expected_counts
    assert gm.code == theirs.module.code


SAFE = ["remove_dropout", "relu_idempotent"]


# ---------------------------------------------------------------------------
# failures at every stage leave the module exactly as it was
# ---------------------------------------------------------------------------


def test_a_builder_that_raises_after_other_rewrites():
    gm = traced_conv_bn()
    x, = faults.inputs_for(gm)
    with torch.no_grad():
        expected = gm(x)
    before = deep_snapshot(gm)
    with pytest.raises(fxrules.RewriteError) as info:
        fxrules.apply_rules(gm, fault_rules("builder_boom"), inplace=True)
    faults.assert_names_rule_and_node(info.value, "builder_boom", "boom.fxr:1", "bn")
    assert isinstance(info.value.__cause__, helpers.BuilderBoom)
    assert_same_deep(before, deep_snapshot(gm))
    with torch.no_grad():
        assert_close(gm(x), expected, rtol=0, atol=0)
    same_as_untouched(gm, boom_rules().select(names=SAFE), {"remove_dropout": 1, "relu_idempotent": 1})


@pytest.mark.parametrize("with_inputs", [False, True])
def test_a_predicate_that_raises(with_inputs):
    gm = traced_conv_bn()
    x, = faults.inputs_for(gm)
    before = deep_snapshot(gm)
    with pytest.raises(fxrules.RewriteError) as info:
        fxrules.apply_rules(gm, fault_rules("predicate_boom"), example_inputs=(x,) if with_inputs else None,
                            inplace=True)
    faults.assert_names_rule_and_node(info.value, "predicate_boom", "boom.fxr:5", "add")
    assert_same_deep(before, deep_snapshot(gm))  # metadata from the example inputs went too
    same_as_untouched(gm, boom_rules().select(names=SAFE), {"remove_dropout": 1, "relu_idempotent": 1})


@pytest.mark.parametrize("where", ["builder", "predicate"])
def test_keyboard_interrupt(monkeypatch, where):
    rule = "builder_boom" if where == "builder" else "predicate_boom"
    rules = fault_rules(rule)
    function = helpers.exploding_builder if where == "builder" else helpers.exploding_predicate
    monkeypatch.setattr(function, "__code__", faults.interrupt.__code__)
    gm = traced_conv_bn()
    x, = faults.inputs_for(gm)
    before = deep_snapshot(gm)
    with pytest.raises(KeyboardInterrupt):
        fxrules.apply_rules(gm, rules, example_inputs=(x,), inplace=True)
    assert_same_deep(before, deep_snapshot(gm))


def test_example_inputs_that_do_not_run():
    model = fx.symbolic_trace(seeded(PicksyBatch).eval())
    before = deep_snapshot(model)
    with pytest.raises(fxrules.ModelError, match="this model does not take a batch of 3"):
        fxrules.apply_rules(model, fxrules.load_rules(RULES_DIR), example_inputs=(randn(3, 4),), inplace=True)
    assert_same_deep(before, deep_snapshot(model))


def test_keyboard_interrupt_while_propagating_values(monkeypatch):
    monkeypatch.setattr(faults, "refuse_batch_of_three", faults.interrupt)  # before tracing: the code binds it
    model = fx.symbolic_trace(seeded(PicksyBatch).eval())
    before = deep_snapshot(model)
    with pytest.raises(KeyboardInterrupt):
        fxrules.apply_rules(model, fxrules.load_rules(RULES_DIR), example_inputs=(randn(2, 4),), inplace=True)
    assert_same_deep(before, deep_snapshot(model))


class ManyUsers(nn.Module):
    """``x`` has three users, the Dropout in the middle: removing it gives ``x`` the users in
    another order, which a rollback must give back (later passes walk users in order)."""

    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        a, d, b = torch.relu(x), self.drop(x), torch.neg(x)
        return torch.relu(torch.relu(a + d + b)) + 1


def test_users_come_back_in_their_order():
    gm = fx.symbolic_trace(ManyUsers().eval())
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert [u.name for u in x.users] == ["relu", "drop", "neg"]
    before = deep_snapshot(gm)
    with pytest.raises(fxrules.RewriteError):
        fxrules.apply_rules(gm, fault_rules("predicate_boom"), inplace=True)
    assert [u.name for u in x.users] == ["relu", "drop", "neg"]
    assert_same_deep(before, deep_snapshot(gm))


# ---------------------------------------------------------------------------
# an edit that stops part way
# ---------------------------------------------------------------------------

EDITING = fxrules.load_rules(RULES_DIR).select(names=["remove_dropout", "relu_idempotent", "fold_conv2d_bn"]) \
    + fxrules.parse_rules("rule spelled [exact]: call_function operator.add($x, 1) -> call_function torch.add($x, 1)\n",
                          source="spelled.fxr")
"""Rules whose rewrites of ConvBN erase nodes (the dropout, the outer relu, the conv and the bn), create a
module call (the fold) and a function call (``torch.add``), rewire users, and place a module."""

EDITED = {"remove_dropout": 1, "relu_idempotent": 1, "fold_conv2d_bn": 1, "spelled": 1}


class NodeHookSaysNo(Exception):
    pass


def assert_list_intact(graph: fx.Graph, before: dict) -> None:
    """The graph's node list runs from its root back to its root through as many nodes as before, each
    pointing back at the one before it (a walk bounded by that count: a list tied into a loop fails
    here rather than hang the snapshot's walk)."""
    root = graph._root
    node, count = root, 0
    while True:
        following = node._next
        assert following._prev is node, f"%{following.name} does not point back at %{node.name}"
        if following is root:
            break
        count += 1
        assert count <= len(before["nodes"]), "the node list is longer than before, or tied into a loop"
        node = following
    assert count == len(before["nodes"])


@pytest.mark.parametrize("kind", ["create", "erase"])
@pytest.mark.parametrize("at_call", [1, 2])
def test_a_node_hook_that_raises_inside_an_edit(kind, at_call):
    """A GraphModule may carry create-node and erase-node hooks (``_register_create_node_hook``, used by
    inductor), which torch runs inside ``create_node`` after linking the new node and inside
    ``erase_node`` before unlinking the node. One that raises leaves its edit half made. The rollback
    must unlink a new node the journal never recorded, and must not link again a node it recorded as
    erased that is still in the list: that tied the list into a loop, and iterating the caller's graph
    never ended (found by injecting a fault at every call of each edit primitive)."""
    gm = traced_conv_bn()
    x, = faults.inputs_for(gm)
    with torch.no_grad():
        expected = gm(x)
    before = deep_snapshot(gm)
    seen = []

    def hook(node):
        seen.append(node.name)
        if len(seen) == at_call:
            raise NodeHookSaysNo(f"the {kind} hook refuses %{node.name}")

    getattr(gm, f"_register_{kind}_node_hook")(hook)
    with pytest.raises(fxrules.RewriteError, match=f"the {kind} hook refuses") as info:
        fxrules.apply_rules(gm, EDITING, inplace=True)
    assert isinstance(info.value.__cause__, NodeHookSaysNo)
    getattr(gm, f"_unregister_{kind}_node_hook")(hook)
    assert len(seen) == at_call
    assert_list_intact(gm.graph, before)
    assert_same_deep(before, deep_snapshot(gm))
    gm.graph.lint()
    with torch.no_grad():
        assert_close(gm(x), expected, rtol=0, atol=0)
    result = fxrules.apply_rules(gm, EDITING, inplace=True)
    assert result.counts == EDITED
    assert gm.code == fxrules.apply_rules(traced_conv_bn(), EDITING).module.code


def _inspected_twice(graph, x, inner, outer):
    """ConvBN aside: ``neg(neg(x))`` whose inner neg an implied metadata assertion checks and a
    ``size()`` read after the match reads (tests/test_fuse_inspection.py)."""
    with graph.inserting_after(inner):
        graph.call_function(torch.ops.aten._assert_tensor_metadata.default, (inner,),
                            {"dtype": torch.float32, "device": torch.device("cpu"), "layout": torch.strided})
    with graph.inserting_after(outer):
        size = graph.call_method("size", (inner,))
    return (size,)


@pytest.mark.parametrize("where", ["recompile", "another_rewrite"])
def test_users_that_only_inspect_are_given_back(monkeypatch, where):
    """A rewrite settles the users that only inspect its interior node (engine/inspection.py): it drops
    an implied assertion and re-points a metadata read to the root. In place, both edits go through the
    journal (they were made on the graph directly, so a rollback left the assertion erased and the read
    re-pointed), and so do the users' other inputs, whose users torch reorders when it rewires a user."""
    from tests.test_fuse_inspection import RULES as NEG_NEG, _module

    gm = _module(_inspected_twice)
    x = randn(3, 4)
    before = deep_snapshot(gm)
    rules = NEG_NEG
    if where == "recompile":
        monkeypatch.setattr(fx.GraphModule, "recompile", faults.interrupt)
    else:  # a later rewrite's builder raises (relu after the neg pair, folded by a builder that raises)
        rules = NEG_NEG + fxrules.parse_rules(
            "rule boom [exact]: call_method size($x) where tests.helpers_builders.exploding_predicate($x) -> $x\n",
            source="boom.fxr", allow_imports=["tests"])
    with pytest.raises((KeyboardInterrupt, fxrules.RewriteError)):
        fxrules.apply_rules(gm, rules, example_inputs=(x,), inplace=True)
    monkeypatch.undo()
    assert_list_intact(gm.graph, before)
    assert_same_deep(before, deep_snapshot(gm))
    result = fxrules.apply_rules(gm, NEG_NEG, example_inputs=(x,), inplace=True)
    assert result.counts == {"double_neg": 1}
    assert gm.code == fxrules.apply_rules(_module(_inspected_twice), NEG_NEG, example_inputs=(x,)).module.code


class TanhBeside(nn.Module):
    """``r`` has the users ``a`` then ``b``. Rewiring ``a`` (its ``F.tanh`` input replaced by
    ``torch.tanh``) takes ``a`` off ``r``'s users and puts it back last: ``b`` then ``a``."""

    def forward(self, x):
        r = torch.relu(x)
        a = r + torch.nn.functional.tanh(x)
        b = torch.neg(r)
        return a, b


def test_a_rewired_user_s_other_inputs_get_their_users_order_back(monkeypatch):
    """Found by test_fuzz_engine's in-place property: the journal saved the replaced node, its
    replacement and its users, but not the users' other inputs, whose users torch reorders."""
    gm = fx.symbolic_trace(TanhBeside())
    r = next(n for n in gm.graph.nodes if n.name == "relu")
    assert [u.name for u in r.users] == ["add", "neg"]
    before = deep_snapshot(gm)
    rules = fxrules.load_rules(RULES_DIR / "canonicalize" / "tanh.fxr")
    monkeypatch.setattr(fx.GraphModule, "recompile", faults.interrupt)
    with pytest.raises(KeyboardInterrupt):
        fxrules.apply_rules(gm, rules, inplace=True)
    monkeypatch.undo()
    assert [u.name for u in r.users] == ["add", "neg"]
    assert_same_deep(before, deep_snapshot(gm))
    assert fxrules.apply_rules(gm, rules, inplace=True).counts


# Every primitive an in-place rewrite edits the graph with, and the journal's records around them. An
# interrupt (a KeyboardInterrupt: it can arrive between any two bytecodes) just before or just after each
# call of each shows that the journal's record of every edit undoes it wherever the edit stopped.
GRAPH_EDITS = [
    (fxaccess, "create_node"), (fxaccess, "erase_node"), (fx.Node, "_prepend"), (fx.Node, "_remove_from_list"),
    (fx.Node, "replace_all_uses_with"), (transaction.Journal, "created"), (transaction.Journal, "erasing"),
    (transaction.Journal, "meta_of"),
]
"""The steps that change the graph's nodes, and the journal's records of them (the fuzz property in
test_fuzz_engine.py interrupts these at a drawn call on random graphs)."""

PRIMITIVES = GRAPH_EDITS + [
    (codegen, "unique_name"), (fx.Node, "__init__"), (torch._C, "_fx_map_arg"), (transaction.Workpiece, "replace_uses"),
    (transaction.Journal, "creating"), (transaction, "_erase_dead"), (transaction.Workpiece, "take_name"),
    (transaction, "_put_at"), (fxaccess, "put_child"), (transaction.Journal, "recompiling"),
    (fx.GraphModule, "recompile"),
]


class Interrupting:
    """``owner.name`` replaced by a wrapper that counts its calls and, at call ``stop_at`` (if given),
    raises KeyboardInterrupt just before (``before``) or just after the call; put back on exit."""

    def __init__(self, owner, name: str, stop_at=None, before: bool = True):
        self.owner, self.name, self.stop_at, self.before = owner, name, stop_at, before
        self.calls = 0

    def __enter__(self) -> "Interrupting":
        owner, name = self.owner, self.name
        self.original = owner.__dict__.get(name, _ABSENT) if isinstance(owner, type) else getattr(owner, name)
        function = getattr(owner, name)

        def interrupting(*args, **kwargs):
            self.calls += 1
            if self.calls == self.stop_at and self.before:
                raise KeyboardInterrupt
            result = function(*args, **kwargs)
            if self.calls == self.stop_at:
                raise KeyboardInterrupt
            return result

        setattr(owner, name, interrupting)
        return self

    def __exit__(self, *exc) -> None:
        if self.original is _ABSENT:  # a class's inherited method: its own attribute goes again
            delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self.original)


_ABSENT = object()


@pytest.mark.parametrize("owner, name", PRIMITIVES, ids=[f"{getattr(o, '__name__', o)}.{n}" for o, n in PRIMITIVES])
@pytest.mark.parametrize("when", ["before", "after"])
def test_an_interrupt_at_any_call_of_an_edit_primitive_is_undone(owner, name, when):
    interrupted_runs = 0
    for stop_at in range(1, 200):
        gm = traced_conv_bn()
        before = deep_snapshot(gm)
        try:
            with Interrupting(owner, name, stop_at, when == "before"):
                result = fxrules.apply_rules(gm, EDITING, inplace=True)
        except KeyboardInterrupt:
            pass
        else:  # fewer calls than stop_at: the run finished, as an untouched module's does
            assert result.counts == EDITED
            break
        interrupted_runs += 1
        assert_list_intact(gm.graph, before)
        assert_same_deep(before, deep_snapshot(gm))
        assert fxrules.apply_rules(gm, EDITING, inplace=True).counts == EDITED
    else:
        pytest.fail(f"{name} was still being called at call {stop_at}")
    assert interrupted_runs > 0, f"{name} was never called"


def test_the_iteration_cap():
    gm = traced_conv_bn()
    before = deep_snapshot(gm)
    with pytest.raises(fxrules.RewriteLoopError):
        fxrules.apply_rules(gm, boom_rules().select(names=SAFE), max_iterations=1, inplace=True)
    assert_same_deep(before, deep_snapshot(gm))


FOLD = ["remove_dropout", "relu_idempotent", "fold_conv2d_bn"]


def _fail_after(monkeypatch, owner, name, error):
    """``owner.name`` runs, then raises ``error``: a failure after its writes."""
    real = getattr(owner, name)

    def failing(*args, **kwargs):
        real(*args, **kwargs)
        raise error

    monkeypatch.setattr(owner, name, failing)


@pytest.mark.parametrize("stage", ["check", "placing", "deleting", "codegen", "compile", "after_recompile"])
@pytest.mark.parametrize("error", [RuntimeError("injected"), KeyboardInterrupt()], ids=["error", "interrupt"])
@pytest.mark.slow
def test_failures_in_the_commit(monkeypatch, stage, error):
    """The commit places the folded module (replacing `conv`), deletes `bn`, then recompiles: a
    failure at each step, after its writes, is rolled back, code and class attributes included."""
    gm = traced_conv_bn()
    x, = faults.inputs_for(gm)
    with torch.no_grad():
        expected = gm(x)
    rules = fxrules.load_rules(RULES_DIR).select(names=FOLD)
    before = deep_snapshot(gm)
    if stage == "check":
        _fail_after(monkeypatch, transaction.Workpiece, "check_changed", error)
    elif stage == "placing":
        _fail_after(monkeypatch, transaction, "_put_at", error)
    elif stage == "deleting":
        _fail_after(monkeypatch, transaction, "_delete_unused", error)
    elif stage == "codegen":
        monkeypatch.setattr(fx.Graph, "python_code", lambda *a, **k: (_ for _ in ()).throw(error))
    elif stage == "compile":
        monkeypatch.setattr(fx.graph_module, "_forward_from_src", lambda *a, **k: (_ for _ in ()).throw(error))
    else:
        _fail_after(monkeypatch, fx.GraphModule, "recompile", error)
    expected_error = KeyboardInterrupt if isinstance(error, KeyboardInterrupt) else fxrules.ModelError
    with pytest.raises(expected_error):
        fxrules.apply_rules(gm, rules, inplace=True)
    monkeypatch.undo()
    assert_same_deep(before, deep_snapshot(gm))
    with torch.no_grad():
        assert_close(gm(x), expected, rtol=0, atol=0)
    result = fxrules.apply_rules(gm, rules, inplace=True)
    assert result.counts == {"remove_dropout": 1, "relu_idempotent": 1, "fold_conv2d_bn": 1}
    assert not hasattr(gm, "bn") and isinstance(gm.conv, nn.Conv2d)
    with torch.no_grad():
        assert_close(gm(x), expected, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# a successful run: what a copying run gives, in the caller's module
# ---------------------------------------------------------------------------


def _comparable(report: fxrules.Report) -> tuple:
    return report.applied, report.rejected, report.nodes_before, report.nodes_after, report.notes


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
@pytest.mark.parametrize("with_inputs", [False, True])
@pytest.mark.slow
def test_the_same_result_as_a_copying_run(name, with_inputs):
    rules = fxrules.load_rules(RULES_DIR)
    if not with_inputs:
        rules = rules.select(names=[r.name for r in rules if r.source.split(":")[0].endswith(faults.UNTYPED_FILES)])
    model = zoo.ZOO[name]()
    inputs = zoo.example_inputs(name)
    copied_from, gm = fx.symbolic_trace(model), fx.symbolic_trace(model)
    copying = fxrules.apply_rules(copied_from, rules, example_inputs=inputs if with_inputs else None)
    graph = gm.graph
    in_place = fxrules.apply_rules(gm, rules, example_inputs=inputs if with_inputs else None, inplace=True)
    assert in_place.module is gm and gm.graph is graph
    assert _comparable(in_place.report) == _comparable(copying.report)
    assert in_place.counts == copying.counts
    assert gm.code == copying.module.code
    assert list(gm.state_dict()) == list(copying.module.state_dict()) or \
        sorted(gm.state_dict()) == sorted(copying.module.state_dict())
    gm.graph.lint()
    with torch.no_grad():
        assert_close(gm(*inputs), copying.module(*inputs), rtol=0, atol=0)
    again = fxrules.apply_rules(gm, rules, example_inputs=inputs if with_inputs else None, inplace=True)
    assert not again.report.applied


def test_refusals_are_reported_as_by_a_copying_run():
    """A guard refusal is not an error: the run goes on and reports it, in place as when copying."""
    model = seeded(PicksyBatch).eval()
    rules = fxrules.load_rules(RULES_DIR).select(contracts=["exact", "approx"])
    x = randn(2, 4)
    copying = fxrules.apply_rules(fx.symbolic_trace(model), rules, example_inputs=(x,))
    gm = fx.symbolic_trace(model)
    in_place = fxrules.apply_rules(gm, rules, example_inputs=(x,), inplace=True)
    assert _comparable(in_place.report) == _comparable(copying.report)
    assert gm.code == copying.module.code


def test_only_a_graph_module_is_rewritten_in_place():
    model = conv_bn()
    before = snapshot_module(model)
    rules = boom_rules().select(names=SAFE)
    with pytest.raises(fxrules.ModelError, match="inplace=True rewrites the torch.fx.GraphModule"):
        fxrules.apply_rules(model, rules, inplace=True)
    assert_same_snapshot(before, snapshot_module(model))
    program = torch.export.export(conv_bn(), faults.inputs_for(model))
    with pytest.raises(fxrules.ModelError, match="an ExportedProgram is not one"):
        fxrules.apply_rules(program, rules, inplace=True)


def test_the_folded_module_replaces_the_conv_and_the_bn_is_deleted():
    gm = traced_conv_bn()
    conv_before = gm.conv
    result = fxrules.apply_rules(gm, fxrules.load_rules(RULES_DIR).select(names=FOLD), inplace=True)
    assert result.counts["fold_conv2d_bn"] == 1
    assert [name for name, _ in gm.named_children()] == ["drop", "conv"] or \
        [name for name, _ in gm.named_children()] == ["conv"]
    assert gm.conv is not conv_before and not hasattr(gm, "bn")
    assert "bn" not in gm.code


def test_a_module_still_called_elsewhere_is_kept():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.1)
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            return self.drop(self.fc(x)) + self.fc(x)

    gm = fx.symbolic_trace(seeded(Twice).eval())
    rules = fxrules.load_rules(RULES_DIR).select(names=["remove_dropout"])
    fxrules.apply_rules(gm, rules, inplace=True)
    assert not hasattr(gm, "drop") and hasattr(gm, "fc")


def test_rule_pass_rewrites_in_place_and_rolls_back():
    gm = traced_conv_bn()
    x, = faults.inputs_for(gm)
    with torch.no_grad():
        expected = gm(x)
    rule_pass = fxrules.RulePass(fault_rules("builder_boom"))
    before = deep_snapshot(gm)
    with pytest.raises(fxrules.RewriteError):
        rule_pass(gm)
    assert_same_deep(before, deep_snapshot(gm))
    result = fxrules.RulePass(boom_rules().select(names=SAFE))(gm)
    assert result.modified and result.graph_module is gm
    with torch.no_grad():
        assert_close(gm(x), expected, rtol=0, atol=0)


def test_the_public_paths_rewrite_and_roll_back_alike(monkeypatch):
    """With the fast paths off (a torch release fxaccess was not written for), the in-place mode
    gives the same result, and its undo (which has no public equivalent) still restores exactly."""
    from fxrules.engine import fxaccess

    monkeypatch.setattr(fxaccess, "FAST", False)
    rules = fxrules.load_rules(RULES_DIR).select(names=FOLD)
    gm, twin = traced_conv_bn(), traced_conv_bn()
    copying = fxrules.apply_rules(twin, rules)
    in_place = fxrules.apply_rules(gm, rules, inplace=True)
    assert _comparable(in_place.report) == _comparable(copying.report) and gm.code == copying.module.code
    gm = traced_conv_bn()
    before = deep_snapshot(gm)
    with pytest.raises(fxrules.RewriteError):
        fxrules.apply_rules(gm, fault_rules("builder_boom"), inplace=True)
    assert_same_deep(before, deep_snapshot(gm))


class _FoldedButRead(nn.Module):
    """conv + bn that the fold rewrites, and the batch norm's weight read again by a get_attr."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.sub = nn.Module()
        self.sub.norm = nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.sub.norm(self.bn(self.conv(x)))
        return y + self.bn.weight.view(1, -1, 1, 1) * self.sub.norm.weight.view(1, -1, 1, 1)


def test_a_module_a_get_attr_still_reads_inside_keeps_only_what_is_read():
    """The folds erase both batch norms' calls; get_attr nodes still read `bn.weight` and
    `sub.norm.weight`. A copying run's module holds only those; in place, the caller's `bn` and
    `sub.norm` stay, without the parameters and buffers no node reads (the same state_dict keys), and a
    failed run gives them back."""
    model = seeded(_FoldedButRead).eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.sub.norm.running_var.uniform_(0.5, 2)
    rules = fxrules.load_rules(RULES_DIR).select(names=["fold_conv2d_bn"])
    x = randn(2, 4, 6, 6)
    copying = fxrules.apply_rules(fx.symbolic_trace(model), rules)
    assert copying.counts == {"fold_conv2d_bn": 2}  # conv + bn, then that conv + sub.norm
    gm = fx.symbolic_trace(model)
    before = deep_snapshot(gm)
    with pytest.raises(KeyboardInterrupt), Interrupting(fx.GraphModule, "recompile", 1):
        fxrules.apply_rules(gm, rules, inplace=True)
    assert_same_deep(before, deep_snapshot(gm))
    assert "bn.bias" in gm.state_dict()
    result = fxrules.apply_rules(gm, rules, inplace=True)
    assert list(gm.state_dict()) == list(copying.module.state_dict())
    assert "bn.weight" in gm.state_dict() and "bn.bias" not in gm.state_dict()
    assert "sub.norm.weight" in gm.state_dict() and "sub.norm.running_mean" not in gm.state_dict()
    assert gm.code == copying.module.code and result.report.applied == copying.report.applied
    # gm.bn is a container of what is read, as in the copying result; the batch norm object itself (which
    # the traced-from model shares) keeps every member
    assert type(gm.bn) is type(copying.module.bn) is nn.Module and gm.bn.weight is model.bn.weight
    assert type(gm.sub.norm) is nn.Module and model.sub.norm.running_mean is not None
    with torch.no_grad():
        assert_close(gm(x), model(x))
        assert_close(copying.module(x), model(x))


class _Refusable(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        inner = torch.relu(self.fc(x))
        return self.drop(torch.relu(inner) + inner)  # relu(relu(x)) whose inner relu is used outside


@pytest.mark.parametrize("with_inputs", [False, True])
def test_a_run_that_rewrites_nothing_leaves_the_module_uncompiled(with_inputs, monkeypatch):
    """Nothing rewritten (a rule that never matches, and a match refused): no recompile; the module's
    code, its class's forward and its nodes stay the objects they were. With example inputs the nodes
    keep the values the run wrote. A run that rewrites recompiles once."""
    gm = fx.symbolic_trace(seeded(_Refusable).eval())
    x = randn(2, 4)
    inputs = (x,) if with_inputs else None
    forward, code, nodes = type(gm).forward, gm.code, list(gm.graph.nodes)
    recompiles = []
    real = fx.GraphModule.recompile
    monkeypatch.setattr(fx.GraphModule, "recompile", lambda self: recompiles.append(self) or real(self))
    rules = fxrules.parse_rules("""
rule never "" [exact]:
    call_function torch.sigmoid(call_function torch.sigmoid($x)) -> $x
rule relu_twice "" [exact]:
    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)
""")
    result = fxrules.apply_rules(gm, rules, example_inputs=inputs, inplace=True)
    assert not result.report.applied and result.module is gm
    assert [r.code for r in result.report.rejected] == ["interior-used-outside"]
    assert recompiles == [] and type(gm).forward is forward and gm.code == code and list(gm.graph.nodes) == nodes
    assert all(("val" in n.meta) is with_inputs for n in gm.graph.nodes if n.op != "output")
    expected = gm(x)
    dropout = fxrules.load_rules(RULES_DIR).select(names=["remove_dropout"])
    assert fxrules.apply_rules(gm, dropout, example_inputs=inputs, inplace=True).report.applied
    assert recompiles == [gm] and "drop" not in gm.code and type(gm).forward is not forward
    assert_close(gm(x), expected, rtol=0, atol=0)
