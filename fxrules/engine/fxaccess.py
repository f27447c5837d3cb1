"""Every use fxrules makes of torch's private members, in one place, each beside its public equivalent.

The engine, the verifier and the tools reach into torch.fx and nn.Module internals for speed:
copying a graph without re-deriving every name, creating a node without ``create_node``'s
argument walk, reading a module's own dictionaries instead of walking generators. Each such
access is a pair of functions here:

- ``<name>_fast``: the private way, written and tested for the torch versions in
  :data:`WRITTEN_FOR`;
- ``<name>_public``: the same answer through torch's public API (slower, sometimes much);
- ``<name>``: the one the rest of fxrules calls, which takes the fast path when :data:`FAST`
  is true and the public path otherwise.

:data:`FAST` is the single switch point: decided once, at import, from ``torch.__version__``.
A torch release this module was not written for may have changed the internals, so it gets the
public paths: slower, but correct. Tests call both paths of every pair on real graphs and
modules and check they agree, and run the engine with :data:`FAST` set false.

A few private members have no public equivalent at all (the operator classes of ``torch._ops``,
an operator's schema, a graph's tracer class, a module's non-persistent buffer names, the hook
call that bypasses a patched ``nn.Module.__call__``). Those are the last section: one function
each, the same on every version, so that a torch change is fixed here only.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import copyreg
import logging
import re
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional

import torch
from torch import fx, nn
from torch._library.utils import _RANDOM_FUNCTIONS as _TORCH_RANDOM_FUNCTIONS
from torch._library.utils import is_impure as _torch_is_impure
from torch._subclasses.fake_tensor import FakeCopyMode as _FakeCopyMode
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
from torch._subclasses.fake_tensor import FakeTensorMode as _FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode as _TorchDispatchMode

from fxrules.engine import codegen

WRITTEN_FOR = ("2.13",)
"""The torch releases (major.minor) whose internals the fast paths were written and tested against."""


def fast_paths_apply(version: str) -> bool:
    """Whether the fast paths may be used with torch ``version`` (``torch.__version__``, such as
    ``2.13.0+cpu``): its major.minor release is one of :data:`WRITTEN_FOR`."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return match is not None and f"{match.group(1)}.{match.group(2)}" in WRITTEN_FOR


FAST: bool = fast_paths_apply(torch.__version__)
"""The switch point: true takes every fast path below, false every public one. Set once, here, at
import; tests set it false to run the engine on the public paths."""


# ---------------------------------------------------------------------------
# Nodes
# ---------------------------------------------------------------------------


def erased_fast(node: fx.Node) -> bool:
    return node._erased


def erased_public(node: fx.Node) -> bool:
    """Not among the nodes ``graph.find_nodes`` reports: erasing a node takes it out of the lookup
    table behind ``find_nodes`` (a scan of every node of that op for ops other than call_function)."""
    graph = node.graph
    if graph is None:
        return True
    target = node.target if node.op == "call_function" else None
    return node not in graph.find_nodes(op=node.op, target=target)


def erased(node: fx.Node) -> bool:
    """Whether ``node`` was erased from its graph (an iterator or a queue may still hold it).
    Called per queued node: the fast path is :func:`erased_fast` written out, without a second call."""
    return node._erased if FAST else erased_public(node)


def sort_key_fast(node: fx.Node) -> Any:
    return node._sort_key


def sort_key_public(node: fx.Node) -> Any:
    """The node itself: nodes of one graph compare by position (``a < b``)."""
    return node


def sort_key(node: fx.Node) -> Any:
    """A value that orders the nodes of one graph by position, for a heap: the node's own cached
    position key on the fast path (a tuple compares without a call into torch). Called per queued
    node: the paths are :func:`sort_key_fast` and :func:`sort_key_public` written out."""
    return node._sort_key if FAST else node


# ---------------------------------------------------------------------------
# Graphs
# ---------------------------------------------------------------------------


def copy_graph_fast(graph: fx.Graph) -> fx.Graph:
    """The nodes ``copy.deepcopy(graph)`` makes, in a fraction of the time.

    The same nodes in the same order, with the same names, ops, targets, types, arguments
    (mapped to the new nodes) and shallow copies of ``meta``; a deep copy of the code
    generator (:func:`copy_codegen`). The copy's name table is the original's (every name it
    ever handed out, and its per-base counters), so a node created in the copy gets the name it
    would get in the original: the rewrite names new nodes as an in-place edit would.
    ``Graph.node_copy`` instead re-derives each name through ``_Namespace.create_name`` (a
    regular expression per node: half the time of a deepcopy at 20,000 nodes), scans every
    argument for raw symbolic values and goes through ``Node.__setattr__`` for ``meta``.
    """
    new = fx.Graph(tracer_cls=graph._tracer_cls)
    namespace, source = new._graph_namespace, graph._graph_namespace
    table = new._find_nodes_lookup_table
    env: dict = {}
    get = env.__getitem__
    names = namespace._obj_to_name
    # The graph's own methods without their Python wrappers: ``Node.prepend`` calls ``_prepend``;
    # the lookup table's ``insert`` files a node under ``(op, target if op == "call_function"
    # else None)`` in a defaultdict.
    insert = getattr(new._root, "_prepend", None) if new._insert == new._root.prepend else None
    insert = insert or new._insert
    store = getattr(table, "table", None)
    filed = isinstance(store, collections.defaultdict) and store.default_factory is dict \
        and (type(table).insert, type(table)._key) == _TABLE_METHODS
    # A node is made as ``fx.Node(...)`` makes it, without its Python layers: ``Node.__init__`` checks
    # the op and the target's type (the source node passed the same checks) and then runs the C base's
    # ``__init__`` and ``_update_args_kwargs``; ``fx.node.map_arg`` checks that its function is callable
    # and calls the C ``_fx_map_arg``. Together a sixth of the copy at 20,000 nodes.
    map_arg, node_class, init = torch._C._fx_map_arg, fx.Node, torch._C._NodeBase.__init__
    new_node = node_class.__new__
    for node in graph.nodes:  # the output node too: it keeps its name
        args, kwargs = node.args, node.kwargs
        copied = new_node(node_class)
        init(copied, new, node.name, node.op, node.target, node.type)
        copied._update_args_kwargs(map_arg(args, get) if args else (), map_arg(kwargs, get) if kwargs else _NO_KWARGS)
        meta = node.meta
        if type(meta) is dict and type(copied.meta) is dict and not copied.meta:
            copied.meta.update(meta)
        else:
            copied.meta = copy.copy(meta)
        names[copied] = node.name
        insert(copied)
        if filed:
            op = node.op
            store[(op, node.target if op == "call_function" else None)][copied] = None
        else:
            table.insert(copied)
        env[node] = copied
    new._len += len(env)
    namespace._used_names.update(source._used_names)
    namespace._base_count.update(source._base_count)
    new._codegen = copy_codegen(graph._codegen)
    return new


def copy_codegen(codegen: Any) -> Any:
    """A deep copy of a graph's code generator that shares its pytree specs (``_PyTreeCodeGen``'s
    ``in_spec`` and ``out_spec``, which torch.export's graphs carry). A TreeSpec is immutable, and
    deep-copying one on torch 2.13 raises a ``FutureWarning`` from inside torch (its leaf specs are
    rebuilt through a deprecated class): under ``-W error`` or pytest's ``filterwarnings = error``
    every rewrite of an exported module failed there."""
    memo: dict = {}
    info = getattr(codegen, "pytree_info", None)
    for spec in (getattr(info, "in_spec", None), getattr(info, "out_spec", None)):
        if spec is not None:
            memo[id(spec)] = spec
    return copy.deepcopy(codegen, memo)


