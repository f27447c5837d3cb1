"""``fxrules.engine.fxaccess``: every private torch member fxrules touches, fast path beside public path.

* the version gate takes the fast paths on the torch releases they were written for only;
* each fast path and its public equivalent, called directly, agree on real graphs and modules;
* with the gate forced to the public paths, the engine gives the same graphs, reports, names
  and outputs (fold, cleanup, swaps, an exported program, saving).
"""

from __future__ import annotations

import copy
import operator
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import fxrules
from fxrules import zoo
from fxrules.engine import aliasing, fxaccess


def seeded(build, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def traced(build) -> fx.GraphModule:
    return fx.symbolic_trace(seeded(build).eval())


class Shared(nn.Module):
    """A submodule under two names, a child registered as None, a parameter under two names, a
    non-persistent buffer and a plain tensor attribute: what a module walk can get wrong."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.again = self.conv
        self.register_module("hole", None)
        self.scale = nn.Parameter(torch.ones(4))
        self.register_parameter("scale_alias", self.scale)
        self.register_parameter("nothing", None)
        self.register_buffer("count", torch.zeros(1))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)
        self.constant = torch.ones(3)

    def forward(self, x):
        y = self.bn(self.conv(x)) * self.scale.view(1, -1, 1, 1)
        return torch.relu(y) + self.count


MODELS = {
    "resnet": zoo.resnet,
    "transformer": zoo.transformer,
    "mlp": zoo.mlp,
    "methods": zoo.methods,
    "deep_cnn": lambda: zoo.deep_cnn(2),
    "shared": Shared,
}


# ------------------------------------------------------------------------------ the gate


@pytest.mark.parametrize("version, fast", [
    ("2.13.0", True), ("2.13.0+cpu", True), ("2.13.1+cu128", True), ("2.13.0a0+git1234", True),
    ("2.12.1", False), ("2.14.0", False), ("2.1.0", False), ("3.13.0", False), ("12.13.0", False), ("", False),
    ("nightly", False),
])
def test_the_gate_takes_the_fast_paths_on_the_written_for_release_only(version, fast):
    assert fxaccess.fast_paths_apply(version) is fast


def test_the_gate_is_decided_from_this_torch():
    assert fxaccess.FAST is fxaccess.fast_paths_apply(torch.__version__)


def test_each_accessor_dispatches_to_its_public_path_when_the_gate_is_off(monkeypatch):
    """With FAST false not one private member of a node, graph or module is read: every fast
    path is replaced by one that fails, and the engine still runs."""
    def refuse(*args, **kwargs):
        raise AssertionError("a fast path ran with the gate off")

    fast = [name for name in vars(fxaccess) if name.endswith("_fast") and callable(getattr(fxaccess, name))]
    assert len(fast) >= 20
    for name in fast:
        monkeypatch.setattr(fxaccess, name, refuse)
    monkeypatch.setattr(fxaccess, "FAST", False)
    monkeypatch.setattr(fxaccess, "_QuietLookupTable", refuse)
    model = seeded(zoo.resnet).eval()
    result = fxrules.apply_rules(model, fxrules.load_rules(fxrules.LIBRARY / "fold"))
    assert result.report.applied


# ------------------------------------------------------------------------------ node accessors


@pytest.mark.parametrize("name", ["resnet", "transformer", "methods", "shared"])
def test_erased_agrees(name):
    gm = traced(MODELS[name])
    graph = gm.graph
    gone = []
    for node in list(graph.nodes):  # erase a few of each kind, users first
        if node.op in ("call_function", "call_method", "call_module", "get_attr") and len(gone) < 12:
            with graph.inserting_after(node):
                dead = graph.node_copy(node)
            gone.append(dead)
    for node in gone:
        assert fxaccess.erased_fast(node) is fxaccess.erased_public(node) is False
        graph.erase_node(node)
    for node in list(graph.nodes) + gone:
        assert fxaccess.erased_fast(node) == fxaccess.erased_public(node) == fxaccess.erased(node) == (node in gone)
    assert len({n.op for n in gone}) >= 2


@pytest.mark.parametrize("name", ["resnet", "transformer"])
def test_misread_agrees(name):
    """Both paths find a node reading a later node, and one reading a node that is no longer in the
    graph, and pass over changed nodes that are themselves erased; an untouched graph reads in order."""
    gm = traced(MODELS[name])
    graph = gm.graph
    calls = [n for n in graph.nodes if n.op in ("call_function", "call_method", "call_module") and n.args
             and isinstance(n.args[0], fx.Node)]
    for path in (fxaccess.misread_fast, fxaccess.misread_public, fxaccess.misread):
        assert path(graph, list(graph.nodes)) is None
    early, late = calls[0], calls[-1]
    original = early.args
    early.args = (late,) + tuple(early.args[1:])
    for path in (fxaccess.misread_fast, fxaccess.misread_public):
        assert path(graph, [calls[1], early]) == (early, late, True)
    early.args = original  # in order again
    with graph.inserting_before(calls[2]):
        gone = graph.call_function(torch.neg, (calls[1].args[0],))
    reader = calls[2]
    original = reader.args
    reader.args = (gone,) + tuple(reader.args[1:])
    other = fx.Graph()
    stranger = other.placeholder("x")
    for path in (fxaccess.misread_fast, fxaccess.misread_public):
        assert path(graph, [reader]) is None
        assert path(graph, [stranger]) is None  # not this graph's: passed over
    reader.args = original
    graph.erase_node(gone)
    made = graph.call_function(torch.neg, (calls[0],))
    made.args = (gone,)  # reads an erased node
    for path in (fxaccess.misread_fast, fxaccess.misread_public):
        assert path(graph, [early, made]) == (made, gone, False)
        assert path(graph, [gone]) is None  # an erased changed node: passed over


@pytest.mark.parametrize("name", ["resnet", "transformer"])
def test_sort_keys_order_nodes_alike(name):
    gm = traced(MODELS[name])
    graph = gm.graph
    nodes = list(graph.nodes)
    with graph.inserting_before(nodes[len(nodes) // 2]):  # positions between existing ones
        x = nodes[0]
        extra = [graph.call_function(torch.relu, (x,)) for _ in range(5)]
    order = list(graph.nodes)
    shuffled = sorted(order, key=id)
    assert sorted(shuffled, key=fxaccess.sort_key_fast) == order
    assert sorted(shuffled, key=fxaccess.sort_key_public) == order
    assert all(fxaccess.sort_key(n) == (fxaccess.sort_key_fast if fxaccess.FAST else fxaccess.sort_key_public)(n)
               for n in order)
    for a, b in zip(order, order[1:]):  # the comparison a heap makes
        assert fxaccess.sort_key_fast(a) < fxaccess.sort_key_fast(b)
        assert fxaccess.sort_key_public(a) < fxaccess.sort_key_public(b)
    assert all(e in order for e in extra)


# ------------------------------------------------------------------------------ graph accessors


def _node_facts(graph: fx.Graph) -> list:
    return [(n.name, n.op, n.target, n.type, repr(n.args), repr(n.kwargs), type(n.args), type(n.kwargs),
             [u.name for u in n.users], dict(n.meta)) for n in graph.nodes]


@pytest.mark.parametrize("name", ["resnet", "transformer", "methods", "shared"])
def test_copy_graph_agrees(name):
    gm = traced(MODELS[name])
    fast, public = fxaccess.copy_graph_fast(gm.graph), fxaccess.copy_graph_public(gm.graph)
    assert _node_facts(fast) == _node_facts(public) == _node_facts(gm.graph)
    assert fast.python_code("self").src == public.python_code("self").src
    for copied in (fast, public):
        copied.lint()
        for op in ("placeholder", "call_module", "get_attr", "call_method", "output"):
            assert copied.find_nodes(op=op) == [n for n in copied.nodes if n.op == op]
    # nodes created later are named alike in both copies
    names = []
    for copied in (fast, public):
        out = next(iter(copied.find_nodes(op="output")))
        with copied.inserting_before(out):
            made = [copied.call_function(torch.relu, (out.args[0],)), copied.call_method("add", (out.args[0], 1)),
                    copied.call_function(operator.add, (out.args[0], 2))]
        names.append([n.name for n in made])
    assert names[0] == names[1]


@pytest.mark.parametrize("name", ["resnet", "transformer", "shared"])
def test_create_node_agrees(name):
    gm = traced(MODELS[name])
    made = []
    for create in (fxaccess.create_node_fast, fxaccess.create_node_public):
        graph = fxaccess.copy_graph_public(gm.graph)
        nodes = list(graph.nodes)
        base_names: dict = {}
        created = []
        for anchor in (nodes[1], nodes[len(nodes) // 2], nodes[-1]):
            with graph.inserting_before(anchor):
                x = anchor.prev
                created.append(create(graph, "call_function", torch.relu, (x,), {}, base_names))
                created.append(create(graph, "call_function", F.gelu, (x,), {"approximate": "tanh"}, base_names))
                created.append(create(graph, "call_method", "view", (x, -1), {}, base_names))
                created.append(create(graph, "call_module", "conv" if name == "shared" else "fc", (x,), {},
                                      base_names))
                created.append(create(graph, "get_attr", "fxrules_new.weight", (), {}, base_names))
                created.append(create(graph, "call_function", torch.relu, (x,), {}, base_names))
        graph.lint()
        assert len(graph.nodes) == len(nodes) + len(created)
        for node in created:
            assert node in graph.find_nodes(op=node.op, target=node.target if node.op == "call_function" else None)
        made.append((_node_facts(graph), [n.name for n in created]))
    assert made[0] == made[1]


@pytest.mark.parametrize("target", [
    "fc", "layer1.conv_bn", "layer1.0.conv1_bn1", "view", "add_", "_private", "x2", "", "__add__", "__iadd__",
    "__init", "init__", "__", "_", "layer1.Conv", "convBn", "ALL_CAPS", "mod.pascalCase", "é", "ÉCOLE", "ǅ",
    "ß", "İ", "x.y_Z", "a1B", "1a", "fxrules_new.weight", torch.relu, F.gelu, operator.add, torch.Tensor.add_,
])
def test_the_base_name_of_a_target_is_torch_s(target):
    graph = fx.Graph()
    assert fxaccess._base_name(graph, target) == graph._target_to_str(target)


def test_storage_keys_are_storage_key_per_tensor_without_the_storageless():
    base = torch.randn(4, 4)
    dense = [base, base[1:], base.t(), torch.randn(3), nn.Parameter(torch.randn(2))]
    sparse = torch.randn(3, 3).to_sparse()
    assert fxaccess.storage_keys(dense) == {fxaccess.storage_key(t) for t in dense}
    assert len(fxaccess.storage_keys(dense)) == 3  # views share their base's storage
    assert fxaccess.storage_keys([sparse, *dense]) == fxaccess.storage_keys(dense)
    assert fxaccess.storage_keys([sparse]) == set() and fxaccess.storage_keys(()) == set()


@pytest.mark.parametrize("name", ["resnet", "transformer", "methods", "shared"])
def test_erase_node_agrees(name):
    """The fast erase leaves the graph as ``Graph.erase_node`` does: the same nodes, users, lookup table,
    length and code; the erased nodes flagged, without arguments."""
    gm = traced(MODELS[name])
    results = []
    for erase in (fxaccess.erase_node_fast, fxaccess.erase_node_public):
        graph = fxaccess.copy_graph_public(gm.graph)
        gone = []
        for node in list(graph.nodes):  # copies of nodes of each kind, then erased users first
            if node.op in ("call_function", "call_method", "call_module", "get_attr") and len(gone) < 12:
                with graph.inserting_after(node):
                    gone.append(graph.node_copy(node))
        with graph.inserting_after(gone[0]):
            gone.insert(0, graph.call_function(torch.add, (gone[0], gone[-1]), {"alpha": 2}))  # reads two of them
        for node in gone:
            erase(graph, node)
        graph.lint()
        assert all(fxaccess.erased_public(n) and n._erased and not n.all_input_nodes for n in gone)
        for op in ("placeholder", "call_module", "get_attr", "call_method", "output"):
            assert graph.find_nodes(op=op) == [n for n in graph.nodes if n.op == op]
        assert len(graph.nodes) == len(gm.graph.nodes)
        results.append((_node_facts(graph), graph.python_code("self").src,
                        [(n.name, repr(n.args), repr(n.kwargs)) for n in gone]))
    assert results[0] == results[1]
    assert results[0][:2] == (_node_facts(gm.graph), gm.graph.python_code("self").src)


@pytest.mark.parametrize("training", [True, False])
def test_a_new_container_is_what_nn_module_makes(training):
    """The fast container has nn.Module()'s instance dictionary: the same names in the same order, each
    value of the same type and equal, none shared with another container; and it works as one."""
    made = [fxaccess.new_container_fast(training), fxaccess.new_container_public(training),
            fxaccess.new_container(training)]
    reference = nn.Module()
    reference.training = training
    for module in made:
        assert type(module) is nn.Module
        assert list(vars(module)) == list(vars(reference))
        assert all(type(value) is type(vars(reference)[key]) and value == vars(reference)[key]
                   for key, value in vars(module).items())
    fast, other = made[0], fxaccess.new_container_fast(training)
    assert not {id(v) for v in vars(fast).values() if isinstance(v, (dict, set))} & \
        {id(v) for v in vars(other).values() if isinstance(v, (dict, set))}
    fast.add_module("lin", nn.Linear(2, 2))
    fast.register_forward_hook(lambda *args: None)
    assert fast.training is training and len(fast._forward_hooks) == 1
    assert not other._modules and not other._forward_hooks  # nothing shared with another container
    assert list(fast.state_dict()) == ["lin.weight", "lin.bias"]
    copied = copy.deepcopy(fast)
    assert list(copied.state_dict()) == ["lin.weight", "lin.bias"] and copied.training is training
    assert fast.eval().training is False and fast.lin.training is False


class _NoStorage(torch.Tensor):
    """A tensor subclass with no storage of its own (as wrapper subclasses are)."""

    @staticmethod
    def __new__(cls, like):
        return torch.Tensor._make_wrapper_subclass(cls, like.shape, dtype=like.dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(str(func))


def _tensor_kinds() -> dict:
    from torch._subclasses.fake_tensor import FakeTensorMode

    base = torch.randn(10)
    with FakeTensorMode():
        fake = torch.empty(3)
    with warnings.catch_warnings():  # (nested, quantized and CSR tensors warn that they are beta or deprecated)
        warnings.simplefilter("ignore")
        return {"dense": base, "view": base[3:], "empty view": base[10:], "empty": torch.empty(0),
                "parameter": nn.Parameter(torch.randn(2)), "meta": torch.empty(3, device="meta"), "fake": fake,
                "quantized": torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8),
                "nested": torch.nested.nested_tensor([torch.randn(2), torch.randn(3)]),
                "complex view": torch.randn(4, dtype=torch.cfloat)[1:], "sparse": torch.randn(3, 3).to_sparse(),
                "csr": torch.randn(3, 3).to_sparse_csr(), "no storage": _NoStorage(torch.randn(3))}


def _answer(function, tensor):
    try:
        return function(tensor)
    except Exception as exc:
        return type(exc)


def test_storage_keys_and_addresses_agree_without_making_storage_objects():
    """The storage identity and data address read without the Python storage object give what
    ``untyped_storage()`` gives (its errors too), on every kind of tensor; the one difference, a
    subclass without storage, means "no address" to aliasing.storage_key either way. The fast paths
    leave no storage object behind; the public ones leave one per storage, kept as long as the tensor."""
    import gc

    kinds = _tensor_kinds()
    for name, tensor in kinds.items():
        assert _answer(fxaccess.storage_key_fast, tensor) == _answer(fxaccess.storage_key_public, tensor), name
        with warnings.catch_warnings(record=True) as seen:  # the public path warns for a fake tensor
            warnings.simplefilter("always")
            fast = _answer(fxaccess.storage_address_fast, tensor)
            assert not seen, name  # the fast path never does
            public = _answer(fxaccess.storage_address_public, tensor)
        assert fast == public or (name == "no storage" and fast == 0 and public is RuntimeError), name
        assert aliasing.storage_key(tensor) == (("tensor", id(tensor)) if not fast or isinstance(fast, type)
                                                else (str(tensor.device), fast)), name
    assert fxaccess.storage_key(kinds["view"]) == fxaccess.storage_key(kinds["dense"])
    assert fxaccess.storage_address(kinds["view"]) == fxaccess.storage_address(kinds["dense"]) \
        == kinds["dense"].data_ptr() != kinds["view"].data_ptr()
    assert fxaccess.storage_keys([kinds["dense"], kinds["sparse"], kinds["view"], kinds["parameter"]]) == \
        {fxaccess.storage_key(kinds["dense"]), fxaccess.storage_key(kinds["parameter"])}

    def storages() -> int:
        gc.collect()
        return sum(type(o) is torch.UntypedStorage for o in gc.get_objects())

    fresh = [torch.randn(3) for _ in range(50)]
    before = storages()
    for tensor in fresh:
        fxaccess.storage_key_fast(tensor), fxaccess.storage_address_fast(tensor)
    fxaccess.storage_keys(fresh)
    if fxaccess.FAST:
        [aliasing.storage_key(tensor) for tensor in fresh]
    assert storages() == before
    for tensor in fresh:
        fxaccess.storage_key_public(tensor)
    assert storages() == before + 50


def test_folding_leaves_no_storage_objects_on_the_models_tensors():
    """A conv+bn fold (builder checks, aliasing keys, the planner's writes) adds no Python storage object to
    the caller's tensors or the result's, copying or in place."""
    import gc

    rules = fxrules.load_rules(fxrules.LIBRARY / "fold")
    for inplace in (False, True):
        model = traced(zoo.resnet)
        x = torch.randn(2, 3, 16, 16)
        expected = model(x)
        gc.collect()
        before = sum(type(o) is torch.UntypedStorage for o in gc.get_objects())
        result = fxrules.apply_rules(model, rules, inplace=inplace)
        gc.collect()
        assert sum(type(o) is torch.UntypedStorage for o in gc.get_objects()) == before
        assert result.report.counts and torch.allclose(result.module(x), expected, atol=1e-5)


def test_erase_node_keeps_erase_node_s_errors_and_hooks():
    gm = traced(zoo.mlp)
    seen = []
    gm._register_erase_node_hook(seen.append)
    graph = gm.graph
    used = next(n for n in graph.nodes if n.op == "call_module")
    with pytest.raises(RuntimeError, match="still had"):
        fxaccess.erase_node_fast(graph, used)
    with graph.inserting_after(used):
        dead = graph.call_function(torch.relu, (used,))
    fxaccess.erase_node_fast(graph, dead)
    assert seen == [dead] and dead._erased and dead not in used.users


def test_create_node_runs_the_owners_creation_hooks():
    gm = traced(zoo.mlp)
    seen = []
    gm._register_create_node_hook(seen.append)
    graph = gm.graph
    with graph.inserting_before(next(iter(graph.find_nodes(op="output")))):
        node = fxaccess.create_node_fast(graph, "call_function", torch.relu, (next(iter(graph.nodes)),), {}, {})
    assert seen == [node]


def test_the_quiet_lookup_table_changes_nothing_but_the_time():
    gm = traced(zoo.transformer)
    codes = []
    for quiet in (fxaccess.quiet_lookup_table_fast, fxaccess.quiet_lookup_table_public):
        graph = fxaccess.copy_graph_fast(gm.graph)
        real = graph._find_nodes_lookup_table
        module = fx.GraphModule(gm, fxaccess.copy_graph_public(gm.graph))  # has every attribute
        with quiet(graph):
            module.graph = graph
        assert graph._find_nodes_lookup_table is real
        assert all(node in real for node in graph.nodes)
        graph.lint()
        codes.append(module.code)
    assert codes[0] == codes[1] == gm.code


def test_release_owner_agrees():
    for release in (fxaccess.release_owner_fast, fxaccess.release_owner_public):
        gm = traced(zoo.mlp)
        assert gm.graph.owning_module is gm
        release(gm.graph)
        assert gm.graph.owning_module is None


class KeepingTracer(fx.Tracer):
    """A tracer of its own (at module level: GraphModule records only importable tracers)."""


def test_empty_graph_like_keeps_the_tracer():
    model = seeded(zoo.mlp)
    graph = KeepingTracer().trace(model)
    empty = fxaccess.empty_graph_like(graph)
    assert list(empty.nodes) == []
    assert fx.GraphModule(nn.Module(), empty)._tracer_cls is fx.GraphModule(model, graph)._tracer_cls is KeepingTracer


# ------------------------------------------------------------------------------ module accessors


@pytest.mark.parametrize("name", list(MODELS))
def test_module_walks_agree(name):
    model = seeded(MODELS[name])
    leaves = [m for n, m in model.named_modules() if n and not list(m.children())]
    if leaves:
        model.shared_leaf = leaves[0]
    for path, module in fxaccess.modules_by_path_public(model).items():
        assert fxaccess.children_fast(module) == fxaccess.children_public(module), path
        for child_name in list(module._modules) + ["missing", "training"]:
            assert fxaccess.child_fast(module, child_name) is fxaccess.child_public(module, child_name)
    fast, public = fxaccess.modules_by_path_fast(model), fxaccess.modules_by_path_public(model)
    assert fast.keys() == public.keys()
    assert all(fast[k] is public[k] for k in public)


@pytest.mark.parametrize("name", list(MODELS))
def test_module_members_agree(name):
    model = seeded(MODELS[name])
    for path, module in fxaccess.modules_by_path_public(model).items():
        assert fxaccess.own_parameters_fast(module) == fxaccess.own_parameters_public(module)
        assert fxaccess.own_buffers_fast(module) == fxaccess.own_buffers_public(module)
        ids = [[id(t) for t in paths(module)] for paths in (fxaccess.tensors_fast, fxaccess.tensors_public)]
        assert ids[0] == ids[1] or (list(dict.fromkeys(ids[0])) == ids[1] and not list(module.children())), path
        fast, public = fxaccess.members_fast(module), fxaccess.members_public(module)
        assert {k: v for k, v in fast.items() if v is not None} == {k: v for k, v in public.items() if v is not None}
        names = set(fast) | {"missing", "forward", "training"}
        for member in names:
            assert fxaccess.own_parameter_fast(module, member) is fxaccess.own_parameter_public(module, member)
            assert fxaccess.registered_member_fast(module, member, "absent") is \
                fxaccess.registered_member_public(module, member, "absent")
            assert fxaccess.holds_non_module_fast(module, member) == fxaccess.holds_non_module_public(module, member)
    registered = fxaccess.registered_values(model)
    assert set(registered.buffers) - registered.non_persistent == {
        k for k in model.state_dict() if "." not in k and k in registered.buffers}


def test_shared_modules_and_tensors_are_seen_under_every_name():
    model = seeded(Shared)
    for children in (fxaccess.children_fast, fxaccess.children_public):
        assert list(children(model)) == ["conv", "bn", "again"]
    for members in (fxaccess.own_parameters_fast, fxaccess.own_parameters_public):
        assert list(members(model)) == ["scale", "scale_alias"]
    assert fxaccess.registered_values(model).non_persistent == {"scratch"}
    for walk in (fxaccess.modules_by_path_fast, fxaccess.modules_by_path_public):
        assert walk(model).keys() == {"", "conv", "bn", "again"}


@pytest.mark.parametrize("member", ["conv", "scale", "count", "scratch", "constant", "training"])
def test_take_member_agrees(member):
    taken = []
    for take in (fxaccess.take_member_fast, fxaccess.take_member_public):
        model = seeded(Shared)
        before = dict(fxaccess.members_public(model))
        value = take(model, member)
        assert value is not None
        with pytest.raises(AttributeError):
            getattr(model, member)
        after = fxaccess.members_public(model)
        assert after.keys() == before.keys() - {member}
        taken.append((type(value), value.shape if isinstance(value, torch.Tensor) else None))
    assert taken[0] == taken[1]


def test_putting_members_agrees():
    results = []
    conv, weight, buffer = nn.Conv2d(1, 1, 1), nn.Parameter(torch.ones(2)), torch.zeros(3)
    for put_child, put_buffer, put_parameter in (
            (fxaccess.put_child_fast, fxaccess.put_buffer_fast, fxaccess.put_parameter_fast),
            (fxaccess.put_child_public, fxaccess.put_buffer_public, fxaccess.put_parameter_public)):
        module = nn.Module()
        put_child(module, "conv", conv)
        put_buffer(module, "buf", buffer)
        put_parameter(module, "weight", weight)
        assert module.conv is conv and module.buf is buffer and module.weight is weight
        results.append((list(module.state_dict()), [n for n, _ in module.named_modules()],
                        [n for n, _ in module.named_parameters()], [n for n, _ in module.named_buffers()]))
    assert results[0] == results[1]


# ------------------------------------------------------------------------------ operators


@pytest.mark.parametrize("op", [torch.ops.aten.add.Tensor, torch.ops.aten.convolution.default,
                                torch.ops.aten.relu_.default, torch.ops.aten.native_batch_norm.default,
                                torch.ops.aten.view.default, torch.ops.aten.sum.dim_IntList])
def test_op_signatures_agree(op):
    assert fxaccess.is_op_overload(op)
    assert fxaccess.op_signature_fast(op) == fxaccess.op_signature_public(op)
    names = [a.name for a in fxaccess.op_schema(op).arguments]
    assert ["input" if n == "self" else n for n in names] == list(fxaccess.op_signature_fast(op).parameters)


def test_operator_kinds():
    assert not fxaccess.is_op_overload(torch.relu) and not fxaccess.is_op_overload(torch.ops.aten.add)
    assert fxaccess.is_higher_order_operator(torch.ops.higher_order.cond)
    assert not fxaccess.is_higher_order_operator(torch.ops.aten.add.Tensor)


# ------------------------------------------------------------------------------ the engine on public paths


def _outcome(result) -> tuple:
    module = result.module
    report = {k: v for k, v in result.report.to_json().items() if k != "seconds"}
    return (module.code, report, dict(result.counts),
            [(n, type(m).__name__, m.training) for n, m in module.named_modules(remove_duplicate=False)],
            {k: (v.shape, v.dtype) for k, v in module.state_dict().items()},
            [(n.name, n.op, str(n.target), {k: v for k, v in n.meta.items() if k not in ("val", "from_node")}) for n in module.graph.nodes])


def _both_paths(monkeypatch, run) -> list:
    outcomes = []
    for fast in (True, False):
        monkeypatch.setattr(fxaccess, "FAST", fast)
        outcomes.append(run())
    monkeypatch.undo()
    return outcomes


CASES = [
    ("resnet", "fold"), ("deep_cnn", "fold"), ("shared", "fold"), ("transformer", "cleanup"),
    ("methods", "canonicalize"), ("redundant", "cleanup"), ("mlp", "swap"), ("transformer", "swap"),
]


@pytest.mark.parametrize("name, library", CASES)
@pytest.mark.slow
def test_the_engine_on_public_paths_gives_the_same_results(monkeypatch, name, library):
    build = MODELS.get(name) or getattr(zoo, name)
    rules = fxrules.load_rules(fxrules.LIBRARY / library)
    x = torch.randn(2, 3, 16, 16) if name == "shared" else zoo.example_inputs(name if name != "deep_cnn"
                                                                                 else "deep_cnn")[0]

    def run():
        model = seeded(build).eval()
        result = fxrules.apply_rules(model, rules, example_inputs=(x,))
        with torch.no_grad():
            return _outcome(result), result.module(x)

    (fast, fast_out), (public, public_out) = _both_paths(monkeypatch, run)
    assert fast == public
    assert torch.equal(fast_out, public_out)
    assert fast[1]["applied"] or library == "swap" and name == "transformer"


def test_a_graph_module_input_keeps_its_meta_on_public_paths(monkeypatch):
    def run():
        gm = traced(zoo.resnet)
        gm.meta["note"] = "kept"
        result = fxrules.apply_rules(gm, fxrules.load_rules(fxrules.LIBRARY / "fold"),
                                     example_inputs=zoo.example_inputs("resnet"))
        vals = [tuple(n.meta["val"].shape) for n in result.module.graph.nodes
                if isinstance(n.meta.get("val"), torch.Tensor)]
        return _outcome(result), result.module.meta.get("note"), vals

    fast, public = _both_paths(monkeypatch, run)
    assert fast == public
    assert fast[1] == "kept" and fast[2]


def test_an_exported_program_on_public_paths(monkeypatch):
    model = seeded(zoo.resnet).eval()
    inputs = zoo.example_inputs("resnet")
    program = torch.export.export(model, inputs)
    rules = fxrules.load_rules(fxrules.LIBRARY / "aten")

    def run():
        result = fxrules.apply_rules(copy.deepcopy(program), rules)
        with torch.no_grad():
            return _outcome(result), result.module(*inputs)

    (fast, fast_out), (public, public_out) = _both_paths(monkeypatch, run)
    assert fast == public
    assert torch.equal(fast_out, public_out)
    assert fast[1]["applied"]


class _DictOut(nn.Module):
    def forward(self, x, y):
        return {"a": torch.relu(torch.relu(x)), "b": (y * 2,)}


@pytest.mark.parametrize("inplace", [False, True])
def test_an_exported_module_rewrites_without_a_warning(inplace):
    """The copy of an exported module's graph copies its code generator but shares its pytree specs:
    deep-copying a TreeSpec warns on torch 2.13 (FutureWarning from inside torch), which failed every
    copying rewrite of an exported module under ``-W error``."""
    inputs = (torch.randn(2, 3), torch.randn(3))
    gm = torch.export.export(_DictOut(), inputs).module()
    rules = fxrules.parse_rules("rule r: call_function aten.relu.default(call_function aten.relu.default($x))\n"
                                "    -> call_function aten.relu.default($x)")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = fxrules.apply_rules(gm, rules, inplace=inplace)
    assert result.counts == {"r": 1}
    out = result.module(*inputs)
    assert torch.equal(out["a"], torch.relu(inputs[0])) and torch.equal(out["b"][0], inputs[1] * 2)
    codegen, original = result.module.graph._codegen, gm.graph._codegen
    assert (codegen is original) == inplace
    assert codegen.pytree_info.in_spec is original.pytree_info.in_spec
    assert codegen.pytree_info.out_spec is original.pytree_info.out_spec


def test_saving_on_public_paths(monkeypatch, tmp_path):
    from fxrules.tools.saving import save_module

    model = seeded(Shared).eval()
    result = fxrules.apply_rules(model, fxrules.load_rules(fxrules.LIBRARY / "fold"))
    written = []
    for fast in (True, False):
        monkeypatch.setattr(fxaccess, "FAST", fast)
        path = save_module(result.module, tmp_path / str(fast))
        written.append(((path / "module.py").read_text(), sorted(p.name for p in path.iterdir())))
        loaded = fxrules.load_saved(path)
        x = torch.randn(2, 3, 8, 8)
        with torch.no_grad():
            assert torch.equal(loaded(x), result.module(x))
    assert written[0] == written[1]


@pytest.mark.slow
def test_the_verifier_on_public_paths(monkeypatch):
    rules = fxrules.parse_rules('rule relu_relu: call_function torch.relu(call_function torch.relu($x)) '
                                '-> call_function torch.relu($x)\n'
                                'rule swap_mod: call_module ReLU{inplace=False}($x) -> call_function F.relu($x)\n')

    def run():
        report = fxrules.verify(rules, max_examples=10, seed=3, database=None)
        return [(v.rule, v.grade, v.hosts_checked, v.ok) for v in report.verdicts]

    fast, public = _both_paths(monkeypatch, run)
    assert fast == public
    assert all(checked for _, _, checked, _ in fast)
    assert fast[0][3]  # relu_relu validated (swap_mod may meet a drawn forward hook: wrong until the engine refuses it)


def test_fake_tensors_and_impurity():
    mode = fxaccess.new_fake_mode()
    with fxaccess.fake_copy_mode(mode):
        fake = copy.deepcopy(nn.Linear(3, 2))
    assert fxaccess.is_fake_tensor(fake.weight) and not fxaccess.is_fake_tensor(torch.ones(1))
    assert tuple(fake.weight.shape) == (2, 3)
    assert fxaccess.function_is_impure(torch.ops.aten._print.default, ("x",), {})
    assert not fxaccess.function_is_impure(torch.ops.aten.add.Tensor, (), {})


def test_graph_module_internals_are_what_a_graph_module_sets_up():
    gm = traced(zoo.mlp)
    own = {k for k in vars(gm) if not k.startswith("__")}
    # shape_env belongs to the trace (a rewrite carries it over like any attribute of the input)
    assert own - fxaccess.GRAPH_MODULE_INTERNALS <= {"shape_env"}, own - fxaccess.GRAPH_MODULE_INTERNALS
    assert set(fxaccess.EXPORT_SPECS) <= fxaccess.GRAPH_MODULE_INTERNALS


def test_hooked_kinds():
    module = nn.Linear(2, 2)
    assert fxaccess.hooked_kinds(module) == []
    module.register_forward_pre_hook(lambda m, args: None)
    module.register_full_backward_hook(lambda m, gi, go: None)
    assert fxaccess.hooked_kinds(module) == ["forward_pre_hooks", "backward_hooks"]


@pytest.mark.parametrize("register", ["none", "register_forward_hook", "register_forward_pre_hook",
                                      "register_full_backward_hook", "register_full_backward_pre_hook", "removed"])
def test_hooked_kinds_fast_and_public_agree(register):
    module = nn.Linear(2, 2)
    if register == "removed":
        module.register_forward_hook(lambda m, args, out: None).remove()
    elif register != "none":
        hook = (lambda m, a, b: None) if "backward_hook" in register or register == "register_forward_hook" \
            else (lambda m, a: None)
        getattr(module, register)(hook)
    expected = [] if register in ("none", "removed") else [register.replace("register_", "").replace("full_", "") + "s"]
    assert fxaccess.hooked_kinds_fast(module) == fxaccess.hooked_kinds_public(module) == expected


@pytest.mark.parametrize("change", ["none", "forward_hook", "backward_pre_hook", "watched_attribute",
                                    "flag_attribute", "flag_parameter", "flag_buffer", "flag_submodule",
                                    "other_attribute", "other_buffer"])
def test_plain_instance_fast_and_public_agree(change):
    """A module is plain unless it sets a watched name itself, has a hook of its own or registers a
    flag as a member; both paths say so alike."""
    module = nn.Linear(2, 2)
    watched, flags = frozenset({"forward", "inplace", "_is_impure"}), ("inplace", "_is_impure")
    if change == "forward_hook":
        module.register_forward_hook(lambda m, args, out: None)
    elif change == "backward_pre_hook":
        module.register_full_backward_pre_hook(lambda m, grad: None)
    elif change == "watched_attribute":
        module.forward = lambda x: x
    elif change == "flag_attribute":
        module.inplace = True
    elif change == "flag_parameter":
        module.register_parameter("inplace", nn.Parameter(torch.ones(1)))
    elif change == "flag_buffer":
        module.register_buffer("_is_impure", torch.ones(1))
    elif change == "flag_submodule":
        module.add_module("inplace", nn.ReLU())
    elif change == "other_attribute":
        module.note = "kept"
    elif change == "other_buffer":
        module.register_buffer("scale", torch.ones(1))
    expected = change in ("none", "other_attribute", "other_buffer")
    assert fxaccess.plain_instance_fast(module, watched, flags) is expected
    assert fxaccess.plain_instance_public(module, watched, flags) is expected


# -- fake copies of modules (fake_module_copy) -------------------------------------------------


def _tied() -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    model[2].weight = model[0].weight  # one parameter under two modules
    return model


def _with(module: nn.Module, name: str, value) -> nn.Module:
    setattr(module, name, value)
    return module


def _training_norm() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.GELU("tanh")).train()


LIGHT = {  # modules whose fake copy is made directly; the input their forward takes
    "linear": (lambda: nn.Linear(3, 2), (5, 3)),
    "linear_frozen_half": (lambda: nn.Linear(3, 2).half().requires_grad_(False), (5, 3)),
    "conv_bn_eval": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval(), (2, 3, 6, 6)),
    "conv_bn_train": (_training_norm, (2, 3, 6, 6)),
    "layer_norm": (lambda: nn.LayerNorm((4, 5)), (2, 4, 5)),
    "embedding": (lambda: nn.Embedding(10, 3), None),
    "dropout": (lambda: nn.Dropout(0.3).eval(), (2, 3)),
    "tied": (_tied, (2, 4)),
    "pool_flatten": (lambda: nn.Sequential(nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten()), (2, 3, 4, 4)),
    "own_setstate_softmax": (lambda: nn.Softmax(-1), (2, 3)),
    # nn.Module.__getstate__ leaves out what Module.compile() set: so do both copies
    "compiled_call_left_out": (lambda: _with(nn.Linear(2, 2), "_compiled_call_impl", len), (3, 2)),
    "encoder_layer": (lambda: nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, batch_first=True).eval(), (2, 3, 4)),
}


def _deep_fake(mode, module):
    with fxaccess.fake_copy_mode(mode):
        return copy.deepcopy(module)


def _described(value) -> object:
    """What a fake copy must agree on: tensors by metadata, modules by class, training mode, state."""
    if isinstance(value, nn.parameter.UninitializedTensorMixin):
        return ("uninitialized", type(value), value.requires_grad)
    if isinstance(value, torch.Tensor):
        return ("tensor", isinstance(value, nn.Parameter), fxaccess.is_fake_tensor(value), tuple(value.shape),
                value.dtype, value.stride(), value.device, value.requires_grad)
    if isinstance(value, nn.Module):
        own = {k: v for k, v in vars(value).items() if k not in ("_parameters", "_buffers", "_modules")}
        return (type(value), value.training, {k: _described(v) for k, v in own.items()},
                {k: _described(v) for k, v in value._parameters.items()},
                {k: _described(v) for k, v in value._buffers.items()},
                {k: _described(v) for k, v in value._modules.items()})
    if isinstance(value, dict):
        return (type(value), {k: _described(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return (type(value), [_described(v) for v in value])
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, torch.dtype, torch.device)):
        return value
    return type(value)  # (a weak reference, a function: by kind)


def _values(tensor: torch.Tensor):
    return None if isinstance(tensor, nn.parameter.UninitializedTensorMixin) else tensor.detach().clone()


def _same_values(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def _snapshot(module: nn.Module) -> list:
    """Everything of ``module`` a copy must leave as it was: each attribute's object, each tensor's values."""
    found = []
    for name, inner in module.named_modules(remove_duplicate=False):
        found.append((name, type(inner), inner.training, {k: id(v) for k, v in vars(inner).items()},
                      {k: (id(v), _values(v), v.requires_grad) for k, v in inner._parameters.items()
                       if v is not None},
                      {k: (id(v), _values(v)) for k, v in inner._buffers.items() if v is not None},
                      {k: dict(v) for k, v in vars(inner).items() if k.endswith("hooks")}))
    return found


def _same_snapshot(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x[:4] != y[:4] or x[6] != y[6] or x[4].keys() != y[4].keys() or x[5].keys() != y[5].keys():
            return False
        for k in x[4]:
            if x[4][k][0] != y[4][k][0] or not _same_values(x[4][k][1], y[4][k][1]) or x[4][k][2] != y[4][k][2]:
                return False
        for k in x[5]:
            if x[5][k][0] != y[5][k][0] or not _same_values(x[5][k][1], y[5][k][1]):
                return False
    return True


@pytest.mark.parametrize("name", sorted(LIGHT))
def test_a_direct_fake_copy_is_the_deep_copy(name):
    build, shape = LIGHT[name]
    module = seeded(build)
    before = _snapshot(module)
    mode = fxaccess.new_fake_mode()
    light = fxaccess._light_fake_copy(mode, module, {})
    assert light is not None, "the copy went through the deep copy"
    deep = _deep_fake(mode, module)
    assert _described(light) == _described(deep)
    assert fxaccess.fake_module_copy(mode, module) is not module
    if name == "tied":  # one parameter, one copy (as the deep copy's memo gives)
        assert light[0].weight is light[2].weight and light[0].weight is not module[0].weight
    # the copies compute the same metadata, and running one (a train-mode norm updates its running
    # statistics) leaves the module as it was
    x = torch.randint(0, 10, (2, 3)) if shape is None else torch.randn(*shape)
    if module.training or name == "linear_frozen_half":
        x = x.half() if name == "linear_frozen_half" else x
    outs = []
    for copied in (light, deep):
        with mode:
            out = fxaccess.hooks_call(copied)(mode.from_tensor(x))
        outs.append(_described(out))
    assert outs[0] == outs[1]
    assert _same_snapshot(before, _snapshot(module))


class _OwnLinear(nn.Linear):
    pass


def _hooked() -> nn.Module:
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    model[1].register_forward_hook(lambda m, args, out: out)
    return model


def _listed() -> nn.Module:
    module = nn.Linear(3, 3)
    module.notes = ["mutable"]  # a deep copy copies the list: not a copy made directly
    return module


DEEP = {  # modules whose fake copy goes through the deep copy
    "hooked_child": _hooked,
    "own_class": lambda: _OwnLinear(3, 3),
    "flat_weights_list": lambda: nn.LSTM(3, 4),
    "list_attribute": _listed,
    "lazy_parameter": lambda: nn.LazyLinear(3),
    "size_attribute": lambda: _with(nn.Linear(2, 2), "shape", torch.Size([2])),
}


@pytest.mark.parametrize("name", sorted(DEEP))
def test_a_module_not_known_to_copy_directly_is_deep_copied(name):
    module = seeded(DEEP[name])
    before = _snapshot(module)
    mode = fxaccess.new_fake_mode()
    assert fxaccess._light_fake_copy(mode, module, {}) is None
    copied = fxaccess.fake_module_copy(mode, module)
    assert _described(copied) == _described(_deep_fake(mode, module))
    assert _same_snapshot(before, _snapshot(module))


def test_example_inputs_give_the_same_values_with_direct_fake_copies(monkeypatch):
    """Propagation with the direct copies (the fast path) and the deep copies (the public path): the
    same meta['val'] on every node of a model with norms in training mode, tied and frozen weights."""

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = _training_norm()
            self.head = _tied()
            self.head[0].bias.requires_grad_(False)
            self.tail = nn.LSTM(4, 4, batch_first=True)  # deep-copied on both paths

        def forward(self, x):
            y = self.body(x).flatten(2)[..., :4]
            z = self.head(y)
            return self.tail(z)[0]

    x = torch.randn(2, 3, 6, 6)

    def run():
        model = seeded(Model)
        before = _snapshot(model)
        result = fxrules.apply_rules(model, fxrules.parse_rules("call_module Dropout($x) -> $x"),
                                     example_inputs=(x,))
        assert _same_snapshot(before, _snapshot(model))
        return [(n.name, _described(n.meta.get("val"))) for n in result.module.graph.nodes]

    fast, public = _both_paths(monkeypatch, run)
    assert fast == public
    assert sum(1 for _, val in fast if isinstance(val, tuple) and val[:1] == ("tensor",)) > 5


# -- one fake copy per kind of module, for propagation (fake_module_to_run) ------------------------


def _transposed_weight() -> nn.Module:
    module = nn.Linear(4, 4)
    module.weight = nn.Parameter(module.weight.detach().t().contiguous().t())  # the same shape, other strides
    return module


def _signature_pairs():
    """(a, b, whether their calls compute alike) for run_signature."""
    return [
        (lambda: nn.Linear(3, 2), lambda: nn.Linear(3, 2), True),  # other values, the same metadata
        (lambda: nn.Linear(3, 2), lambda: nn.Linear(3, 2, bias=False), False),
        (lambda: nn.Linear(3, 2), lambda: nn.Linear(2, 3), False),
        (lambda: nn.Linear(4, 4), _transposed_weight, False),  # strides
        (lambda: nn.Linear(3, 2), lambda: nn.Linear(3, 2).requires_grad_(False), False),
        (lambda: nn.Linear(3, 2), lambda: nn.Linear(3, 2).double(), False),
        (lambda: nn.BatchNorm1d(3), lambda: nn.BatchNorm1d(3).eval(), False),  # the training flag
        (lambda: nn.Flatten(1), lambda: nn.Flatten(True), False),  # 1 and True: typed
        (lambda: nn.Softmax(1), lambda: nn.Softmax(1.0), False),
        (lambda: nn.Softmax(1), lambda: nn.Softmax(1), True),
        (lambda: nn.Upsample(scale_factor=(2.0, 2.0)), lambda: nn.Upsample(scale_factor=(2.0, 3.0)), False),
        (lambda: nn.GELU("tanh"), lambda: nn.GELU("none"), False),
        (lambda: nn.ReLU(), lambda: nn.ReLU6(), False),  # the class
    ]


@pytest.mark.parametrize("index", range(len(_signature_pairs())))
def test_run_signatures_tell_apart_what_a_call_computes_from(index):
    make_a, make_b, alike = _signature_pairs()[index]
    a, b = make_a(), make_b()
    sa, sb = fxaccess.run_signature(a), fxaccess.run_signature(b)
    assert sa is not None and sb is not None
    hash(sa), hash(sb)  # a dictionary key (raises TypeError if a part is unhashable)
    assert (sa == sb) is alike


@pytest.mark.parametrize("name", sorted(DEEP) + ["container", "leaf_with_hook", "subclass_parameter"])
def test_a_module_with_no_run_signature_gets_a_copy_of_its_own(name):
    if name == "container":
        module = nn.Sequential(nn.Linear(2, 2))
    elif name == "leaf_with_hook":
        module = nn.Linear(2, 2)
        module.register_forward_pre_hook(lambda m, args: None)
    elif name == "subclass_parameter":
        module = nn.Linear(2, 2)
        module._parameters["weight"] = nn.parameter.UninitializedParameter()
    else:
        module = seeded(DEEP[name])
    assert fxaccess.run_signature(module) is None
    mode, shared = fxaccess.new_fake_mode(), {}
    first, second = (fxaccess.fake_module_to_run(mode, module, shared) for _ in range(2))
    assert first is not second and not shared


class _Blocks(nn.Module):
    """Identical blocks, and modules that differ from them in one fact each."""

    def __init__(self):
        super().__init__()
        self.same = nn.ModuleList([nn.Linear(4, 4) for _ in range(6)])
        self.frozen = nn.Linear(4, 4).requires_grad_(False)
        self.strided = _transposed_weight()
        self.norm_train, self.norm_eval = nn.BatchNorm1d(4), nn.BatchNorm1d(4).eval()
        self.wide = nn.Linear(4, 8)
        self.wide64 = nn.Linear(4, 4).double()
        self.flat1, self.flat2 = nn.Flatten(1), nn.Flatten(2)

    def forward(self, x):
        for layer in self.same:
            x = torch.relu(layer(x))
        y = self.strided(x) + self.frozen(x) + self.frozen(x.detach())
        y = self.norm_train(y) + self.norm_eval(y)
        z = self.wide64(y.double()).float()
        return self.wide(z + y), self.flat1(x.unsqueeze(2).unsqueeze(3)), self.flat2(x.unsqueeze(2).unsqueeze(3))


def test_propagation_shares_one_fake_copy_per_kind_of_module_and_gives_the_same_values(monkeypatch):
    """meta['val'] of every node is what a copy per module gives; the six identical Linears share one
    copy, and each module that differs in one fact (requires_grad, strides, training, width, dtype, an
    attribute) gets its own; the model is left as it was (a train-mode norm ran on a fake copy)."""
    x = torch.randn(3, 4)
    rules = fxrules.parse_rules("call_module Dropout($x) -> $x")
    made = []
    copy_one = fxaccess.fake_module_copy

    def counting(mode, module):
        made.append(module)
        return copy_one(mode, module)

    monkeypatch.setattr(fxaccess, "fake_module_copy", counting)

    def values(model):
        result = fxrules.apply_rules(model, rules, example_inputs=(x,))
        return [(n.name, _described(n.meta.get("val"))) for n in result.module.graph.nodes]

    model = seeded(_Blocks)
    before = _snapshot(model)
    shared = values(model)
    assert _same_snapshot(before, _snapshot(model))
    copies_shared = len(made)
    made.clear()
    monkeypatch.setattr(fxaccess, "run_signature", lambda module: None)
    own = values(seeded(_Blocks))
    assert shared == own
    # 14 modules called (`frozen` twice): a copy per module unshared; shared, the six `same` make one
    assert len(made) == 14
    assert copies_shared == 14 - 5
    tensors = [v for v in dict(shared).values() if isinstance(v, tuple) and v[:1] == ("tensor",)]
    assert any(v[4] == torch.float64 for v in tensors) and any(v[3] == (3, 8) for v in tensors)


class _ConvBnBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)) for _ in range(4)])
        self.other = nn.Sequential(nn.Conv2d(4, 6, 1), nn.BatchNorm2d(6))  # another shape: its own copy

    def forward(self, x):
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.other(x)


def test_the_guards_dry_runs_share_the_fake_copies_of_built_modules_alike(monkeypatch):
    """Folding conv+bn with example inputs: each fold's new module runs on fake tensors (the guards' dry
    run). The four folded modules of one shape share one fake copy, with the propagation's copies in the
    same run; the new nodes' meta['val'] and the report are what a copy per module gives."""
    rules = fxrules.parse_rules("""
rule fold "" [approx]:
    call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn where not bn.training
    -> call_module fxrules.builders.fold_conv_bn(conv, bn)($x)
""")
    x = torch.randn(2, 4, 5, 5)
    made = []
    copy_one = fxaccess.fake_module_copy

    def counting(mode, module):
        made.append(type(module).__name__)
        return copy_one(mode, module)

    monkeypatch.setattr(fxaccess, "fake_module_copy", counting)

    def run():
        made.clear()
        result = fxrules.apply_rules(seeded(_ConvBnBlocks).eval(), rules, example_inputs=(x,))
        assert result.counts["fold"] == 5
        return [(n.name, _described(n.meta.get("val"))) for n in result.module.graph.nodes], list(made)

    shared, shared_made = run()
    monkeypatch.setattr(fxaccess, "run_signature", lambda module: None)
    own, own_made = run()
    assert shared == own
    # a copy per module: 10 modules propagated, 5 folded modules dry-run (each a Conv2d). Shared: one
    # per kind propagated (two shapes of each class), and the folded convs are Conv2d modules of the
    # convs' own kind (class, attributes, tensor metadata): they run on the propagation's copies
    assert sorted(own_made) == sorted(["Conv2d"] * 10 + ["BatchNorm2d"] * 5)
    assert sorted(shared_made) == sorted(["Conv2d"] * 2 + ["BatchNorm2d"] * 2)
