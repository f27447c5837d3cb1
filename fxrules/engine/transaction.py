"""Edit a copy, or the caller's GraphModule under an undo log; all or nothing either way.

A :class:`Workpiece` holds the graph being rewritten, a read-only view of the
caller's module hierarchy until the commit, and an overlay of the modules the
rewrite creates. Two ways to use it, chosen once per run by the driver:

- **copying** (the default): the graph is a copy (or a fresh trace), and
  nothing of the caller's model is ever written. The result is assembled once,
  in :meth:`Workpiece.commit`, as a new ``GraphModule`` that references exactly
  the modules, parameters and buffers its graph uses (so nothing the rewrite
  made unused is left behind), compiled once. If anything fails before that,
  the workpiece is dropped and the caller's model is as it was. Leaf modules
  and parameters that the rewrite keeps are shared with the input, as
  ``torch.fx.symbolic_trace`` shares them with the traced model.
- **in place** (``apply_rules(..., inplace=True)``): the graph is the caller's
  GraphModule's own, and every edit first records, in a :class:`Journal`, the
  state it is about to change (per node, once: its arguments, users, metadata;
  per module dictionary, once: its items). :meth:`Workpiece.commit_in_place`
  puts the new modules into the caller's module, deletes the ones the rewrite
  left unused and recompiles it. On any failure, up to and including that
  recompile, :meth:`Journal.rollback` gives everything back as it was.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import fx, nn

from fxrules.engine import aliasing, fxaccess, guards, planner
from fxrules.engine.errors import ModelError
from fxrules.engine.inspection import NOTHING as NO_INSPECTIONS, apply_settlement
from fxrules.engine.matcher import Match
from fxrules.engine.planner import Effects, Plan
from fxrules.engine.program import RBuilder, RCall, RComputed, RNewModule, RReuse, graph_constant
from fxrules.engine.refusals import Refusal, RefusalCode
from fxrules.engine.report import Applied
from fxrules.engine.users import UsersByKey
from fxrules.engine.watch import StorageWatch

_NOT_LOOKED_UP = object()

_INHERITED_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node", "seq_nr", "custom")


def copy_graph(graph: fx.Graph) -> fx.Graph:
    """A copy of ``graph``: the nodes ``copy.deepcopy(graph)`` makes, named as in ``graph`` (so a node
    created in the copy gets the name an in-place edit would give it); see
    :func:`fxrules.engine.fxaccess.copy_graph_fast` for the fast path."""
    return fxaccess.copy_graph(graph)


class Unrecorded:
    """The journal of a copying run: records nothing (the caller's model is never edited; a failed
    run drops its copy). Every edit of the workpiece calls the same methods as on a :class:`Journal`."""

    __slots__ = ()

    def touch(self, node: fx.Node) -> None:
        pass

    def creating(self, args: tuple, kwargs: dict) -> None:
        pass

    def created(self, node: fx.Node) -> None:
        pass

    def replacing(self, root: fx.Node, value: fx.Node) -> None:
        pass

    def repointing(self, user: fx.Node, new: fx.Node) -> None:
        pass

    def erasing(self, node: fx.Node) -> None:
        pass

    def meta_of(self, node: fx.Node) -> dict:
        return node.meta


UNRECORDED = Unrecorded()


class Journal:
    """The undo log of an in-place run: the state of everything the run changes, saved just before
    its first change (not a copy of the model: a node's state is saved when an edit first reaches
    it, a module dictionary's items when one is first written).

    :meth:`rollback` undoes the run: the changes to the node list are undone in the reverse of the
    order they were made (a node created is unlinked, a node erased is linked again after the node
    that was before it when it was erased: each undo finds the list as that change left it, so every
    step is one link or unlink, however many nodes the run made around it), then the name table is
    restored, every saved node gets back its arguments, users (in their order) and position key,
    and metadata (the same dictionary, its old items), every saved module dictionary its items in
    their order, and the module its code (``recompile``'s attributes)."""

    def __init__(self, graph: fx.Graph):
        self.graph = graph
        self.saved: dict = {}  # node -> fxaccess.NodeState before this run first changed it
        self.metas: dict = {}  # node -> a copy of its meta before this run first wrote it
        self.made: dict = {}  # the nodes this run created (a dict as an ordered set)
        # users whose every input has been saved (or made): a later input is a value put in a root's place or
        # repointed to, saved as it comes, so the inputs of a user read by thousands (the output node) are
        # looked through once, not per rewrite
        self.inputs_saved: set = set()
        # The node list's changes in the order they were made: (node, None) for a node created, (node, the
        # node before it then) for a node erased (one this run created too)
        self.links: list = []
        self.unused: dict = {}  # targets of the graph's own call_module/get_attr nodes that were erased
        self.names: Optional[fxaccess.NameTable] = None  # the graph's name table before the first node was created
        self.stores: dict = {}  # id(dict) -> (the dict, its items before this run first wrote it)
        self.class_code: Optional[tuple] = None  # (class, {name: value or _ABSENT}) before the recompile
        # A node creation begun and not yet recorded: (the insertion gap's two nodes, the new node's
        # arguments and keywords), or None. A creation that fails part way (a create-node hook of the
        # GraphModule raising after the node was linked, an interrupt) leaves a node no entry names.
        self.pending: Optional[tuple] = None

    def graph_and_modules_untouched(self) -> bool:
        """Whether this run has edited no node (saved, made, erased, or a creation begun) and no module
        dictionary: at most metadata (example inputs' values) was written."""
        return not (self.saved or self.made or self.links or self.stores or self.unused) and self.pending is None

    def touch(self, node: fx.Node) -> None:
        """Before an edit changes ``node`` (a node the graph had before this run)."""
        if node not in self.saved and node not in self.made:
            self.saved[node] = fxaccess.node_state(node)

    def creating(self, args: tuple, kwargs: dict) -> None:
        """Before a node is created with these arguments at the graph's insert point."""
        if self.names is None:
            self.names = fxaccess.name_table(self.graph)
        self.pending = (fxaccess.insertion_gap(self.graph), args, kwargs)

    def created(self, node: fx.Node) -> None:
        """After ``node`` was created: its inputs gained it as a user. (Its inputs' states are saved
        before it counts as made: until then :meth:`rollback` finds it as an unfinished creation.)"""
        saved, made = self.saved, self.made
        for used in node.all_input_nodes:
            if used not in saved and used not in made:
                saved[used] = fxaccess.node_state(used, without_user=node)
        made[node] = None
        self.links.append((node, None))
        self.pending = None

    def replacing(self, root: fx.Node, value: fx.Node) -> None:
        """Before ``root``'s uses are replaced by ``value``. Torch rewires a user by taking it off the
        users of every node it reads and putting it back at the end: the users of a user's other
        inputs change order too, so they are saved as well."""
        saved, made = self.saved, self.made
        for node in (root, value, *root.users):  # touch(), written out: per rewrite, on the hot path
            if node not in saved and node not in made:
                saved[node] = fxaccess.node_state(node)
        inputs_saved = self.inputs_saved
        for user in root.users:
            if user in inputs_saved:
                continue
            for used in user.all_input_nodes:
                if used not in saved and used not in made:
                    saved[used] = fxaccess.node_state(used)
            inputs_saved.add(user)

    def repointing(self, user: fx.Node, new: fx.Node) -> None:
        """Before ``user``'s reads of one node are re-pointed to ``new`` (as :meth:`replacing`, for one user)."""
        for node in (user, new, *user.all_input_nodes):
            self.touch(node)

    def erasing(self, node: fx.Node) -> None:
        """Before ``node`` is erased: its inputs lose it as a user; it goes back after the node before it
        now (the undo of the changes after this one puts that node back in its place first)."""
        saved, made = self.saved, self.made
        for used in node.all_input_nodes:  # touch(), written out
            if used not in saved and used not in made:
                saved[used] = fxaccess.node_state(used)
        self.links.append((node, node.prev))
        if node in made:
            return
        if node not in saved:
            saved[node] = fxaccess.node_state(node)
        if node.op in ("call_module", "get_attr") and isinstance(node.target, str):
            self.unused[node.target] = None

    def meta_of(self, node: fx.Node) -> dict:
        """``node``'s metadata, to be written."""
        meta = node.meta
        if node not in self.metas and node not in self.made:
            self.metas[node] = dict(meta)
        return meta

    def store(self, items: dict) -> dict:
        """``items`` (a module's dictionary), to be written."""
        if id(items) not in self.stores:
            self.stores[id(items)] = (items, dict(items))
        return items

    def recompiling(self, module: fx.GraphModule) -> None:
        """Before ``module.recompile()``: what it sets on the module and on its class."""
        self.store(fxaccess.module_stores(module)[3])
        cls = type(module)
        self.class_code = (cls, {name: vars(cls).get(name, _ABSENT) for name in fxaccess.GRAPH_MODULE_CLASS_CODE})

    def rollback(self) -> None:
        graph = self.graph
        if self.pending is not None:
            self._abandon_creation()
        for node, after in reversed(self.links):
            if after is None:
                fxaccess.unlink_created_node(graph, node)
            else:
                fxaccess.relink_erased_node(graph, node, after)
        if self.names is not None:
            fxaccess.restore_name_table(graph, self.names)
        for node, state in self.saved.items():
            fxaccess.restore_node_state(node, state)
        for node, meta in self.metas.items():
            mine = node.meta
            mine.clear()
            mine.update(meta)
        for items, before in self.stores.values():
            items.clear()
            items.update(before)
        if self.class_code is not None:
            cls, values = self.class_code
            for name, value in values.items():
                if value is _ABSENT:
                    if name in vars(cls):
                        delattr(cls, name)
                else:
                    setattr(cls, name, value)
        fxaccess.recount_nodes(graph)

    def _abandon_creation(self) -> None:
        """Undo a node creation that did not finish (:attr:`pending`): the node it linked at the
        insertion gap joins the made nodes, to be unlinked, and a node it made but did not link is
        dropped from its inputs' users (those the journal has no state of; the others get theirs
        back). The name table is restored whole (:meth:`rollback`)."""
        gap, args, kwargs = self.pending
        self.pending = None
        strays = fxaccess.nodes_between(*gap) if gap is not None else []
        made, saved = self.made, self.saved
        for node in strays:
            if node not in made:
                made[node] = None
                self.links.append((node, None))
        inputs: dict = {}
        fx.node.map_arg((args, kwargs), lambda n: inputs.setdefault(n, None))
        for used in inputs:
            if used in saved or used in made:
                continue
            for user in list(used.users):
                if user not in saved and (user in strays or not fxaccess.linked(user)):
                    del used.users[user]


_ABSENT = object()

_NO_MODULES: dict = {}
"""What a closed workpiece's ``module_of`` reads (:meth:`Workpiece.close`): nothing."""


class Workpiece:
    """The graph being rewritten and the modules it refers to; every edit goes through its journal
    (:data:`UNRECORDED` for a copy, a :class:`Journal` for the caller's own graph)."""

    def __init__(self, graph: fx.Graph, root: nn.Module, *, class_name: str, donor: Optional[nn.Module] = None,
                 extra_attrs: Optional[dict] = None, journal: "Unrecorded | Journal" = UNRECORDED):
        self.graph = graph
        self.journal = journal
        self.root = root  # read only
        self.class_name = class_name
        self.donor = donor
        self.training = root.training
        self._modules: Optional[dict] = None
        self.new_modules: dict[str, nn.Module] = {}
        self.extra_attrs: dict[str, Any] = dict(extra_attrs or {})
        self._taken: Optional[set] = None
        self._callers: Optional[dict] = None  # call_module target -> {node: None}, built on first use
        self._attr_readers: Optional[dict] = None  # dotted path -> get_attr nodes reading it or inside it
        self.notes: list[str] = []
        self.has_values = any("val" in n.meta for n in graph.find_nodes(op="placeholder"))
        # Whether the model may be trained, so a parameter requiring grad is trainable (guards): an
        # nn.Module or GraphModule in training mode. The driver sets it False for an ExportedProgram,
        # which keeps no mode (docs/semantics.md).
        self.trains = root.training
        # Whether the values' requires_grad was computed with autograd on (example inputs run on fake
        # tensors); torch.export records meta['val'] without it. Set by the driver.
        self.tracks_grad = False
        self._fake_mode: Any = _NOT_LOOKED_UP
        self._fake_runs: Optional[tuple] = None  # (a fake mode, signature -> fake module copy): fake_runs
        self._node_names: dict = {}  # (op, target) -> the base name torch gives such a node
        self.changed: set = set()  # nodes the rewrite created or rewired: what commit checks
        # module_of(target): the module a call_module target names, one the rewrite made (take_name adds
        # it) or else the input's. It is this dictionary's own ``get``: the planner, the matcher and the
        # fixpoint ask it several times per match, and a method around the lookup cost as much as the lookup.
        self._lookup: Optional[dict] = dict(self.modules)
        self.module_of: Callable[[str], Any] = self._lookup.get
        self.effects = Effects(self.module_of, self.attr_of)
        # the users of nodes read by many, grouped for the search of multi-root rules' further roots (the
        # matcher asks through its GraphView); every edit below that gives a node a user tells it
        self.hubs = UsersByKey(self.module_of)
        # the nodes matches turned down for a storage reason wait on (the driver's), told of every user they
        # lose by the edits below that may hand their storage on (fxrules.engine.watch)
        self.storage = StorageWatch(self.effects.hands_on_storage)
        self._stride_readers: Optional[int] = None  # nodes reading strides (guards), counted on first use
        # what guards.stride_reader's walks found (without, with the output as a reader), told of each edit
        self._stride_walks: Optional[tuple] = None
        # guards.output_aliased's outputs and parameters by storage, kept between matches
        self.output_storages: Optional[guards.OutputStorages] = None

    # -- creating nodes ----------------------------------------------------------
    def new_node(self, op: str, target: Any, args: tuple, kwargs: dict) -> fx.Node:
        """A node at the graph's insert point: what ``Graph.create_node`` makes, with the same name
        (faster: :func:`fxrules.engine.fxaccess.create_node_fast`)."""
        journal = self.journal
        journal.creating(args, kwargs)
        node = fxaccess.create_node(self.graph, op, target, args, kwargs, self._node_names)
        journal.created(node)
        self.effects.edits += 1
        if self._stride_walks is not None:
            for walks in self._stride_walks:
                walks.made(node)
        if self.hubs.grouped:
            self.hubs.made(node)
        if self.effects.aliasing.hub_users:
            self.effects.aliasing.rewired(node)
        return node

    def replace_uses(self, root: fx.Node, value: fx.Node) -> None:
        """Every use of ``root`` becomes a use of ``value``."""
        self.journal.replacing(root, value)
        moved = list(root.users) if self.hubs.grouped and self.hubs.watches(value) else ()
        if self.storage.waiting:
            self.storage.lost(root, root.users)
        rewired = list(root.users) if self.effects.aliasing.hub_users else ()
        if self._stride_walks is not None:
            for walks in self._stride_walks:
                walks.gave(root.users)
        root.replace_all_uses_with(value)
        self.effects.edits += 1
        if self.output_storages is not None:
            self.output_storages.rewired(root, value)
        for user in rewired:  # (in the order torch re-adds them to their inputs' users)
            self.effects.aliasing.rewired(user)
        for user in moved:
            self.hubs.added(value, user)

    def repoint(self, user: fx.Node, old: fx.Node, new: fx.Node) -> None:
        """``user`` reads ``new`` where it read ``old``."""
        self.journal.repointing(user, new)
        if self.storage.waiting:
            self.storage.lost(old, (user,))
        user.replace_input_with(old, new)
        self.effects.edits += 1
        if self._stride_walks is not None:
            for walks in self._stride_walks:
                walks.gave((user,))
        if self.output_storages is not None and user.op == "output":
            self.output_storages.rewired(old, new)
        if self.effects.aliasing.hub_users:
            self.effects.aliasing.rewired(user)
        if self.hubs.grouped:
            self.hubs.added(new, user)

    def erase(self, node: fx.Node) -> None:
        """Erase ``node`` (it has no users left)."""
        self.journal.erasing(node)
        if self.storage.waiting:  # (judged with its arguments: erasing clears them)
            self.storage.erasing(node)
        fxaccess.erase_node(self.graph, node)
        self.erased(node)
        self.effects.edits += 1
        if self._stride_walks is not None:
            for walks in self._stride_walks:
                walks.took()

    def meta_of(self, node: fx.Node) -> dict:
        """``node.meta``, to be written."""
        return self.journal.meta_of(node)

    def set_value(self, node: fx.Node, val: Any) -> None:
        """Give a node of the graph the value ``val`` (``meta['val']``); the guards' index of the outputs by
        storage is told (the node may be returned)."""
        self.meta_of(node)["val"] = val
        if self.output_storages is not None:
            self.output_storages.revalued(node)

    # -- lookups ---------------------------------------------------------------
    def fake_mode(self) -> Any:
        """The fake mode of the graph's values (None when they are not fake tensors), found once."""
        if self._fake_mode is _NOT_LOOKED_UP:
            mode = None
            for node in self.graph.nodes:
                val = node.meta.get("val")
                if fxaccess.is_fake_tensor(val):
                    mode = val.fake_mode
                    break
            self._fake_mode = mode
        return self._fake_mode

    def fake_runs(self, mode: Any) -> dict:
        """The fake copies of modules this run calls on ``mode``'s tensors (metadata propagation, the
        guards' dry runs), one per kind of module (:func:`fxrules.engine.fxaccess.fake_module_to_run`):
        a dictionary kept for the run, a new one for another mode."""
        held = self._fake_runs
        if held is None or held[0] is not mode:
            held = self._fake_runs = (mode, {})
        return held[1]

    @property
    def modules(self) -> dict:
        if self._modules is None:
            self._modules = fxaccess.modules_by_path(self.root)
        return self._modules

    def attr_of(self, target: str) -> Any:
        if target in self.extra_attrs:
            return self.extra_attrs[target]
        if target in self.new_modules:
            return self.new_modules[target]
        # the module holding it by its path (module_of's table of the input's modules), then one getattr:
        # not a getattr per part through nn.Module.__getattr__ (an exported module reads every
        # parameter by a dotted path: a tenth of a copying commit); a path that is not a registered
        # module's is walked as before
        path, _, field = target.rpartition(".")
        value: Any = self.modules.get(path) if path else self.root
        if value is not None:
            return getattr(value, field)
        value = self.root
        for part in target.split("."):
            value = getattr(value, part)
        return value

    def unique_name(self, base: str) -> str:
        if self._taken is None:
            taken = set(self.modules)
            taken.update(name for name, _ in self.root.named_parameters(remove_duplicate=False))
            taken.update(name for name, _ in self.root.named_buffers(remove_duplicate=False))
            taken.update(self.extra_attrs)
            taken.update(n.target for n in self.graph.nodes if n.op in ("get_attr", "call_module"))
            self._taken = taken
        name = base
        i = 1
        while name in self._taken:
            name = f"{base}_{i}"
            i += 1
        self._taken.add(name)
        return name

    # -- an index of module and attribute users, kept up to date by created() and erased() --
    def _index(self) -> None:
        callers: dict = {}
        below: dict = {}
        for node in self.graph.nodes:
            self._add_to_index(node, callers, below)
        self._callers, self._attr_readers = callers, below

    @staticmethod
    def _add_to_index(node: fx.Node, callers: dict, below: dict) -> None:
        if node.op == "call_module":
            callers.setdefault(node.target, {})[node] = None
        elif node.op == "get_attr" and isinstance(node.target, str):
            parts = node.target.split(".")
            for i in range(1, len(parts) + 1):  # each module on the path, and the target itself
                below[".".join(parts[:i])] = below.get(".".join(parts[:i]), 0) + 1

    def has_stride_reader(self) -> bool:
        """Whether a node of the graph reads strides (``guards.is_stride_reader``): counted once,
        then kept up to date by :meth:`created` and :meth:`erased`."""
        if self._stride_readers is None:
            self._stride_readers = guards.count_stride_readers(self.graph)
        return self._stride_readers > 0

    def stride_readers(self, outputs_read: bool) -> "guards.StrideWalks":
        """What :func:`fxrules.engine.guards.stride_reader` has found below nodes (``outputs_read`` or not),
        kept through the edits below while it holds (:class:`~fxrules.engine.guards.StrideWalks`)."""
        walks = self._stride_walks
        if walks is None:
            walks = self._stride_walks = (guards.StrideWalks(False), guards.StrideWalks(True))
        return walks[outputs_read]

    def created(self, node: fx.Node) -> None:
        self.effects.node_created(node)
        if self._stride_readers is not None and guards.is_stride_reader(node):
            self._stride_readers += 1
        if self._callers is not None:
            self._add_to_index(node, self._callers, self._attr_readers)

    def erased(self, node: fx.Node) -> None:
        self.effects.node_erased(node)
        if self._stride_readers is not None and guards.is_stride_reader(node):
            self._stride_readers -= 1
        if self._callers is None:
            return
        if node.op == "call_module":
            users = self._callers.get(node.target)
            if users is not None:
                users.pop(node, None)
        elif node.op == "get_attr" and isinstance(node.target, str):
            parts = node.target.split(".")
            for i in range(1, len(parts) + 1):
                self._attr_readers[".".join(parts[:i])] -= 1

    def callers_of(self, target: str) -> Any:
        """The call_module nodes calling ``target``."""
        if self._callers is None:
            self._index()
        return self._callers.get(target, {})

    def read_by_get_attr(self, target: str) -> bool:
        """Whether a get_attr node reads module ``target`` itself or an attribute inside it
        (``target``, ``target.weight``)."""
        if self._callers is None:
            self._index()
        return self._attr_readers.get(target, 0) > 0

    def add_module(self, name: str, module: nn.Module) -> str:
        """Put ``module`` under a new name made from ``name`` (:meth:`unique_name`); returns it."""
        return self.take_name(self.unique_name(name), module)

    def take_name(self, name: str, module: nn.Module) -> str:
        """Put ``module`` under ``name``. An existing module's name only when every node calling it now
        is erased by the rewrite in progress (:meth:`_ReplacementWriter._only_matched_use`; ``apply_match``
        checks it afterwards): no node that outlives the rewrite calls the old module by that name, so no
        node's effects (:class:`Effects`) change with it."""
        self.new_modules[name] = module
        self._lookup[name] = module
        return name

    def close(self) -> None:
        """Let go of what the run kept for its checks: the effects (with their aliasing) and their caches,
        the module and user indexes, the journal. They refer back to this workpiece through bound
        methods (``Effects(self.module_of, ...)``), so otherwise this whole web, and whatever it holds
        (the journal's saved states, module dictionaries and the modules a rewrite removed, the
        per-module facts), would be garbage in reference cycles, left to the cyclic collector: one
        traversal of all of it when ``apply_rules`` lets the collector run again (at 20,000 nodes,
        tens of milliseconds; in place on conv+bn folding, more). Dropped here, reference counting
        frees it at once. The driver calls it when a run has ended, after the commit or the rollback;
        the workpiece is not used again."""
        effects = self.effects
        if effects is not None:
            effects.close()
        self.effects = None
        self.journal = UNRECORDED
        self._lookup = self._modules = self._callers = self._attr_readers = self._taken = self._fake_runs = None
        self.module_of = _NO_MODULES.get

    # -- commit ----------------------------------------------------------------
    def check_changed(self) -> None:
        """What ``Graph.lint`` checks, for the nodes this run created or rewired.

        Every other node is as the input had it, so a whole-graph lint would re-check the
        input at the cost of a quarter of a recompile (20,000 nodes). A changed node must be
        in the graph and read only nodes that are in the graph and come before it.
        """
        found = fxaccess.misread(self.graph, self.changed)
        if found is not None:
            node, used, in_graph = found
            if not in_graph:
                raise ModelError(f"node %{node.name} uses %{used.name}, which is not in the graph")
            raise ModelError(f"node %{node.name} uses %{used.name} before it is computed")

    def commit(self) -> fx.GraphModule:
        """Check what changed and build the one new GraphModule (the single recompile of the run)."""
        # The graph may still name its source module as owner (graphs from torch.export do), which
        # lacks the modules this run created; the new GraphModule below becomes its owner.
        fxaccess.release_owner(self.graph)
        self.check_changed()
        root: dict = {}
        for node in self.graph.nodes:
            if node.op == "call_module":
                module = self.module_of(node.target)
                if module is None:
                    raise ModelError(f"node %{node.name} calls `{node.target}`, which the model does not have")
                root[node.target] = module
            elif node.op == "get_attr":
                root[node.target] = self.attr_of(node.target)
        module = _assemble(root, self.graph, self.class_name, self.modules)
        module.training = self.training
        if self.donor is not None:
            _carry_state(self.donor, module)
        return module


    def commit_in_place(self) -> fx.GraphModule:
        """Check what changed, put the modules the graph now calls into the caller's module (its
        own, :attr:`root`), delete those the rewrite left unused, and recompile it: every write
        recorded in the journal first, so that a failure here too is undone by the caller.

        A run that changed nothing (no node made, rewired or erased, no module made) leaves the
        module as it was, its code included: its graph is the graph it had, so a recompile would
        write the same program again (a tenth of a second at 5,000 nodes). A pass pipeline whose rule
        sets mostly find nothing pays only for looking."""
        journal = self.journal
        module = self.root
        if journal.graph_and_modules_untouched() and not self.new_modules:
            return module
        self.check_changed()
        for target, made in self.new_modules.items():
            if self.callers_of(target) or self.read_by_get_attr(target):
                _put_at(module, target, made, journal, self.training)
        if journal.unused:
            _delete_unused(module, self.modules, self.graph, journal)
        journal.recompiling(module)
        with fxaccess.recompiling(self.graph):
            module.recompile()
        return module


def _put_at(root: nn.Module, target: str, module: nn.Module, journal: Journal, training: bool) -> None:
    """Register ``module`` at the dotted ``target`` below ``root`` (replacing a module there), with
    the containers missing on the way (``GraphModule.add_submodule``'s way), each write journaled."""
    parent = root
    path, _, field = target.rpartition(".")
    for item in path.split(".") if path else ():
        child = fxaccess.child(parent, item)
        if child is None:
            if fxaccess.holds_non_module(parent, item):
                raise ModelError(f"cannot place `{target}`: `{item}` on its path is not a module")
            child = nn.Module()
            child.training = training
            journal.store(fxaccess.module_stores(parent)[0])
            fxaccess.put_child(parent, item, child)
        parent = child
    if fxaccess.holds_non_module(parent, field):
        raise ModelError(f"cannot place `{target}`: the model has a value that is not a module there")
    journal.store(fxaccess.module_stores(parent)[0])
    fxaccess.put_child(parent, field, module)


def _delete_unused(root: nn.Module, modules: dict, graph: fx.Graph, journal: Journal) -> None:
    """Delete the submodules, parameters and buffers that erased nodes called or read and no node
    of ``graph`` uses any more: neither that target, nor one inside it, nor a module around it.
    ``modules``: ``root``'s modules by path, as the run found them."""
    used = {target for op in ("call_module", "get_attr") for node in graph.find_nodes(op=op, sort=False)
            if isinstance(target := node.target, str)}  # call_module and get_attr targets
    around: set = set()  # the modules around them: their parents, the parents' parents, ...
    level = {target.rpartition(".")[0] for target in used if "." in target}
    while level:
        around.update(level)
        level = {path.rpartition(".")[0] for path in level if "." in path}.difference(around)
    for target in sorted(journal.unused, key=lambda t: -t.count(".")):  # the innermost first
        if target in used:
            continue
        path, _, field = target.rpartition(".")
        prefix, inside_used = path, False
        while prefix:
            if prefix in used:
                inside_used = True
                break
            prefix = prefix.rpartition(".")[0]
        if inside_used:
            continue
        parent = modules.get(path) if path else root
        if parent is None:
            continue
        if target in around:  # a get_attr still reads inside it: kept as a container of what is read
            module = modules.get(target)
            if isinstance(module, nn.Module):
                journal.store(fxaccess.module_stores(parent)[0])
                fxaccess.put_child(parent, field, _read_part(module, target, used, around))
            continue
        for items in fxaccess.module_stores(parent)[:3]:
            if field in items:
                del journal.store(items)[field]
                break


def _read_part(module: nn.Module, path: str, used: set, around: set) -> nn.Module:
    """A new container for the module at ``path``, which no node calls any more but inside which
    get_attr nodes still read: the members they read (the same objects), and containers of the same
    kind for the submodules around what they read, each in its module's training mode. What a
    copying run's result holds there (``_assemble`` builds it from the targets), so an in-place run
    leaves the caller's module the same state_dict keys; the module itself, which the model the
    GraphModule was traced from may share, is not changed."""
    container = nn.Module()
    container.training = module.training
    prefix = path + "."
    names = dict.fromkeys(t[len(prefix):].split(".")[0] for t in used | around if t.startswith(prefix))
    for name in names:
        member, value = prefix + name, getattr(module, name, None)
        if member not in used:
            if member in around and isinstance(value, nn.Module):
                fxaccess.put_child(container, name, _read_part(value, member, used, around))
        elif value is not None:
            _put_member(container, name, value)
    return container


def _put_member(parent: nn.Module, field: str, value: Any) -> None:
    """Put ``value`` on ``parent`` under a name it does not have yet, as GraphModule's constructor would:
    a module as a submodule, a parameter as a parameter, a plain tensor as a (persistent) buffer,
    anything else as an attribute."""
    if isinstance(value, nn.Module):
        fxaccess.put_child(parent, field, value)
    elif isinstance(value, nn.Parameter):
        fxaccess.put_parameter(parent, field, value)
    elif isinstance(value, torch.Tensor):
        fxaccess.put_buffer(parent, field, value)
    else:
        setattr(parent, field, value)


def _assemble(root: dict, graph: fx.Graph, class_name: str, originals: Optional[dict] = None) -> fx.GraphModule:
    """``fx.GraphModule(root, graph, class_name=...)``, with the module tree built directly.

    GraphModule's constructor puts every target in place with ``getattr``/``setattr`` through
    ``nn.Module``'s attribute hooks, several per target (a fifth of a recompile at 20,000
    nodes); here each goes straight into its container's ``_modules``, ``_parameters`` or
    ``_buffers``, as those hooks would have put it. A container made for a dotted target
    (``blocks.0`` in ``blocks.0.fc``) takes the training mode of the module at that path in
    ``originals`` (the input's modules by path), where there is one; GraphModule would leave it
    in training mode. The module is made around an empty graph of the same tracer, then given
    ``graph``: that is the one recompile.
    """
    originals = originals if originals is not None else {}
    module = fx.GraphModule({}, fxaccess.empty_graph_like(graph), class_name=class_name)
    made_at: dict = {"": module}  # path -> container created here (the only modules this may write to)
    class_has: dict = {}  # (class, name) -> whether the class has that attribute
    for target in sorted(root, key=lambda t: t.count(".")):  # containers before what is inside them
        value = root[target]
        path, _, field = target.rpartition(".")
        parent = made_at.get(path)
        if parent is None:
            parent = _container(module, path, made_at, originals, target)
        if made_at.get(path) is not parent:  # inside a module the graph also uses as a whole (the input's)
            if getattr(parent, field, None) is not value:
                raise ModelError(f"cannot place `{target}`: it would change module `{path}`, which "
                                 f"the input model shares")
            continue
        key = (type(parent), field)
        has = class_has.get(key)
        if has is None:
            has = class_has[key] = hasattr(key[0], field)
        plain_tensor = isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter)
        if has or field in parent.__dict__ or not isinstance(value, (nn.Module, torch.Tensor)):
            # a name the module class or instance already has, or not a module or tensor: exactly
            # GraphModule's way (its checks and errors included)
            if plain_tensor:
                parent.register_buffer(field, value)
            else:
                setattr(parent, field, value)
        else:
            _put_member(parent, field, value)
    with fxaccess.recompiling(graph):
        module.graph = graph  # the one recompile
    return module


def _container(module: nn.Module, path: str, made_at: dict, originals: dict, target: str) -> nn.Module:
    """The module at ``path`` below ``module``, making the containers missing on the way (and
    recording them in ``made_at``)."""
    parent: nn.Module = module
    walked = ""
    items = path.split(".")
    # from the deepest container already made on the way (targets come outermost first): the walk from
    # the top would reach the same module, one child at a time
    for depth in range(len(items) - 1, 0, -1):
        prefix = ".".join(items[:depth])
        if prefix in made_at:
            parent, walked, items = made_at[prefix], prefix, items[depth:]
            break
    for item in items:
        walked = f"{walked}.{item}" if walked else item
        child = fxaccess.child(parent, item)
        if child is None:
            if fxaccess.holds_non_module(parent, item):
                raise ModelError(f"cannot place `{target}`: `{item}` on its path is not a module")
            original = originals.get(walked)
            child = fxaccess.new_container(original.training if original is not None else True)
            fxaccess.put_child(parent, item, child)
            made_at[walked] = child
        parent = child
    return parent


def _carry_state(donor: nn.Module, module: fx.GraphModule) -> None:
    """Keep what a GraphModule input carried besides its graph: meta, export specs, hooks."""
    module.meta = dict(getattr(donor, "meta", {}) or {})
    for key, value in donor.__dict__.items():
        if "hooks" in key and isinstance(value, (dict, set)) and value:
            setattr(module, key, copy.copy(value))
        elif key not in module.__dict__ and key not in fxaccess.GRAPH_MODULE_INTERNALS and not key.startswith("__"):
            module.__dict__[key] = value
    for key in fxaccess.EXPORT_SPECS:
        if key in donor.__dict__:
            module.__dict__[key] = donor.__dict__[key]


# ---------------------------------------------------------------------------
# Applying one match
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Refusal:
    """A builder argument that cannot be handed over, and why."""

    reason: str


class _ReplacementWriter(planner.ReplacementValues):
    """The transaction's reader of a replacement (:class:`planner.ReplacementValues`): a call is a new node
    (or the matched node it computes again), a computed value is what :meth:`compute_values` found."""

    def __init__(self, work: Workpiece, match: Match):
        super().__init__(match)
        self.work = work
        self.created: list[fx.Node] = []
        self.meta_source: fx.Node = match.roots[0]
        self.reused_names: set[str] = set()
        self.kept_matched: Optional[frozenset] = None  # planner.kept_nodes(match).nodes, found when first asked
        self.premade: dict = {}  # id(RCall) -> (module, reference module, base name)
        self.origin: Optional[tuple] = None  # (rule name, rule file:line) for the new nodes' meta
        self.kept: list[fx.Node] = []  # matched nodes the replacement uses as they are (matched_equal)
        self.dry_values: dict = {}  # id(RCall) -> its value from the dry run (guards.DryRun): new nodes' meta['val']
        self.computed: dict = {}  # id(RComputed) -> its value (compute_values)

    def compute_values(self) -> None:
        """Evaluate the replacement's computed values (``{...}``), before modules are made and the graph
        is touched, with the evaluator of ``where`` clauses (its allow-list and budget)."""
        program = self.match.program
        if not program.method_objects and not program.computed:  # the common replacement: nothing to do
            return
        from fxrules.engine.conditions import Evaluator

        for item, name in program.method_objects:
            if name is None:  # forwarded arguments
                args = self.match.roots[item.root_index].args
                value, name = (args[0] if args else None), "the first argument of the matched node"
            else:
                value = self.env.captures.get(name)
                name = "$" + name
            if not isinstance(value, fx.Node):
                raise TypeError(f"the replacement calls the method `{item.target}` on {name}, which this match "
                                f"binds to {value!r}, not a graph value (the rule is wrong: write `call_function "
                                f"torch.{item.target}(...)`, or a condition that it is a tensor)")
        for item in program.computed:
            evaluator = Evaluator(self.env.captures, self.env.names, self.work.module_of, self.work.attr_of,
                                  item.aliases, item.resolver)
            self.computed[id(item)] = graph_constant(evaluator.value(item.cond), item.span)

    def make_modules(self) -> Optional[str]:
        """Construct every module the replacement needs, before the graph is touched.

        Returns None, or why the match is refused: a builder raising
        :class:`fxrules.builders.BuilderError` declines these inputs (any other exception is
        a failure and propagates).
        """
        calls = self.match.program.module_calls
        if not calls:
            return None
        from fxrules.engine.errors import BuilderError

        for item in calls:
            spec = item.target
            root = self.match.roots[item.root_index]
            if isinstance(spec, RBuilder):
                inputs, nodes = [], []
                for name in spec.names:
                    if name.startswith("$"):
                        inputs.append(self.builder_argument(name[1:]))
                    else:
                        nodes.append(self.env.names[name])
                        inputs.append(self.work.module_of(nodes[-1].target))
                refused = next((v for v in inputs if isinstance(v, _Refusal)), None)
                if refused is not None:
                    return f"builder {spec.label} declined: {refused.reason}"
                try:
                    module = spec.function(*inputs)
                except BuilderError as exc:
                    return f"builder {spec.label} declined: {exc}"
                if not isinstance(module, nn.Module):
                    raise TypeError(f"builder {spec.label} returned {type(module).__name__}, not an nn.Module")
                shared = _shared_with_inputs(module, inputs, spec.names)
                if shared is not None:
                    raise TypeError(
                        f"builder {spec.label} returned a module that shares {shared}; a builder returns a new "
                        f"module (the builder contract, fxrules.builders): copy what it keeps (copy.deepcopy). "
                        f"The engine sets a new module's training mode, device and dtype, which would change "
                        f"the model's own modules")
                reference = self.work.module_of(nodes[0].target) if nodes else None
                base = _joined_name([n.target for n in nodes]) if nodes else spec.label.rsplit(".", 1)[-1]
                module = _place_built(module, reference, self.work.training)
            elif isinstance(spec, RNewModule):
                kwargs = {name: self.constructor_value(v) for name, v in spec.attrs}
                module = spec.cls(**kwargs)
                reference = self.work.module_of(root.target) if root.op == "call_module" else None
                base = _snake(spec.cls.__name__)
                module = _place_like(module, reference, self.work.training)
            self.premade[id(item)] = (module, reference, base)
        return None

    def built_module_draws(self) -> Optional[Refusal]:
        """Under ``[exact]``/``[approx]``: a module a builder made that draws random numbers as placed (a
        dropout in training mode inside it, in a model that trains) would add draws to the graph; refused as
        ``changes-random-draws``, as the planner refuses a replacement call that draws (it cannot ask a
        builder's module before it is made; a constructed module's class it asks itself)."""
        contract = self.match.rule.contract
        if contract not in planner.RANDOM_CONTRACTS:
            return None
        for item in self.match.program.module_calls:
            if not isinstance(item.target, RBuilder):
                continue
            for inner in _modules_within(self.premade[id(item)][0]):
                if aliasing.module_draws_random(inner):
                    root = self.match.roots[item.root_index]
                    return Refusal(RefusalCode.CHANGES_RANDOM_DRAWS,
                                   f"the module builder {item.target.label} made for %{root.name} draws random numbers "
                                   f"(a {type(inner).__name__} in training mode); under [{contract}] a rewrite may not "
                                   f"add a call that draws them", (root.name,))
        return None

    def builder_argument(self, capture: str) -> Any:
        """A capture handed to a module builder: a parameter or buffer (read by get_attr) as its tensor,
        a constant as itself; a value the graph computes cannot be, so the match is declined."""
        value = self.env.captures[capture]
        if isinstance(value, fx.Node):
            if value.op == "get_attr":
                return self.work.attr_of(value.target)
            return _Refusal(f"${capture} is computed by node %{value.name}, not a parameter or a constant")
        if isinstance(value, (list, tuple)) and any(isinstance(v, fx.Node) for v in value):
            return _Refusal(f"${capture} holds graph values, not constants")
        return value

    def computed_value(self, item: RComputed) -> Any:
        return self.computed[id(item)]

    def call(self, item: RCall) -> fx.Node:
        root = self.match.roots[item.root_index]
        self.meta_source = root
        if item.respells is not None:
            return self.keep(item, root)
        args, kwargs = self.arguments(item, root)
        # Not Graph.call_module: it looks the new name up in the graph's owning module (set for
        # graphs from torch.export), where new modules are not yet (they join at commit).
        target = self.module_target(item, root) if item.op == "call_module" else item.target
        if item.op != "call_module" or type(item.target) is RReuse:
            kept = self.matched_equal(item.op, target, args, kwargs)
            if kept is not None:  # it now stands for the rule's result: it carries what a new node would
                self.inherit_meta(kept, root)
                self.kept.append(kept)
                return kept
        node = self.work.new_node(item.op, target, args, kwargs)
        self.work.created(node)
        self.inherit_meta(node, root)
        value = self.dry_values.get(id(item), _NOT_LOOKED_UP)
        if value is not _NOT_LOOKED_UP and not isinstance(value, guards.Unknown):
            node.meta["val"] = value
        self.created.append(node)
        return node

    def keep(self, item: RCall, root: fx.Node) -> fx.Node:
        """A call the compiler found computes a matched node again (:func:`fxrules.engine.program.respelled`):
        that node, kept as :meth:`call` keeps one :meth:`matched_equal` finds (the calls it re-spells in its
        arguments first, as resolving them would)."""
        for arg in item.args:
            if type(arg) is RCall:  # a respelling call's calls are respellings too
                self.keep(arg, root)
        for _, arg in item.kwargs:
            if type(arg) is RCall:
                self.keep(arg, root)
        kept = self.env.names[item.respells]
        self.inherit_meta(kept, root)
        self.kept.append(kept)
        return kept

    def matched_equal(self, op: str, target: Any, args: tuple, kwargs: dict) -> Optional[fx.Node]:
        """A matched node, not a root, that computes exactly this call (:func:`planner.matched_equal`,
        which :func:`planner.kept_nodes` asks with the same arguments before the graph is edited): the
        replacement keeps it rather than build a copy of it (``relu(relu($x)) -> relu($x)`` keeps the
        inner relu; ``F.gelu(l($x))`` keeps both nodes it matched). Every user it has is in the match
        (or the planner refuses it), and it already sits before the insertion point, with its own name;
        reading its inputs where it always did, it also cannot move a read across a mutation, nor
        change a random draw it makes (the planner lets a drawing node through only when it is kept).
        It takes the metadata a new node would take (:meth:`inherit_meta`). Roots are never kept: a
        rule whose replacement equals its root rewrites forever, and is reported so. Modules the
        replacement makes are never matched nodes' modules."""
        return planner.matched_equal(self.match, op, target, args, kwargs)

    def module_target(self, item: RCall, root: fx.Node) -> str:
        spec = item.target
        nodes: list = []
        if isinstance(spec, RReuse):
            return self.env.names[spec.name].target
        module, reference, base = self.premade[id(item)]
        if isinstance(spec, RBuilder):
            nodes = [self.env.names[name] for name in spec.names if not name.startswith("$")]
        # Readable names: the new module takes the name of the module it replaces (a builder's first
        # input, else the root's) when no node outside the match still calls that name.
        if isinstance(spec, RBuilder) and nodes:
            candidates = [n.target for n in nodes if n in self.env.nodes]
        else:
            candidates = [root.target] if root.op == "call_module" else []
        for target in candidates:
            if target not in self.reused_names and self._only_matched_use(target):
                self.reused_names.add(target)
                return self.work.take_name(target, module)
        if root.op == "call_module" and "." in root.target:
            base = root.target.rsplit(".", 1)[0] + "." + base.rsplit(".", 1)[-1]
        return self.work.add_module(base, module)

    def _only_matched_use(self, target: str) -> bool:
        """Whether the new module may take the name ``target``: every node calling it now is a matched
        node that this rewrite erases, and no get_attr node reads it or an attribute inside it. A node
        still calling the name after the rewrite would call the new module instead of the old one.

        A matched node outlives the rewrite when the replacement keeps it (:func:`planner.kept_nodes`: it
        reads the node by name or capture, directly or through a kept node), or when a replacement call
        names its module again (``call_module conv($x)``: the transaction may keep the matched node as it
        is, or make a new node calling the same name; either calls whatever the name holds). Every other
        matched node is left without users and erased (the planner refuses a match whose interior nodes
        are read outside it or have effects the rewrite would drop)."""
        matched = self.env.nodes
        callers = self.work.callers_of(target)
        if not all(n in matched for n in callers) or self.work.read_by_get_attr(target):
            return False
        names = self.env.names
        for item in self.match.program.reused_modules:
            if names[item].target == target:
                return False
        if self.kept_matched is None:
            self.kept_matched = planner.kept_nodes(self.match).nodes
        return self.kept_matched.isdisjoint(callers)

    def constructor_value(self, item: Any) -> Any:
        value = self.value(item)
        if isinstance(value, fx.Node):
            raise TypeError("a module constructor argument is bound to a graph node, not a constant")
        return value

    def inherit_meta(self, node: fx.Node, root: fx.Node) -> None:
        source, meta = root.meta, self.work.meta_of(node)
        if source:
            for key in _INHERITED_META:
                if key in source:
                    meta[key] = source[key]
        if self.origin is None:
            program = self.match.program
            self.origin = (program.rule.name, program.source)  # (the program formatted the source once)
        meta["fxrules"] = {"rule": self.origin[0], "source": self.origin[1]}


def prospect(work: Workpiece, match: Match) -> "tuple[_ReplacementWriter, tuple] | Refusal":
    """Everything a rewrite decides before it touches the graph: the modules the replacement needs
    (a builder may decline: ``builder-declined``), the replacement's values on fake tensors, and the
    contract guards (:func:`fxrules.engine.guards.check`). Returns the writer, ready to edit, with
    the metadata changes a ``[changes]`` rewrite makes; or the Refusal. The graph is not touched."""
    writer = _ReplacementWriter(work, match)
    program = match.program
    modules: dict = {}
    if program.module_calls or program.computed or program.method_objects:  # (the common replacement: none)
        writer.compute_values()
        declined = writer.make_modules()
        if declined is not None:
            return Refusal(RefusalCode.BUILDER_DECLINED, declined, tuple(n.name for n in match.roots))
        drawing = writer.built_module_draws()
        if drawing is not None:
            return drawing
        modules = {key: made[0] for key, made in writer.premade.items()}
    values = None
    if work.has_values:
        values = guards.DryRun(work, match, modules, writer.computed).run()
        writer.dry_values = values.made
        work.notes.extend(values.notes)
    decided = guards.check(work, match, modules, values)
    if isinstance(decided, Refusal):
        return decided
    return writer, decided


def refusal_before_edit(work: Workpiece, match: Match) -> Optional[Refusal]:
    """What :func:`prospect` refuses, for ``find_matches`` and ``explain`` (nothing is rewritten)."""
    decided = prospect(work, match)
    return decided if isinstance(decided, Refusal) else None


def apply_match(work: Workpiece, match: Match, plan: Plan) -> "tuple[Applied, set, set] | Refusal":
    """Rewrite one match. Returns the report entry, the nodes to revisit (some perhaps erased since: the
    driver's revisit leaves those out), and the nodes whose only change is in their users (none of them
    among the nodes to revisit): inputs of erased nodes and matched nodes left in place lost some; a value
    the graph had before (``-> $x``) gained the roots' users. Or, when a builder declined or a contract
    guard refused (before the graph is touched), the Refusal.

    A value that gains users is not revisited with its users: its own arguments and theirs are as they
    were, so no pattern rooted at it or above it matches otherwise (the roots' users, whose argument
    changed, are revisited). What gaining users may change is a match turned down while reading it (a
    condition on ``users($x)``), sent back by the driver as for a node that lost users; and a multi-root
    match that may now find a root's user as its further root, which the driver finds through that user.
    (Revisiting the value's users made a graph whose input many read quadratic: 300 eval Dropouts of one
    input, each removed by ``-> $x``, revisited all 600 of its users per rewrite.)"""
    decided = prospect(work, match)
    if isinstance(decided, Refusal):
        return decided
    writer, changes = decided
    program = match.program
    # a replacement's calls make nodes, before the plan's anchor; bound values, literals and calls that
    # compute a matched node again (kept: _ReplacementWriter.keep) make none
    if program.makes_nodes:
        with work.graph.inserting_before(plan.anchor):
            new_values = [writer.value(r) for r in program.replacements]
    else:
        new_values = [writer.value(r) for r in program.replacements]
    touched: set = set(writer.created)
    touched.update(writer.kept)
    if plan.inspections is not NO_INSPECTIONS:  # users that only inspect (planner)
        touched.update(apply_settlement(work, plan.inspections))
    roots = match.roots
    gained: list = []  # values the graph had before this rewrite that the roots' users now read
    for root, value in zip(roots, new_values):
        if isinstance(value, fx.Node) and value is not root:
            if work.has_values and "val" not in value.meta and "val" in root.meta:
                work.set_value(value, root.meta["val"])
            touched.update(root.users)
            work.replace_uses(root, value)
            if value in touched:  # made or kept by this replacement
                continue
            gained.append(value)
    matched = match.bindings.nodes
    matched_names = tuple([n.name for n in roots] + [n.name for n in matched if n not in roots])
    attrs = match.bindings.attrs
    lost = _erase_dead(work, [*matched, *attrs] if attrs else list(matched), matched)
    lost.update(gained)
    lost.difference_update(touched)
    for name in writer.reused_names:
        _check_name_taken(work, name, writer.created)
    work.changed.update(touched)  # (erased ones too: the driver's revisit leaves those out)
    work.changed.update(lost)
    replaced_by = tuple([v.name if isinstance(v, fx.Node) else repr(v) for v in new_values])
    return Applied(program.rule.name, program.source, matched_names, tuple([n.name for n in writer.created]), replaced_by,
                   changes), touched, lost


def _check_name_taken(work: Workpiece, name: str, created: list) -> None:
    """After a rewrite whose new module took the name of a module it replaced: only the nodes the rewrite
    made call that name (:meth:`_ReplacementWriter._only_matched_use` decided, before the edit, that every
    other caller would be erased). One left would now compute with the new module; the run fails and is
    undone rather than answer otherwise than the rule says."""
    for node in work.callers_of(name):
        if node not in created and not fxaccess.erased(node):
            raise RuntimeError(f"internal error: node %{node.name} still calls `{name}`, which a rewrite gave to a "
                               f"new module")
    if work.read_by_get_attr(name) and not any(n.op == "get_attr" for n in created):
        raise RuntimeError(f"internal error: a get_attr node still reads `{name}`, which a rewrite gave to a new module")


def _erase_dead(work: Workpiece, candidates: list, checked: Any = ()) -> set:
    """Erase matched nodes left without users, then pure inputs the rewrite left without users.

    ``checked``: nodes already known to have no side effect (the planner refuses a match with an
    effectful node), so they are not asked again."""
    # pop() takes the latest node first: users before producers
    stack = sorted(set(candidates), key=fxaccess.sort_key) if len(candidates) > 1 else list(candidates)
    survivors: set = set()
    seen: set = set()
    while stack:
        node = stack.pop()
        if node in seen or fxaccess.erased(node):
            continue
        if node.users:
            survivors.add(node)
            continue
        seen.add(node)
        inputs = node.all_input_nodes  # (a new list: erasing the node empties its own)
        work.erase(node)
        for inp in inputs:
            if not inp.users and inp.op not in ("placeholder", "output") \
                    and (inp in checked or work.effects.side_effect(inp) is None):
                stack.append(inp)
            else:
                survivors.add(inp)
    # what lost users: a match turned down while reading one of them may pass now (the driver sends it back)
    return {n for n in survivors if not fxaccess.erased(n)}


def _shared_with_inputs(module: nn.Module, inputs: list, names: tuple) -> Optional[str]:
    """What a builder's result shares with the inputs it was given, described, or None: one of the input
    modules (or a module inside one) as the result or inside it, or the storage of an input tensor (an
    input module's parameter or buffer, or a captured tensor) as one of the result's tensors.

    The builder contract (:mod:`fxrules.builders`) forbids both: :func:`_place_like` sets the new
    module's training mode (recursively) and may move it to another device or dtype, which would change
    the model's own modules (``nn.Sequential(conv, bn)`` would put the model's eval-mode ``bn`` in
    training mode), and the planner takes a new module's tensors for storage of its own."""
    own = {id(inner): inner for inner in _modules_within(module)}
    storages = fxaccess.storage_keys(fxaccess.tensors(module))
    for value, name in zip(inputs, names):
        if isinstance(value, nn.Module):
            for inner in _modules_within(value):
                if id(inner) in own:
                    return _input_label(name) + (" itself" if own[id(inner)] is module else " (as a submodule)")
            tensors = fxaccess.tensors(value)
        elif isinstance(value, torch.Tensor):
            tensors = (value,)
        else:
            continue
        if storages and not storages.isdisjoint(fxaccess.storage_keys(tensors)):
            return f"a tensor's storage with {_input_label(name)}"
    return None


def _input_label(name: str) -> str:
    return f"`{name}`" if name.startswith("$") else f"the module `{name}`"


def _modules_within(module: nn.Module) -> list:
    """``module`` and every module inside it (``Module.modules()`` without its generators: a builder's
    inputs and result are most often leaves)."""
    found, stack = [], [module]
    while stack:
        inner = stack.pop()
        found.append(inner)
        children = fxaccess.children(inner)
        if children:
            stack.extend(children.values())
    return found


def _place_like(module: nn.Module, reference: Optional[nn.Module], training: bool) -> nn.Module:
    """A module the rule constructs (``torch.nn.LayerNorm{...}``, made in training mode) lives on the
    device and dtype of the module it replaces, in its training mode (the run's, without one)."""
    if reference is not None:
        module = _place_on(module, reference)
        training = reference.training
    # Module.train sets the mode of the module and every submodule; a module without submodules already
    # in that mode, whose class keeps torch's train, would be left as it is
    if fxaccess.children(module) or module.training != training or type(module).train is not nn.Module.train:
        module.train(training)
    return module


def _place_built(module: nn.Module, reference: Optional[nn.Module], training: bool) -> nn.Module:
    """A builder's result lives on the device and dtype of the module it replaces, in its training mode,
    except that the engine never puts in training mode a module the builder made in eval mode whose
    computation depends on the mode. Each module inside the result of a class whose ``forward`` never
    reads the mode (:data:`aliasing.MODE_INDEPENDENT_MODULES`: a fold's conv, a container) takes the
    replaced module's mode; every other one (a dropout, a norm, a class the engine does not know) is put
    in eval mode when the replaced module is in eval mode (the builder contract's mode; a builder that
    forgot ``.eval()`` on a new batch norm), and otherwise keeps the mode the builder gave it: replacing
    a conv in training mode by ``nn.Sequential(copy of the conv, copy of an eval-mode batch norm)`` must
    not make that batch norm normalise with the batch's statistics."""
    if reference is not None:
        module = _place_on(module, reference)
        training = reference.training
    independent = aliasing.MODE_INDEPENDENT_MODULES
    for inner in _modules_within(module):  # a module before its submodules: they are set after it
        if type(inner) in independent:
            if inner.training != training:
                inner.training = training  # (what Module.train does to it, without its submodules)
        elif inner.training and not training:
            inner.train(False)  # its own train, if its class has one
    return module


def _place_on(module: nn.Module, reference: nn.Module) -> nn.Module:
    """``module`` on the device and dtype of ``reference``'s first floating-point tensor (moved only
    when something would change: ``Module.to`` walks the whole module)."""
    tensor = None
    for candidate in fxaccess.tensors(reference):  # (loops, not generators: once per new module)
        if candidate.is_floating_point():
            tensor = candidate
            break
    if tensor is None:
        return module
    device, dtype = tensor.device, tensor.dtype
    own = fxaccess.tensors(module)
    has_float = False
    for t in own:
        if t.is_floating_point():
            has_float = True
            break
    # Module.to moves every tensor to the device and casts floating and complex ones to the
    # dtype; skip it when nothing would change (it walks the whole module).
    for t in own:
        if t.device != device or (has_float and t.dtype != dtype and (t.is_floating_point() or t.is_complex())):
            module = module.to(device=device, dtype=dtype) if has_float else module.to(device=device)
            break
    return module


def _snake(name: str) -> str:
    """``LeakyReLU`` -> ``leaky_relu``, ``GELU`` -> ``gelu``, ``BatchNorm2d`` -> ``batch_norm2d``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _joined_name(targets: list) -> str:
    """``layer1.conv`` + ``layer1.bn`` -> ``layer1.conv_bn``."""
    if not targets:
        return "fxrules_module"
    parents = {t.rsplit(".", 1)[0] if "." in t else "" for t in targets}
    last = "_".join(t.rsplit(".", 1)[-1] for t in targets)
    if len(parents) == 1:
        parent = parents.pop()
        return f"{parent}.{last}" if parent else last
    return last