_NO_KWARGS = torch.fx.immutable_collections.immutable_dict()
"""The keywords of every node without any that the engine copies or creates, one object for all:
``Node._update_args_kwargs`` keeps an ``immutable_dict`` it is given as it is (a plain dict it converts,
one new object per node), and nothing writes to one (every mutating method raises; torch's edits give a
node new keywords, never change its own). The copy allocates one object less per node, and the cyclic
collector has one object less per node to walk."""

_TABLE = torch.fx.graph._FindNodesLookupTable if FAST else None
_TABLE_METHODS = (_TABLE.insert, _TABLE._key) if FAST else None
"""torch.fx's own lookup-table insert and key (``copy_graph_fast`` inlines them only when a graph's
table uses exactly these)."""


def copy_graph_public(graph: fx.Graph) -> fx.Graph:
    return copy.deepcopy(graph)


def copy_graph(graph: fx.Graph) -> fx.Graph:
    """A copy of ``graph``, its nodes named as in ``graph``."""
    return copy_graph_fast(graph) if FAST else copy_graph_public(graph)


def create_node_fast(graph: fx.Graph, op: str, target: Any, args: tuple, kwargs: dict, base_names: dict) -> fx.Node:
    """What ``graph.create_node`` makes, with the same name, without its argument walk.

    ``create_node`` also walks every argument with pytree to warn about raw symbolic values
    (which a rewrite only ever passes on from nodes the graph already had) and derives the
    base name from the target each time: together about half the cost of a rewrite that makes
    one node. ``base_names`` remembers the base name per ``(op, target)`` across calls. Graphs
    whose owner installed node-creation hooks go through ``create_node`` so the hooks run.
    """
    owner = graph._owning_module
    if owner is not None and getattr(owner, "_create_node_hooks", None):
        return graph.create_node(op, target, args, kwargs)
    try:
        key = (op, target)
        base = base_names.get(key)
    except TypeError:  # an unhashable target
        key, base = None, None
    if base is None:
        base = _base_name(graph, target)
        if key is not None:
            base_names[key] = base
    namespace = graph._graph_namespace
    name = codegen.unique_name(namespace, base, None)
    node = fx.Node(graph, name, op, target, args, kwargs if kwargs else _NO_KWARGS)
    namespace.associate_name_with_obj(name, node)
    graph._insert(node)
    graph._find_nodes_lookup_table.insert(node)
    graph._len += 1
    return node


def _base_name(graph: fx.Graph, target: Any) -> str:
    """``graph._target_to_str(target)``: for a module path or method name in lower case (the usual new
    module's target: a fold's ``layer1.conv_bn``, a matched ``fc1``), the target itself, without its
    regular expression (asked for every module call a rewrite makes: each has its own target). Torch's
    ``_snake_case`` puts ``_`` before an ASCII capital that follows a lower-case letter, then lowers
    the whole: a string equal to its lower-cased self has no capital to act on, and stays as it is."""
    if type(target) is str and target == target.lower() and not (target.startswith("__") and target.endswith("__")):
        return target
    return graph._target_to_str(target)


def create_node_public(graph: fx.Graph, op: str, target: Any, args: tuple, kwargs: dict,
                       base_names: dict) -> fx.Node:
    return graph.create_node(op, target, args, kwargs)


def create_node(graph: fx.Graph, op: str, target: Any, args: tuple, kwargs: dict, base_names: dict) -> fx.Node:
    """A new node at ``graph``'s insert point, named as ``graph.create_node`` names it."""
    return (create_node_fast if FAST else create_node_public)(graph, op, target, args, kwargs, base_names)


def erase_node_fast(graph: fx.Graph, node: fx.Node) -> None:
    """What ``graph.erase_node(node)`` does, without its Python layers: ``Node.__setattr__`` for the
    erased flag (which asks the lookup table, again, whether it holds the node) and ``map_arg``'s
    checks around the C ``_fx_map_arg`` that drops the node's arguments (and so its inputs' uses of
    it). A node with users, of another graph or already erased, and a graph whose owner installed
    node-erasure hooks, go through ``erase_node`` (its errors, warning and hooks)."""
    owner = graph._owning_module
    if node.users or node.graph is not graph or node._erased or \
            (owner is not None and getattr(owner, "_erase_node_hooks", None)):
        graph.erase_node(node)
        return
    graph._find_nodes_lookup_table.remove(node)
    node._remove_from_list()
    object.__setattr__(node, "_erased", True)  # iterators may still hold it
    graph._len -= 1
    map_arg = torch._C._fx_map_arg
    node._update_args_kwargs(map_arg(node._args, _to_none), map_arg(node._kwargs, _to_none))


def _to_none(node: fx.Node) -> None:
    return None


def erase_node_public(graph: fx.Graph, node: fx.Node) -> None:
    graph.erase_node(node)


def erase_node(graph: fx.Graph, node: fx.Node) -> None:
    """Erase ``node`` (without users) from ``graph``, as ``graph.erase_node`` does."""
    if FAST:
        erase_node_fast(graph, node)
    else:
        erase_node_public(graph, node)


def misread_fast(graph: fx.Graph, nodes: Any) -> Optional[tuple]:
    for node in nodes:
        if node.graph is not graph or node._erased:
            continue
        key = node._sort_key
        for used in node._input_nodes:
            if used.graph is not graph or used._erased:
                return node, used, False
            if not used._sort_key < key:
                return node, used, True
    return None


def misread_public(graph: fx.Graph, nodes: Any) -> Optional[tuple]:
    for node in nodes:
        if node.graph is not graph or erased_public(node):
            continue
        for used in node.all_input_nodes:
            if used.graph is not graph or erased_public(used):
                return node, used, False
            if not used < node:
                return node, used, True
    return None


def misread(graph: fx.Graph, nodes: Any) -> Optional[tuple]:
    """The first of ``nodes`` that is in ``graph`` and reads a node that is not (``(node, used, False)``)
    or that does not come before it (``(node, used, True)``); None when every one reads only earlier
    nodes of the graph. Nodes not in the graph (erased, or of another graph) are passed over. What
    ``Graph.lint`` checks of a node's inputs; asked by the commit for every node a rewrite changed."""
    return misread_fast(graph, nodes) if FAST else misread_public(graph, nodes)


class _QuietLookupTable(frozenset):
    """Stands in for a graph's ``_find_nodes_lookup_table`` while the graph is recompiled.

    ``Graph.python_code`` sets ``_repr_fn`` on every node twice (to name nodes in the
    generated code, then back), and each ``Node.__setattr__`` asks the lookup table whether
    it holds the node and, if it does, takes the node out and puts it back in: an eighth to a
    fifth of the recompile (measured at 5,000 and 20,000 nodes), for an attribute that is not
    part of the table's key. This view shares the real table's storage, so ``find_nodes``,
    ``insert`` and ``remove`` act on the real table; only membership answers no, which makes
    ``__setattr__`` skip the remove/insert. Code generation changes no node's op or target
    (the key), so the table is exactly as it was afterwards.

    It is an empty frozenset, so that membership, asked for every ``_repr_fn`` set, is answered by
    frozenset's own test (no Python call); every other attribute (a frozenset has none of the
    table's: ``table``, ``insert``, ``remove``, ``find_nodes``, ``_key``) is the real table's.
    """

    __slots__ = ("_real",)

    def __new__(cls, real: Any) -> "_QuietLookupTable":
        view = frozenset.__new__(cls)
        view._real = real
        return view

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextlib.contextmanager
def quiet_lookup_table_fast(graph: fx.Graph) -> Iterator[None]:
    real = graph.__dict__.get("_find_nodes_lookup_table")
    if real is None:
        yield
        return
    graph._find_nodes_lookup_table = _QuietLookupTable(real)
    try:
        yield
    finally:
        graph._find_nodes_lookup_table = real


