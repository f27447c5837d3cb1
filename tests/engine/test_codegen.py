"""``fxrules.engine.codegen``: a graph's Python source, exactly as torch.fx writes it, faster.

* on traced, annotated, pytree and exported models, and on random graphs built to collide names
  with globals and to use every argument form the writer handles, the writer's source, globals,
  line map and prologue equal ``Graph.python_code``'s;
* what it does not handle (an enum, a tensor constant, a named tuple, an operator inside a dict,
  a generic annotation, another code generator, ``FX_GRAPH_SHOW_META``) it leaves to torch: None;
* ``fxaccess.recompiling`` gives a module the code ``recompile`` gives it, leaves the graph as it
  was, answers other calls of ``python_code`` with torch's writer, and is torch's alone when the
  fast paths are off.

Every graph the rest of the suite commits is also checked against torch's writer
(``tests/conftest.py``).
"""

from __future__ import annotations

import enum
import operator
import typing
from collections import namedtuple

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from torch import fx, nn

import fxrules
from fxrules import zoo
from fxrules.engine import codegen, fxaccess


def write(graph: fx.Graph):
    """The writer itself (the suite-wide cross-check wraps ``codegen.python_code``; here the
    comparison is the test)."""
    return codegen._Writer(graph._codegen).write(graph.nodes) if codegen._CODE_GENERATORS.__contains__(
        type(graph._codegen)) else None


def assert_same(graph: fx.Graph) -> None:
    ours = write(graph)
    assert ours is not None, "the writer deferred to torch"
    theirs = fx.Graph.python_code(graph, "self")
    assert ours.src == theirs.src
    assert list(ours.globals) == list(theirs.globals)
    assert all(ours.globals[k] is v for k, v in theirs.globals.items())
    assert ours._lineno_map == theirs._lineno_map
    assert ours._prologue_start == theirs._prologue_start


# ---------------------------------------------------------------------------
# Real models
# ---------------------------------------------------------------------------


class Annotated(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x: torch.Tensor, n: int = 2, *rest) -> torch.Tensor:
        y = self.fc(x).relu() * self.scale
        z = torch.cat([y, y], dim=-1)[:, 1:3]
        w = F.dropout(z, 0.5, training=False) + torch.zeros(1, dtype=torch.float32)
        return w.sum(dim=(0,), keepdim=True) + n


class Dicts(nn.Module):
    def forward(self, x):
        return {"a": x, "b": [x.relu(), x * 2], "c": (x.sigmoid(), float("inf"))}


@pytest.mark.parametrize("build", [zoo.mlp, zoo.resnet, zoo.transformer, zoo.methods, zoo.redundant,
                                   Annotated, Dicts])
def test_traced_models(build):
    assert_same(fx.symbolic_trace(build().eval()).graph)


class TakesADict(nn.Module):
    def forward(self, d):
        return {"sum": d["a"] + d["b"], "b": d["b"].relu()}


def test_pytree_signature():
    gm = fx.symbolic_trace(TakesADict(), concrete_args={"d": {"a": fx.PH, "b": fx.PH}})
    assert type(gm.graph._codegen) is fx.graph._PyTreeCodeGen
    assert_same(gm.graph)


def test_exported_program():
    ep = torch.export.export(Annotated().eval(), (torch.randn(2, 4),))
    gm = ep.module()
    assert_same(gm.graph)
    assert_same(ep.graph_module.graph)


def test_a_module_committed_by_fxrules_carries_torchs_code():
    gm = fx.symbolic_trace(zoo.redundant().eval())
    rules = fxrules.parse_rules(
        "call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)\n", "<t>")
    result = fxrules.apply_rules(gm, rules)
    assert result.counts and sum(result.counts.values()) == 1
    out = result.module
    assert out.code == fx.Graph.python_code(out.graph, "self").src
    x = zoo.example_inputs("redundant")
    torch.testing.assert_close(out(*x), gm(*x))


# ---------------------------------------------------------------------------
# Names that collide, every argument form: built by hand
# ---------------------------------------------------------------------------