def quiet_lookup_table_public(graph: fx.Graph) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def quiet_lookup_table(graph: fx.Graph) -> contextlib.AbstractContextManager:
    """A context in which to recompile ``graph`` (set it as a GraphModule's graph) faster; the graph
    is the same afterwards either way."""
    return quiet_lookup_table_fast(graph) if FAST else quiet_lookup_table_public(graph)


_WRITER_OPTIONS = {"verbose": False, "include_stride": False, "include_device": False, "colored": False,
                   "expanded_def": False, "record_func": False, "additional_meta": None}
"""``Graph.python_code``'s keyword arguments at their defaults: the only call fxrules' writer answers."""


@contextlib.contextmanager
def recompiling_fast(graph: fx.Graph) -> Iterator[None]:
    """``GraphModule.recompile`` asks ``graph.python_code(root_module="self", record_func=...)`` for
    the source; for that one call, the graph's own ``python_code`` is :func:`fxrules.engine.codegen.python_code`
    (the same text, written in a third of the time), falling back to the class's method for any
    other call or any graph that writer does not handle. The instance attribute is removed again
    on the way out, so the graph is as it was; the lookup table is quiet as well, for the fallback."""
    method = type(graph).python_code
    if method is not fx.Graph.python_code or "python_code" in graph.__dict__:  # a subclass's own writer
        with quiet_lookup_table_fast(graph):
            yield
        return

    def python_code(root_module: str, **options: Any) -> Any:
        if root_module == "self" and all(_WRITER_OPTIONS.get(k, _ABSENT_OPTION) == v for k, v in options.items()):
            written = codegen.python_code(graph)
            if written is not None:
                return written
        return method(graph, root_module, **options)

    graph.python_code = python_code
    try:
        with quiet_lookup_table_fast(graph):
            yield
    finally:
        del graph.python_code


def recompiling_public(graph: fx.Graph) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def recompiling(graph: fx.Graph) -> contextlib.AbstractContextManager:
    """A context in which to recompile ``graph`` (``GraphModule.recompile``, or setting it as a
    GraphModule's graph) faster: its source written by :mod:`fxrules.engine.codegen` and its lookup
    table quiet. The module's code and the graph are the same afterwards as torch's recompile makes them."""
    return recompiling_fast(graph) if FAST else recompiling_public(graph)


_ABSENT_OPTION = object()


def release_owner_fast(graph: fx.Graph) -> None:
    graph._owning_module = None


def release_owner_public(graph: fx.Graph) -> None:
    graph.owning_module = None


def release_owner(graph: fx.Graph) -> None:
    """Make ``graph`` owned by no module (a GraphModule built from it becomes its owner)."""
    (release_owner_fast if FAST else release_owner_public)(graph)


# ---------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------


def modules_by_path_fast(root: nn.Module) -> dict:
    """Walked without a generator per module: a third of the time on deep models."""
    found: dict = {"": root}
    stack = [("", root)]
    while stack:
        prefix, module = stack.pop()
        for name, child in module._modules.items():
            if child is None:
                continue
            path = f"{prefix}.{name}" if prefix else name
            found[path] = child
            if child._modules:
                stack.append((path, child))
    return found


def modules_by_path_public(root: nn.Module) -> dict:
    return dict(root.named_modules(remove_duplicate=False))


def modules_by_path(root: nn.Module) -> dict:
    """Every module below ``root`` (and ``root`` under ``""``) by dotted path; a module shared under
    two paths is under both (``dict(root.named_modules(remove_duplicate=False))``, in some order)."""
    return modules_by_path_fast(root) if FAST else modules_by_path_public(root)


def children_fast(module: nn.Module) -> dict:
    modules = module._modules
    if not modules:  # a leaf (most modules a rewrite asks about)
        return {}
    return {name: child for name, child in modules.items() if child is not None}


def children_public(module: nn.Module) -> dict:
    """``named_children`` leaves out a module registered under a second name; this does not."""
    return {name: child for name, child in module.named_modules(remove_duplicate=False)
            if name and "." not in name}


def children(module: nn.Module) -> dict:
    """``module``'s direct submodules by name, a module registered under two names under both
    (names registered as None are left out)."""
    return children_fast(module) if FAST else children_public(module)


def child_fast(module: nn.Module, name: str) -> Optional[nn.Module]:
    return module._modules.get(name)


def child_public(module: nn.Module, name: str) -> Optional[nn.Module]:
    return children_public(module).get(name)


def child(module: nn.Module, name: str) -> Optional[nn.Module]:
    """The submodule registered as ``name`` directly on ``module``, or None."""
    return child_fast(module, name) if FAST else child_public(module, name)


def own_parameters_fast(module: nn.Module) -> dict:
    return {name: t for name, t in module._parameters.items() if t is not None}


def own_parameters_public(module: nn.Module) -> dict:
    return dict(module.named_parameters(recurse=False, remove_duplicate=False))


def own_parameters(module: nn.Module) -> dict:
    """The parameters registered on ``module`` itself (not its submodules), by name."""
    return own_parameters_fast(module) if FAST else own_parameters_public(module)


def own_parameter_fast(module: nn.Module, name: str) -> Optional[nn.Parameter]:
    return module._parameters.get(name)


def own_parameter_public(module: nn.Module, name: str) -> Optional[nn.Parameter]:
    return own_parameters_public(module).get(name)


def own_parameter(module: nn.Module, name: str) -> Optional[nn.Parameter]:
    """The parameter registered as ``name`` on ``module`` itself, or None."""
    return own_parameter_fast(module, name) if FAST else own_parameter_public(module, name)


def own_buffers_fast(module: nn.Module) -> dict:
    return {name: t for name, t in module._buffers.items() if t is not None}


def own_buffers_public(module: nn.Module) -> dict:
    return dict(module.named_buffers(recurse=False, remove_duplicate=False))


def own_buffers(module: nn.Module) -> dict:
    """The buffers registered on ``module`` itself (not its submodules), by name."""
    return own_buffers_fast(module) if FAST else own_buffers_public(module)


def tensors_fast(module: nn.Module) -> list:
    """For a module without submodules (a fold's conv, say) the tensors are read from its own
    dictionaries, without the generators ``parameters()``/``buffers()`` walk through (a third of
    a conv+bn rewrite's own time)."""
    if module._modules:
        return list(module.parameters()) + list(module.buffers())
    found = [t for t in module._parameters.values() if t is not None]
    buffers = module._buffers
    if buffers:
        found += [t for t in buffers.values() if t is not None]
    return found


def tensors_public(module: nn.Module) -> list:
    return list(module.parameters()) + list(module.buffers())


def tensors(module: nn.Module) -> list:
    """The parameters, then the buffers, of ``module`` and its submodules; a tensor registered
    under two names may be listed twice."""
    return tensors_fast(module) if FAST else tensors_public(module)


def members_fast(module: nn.Module) -> dict:
    found = dict(module.__dict__)
    found.update(module._parameters)
    found.update(module._buffers)
    found.update(module._modules)
    return found


def members_public(module: nn.Module) -> dict:
    found = dict(vars(module))
    found.update(module.named_parameters(recurse=False, remove_duplicate=False))
    found.update(module.named_buffers(recurse=False, remove_duplicate=False))
    found.update(children_public(module))
    return found


def members(module: nn.Module) -> dict:
    """Everything set on ``module`` itself by name: instance attributes, then its own parameters,
    buffers and submodules (entries registered as None may be present on the fast path)."""
    return members_fast(module) if FAST else members_public(module)


def take_member_fast(module: nn.Module, name: str) -> Any:
    for store in (module.__dict__, module._parameters, module._buffers, module._modules):
        if name in store:
            return store.pop(name)
    raise AttributeError(name)


def take_member_public(module: nn.Module, name: str) -> Any:
    value = getattr(module, name)
    delattr(module, name)
    return value


def take_member(module: nn.Module, name: str) -> Any:
    """Remove ``name`` from ``module`` (an attribute, parameter, buffer or submodule) and return
    its value."""
    return take_member_fast(module, name) if FAST else take_member_public(module, name)


def registered_member_fast(module: nn.Module, name: str, default: Any) -> Any:
    own = module.__dict__
    for store in ("_parameters", "_buffers", "_modules"):
        items = own.get(store)
        if items and name in items:
            return items[name]
    return default


def registered_member_public(module: nn.Module, name: str, default: Any) -> Any:
    """``nn.Module.__getattr__`` is where torch looks a parameter, buffer or submodule up."""
    try:
        return nn.Module.__getattr__(module, name)
    except AttributeError:
        return default


def registered_member(module: nn.Module, name: str, default: Any) -> Any:
    """The parameter, buffer or submodule registered as ``name`` on ``module`` itself, or ``default``."""
    return registered_member_fast(module, name, default) if FAST else registered_member_public(module, name, default)


def holds_non_module_fast(module: nn.Module, name: str) -> bool:
    return name in module.__dict__ or name in module._parameters or name in module._buffers \
        or (name in module._modules and module._modules[name] is None)


def holds_non_module_public(module: nn.Module, name: str) -> bool:
    if name in vars(module):
        return True
    try:
        value = nn.Module.__getattr__(module, name)
    except AttributeError:
        return False
    return not isinstance(value, nn.Module)


def holds_non_module(module: nn.Module, name: str) -> bool:
    """Whether ``module`` itself has ``name`` as an instance attribute, parameter or buffer, or
    registered as None (a parameter, buffer or submodule slot: nothing says which publicly)."""
    return holds_non_module_fast(module, name) if FAST else holds_non_module_public(module, name)


def new_container_fast(training: bool) -> nn.Module:
    """An empty ``nn.Module`` in ``training`` mode: the instance dictionary ``nn.Module.__init__`` writes in
    torch 2.13 (a test holds the two to the same names, types and values), filled in one update rather
    than seventeen ``object.__setattr__`` calls behind the usage logging and the ``call_super_init``
    checks. Made for each container of a dotted target of a copying run's result (hundreds per model)."""
    module = _NEW_MODULE(nn.Module)
    module.__dict__.update(
        training=training, _parameters={}, _buffers={}, _non_persistent_buffers_set=set(),
        _backward_pre_hooks=_ORDERED(), _backward_hooks=_ORDERED(), _is_full_backward_hook=None,
        _forward_hooks=_ORDERED(), _forward_hooks_with_kwargs=_ORDERED(), _forward_hooks_always_called=_ORDERED(),
        _forward_pre_hooks=_ORDERED(), _forward_pre_hooks_with_kwargs=_ORDERED(), _state_dict_hooks=_ORDERED(),
        _state_dict_pre_hooks=_ORDERED(), _load_state_dict_pre_hooks=_ORDERED(),
        _load_state_dict_post_hooks=_ORDERED(), _modules={})
    return module


_NEW_MODULE = nn.Module.__new__
_ORDERED = collections.OrderedDict


def new_container_public(training: bool) -> nn.Module:
    module = nn.Module()
    module.training = training
    return module


def new_container(training: bool) -> nn.Module:
    """A new, empty ``nn.Module()`` in ``training`` mode (what ``GraphModule`` puts on a dotted target's path)."""
    return new_container_fast(training) if FAST else new_container_public(training)


def put_child_fast(module: nn.Module, name: str, child: nn.Module) -> None:
    module._modules[name] = child


def put_child_public(module: nn.Module, name: str, child: nn.Module) -> None:
    module.register_module(name, child)


def put_child(module: nn.Module, name: str, child: nn.Module) -> None:
    """Register ``child`` as ``name`` on ``module``, a name the caller knows is free and valid (the
    fast path skips ``register_module``'s checks; the result is the same)."""
    (put_child_fast if FAST else put_child_public)(module, name, child)