def test_a_node_named_like_a_global_is_renamed_as_torch_renames_it():
    graph = fx.Graph()
    a = graph.placeholder("torch")  # the `torch` global comes first: the node is torch_1
    b = graph.placeholder("inf")
    c = graph.call_function(operator.add, (a, b), name="getattr")
    d = graph.call_function(getattr, (c, "shape"), name="getattr_1")
    e = graph.call_function(torch.relu, (c,), name="NoneType")
    # a call named like the global of its own function: torch names the global first
    f = graph.call_function(helper, (e, d), name="tests_engine_test_codegen_helper")
    graph.output((d, f))
    assert_same(graph)
    source = write(graph).src
    assert "torch_1 = torch" in source
    assert "tests_engine_test_codegen_helper_1 = tests_engine_test_codegen_helper(" in source


def helper(x, y):  # a function of this module: a global the namespace names
    return x


torch.fx.wrap("helper")


def test_forms_of_call():
    graph = fx.Graph()
    x = graph.placeholder("x", type_expr=torch.Tensor)
    y = graph.placeholder("y", default_value=3)
    s = graph.call_function(operator.getitem, (x, (slice(None, 2), Ellipsis, 0)))
    t = graph.call_function(operator.iadd, (s, y))
    u = graph.call_method("view", (t, [2, -1]), {"dtype": None})
    v = graph.call_function(torch.ops.aten.add.Tensor, (u, u), {"alpha": 2})
    w = graph.call_function(torch.ops.aten.sum.dim_IntList, (v, [0]), {"dtype": torch.float32})
    h = graph.call_function(helper, (w, torch.device("cpu")))
    h.meta["is_wrapped"] = True
    g = graph.get_attr("blocks.0.weight")
    m = graph.call_module("blocks.0.fc", (h,), {"scale": 1e-5, "layout": torch.strided, "phase": 2 - 1j})
    graph.call_function(print, (m,))  # no users: `= None` right after
    k = graph.call_function(getattr, (g, "not an identifier"))
    graph.call_function(torch.add, (k, 1), {"out": None, "ops": (torch.ops.aten.mul.Tensor,)})
    graph.output({"m": m, "pair": [g, (k,)]}, type_expr=dict)
    assert_same(graph)
    assert 'wrap("tests_engine_test_codegen_helper")' in write(graph).src


def test_string_annotations():
    graph = fx.Graph()
    x = graph.placeholder("x", type_expr="Tensor")
    graph.output(graph.call_function(torch.relu, (x,), type_expr=torch.Tensor), type_expr="Tensor")
    assert_same(graph)


class Colour(enum.Enum):
    RED = 1


Pair = namedtuple("Pair", "a b")


def _with(arg=None, type_expr=None, output=None):
    graph = fx.Graph()
    x = graph.placeholder("x", type_expr=type_expr)
    y = graph.call_function(torch.relu, (x, arg) if arg is not None else (x,))
    graph.output(output if output is not None else y)
    return graph


@pytest.mark.parametrize("graph", [
    _with(arg=Colour.RED),
    _with(arg=torch.ones(2)),
    _with(arg=Pair(1, 2)),
    _with(type_expr=typing.List[int]),
    _with(type_expr=int | None),
    _with(output={"op": torch.ops.aten.add.Tensor}),
    fx.Graph(),
], ids=["enum", "tensor", "namedtuple", "generic", "union", "operator-in-dict", "empty"])
def test_what_it_does_not_write_is_torchs(graph):
    assert write(graph) is None
    assert codegen.python_code(graph) is None


def test_other_code_generators_and_show_meta_are_torchs(monkeypatch):
    class Mine(fx.graph.CodeGen):
        pass

    graph = _with()
    graph._codegen = Mine()
    assert codegen.python_code(graph) is None
    graph = _with()
    graph._codegen._body_transformer = lambda body: body
    assert codegen.python_code(graph) is None
    graph = _with()
    monkeypatch.setenv("FX_GRAPH_SHOW_META", "1")
    assert codegen.python_code(graph) is None