def put_buffer_fast(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    module._buffers[name] = tensor


def put_buffer_public(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    module.register_buffer(name, tensor)


def put_buffer(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Register ``tensor`` as a persistent buffer ``name`` on ``module`` (a free, valid name)."""
    (put_buffer_fast if FAST else put_buffer_public)(module, name, tensor)


def put_parameter_fast(module: nn.Module, name: str, parameter: nn.Parameter) -> None:
    module._parameters[name] = parameter


def put_parameter_public(module: nn.Module, name: str, parameter: nn.Parameter) -> None:
    module.register_parameter(name, parameter)


def put_parameter(module: nn.Module, name: str, parameter: nn.Parameter) -> None:
    """Register ``parameter`` as ``name`` on ``module`` (a free, valid name)."""
    (put_parameter_fast if FAST else put_parameter_public)(module, name, parameter)


# ---------------------------------------------------------------------------
# Operators
# ---------------------------------------------------------------------------


def op_signature_fast(target: Any) -> Any:
    from torch.fx import operator_schemas

    return operator_schemas._torchscript_schema_to_signature(target._schema)


def op_signature_public(target: Any) -> Any:
    from torch.fx import operator_schemas

    return operator_schemas.get_signature_for_torch_op(target)[0]


def op_signature(target: Any) -> Any:
    """The ``inspect.Signature`` of an ``OpOverload`` (see :func:`is_op_overload`), from its schema."""
    return op_signature_fast(target) if FAST else op_signature_public(target)


# ---------------------------------------------------------------------------
# No public equivalent: the same on every torch version
# ---------------------------------------------------------------------------


def is_op_overload(target: Any) -> bool:
    """Whether ``target`` is one overload of a torch operator (``torch.ops.aten.add.Tensor``)."""
    return isinstance(target, torch._ops.OpOverload)


def is_higher_order_operator(target: Any) -> bool:
    """Whether ``target`` is a higher-order operator (``torch.ops.higher_order.cond`` ...)."""
    return isinstance(target, torch._ops.HigherOrderOperator)


def is_op_packet(target: Any) -> bool:
    """Whether ``target`` is an operator packet (``torch.ops.aten.add``: every overload of it)."""
    return isinstance(target, torch._ops.OpOverloadPacket)


def op_name(target: Any) -> str:
    """An ``OpOverload``'s operator name without namespace and overload (``dropout`` for
    ``aten.dropout.default``)."""
    return target._schema.name.rpartition("::")[2]


def op_draws_random(target: Any) -> bool:
    """Whether torch tags the ``OpOverload`` as drawing from a random number generator."""
    return torch.Tag.nondeterministic_seeded in target.tags


def op_schema(target: Any) -> Any:
    """The ``torch._C.FunctionSchema`` of an ``OpOverload``: its arguments and their alias info."""
    return target._schema


def empty_graph_like(graph: fx.Graph) -> fx.Graph:
    """An empty graph that records the same tracer as ``graph``."""
    empty = fx.Graph(tracer_cls=graph._tracer_cls)
    empty._tracer_extras = graph._tracer_extras
    return empty


def non_persistent_buffer_names(module: nn.Module) -> frozenset:
    """The names of ``module``'s own buffers that ``state_dict`` leaves out."""
    return frozenset(module._non_persistent_buffers_set)


def hooks_call(module: nn.Module) -> Callable:
    """``module``'s call with its hooks, not through ``nn.Module.__call__``: while another thread
    traces, torch.fx patches ``nn.Module.__call__``."""
    return getattr(module, "_call_impl", None) or module.forward


def registered_values(module: nn.Module) -> "Registered":
    """``module``'s own submodules, parameters and buffers by name (see :class:`Registered`)."""
    return Registered(children(module), own_parameters(module), own_buffers(module),
                      non_persistent_buffer_names(module))


@dataclass(frozen=True)
class Registered:
    """What is registered on one module itself: submodules, parameters, buffers, and which buffers
    ``state_dict`` leaves out."""

    children: Mapping[str, nn.Module]
    parameters: Mapping[str, Any]
    buffers: Mapping[str, Any]
    non_persistent: frozenset


def new_fake_mode() -> Any:
    """A ``FakeTensorMode`` that also accepts real tensors as inputs (they are made fake on use)."""
    return _FakeTensorMode(allow_non_fake_inputs=True)


def fake_copy_mode(mode: Any) -> Any:
    """A context in which ``copy.deepcopy`` gives fake copies (in ``mode``) of the tensors it copies."""
    return _FakeCopyMode(mode)


def fake_module_copy(mode: Any, module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose tensors are fake tensors of ``mode``: what ``copy.deepcopy(module)``
    gives under :func:`fake_copy_mode`, the way the engine runs a module on fake tensors without
    touching it (value propagation, the guards' dry runs, the verifier's budget).

    That deep copy walks every attribute of every module and clones each parameter through the fake
    mode's dispatch: about half of propagating example inputs through a large model. A module whose
    copy is known to be just its state made anew (:func:`_light_fake_copy`: a torch.nn class copied by
    ``nn.Module``'s own pickling methods, no hooks, only tensors, submodules and immutable values of its
    own) is copied directly, to the same result; any other goes through the deep copy."""
    copied = _light_fake_copy(mode, module, {}) if FAST else None
    if copied is not None:
        return copied
    with fake_copy_mode(mode):
        return copy.deepcopy(module)


def fake_module_to_run(mode: Any, module: nn.Module, shared: dict) -> nn.Module:
    """A fake copy of ``module`` (:func:`fake_module_copy`) to be called and nothing else, shared
    with every module of ``shared`` that computes alike (:func:`run_signature`): propagating example
    inputs through a model of a thousand identical blocks fakes one block's tensors, not a thousand
    (each parameter's fake is about 0.1 ms; a third of a 5,000-node MLP's propagation).

    Sound for what propagation reads of a call, the metadata of its result (shape, strides, dtype,
    device, ``requires_grad``): a torch.nn leaf module's ``forward`` computes that from its class,
    its attributes and its tensors' metadata, which the signature holds. What a call writes to its
    copy's fake buffers (a batch norm's running statistics in training mode) changes no metadata.
    ``shared``: signature -> copy, one dictionary per fake mode."""
    key = run_signature(module)
    if key is None:
        return fake_module_copy(mode, module)
    made = shared.get(key)
    if made is None:
        made = shared[key] = fake_module_copy(mode, module)
    return made


def run_signature(module: nn.Module) -> Optional[tuple]:
    """What a call of ``module`` computes from, as a hashable value, for a module that
    :func:`_light_fake_copy` copies and that has no submodules: its class; each attribute of its own,
    typed (``1``, ``1.0`` and ``True`` differ), the training flag included; each parameter's and
    buffer's kind, size, strides, offset, dtype, device, ``requires_grad`` and conjugate/negative
    bits (dense tensors only, not subclasses). None for any other module (a container, hooks, an
    attribute that is not immutable, a tensor of another layout): it gets a copy of its own."""
    if not FAST:
        return None
    cls = type(module)
    state = getattr(module, "__dict__", None)
    if type(state) is not dict or not _light_class(cls) or module._modules:
        return None
    parts: list = [cls]
    for key, value in state.items():
        if key == "_parameters" or key == "_buffers":
            if type(value) is not dict:
                return None
            kind = nn.Parameter if key == "_parameters" else torch.Tensor
            for name, tensor in value.items():
                if tensor is None:
                    parts.append((key, name, None))
                    continue
                if type(tensor) is not kind or tensor.layout is not torch.strided or tensor.is_quantized:
                    return None
                parts.append((key, name, tuple(tensor.shape), tensor.stride(), tensor.storage_offset(),
                              tensor.dtype, tensor.device, tensor.requires_grad, tensor.is_conj(), tensor.is_neg()))
        elif key == "_modules":
            continue  # (empty: a leaf)
        elif key in _MODULE_HOOK_STORES:
            if not _no_hooks(value):
                return None
        elif key == "_non_persistent_buffers_set":
            if not _names(value):
                return None
            parts.append((key, frozenset(value)))
        else:
            typed = _typed(value)
            if typed is None:
                return None
            parts.append((key, typed))
    return tuple(parts)


def _no_hooks(store: Any) -> bool:
    """A module's hook dictionary as ``nn.Module.__init__`` makes it, and empty (the condition of a
    light copy, :func:`_light_fake_copy`, and of a run signature, :func:`run_signature`)."""
    return not store and type(store) in (dict, collections.OrderedDict)


def _names(value: Any) -> bool:
    """A module's ``_non_persistent_buffers_set`` as torch keeps it: a set of strings."""
    return type(value) is set and all(type(name) is str for name in value)


def _typed(value: Any) -> Optional[tuple]:
    """An immutable attribute (:func:`_immutable`) with the type of every item beside it, or None."""
    if type(value) is tuple:
        items = [_typed(item) for item in value]
        return None if any(item is None for item in items) else (tuple, tuple(items))
    return (type(value), value) if type(value) in _IMMUTABLE_ATOMS else None


_MODULE_HOOK_STORES = frozenset({
    "_backward_pre_hooks", "_backward_hooks", "_forward_hooks", "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_state_dict_hooks",
    "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
})
"""The hook dictionaries ``nn.Module.__init__`` sets on every module."""

_IMMUTABLE_ATOMS = frozenset({type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
                              torch.layout, torch.memory_format, types.FunctionType, types.BuiltinFunctionType})
"""Types whose values a deep copy returns as they are (``copy._deepcopy_atomic``: ``F.relu`` as a
``TransformerEncoderLayer``'s activation), and a tuple of them (see :func:`_immutable`)."""

_light_classes: dict = {}  # torch.nn class -> whether its modules may be copied by _light_fake_copy


def _light_class(cls: type) -> bool:
    """A class defined by torch.nn whose deep copy is the one ``nn.Module`` defines: no ``__deepcopy__``,
    ``__reduce__``, ``__reduce_ex__`` or ``__getstate__`` of its own, nor a copy function registered for
    it. (Its ``__setstate__`` may be its own: :func:`_light_fake_copy` calls it as the deep copy does.)"""
    if not str(getattr(cls, "__module__", "")).startswith("torch.nn.modules."):
        return False  # (asked first: the memo holds torch.nn's classes only, not each GraphModule's own)
    found = _light_classes.get(cls)
    if found is None:
        found = (not hasattr(cls, "__deepcopy__")
                 and cls.__reduce_ex__ is nn.Module.__reduce_ex__ and cls.__reduce__ is nn.Module.__reduce__
                 and cls.__getstate__ is nn.Module.__getstate__
                 and cls not in copy._deepcopy_dispatch and cls not in copyreg.dispatch_table)
        _light_classes[cls] = found
    return found


def _copied_items(items: Any, copy_one: Callable[[Any], Any]) -> Optional[dict]:
    """A module's dictionary of parameters, buffers or submodules with each entry copied by ``copy_one``
    (an entry registered as None stays None); None when ``items`` is not a plain dict or an entry cannot
    be copied (``copy_one`` gives None)."""
    if type(items) is not dict:
        return None
    copied = {}
    for name, value in items.items():
        made = None if value is None else copy_one(value)
        if made is None and value is not None:
            return None
        copied[name] = made
    return copied


def _immutable(value: Any) -> bool:
    if isinstance(value, tuple) and type(value) is tuple:
        return all(_immutable(item) for item in value)
    return type(value) in _IMMUTABLE_ATOMS


def _light_fake_copy(mode: Any, module: nn.Module, memo: dict) -> Optional[nn.Module]:
    """``module`` copied as ``copy.deepcopy`` under ``FakeCopyMode`` copies it, when that copy is known
    to be: a new object of its class (``nn.Module``'s ``__reduce_ex__``: no constructor runs), given by
    its ``__setstate__`` the state ``nn.Module.__getstate__`` takes (its ``__dict__``) with new parameter
    and buffer dictionaries of fake tensors, new hook dictionaries (empty: a module with any hook is not
    copied here), copies of its submodules, and its other attributes as they are (each an immutable
    value, which a deep copy returns itself). None when ``module`` or a submodule is not such a module
    (its class is not :func:`_light_class`, or an attribute is not one of those). ``memo`` maps the
    tensors and modules copied so far, as a deep copy's memo does (a tensor or module met twice is
    copied once).

    One difference, on purpose: a parameter's fake is the mode's own fake of that parameter
    (``mode.from_tensor``: an ``nn.Parameter`` to ``isinstance``, with its ``requires_grad``, the same
    object each time the mode meets that parameter, as a get_attr node's value is), where the deep copy
    clones it into a fake storage of its own. The clone is a dispatch through the fake mode, a third of
    each parameter's cost, and the storages of fake tensors are only metadata: no torch.nn module's
    ``forward`` writes its parameters. Buffers are the mode's own fakes on both paths."""
    if id(module) in memo:
        return memo[id(module)]
    cls = type(module)
    if type(getattr(module, "__dict__", None)) is not dict or not _light_class(cls):
        return None

    def tensor_of(kind: type) -> Callable[[Any], Any]:
        def fake(tensor: Any) -> Any:  # a plain parameter or buffer (not a subclass): its fake, once
            made = memo.get(id(tensor))
            if made is None and type(tensor) is kind:
                made = memo[id(tensor)] = mode.from_tensor(tensor, static_shapes=True)
            return made
        return fake

    copiers = {"_parameters": tensor_of(nn.Parameter), "_buffers": tensor_of(torch.Tensor),
               "_modules": lambda child: _light_fake_copy(mode, child, memo)}
    state: dict = {}
    for key, value in module.__getstate__().items():  # (what the deep copy copies: nn.Module's)
        copier = copiers.get(key)
        if copier is not None:
            items = _copied_items(value, copier)
            if items is None:
                return None
            state[key] = items
        elif key in _MODULE_HOOK_STORES:
            if not _no_hooks(value):
                return None
            state[key] = type(value)()
        elif key == "_non_persistent_buffers_set":
            if not _names(value):
                return None
            state[key] = set(value)
        elif _immutable(value):
            state[key] = value
        else:
            return None
    copied = cls.__new__(cls)
    copied.__setstate__(state)
    memo[id(module)] = copied
    return copied


def compile_backend_named(name: str) -> Callable:
    """The ``torch.compile`` backend callable registered under ``name`` (``torch.compile`` takes
    names, but no public function returns the callable); raises when there is none."""
    from torch._dynamo import lookup_backend

    return lookup_backend(name)


def to_fake(mode: Any, value: Any) -> Any:
    """``value`` with its real tensors made fake in ``mode`` (lists, tuples and dicts item by item)."""
    if isinstance(value, torch.Tensor) and not is_fake_tensor(value):
        return mode.from_tensor(value)
    if isinstance(value, (list, tuple)):
        return type(value)(to_fake(mode, v) for v in value)
    if isinstance(value, dict):
        return {k: to_fake(mode, v) for k, v in value.items()}
    return value


def is_fake_tensor(value: Any) -> bool:
    """Whether ``value`` is a fake tensor (it has a ``fake_mode``)."""
    return isinstance(value, _FakeTensor)


def view_base(tensor: torch.Tensor) -> Optional[torch.Tensor]:
    """The tensor ``tensor`` is an autograd view of (``Tensor._base``, the first of a chain of views), or None.
    torch has no public spelling of it; the driver reads it to take a long chain of fake views from its base
    in one step (``driver._shallow_view``)."""
    return tensor._base


def function_is_impure(target: Any, args: tuple, kwargs: dict) -> bool:
    """torch's own answer to whether calling ``target`` on these arguments has a side effect
    (random number generation does not count: drawing is the planner's ``changes-random-draws``).
    torch calls its Python-level random functions (``torch.rand``, ``torch.randperm``, ...) impure
    whatever ``impure_random`` says; they are taken as their aten operators are, which it calls pure
    with ``impure_random=False``."""
    try:
        if target in _TORCH_RANDOM_FUNCTIONS:
            return False
    except TypeError:  # an unhashable target
        pass
    return _torch_is_impure(target, args=args, kwargs=kwargs, impure_random=False)


def function_is_impure_besides_writes(target: Any, args: tuple, kwargs: dict) -> bool:
    """torch's answer (:func:`function_is_impure`) less the writes an operator's schema declares.

    torch calls every operator with a mutable schema impure (``aten.detach_``, ``aten.relu_``,
    ``aten.copy_``, ``aten.add.out``): for that alone, since the schema's ``Tensor(a!)`` arguments are
    what it writes. The planner accounts for those writes argument by argument (an in-place call whose
    only effect is writing a private temporary may be removed with a match); what is left is whether
    torch lists the operator among its side-effectful functions or registers an effect for it
    (``aten._print``, ``aten._assert_async``, ``inductor.accumulate_grad_``). Any other target: as
    :func:`function_is_impure`."""
    if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
        from torch._higher_order_ops.effects import _get_effect
        from torch.fx.node import _side_effectful_functions

        return target in _side_effectful_functions or _get_effect(target) is not None
    return function_is_impure(target, args, kwargs)


def boolean_dispatched(target: Any) -> tuple:
    """The two functions a ``torch.nn.functional`` wrapper made by ``boolean_dispatch`` (``F.max_pool2d``,
    ``F.adaptive_max_pool1d``, ...) dispatches to on a flag (``return_indices``), or ``()`` for any other
    target. The wrapper itself takes ``(*args, **kwargs)``; its branches have the real parameters."""
    from torch import _jit_internal

    try:
        found = _jit_internal.boolean_dispatched.get(target)
    except TypeError:  # an unhashable target
        return ()
    return (found["if_false"], found["if_true"]) if found else ()


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def hooked_kinds_fast(module: nn.Module) -> list:
    """The hook dictionaries are instance attributes ``nn.Module.__init__`` sets: read from the
    instance's ``__dict__`` (the usual answer, none, is four dictionary lookups, without ``getattr``)."""
    own = getattr(module, "__dict__", None)
    if type(own) is not dict or "_forward_hooks" not in own:
        return hooked_kinds_public(module)
    if not (own.get("_forward_hooks") or own.get("_forward_pre_hooks") or own.get("_backward_hooks")
            or own.get("_backward_pre_hooks")):
        return []
    return hooked_kinds_public(module)


def hooked_kinds_public(module: nn.Module) -> list:
    return [name.strip("_") for name in _HOOK_DICTS if getattr(module, name, None)]


def plain_instance_fast(module: nn.Module, watched: frozenset, flags: tuple) -> bool:
    """:func:`plain_instance_public` read from the instance's ``__dict__`` and its three member
    dictionaries in one pass: asked once per module of the graph (6,000 at 20,000 nodes)."""
    own = getattr(module, "__dict__", None)
    if type(own) is not dict or "_forward_hooks" not in own:
        return plain_instance_public(module, watched, flags)
    if not watched.isdisjoint(own) or own["_forward_hooks"] or own.get("_forward_pre_hooks") \
            or own.get("_backward_hooks") or own.get("_backward_pre_hooks"):
        return False
    for store in ("_parameters", "_buffers", "_modules"):
        items = own.get(store)
        if items:
            for name in flags:
                if name in items:
                    return False
    return True


def plain_instance_public(module: nn.Module, watched: frozenset, flags: tuple) -> bool:
    return watched.isdisjoint(vars(module)) and not hooked_kinds_public(module) \
        and all(registered_member_public(module, name, _MISSING) is _MISSING for name in flags)


_MISSING = object()


def plain_instance(module: nn.Module, watched: frozenset, flags: tuple) -> bool:
    """Whether ``module`` itself sets none of the ``watched`` names as instance attributes, has no hooks
    of its own (:func:`hooked_kinds` empty) and registers none of ``flags`` as a parameter, buffer or
    submodule (:func:`registered_member`)."""
    return plain_instance_fast(module, watched, flags) if FAST else plain_instance_public(module, watched, flags)


def hooked_kinds(module: nn.Module) -> list:
    """The kinds of hook registered on ``module`` itself (``forward_hooks``, ``forward_pre_hooks``,
    ``backward_hooks``, ``backward_pre_hooks``), in that order; empty when none is."""
    return hooked_kinds_fast(module) if FAST else hooked_kinds_public(module)


_GLOBAL_HOOK_DICTS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                      "_global_backward_pre_hooks")


def global_hook_kinds() -> list:
    """The kinds of hook registered for every module (``torch.nn.modules.module.register_module_forward_hook``
    and its siblings): ``forward_hooks``, ``forward_pre_hooks``, ``backward_hooks``, ``backward_pre_hooks``.
    Asked by the planner for every match: the common answer (none) is four lookups."""
    module = _NN_MODULE_MODULE
    if not (getattr(module, "_global_forward_hooks", None) or getattr(module, "_global_forward_pre_hooks", None)
            or getattr(module, "_global_backward_hooks", None) or getattr(module, "_global_backward_pre_hooks", None)):
        return []  # the common answer, without building a list from a generator
    return [name[len("_global_"):] for name in _GLOBAL_HOOK_DICTS if getattr(module, name, None)]


_NN_MODULE_MODULE = sys.modules["torch.nn.modules.module"]
"""``torch.nn.modules.module``, where the global module hooks are kept (imported with ``torch.nn``)."""


TENSOR_METHOD_OWNERS = (torch.Tensor, torch._C.TensorBase)
"""The classes whose methods a ``torch.Tensor.NAME`` call_function target belongs to (``__objclass__``)."""

NORM_WITH_STATISTICS = nn.modules.batchnorm._NormBase
"""The base of torch.nn's batch and instance norms, which may track running statistics."""