def test_plain_values_are_not_opaque_to_torch():
    from torch._library.opaque_object import is_opaque_value_type

    assert not any(is_opaque_value_type(kind) for kind in codegen._PLAIN_VALUES)


# ---------------------------------------------------------------------------
# Random graphs
# ---------------------------------------------------------------------------

_NAMES = ["x", "y", "add", "add_1", "add_2", "torch", "inf", "nan", "getattr", "getitem", "relu", "list",
          "print", "a.b", "1st", "_", "self_1", "NoneType", "device", "pytree", "helper", "view", "x_1",
          "tests_engine_test_codegen_helper", "_operator_getitem"]
_FUNCTIONS = [operator.add, operator.mul, operator.getitem, operator.neg, operator.iadd, torch.relu, torch.cat,
              torch.ops.aten.add.Tensor, getattr, helper, print, F.gelu]
_ARITY = {operator.add: 2, operator.mul: 2, operator.getitem: 2, operator.iadd: 2, operator.neg: 1}
_PLAIN = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True, width=32),
                   st.just(Ellipsis), st.complex_numbers(max_magnitude=4),
                   st.sampled_from([complex("nan+1j"), complex("inf-0j")]),
                   st.sampled_from(["s", "a'b", ""]), st.sampled_from([torch.float16, torch.device("cpu"),
                                                                        torch.channels_last, torch.strided]))


@st.composite
def random_graphs(draw) -> fx.Graph:
    graph = fx.Graph()
    nodes = [graph.placeholder(draw(st.sampled_from(_NAMES[:8])), type_expr=draw(
        st.sampled_from([None, torch.Tensor, "Tensor", int])))]

    def values(depth: int = 0):
        leaf = st.one_of(st.sampled_from(nodes), _PLAIN)
        if depth >= 2:
            return leaf
        inner = st.deferred(lambda: values(depth + 1))
        return st.one_of(leaf, st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
                         st.builds(slice, inner, inner, inner))

    for _ in range(draw(st.integers(1, 12))):
        op = draw(st.sampled_from(["call_function", "call_method", "call_module", "get_attr", "placeholder"]))
        name = draw(st.sampled_from(_NAMES))
        args = tuple(draw(st.lists(values(), min_size=1, max_size=3)))
        kwargs = draw(st.dictionaries(st.sampled_from(["dim", "out", "alpha"]), values(), max_size=2))
        if op == "placeholder":
            node = graph.placeholder(name)
        elif op == "call_function":
            target = draw(st.sampled_from(_FUNCTIONS))
            if target in _ARITY:  # operators written as expressions take exactly their operands
                args = tuple(draw(st.lists(values(), min_size=_ARITY[target], max_size=_ARITY[target])))
                kwargs = {}
            if target is getattr:
                args, kwargs = (args[0], draw(st.sampled_from(["shape", "T", "not ok"]))), {}
            node = graph.call_function(target, args, kwargs, name=name)
            node.meta["is_wrapped"] = target is helper
        elif op == "call_method":
            node = graph.call_method(draw(st.sampled_from(["view", "relu", "add_"])), args, kwargs)
        elif op == "call_module":
            node = graph.call_module(draw(st.sampled_from(["fc", "blocks.0.fc", "layers.1"])), args, kwargs)
        else:
            node = graph.get_attr(draw(st.sampled_from(["w", "blocks.0.weight", "a.1.b"])))
        if draw(st.booleans()):
            node.type = draw(st.sampled_from([torch.Tensor, "Tensor", int, ()]))
        nodes.append(node)
    out = draw(st.one_of(st.sampled_from(nodes), values(), st.dictionaries(st.sampled_from(["a", "b"]), values(),
                                                                           max_size=2)))
    graph.output(out, type_expr=draw(st.sampled_from([None, torch.Tensor, "Tensor"])))
    return graph


@given(random_graphs())
def test_random_graphs(graph):
    assert_same(graph)


# ---------------------------------------------------------------------------
# fxaccess.recompiling
# ---------------------------------------------------------------------------