DROPOUT_BASE = nn.modules.dropout._DropoutNd
"""The base of torch.nn's dropout modules (they hold ``p``)."""


IMPURE_MODULE_FLAG = "_is_impure"
"""The attribute by which a module says that calling it has a side effect (``Node.is_impure`` reads it)."""

EXPORT_SPECS = ("_in_spec", "_out_spec")
"""The attributes in which a GraphModule from ``torch.export`` keeps its input and output pytree specs."""

GRAPH_MODULE_INTERNALS = frozenset({
    "training", "_parameters", "_buffers", "_non_persistent_buffers_set", "_modules", "_graph", "_code",
    "_lineno_map", "_prologue_start", "_tracer_cls", "_tracer_extras", "meta", "_replace_hooks",
    "_create_node_hooks", "_erase_node_hooks", "_deepcopy_hooks", "_backward_pre_hooks", "_backward_hooks",
    "_is_full_backward_hook", "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks", "_compiled_call_impl", "forward",
    *EXPORT_SPECS,
})
"""The instance attributes a GraphModule sets up itself: what is not carried over from an input
GraphModule to the one a rewrite builds (besides hooks, which are copied)."""


DispatchMode = _TorchDispatchMode
"""torch's base class for a mode that sees every operator call (``__torch_dispatch__``): the
allocation budget (:mod:`fxrules.engine.budget`) counts what each op allocates with one. No public
equivalent."""


def storage_key_fast(tensor: torch.Tensor) -> int:
    return _STORAGE_ID(tensor)


def storage_key_public(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


_STORAGE_ID = torch._C._storage_id if FAST else None
"""The address of a tensor's storage (``StorageImpl``), as ``untyped_storage()._cdata`` gives it (a test holds
the two to the same answers and errors on dense, view, meta, fake, quantized, nested, sparse and storage-less
tensors), without the Python storage object. ``untyped_storage()`` makes one, and torch then keeps it for as
long as the storage lives (its Python object is preserved): asked of a model's parameters, it left a
collector-tracked object on each of the caller's tensors and each of the result's new ones (five per
conv+bn fold)."""


def storage_key(tensor: torch.Tensor) -> int:
    """An identity of ``tensor``'s storage, shared by its views, for fake and real tensors alike
    (a fake tensor's data pointer is 0). Valid while the storage lives."""
    return storage_key_fast(tensor) if FAST else storage_key_public(tensor)


def storage_keys(tensors: Any) -> set:
    """The :func:`storage_key` of each tensor of ``tensors``, leaving out a tensor without a storage of
    its own (a sparse tensor, which raises when asked for it)."""
    try:
        if FAST:  # storage_key_fast, written out: per fold
            storage_id = _STORAGE_ID
            return {storage_id(tensor) for tensor in tensors}
        return {storage_key_public(tensor) for tensor in tensors}
    except Exception:
        keys = set()
        for tensor in tensors:
            try:
                keys.add(storage_key(tensor))
            except Exception:
                continue
        return keys


def storage_address_fast(tensor: torch.Tensor) -> int:
    return _DATA_ADDRESS(tensor)


def storage_address_public(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


_DATA_ADDRESS = torch._C._data_address if FAST else None
"""The data pointer of a tensor's storage (not of the tensor: a view's offset is not added), as
``untyped_storage().data_ptr()`` gives it, without the Python storage object (see :data:`_STORAGE_ID`). One
difference: a tensor subclass without a storage gives 0 where the public path raises; both mean "no
address" to :func:`fxrules.engine.aliasing.storage_key`."""


def storage_address(tensor: torch.Tensor) -> int:
    """The address of the first byte of ``tensor``'s storage (0 for storage without data: meta, fake, empty);
    raises for a tensor without a strided storage (sparse)."""
    return storage_address_fast(tensor) if FAST else storage_address_public(tensor)


def fake_cannot_size(exc: BaseException) -> bool:
    """Whether a fake-tensor run failed because fake tensors cannot tell the sizes (an output shape
    that depends on the data, a value read from the data, an op without a fake or meta kernel), not
    because the computation itself is wrong (which a real run would also find)."""
    from torch._subclasses import fake_tensor as ft
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    unsizable = (ft.DynamicOutputShapeException, ft.DataDependentOutputException, ft.UnsupportedOperatorException,
                 ft.UnsupportedFakeTensorException, ft.UnsupportedMutationAliasingException, ft.MetadataMismatchError,
                 GuardOnDataDependentSymNode, NotImplementedError)
    return isinstance(exc, unsizable)


def new_strict_fake_mode() -> Any:
    """A ``FakeTensorMode`` that accepts real inputs and never runs an op for real: where an op has
    no fake or meta kernel, torch's default runs the real kernel on zero-filled inputs (which
    allocates); here that is an ``UnsupportedOperatorException`` (the allocation budget's measure)."""
    return _FakeTensorMode(allow_non_fake_inputs=True, allow_fallback_kernels=False)


class _DropMetaFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("failed while attempting to run meta")


_META_FAILURES = _DropMetaFailures()


@contextlib.contextmanager
def quiet_meta_failures() -> Iterator[None]:
    """Without torch's log line (and traceback) for each op whose meta kernel raised in a fake run:
    the budget's measure expects such errors (a host that does not run) and reports them itself."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    logger.addFilter(_META_FAILURES)
    try:
        yield
    finally:
        logger.removeFilter(_META_FAILURES)


# ---------------------------------------------------------------------------
# Undoing edits of a graph (apply_rules(..., inplace=True)): no public equivalent
# ---------------------------------------------------------------------------
# torch.fx has no public way to put an erased node back, or to give a node back its users in their
# old order: an in-place rewrite that fails restores what it changed through these. The undo is
# checked to be exact (tests/engine/test_inplace.py); a torch release that changes these members
# fails there.


class NodeState(NamedTuple):
    """Where a node the graph had before stands: its arguments (and the input nodes they name), its
    users in order, and its position key. (A named tuple: one is made per node an in-place edit
    reaches, on the rewrite's hot path, and it builds several times faster than a frozen dataclass.)"""

    args: tuple
    kwargs: Any
    inputs: tuple  # the keys of ``_input_nodes``, in order (tuples: cheaper to make and free than dicts)
    users: tuple  # the keys of ``users``, in order
    sort_key: Any


def node_state(node: fx.Node, without_user: Optional[fx.Node] = None) -> NodeState:
    """``node``'s state now; ``without_user``: a node just created that reads ``node`` (its entry is
    the last of ``node``'s users), left out, which gives the state before it was created."""
    users = node.users
    if without_user is not None and without_user in users:
        kept = tuple([user for user in users if user is not without_user])
    else:
        kept = tuple(users)
    return _NODE_STATE(NodeState, (node._args, node._kwargs, tuple(node._input_nodes), kept, node._sort_key))


_NODE_STATE = tuple.__new__
"""Makes a NodeState from one tuple of its fields, without the named tuple's Python ``__new__``."""


def restore_node_state(node: fx.Node, state: NodeState) -> None:
    """Give ``node`` back ``state``, keeping its own dictionaries (``users``, ``_input_nodes``) as objects."""
    setattr_ = object.__setattr__
    setattr_(node, "_args", state.args)
    setattr_(node, "_kwargs", state.kwargs)
    setattr_(node, "_sort_key", state.sort_key)
    inputs, users = node._input_nodes, node.users
    inputs.clear()
    inputs.update(dict.fromkeys(state.inputs))
    users.clear()
    users.update(dict.fromkeys(state.users))


def unlink_created_node(graph: fx.Graph, node: fx.Node) -> None:
    """Take ``node``, made by the edits being undone, out of ``graph``: out of its node list (unless
    erased already, or never linked: an edit interrupted inside node creation) and its lookup table.
    Other nodes' users and the name table (:func:`restore_name_table`) are restored apart."""
    if not node._erased:
        if node in graph._find_nodes_lookup_table:
            graph._find_nodes_lookup_table.remove(node)
        if linked(node):
            node._remove_from_list()
        object.__setattr__(node, "_erased", True)


def relink_erased_node(graph: fx.Graph, node: fx.Node, after: fx.Node) -> None:
    """Put ``node``, erased by the edits being undone, back into ``graph`` right after ``after`` (the
    graph's root sentinel for the first place); its arguments and users are restored apart.

    The journal records an erasure before it is made, so an erasure that failed part way (a
    GraphModule's erase-node hook raising, an interrupt) may have left ``node`` in the list, or in it
    but out of the lookup table: it is then only filed again. Linking a node that is still linked
    would tie the list into a loop."""
    setattr_ = object.__setattr__
    if not linked(node):
        setattr_(node, "_prev", node)  # erasing left the old neighbours here: unlinking must not touch them
        setattr_(node, "_next", node)
        after._next._prepend(node)
    setattr_(node, "_erased", False)
    table = graph._find_nodes_lookup_table
    if node not in table:
        table.insert(node)


def linked(node: fx.Node) -> bool:
    """Whether ``node`` is in its graph's node list: its neighbours point at it. A node never linked
    points at itself; an unlinked one still points at its old neighbours, which no longer point back."""
    prev = node._prev
    return prev is not node and prev._next is node


def insertion_gap(graph: fx.Graph) -> Optional[tuple]:
    """The two adjacent nodes between which ``graph`` now inserts a new node (``inserting_before(n)``
    inserts with ``n.prepend``, ``inserting_after(n)`` with ``n.append``; the default appends at the
    end, before the root sentinel), or None for an insert point of another kind."""
    insert = graph._insert
    anchor = getattr(insert, "__self__", None)
    if not isinstance(anchor, fx.Node):
        return None
    name = getattr(insert, "__name__", "")
    if name in ("prepend", "_prepend"):
        return anchor._prev, anchor
    if name in ("append", "_append"):
        return anchor, anchor._next
    return None


def nodes_between(left: fx.Node, right: fx.Node, limit: int = 64) -> list:
    """The nodes linked after ``left`` up to ``right`` (not included): what a node creation that failed
    part way left at its insertion gap (:func:`insertion_gap`). At most ``limit``: a creation links one."""
    found = []
    node = left._next
    while node is not right and node is not left and len(found) < limit:
        found.append(node)
        node = node._next
    return found


def recount_nodes(graph: fx.Graph) -> None:
    """Set ``graph``'s node count from its node list (after an undo: an edit interrupted between
    linking or unlinking a node and counting it leaves the count off by one)."""
    root = graph._root
    count = 0
    node = root._next
    while node is not root:
        count += 1
        node = node._next
    graph._len = count


def graph_root(graph: fx.Graph) -> fx.Node:
    """The sentinel node before the first node of ``graph``."""
    return graph._root


class NameTable(NamedTuple):
    """A graph's name table, copied: its per-base-name counters, the names it has given out, and the
    name it gave each object."""

    counters: dict
    used: set
    names: dict


def name_table(graph: fx.Graph) -> NameTable:
    """``graph``'s name table now (to be given back with :func:`restore_name_table`)."""
    namespace = graph._graph_namespace
    return NameTable(dict(namespace._base_count), set(namespace._used_names), dict(namespace._obj_to_name))


def restore_name_table(graph: fx.Graph, saved: NameTable) -> None:
    """Give ``graph``'s name table back what :func:`name_table` saved, keeping its own containers."""
    namespace = graph._graph_namespace
    for mine, before in ((namespace._base_count, saved.counters), (namespace._used_names, saved.used),
                         (namespace._obj_to_name, saved.names)):
        mine.clear()
        mine.update(before)


def module_stores(module: nn.Module) -> tuple:
    """The dictionaries in which ``module`` keeps its submodules, parameters and buffers, and its
    instance dictionary: what placing or removing a member changes."""
    return module._modules, module._parameters, module._buffers, module.__dict__


GRAPH_MODULE_CODE = ("_code", "_lineno_map", "_prologue_start", "_in_spec", "_out_spec")
"""The instance attributes ``GraphModule.recompile`` sets."""

GRAPH_MODULE_CLASS_CODE = ("forward", "__call__", "_wrapped_call")
"""The attributes ``GraphModule.recompile`` sets on the module's own class."""


def dtype_mapping_mode(mapping: Mapping[torch.dtype, torch.dtype]) -> contextlib.AbstractContextManager:
    """A dispatch mode under which every dtype an op is given (``aten.to.dtype(x, torch.float32)``, a
    factory's ``dtype=``) is replaced by ``mapping``'s entry for it, where it has one. The verifier's
    float64 reference runs under it (fxrules/verifier/driver.py). ``TorchDispatchMode`` is torch's
    private dispatch-mode base, hence here."""

    def mapped(value: Any) -> Any:
        return mapping.get(value, value) if isinstance(value, torch.dtype) else value

    class _DtypeMapping(_TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*fx.node.map_aggregate(args, mapped), **fx.node.map_aggregate(kwargs or {}, mapped))

    return _DtypeMapping()