def test_recompiling_gives_recompiles_code_and_leaves_the_graph_as_it_was():
    gm = fx.symbolic_trace(zoo.transformer().eval())
    expected = gm.code
    before = set(vars(gm.graph))
    gm.graph.call_function  # noqa: B018  (the class's method, not an instance attribute)
    with fxaccess.recompiling(gm.graph):
        assert "python_code" in vars(gm.graph)
        gm.recompile()
        verbose = gm.graph.python_code("self", verbose=True)  # another call: torch's writer
    assert set(vars(gm.graph)) == before
    assert gm.code == expected
    assert verbose.src == fx.Graph.python_code(gm.graph, "self", verbose=True).src
    x = zoo.example_inputs("transformer")
    torch.testing.assert_close(gm(*x), fx.symbolic_trace(zoo.transformer().eval())(*x))


def test_recompiling_a_graph_it_does_not_write():
    """An enum argument: fxrules' writer defers, torch's writes the module's code inside the context."""
    graph = _with(arg=Colour.RED)
    assert codegen.python_code(graph) is None
    module = fx.GraphModule(nn.Module(), fx.Graph())
    with fxaccess.recompiling(graph):
        module.graph = graph
    assert "python_code" not in vars(graph)
    assert module.code == fx.Graph.python_code(graph, "self").src
    assert "Colour.RED" in module.code


def test_recompiling_is_torchs_alone_on_the_public_paths(monkeypatch):
    monkeypatch.setattr(fxaccess, "FAST", False)
    gm = fx.symbolic_trace(zoo.mlp().eval())
    with fxaccess.recompiling(gm.graph):
        assert "python_code" not in vars(gm.graph)
        gm.recompile()
    assert gm.code == fx.Graph.python_code(gm.graph, "self").src


_NAME_PARTS = st.sampled_from(["x", "linear", "a", "_", "__", "1", "01", "12", "0", "conv", "input", "sum", "if",
                               "self", "torch", "getattr", "é", "١", "x.y", "-", "A", "Z9", ".", "layer1.0."])


class _Named:
    """A stand-in node: what :meth:`codegen._Writer.node_name` reads of one."""

    def __init__(self, name: str):
        self.name = name


@given(st.lists(st.tuples(st.booleans(), st.lists(_NAME_PARTS, min_size=1, max_size=4).map("".join)),
                max_size=30))
@example([(False, n) for n in ("_1", "_1", "a_01", "a_1", "x_1_2", "x_1", "input", "if", "1a", "a-b_3", "a__1", "a_",
                               "linear", "linear_1", "linear")] + [(True, "linear"), (True, "x_1")])
@example([(True, n) for n in ("layer1.0.conv1", "layer1_0_conv1", "layer1.0.conv1", "0.conv", "_0_conv", "a..b",
                              ".a", "a.", "a.1", "1.2", "if.x", "a.b_1", "a.b_01", "a_b_1", "x.y", "input.0",
                              "sum.1", "é.x", "a.-b")])
def test_node_names_are_the_namespaces_own(steps):
    """The writer's node names, and :func:`codegen.unique_name` without an object (what a new node's
    name is made with: ``fxaccess.create_node_fast``, dotted module paths included), agree with
    ``_Namespace.create_name`` on any sequence of node names and names without a node (illegal
    characters, dots, numeric suffixes, leading digits, builtins, keywords, repeats, a node asked
    twice): the same names, and the same namespace state after each step."""
    writer = codegen._Writer(fx.Graph()._codegen)
    reference = fx.graph._Namespace()
    nodes: list = []
    for is_global, text in steps:
        if is_global:
            got, want = codegen.unique_name(writer.namespace, text, None), reference.create_name(text, None)
        else:
            node = nodes[len(nodes) // 2] if text == "x" and nodes else _Named(text)  # sometimes one asked before
            nodes.append(node)
            got, want = writer.node_name(node), reference.create_name(node.name, node)
        assert got == want, (text, steps)
        assert writer.namespace._used_names == reference._used_names
        assert writer.namespace._base_count == reference._base_count
