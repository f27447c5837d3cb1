"""Deciding whether a match may be rewritten, and where the replacement goes.

A match is refused with a :class:`~fxrules.engine.refusals.Refusal` (a stable code, the
message the report shows, the nodes concerned) when, checked in this order:

* an interior node (matched, not a root) has a user outside the match
  (``interior-used-outside``);
* a matched module has hooks, its own or global ones (``module-has-hooks``);
* a matched node has a side effect its call declares (removing it would drop the effect:
  ``drops-side-effect``): see :meth:`Effects.declared_effect`; torch's own
  ``Node.is_impure`` misses in-place method calls such as ``buf.add_(1)`` and ``print`` in
  symbolic_trace graphs, so this module has its own test; an in-place call that only writes a
  fresh temporary it alone reads (``F.relu6(x + 3, inplace=True)``; the in-place detach of the copy
  torch.export reads a lifted constant through, ``aten.detach_(aten.lift_fresh_copy(c))``) is not
  refused for that (:func:`writes_only_match_temporaries`);
* under ``[exact]``/``[approx]``, the rewrite removes, leaves unused or adds a call that draws
  random numbers (``changes-random-draws``; a matched drawing node the replacement keeps as it is,
  :func:`kept_nodes`, is neither);
* the replacement uses a node the rewrite removes (``uses-replaced-node``), writes in place a
  value that exists outside it (``replacement-writes-input``), replaces a node by a literal
  (``replaces-with-literal``), or replaces a node that is later modified in place (itself
  or through a view) where the write would then reach another value or stop reaching one
  (``replaced-node-mutated``);
* the rewrite would move a read of a captured value across an in-place mutation of anything
  sharing its storage (the replacement reads it at a later point than the matched nodes did:
  ``reads-across-mutation``; or the value, or a view of it, stands in for a root and is
  modified after the match: ``alias-mutated-later``);
* a returned root would come to share storage with a parameter, a buffer, another output or
  (for a ``clone``) an input (``output-alias-introduced``);
* a module builder would read a parameter or buffer the graph writes (``reads-written-value``);
* the replacement would need a node before one of its own inputs (``would-cycle``).

Which values share storage, which calls are known pure and which draw random numbers is
:mod:`fxrules.engine.aliasing`'s business; :class:`Effects` holds one run's answers.
"""

from __future__ import annotations

import bisect
import operator
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional

import torch
from torch import fx
from torch.fx.immutable_collections import immutable_dict, immutable_list

from fxrules.engine import aliasing, fxaccess, inspection
from fxrules.engine.aliasing import Aliasing
from fxrules.engine.matcher import Match, class_defined_names, computes_as, overridden_on_instance
from fxrules.engine.program import (READ_CAPTURE, READ_NAME, READ_REST, READ_ROOT_ARGUMENTS, RBuilder, RCall,
                                    RComputed, RLiteral, RNewModule, RRef, RReuse, RSeq, RShared, RSplat, RValue,
                                    shared_template)
from fxrules.engine.refusals import Refusal, RefusalCode

_INPLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                      operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift,
                      operator.irshift, operator.imatmul, operator.setitem, operator.delitem}
_EFFECTFUL_FUNCTIONS = aliasing.EFFECTFUL_FUNCTIONS

EVERYTHING = "everything"
"""What :meth:`Effects.written_storages` answers while global module hooks are registered: code that
runs around every module call may write any tensor the model holds."""


STORAGE_REFUSALS = frozenset({
    RefusalCode.USES_REPLACED_NODE, RefusalCode.REPLACES_WITH_LITERAL, RefusalCode.REPLACEMENT_WRITES_INPUT,
    RefusalCode.REPLACED_NODE_MUTATED, RefusalCode.READS_ACROSS_MUTATION, RefusalCode.ALIAS_MUTATED_LATER,
    RefusalCode.OUTPUT_ALIAS_INTRODUCED, RefusalCode.READS_WRITTEN_VALUE, RefusalCode.WOULD_CYCLE,
})
"""The refusals of :func:`plan` whose checks read the values a match bound (not its roots or matched nodes)
only through their storage: the views of them and of what they view, the in-place writers of those, the
graph's output among their users (:func:`replacement_writes_input`, :func:`replaced_by_value`,
:func:`reads_across_mutation`, :func:`output_alias_introduced`, :func:`reads_written_value`), and otherwise
only the match itself (:func:`uses_replaced_node`, a literal, :func:`placement`: the roots' users and fixed
positions). A user that comes or goes without viewing, writing or returning a bound value
(:meth:`Effects.hands_on_storage` false) changes none of these answers; one that does, gained, only adds to
what they look for (each refuses when it finds a view, a write or an output of the kind it names), so the
refusal stands; the checks before them (:func:`plan`'s order) may come to refuse, which leaves the match
refused. Only a loss of a user that may view, write or return a bound value can let such a match through
(:mod:`fxrules.engine.watch`). The other refusals read a bound
value's users as such: whether a value would be left unused (``changes-random-draws``), whether an
in-place write's argument is a temporary only it reads (``drops-side-effect``)."""


class Effects:
    """Which nodes write to their inputs or have other side effects, for one run over one graph.

    What a ``call_function`` target does (whether it writes its first argument, whether torch
    lists it as impure, whether fxrules knows it at all) does not depend on the node, so it is
    looked up once per target and remembered for the run. Modules are read per node (a rewrite
    may put a new module under an old name), what their class says about
    ``inplace``/``_is_impure`` and whether it computes as a torch.nn class once per class.

    A call the engine cannot prove pure (see :mod:`fxrules.engine.aliasing`: a function wrapped
    with ``torch.fx.wrap``, a method of a non-tensor object, a user module kept as a leaf, a
    module with hooks) has a side effect: its node is never removed, and it may write any of
    its inputs.
    """

    def __init__(self, module_of: Callable[[str], Any], attr_of: Optional[Callable[[str], Any]] = None):
        self.module_of = module_of
        self.attr_of = attr_of if attr_of is not None else self._attr_through_modules
        self._impure: dict = {}  # call_function target -> why calling it has an effect, or None
        self._writes: dict = {}  # call_function target -> _WRITES_* kind
        self._classes: dict = {}  # (module class, attribute) -> what the class says (see _module_attr)
        self._known_classes: dict = {}  # module class -> whether it computes as a torch.nn class
        self._methods: dict = {}  # call_method name -> aliasing.method_is_known
        self._plain_classes: dict = {}  # module class -> _watched_names
        self._facts: dict = {}  # id(module) -> (module, its ModuleFacts): see module_facts
        self._programs: dict = {}  # id(program) -> (program, (its calls that may write, that may draw))
        self.call_aliases: dict = {}  # id(RCall) -> (RCall, whether its result may alias), where static
        self._storages: Optional[tuple] = None  # (graph, storage keys its nodes write through their inputs)
        self._module_keys: dict = {}  # call_module node -> (its module, storage keys the call writes itself)
        # (graph, {call_module node: its entry}) for the nodes whose calls write something: built by one
        # walk, then kept by node_created/node_erased, so a check does not walk every module call
        self._writers: Optional[tuple] = None
        # (graph, {node: None}) for the nodes that write an input in place (mutated_inputs not empty):
        # one walk per run, then kept by node_created/node_erased. Empty on most graphs,
        # which lets the checks that look for a write (replaced_by_value, reads_across_mutation) stop early.
        self._writer_nodes: Optional[tuple] = None
        # the last of those writers in graph order (None: there is none), or _UNKNOWN until asked again
        # after the set changed: see writes_after
        self._last_writer: Any = _UNKNOWN
        # those writers in graph order, with their position keys (fxaccess.sort_key), or _UNKNOWN until asked
        # again after the set changed: see writers_between
        self._in_order: Any = _UNKNOWN
        # edits of the graph so far: the workpiece counts each node it makes, erases or rewires
        self.edits = 0
        # (edits when filled, {node: Aliasing.ancestors(node)}): see storage_ancestors
        self._ancestors: tuple = (0, {})
        # (graph, {node: None}) for the nodes that draw random numbers: found by the same walk, kept alike
        self._random: Optional[tuple] = None
        self._may_draw: dict = {}  # call_function target -> whether some call of it may draw random numbers
        self._function_scans: dict = {}  # call_function target -> what _scan asks of it (_function_scan)
        self._method_scans: dict = {}  # call_method name -> what _scan asks of it (_method_scan)
        self.aliasing = Aliasing(module_of, self.attr_of, self.module_is_known, self.module_writes_input,
                                 self.hands_on_storage)

    def close(self) -> None:
        """Drop the references that make this object and its aliasing a reference cycle (each holds
        the other's bound methods), so reference counting frees them and their caches when the run
        ends (see :meth:`fxrules.engine.transaction.Workpiece.close`); not used afterwards."""
        self.aliasing = None
        self.attr_of = self.module_of = None

    def _attr_through_modules(self, target: str) -> Any:
        """A get_attr target's value, found through ``module_of`` (its module, then the attribute)."""
        path, _, name = target.rpartition(".")
        module = self.module_of(path)
        if module is None:
            raise AttributeError(target)
        return getattr(module, name)

    def module_is_known(self, module: Any) -> bool:
        """Whether ``module`` computes as a torch.nn class (see :func:`aliasing.module_class_is_known`)."""
        return self.module_facts(module).known

    def module_writes_input(self, module: Any) -> bool:
        """Whether ``module``'s ``inplace`` is True (``getattr(module, "inplace", False) is True``), from its facts."""
        return self.module_facts(module).writes_input

    def module_facts(self, module: Any) -> "ModuleFacts":
        """What the planner asks of ``module`` (:class:`ModuleFacts`), found once per module object
        for the run: a rewrite never changes an existing module's attributes, hooks or training mode
        (new modules are new objects; the entry keeps its module alive, so its id stays its own)."""
        entry = self._facts.get(id(module))
        if entry is not None and entry[0] is module:
            return entry[1]
        cls = type(module)
        watch = self._plain_classes.get(cls, _UNKNOWN)
        if watch is _UNKNOWN:
            watch = self._plain_classes[cls] = self._watched_names(cls)
        # a module of a watched class (see _watched_names) whose instance sets none of the watched names,
        # registers neither flag as a member and has no hooks: its class answers, and for a norm or dropout
        # its own state (training mode, p, track_running_stats, inplace) does
        if watch is not None and fxaccess.plain_instance(module, watch.names, _FLAGS):
            writes_input = module.__dict__.get("inplace", False) is True
            if not watch.stateful:
                facts = _WRITES_INPUT_MODULE if writes_input else _PLAIN_MODULE
            else:
                facts = _stateful_facts(writes_input, aliasing.module_updates_statistics(module),
                                        aliasing.module_draws_random(module))
        else:
            facts = self.facts_in_full(module)
        self._facts[id(module)] = (module, facts)
        return facts

    def facts_in_full(self, module: Any) -> "ModuleFacts":
        """:meth:`module_facts` asked of the module itself, each fact on its own (what the class answers
        for a plain module is the same; a test holds them to agreeing)."""
        cls = type(module)
        known = self._known_classes.get(cls)
        if known is None:
            known = self._known_classes[cls] = aliasing.module_class_is_known(cls, computes_as)
        # a module object that overrides its class's code (``m.forward = ...``) runs code the engine has
        # not reviewed: unknown, hence aliasing and writing what it can reach
        return ModuleFacts(known and not overridden_on_instance(module), tuple(fxaccess.hooked_kinds(module)),
                           _module_attr(module, "inplace", False, self._classes) is True,
                           bool(_module_attr(module, fxaccess.IMPURE_MODULE_FLAG, False, self._classes)),
                           aliasing.module_updates_statistics(module), aliasing.module_draws_random(module))

    def _watched_names(self, cls: type) -> Optional["_Watch"]:
        """For a class whose modules are plain (known to compute as a torch.nn class, and giving neither
        ``inplace`` nor ``_is_impure`` a value of its own), the instance attribute names that would make
        one of its modules not plain (:class:`_Watch`). None for any other class: its modules are asked
        in full.

        A plain module (its instance sets no watched name, registers neither flag as a member, has no
        hooks) is known, hookless and not impure, as its class is. Whether it writes its input is its
        own ``inplace`` (``nn.ReLU(inplace=True)``, ``nn.Dropout(inplace=...)`` set it on the instance,
        so it is not watched). For a class outside :data:`aliasing.STATEFUL_CALL_MODULES` that is all
        (:data:`_PLAIN_MODULE`, :data:`_WRITES_INPUT_MODULE`); for a norm or dropout (stateful) its
        training mode, ``p`` and ``track_running_stats`` decide whether a call draws or updates
        statistics, read from the module."""
        known = self._known_classes.get(cls)
        if known is None:
            known = self._known_classes[cls] = aliasing.module_class_is_known(cls, computes_as)
        if not known:
            return None
        if _module_attr_of_class(cls, "inplace", self._classes) is not _ABSENT or \
                _module_attr_of_class(cls, fxaccess.IMPURE_MODULE_FLAG, self._classes) is not _ABSENT:
            return None
        return _Watch(class_defined_names(cls) | {fxaccess.IMPURE_MODULE_FLAG},
                      issubclass(cls, aliasing.STATEFUL_CALL_MODULES))

    def _module_effects(self, target: str) -> tuple:
        """(writes its input, marked impure) for the module ``target`` names now."""
        module = self.module_of(target)
        if module is None:
            return (False, False)
        facts = self.module_facts(module)
        return (facts.writes_input, facts.impure)

    def hands_on_storage(self, user: fx.Node) -> bool:
        """Whether ``user`` may reach the storage of a node it reads beyond reading it: the graph's output,
        a call whose result may share storage with an argument (:meth:`Aliasing.bases`), one that writes
        in place or has another side effect (every call the engine does not know). What
        :data:`STORAGE_REFUSALS` depend on among a bound value's users (:mod:`fxrules.engine.watch`)."""
        if user.op not in ("call_function", "call_method", "call_module"):
            return True
        return bool(self.aliasing.bases(user)) or self.side_effect(user) is not None

    def mutated_inputs(self, node: fx.Node) -> list:
        """The input nodes ``node`` writes to in place (empty for a pure node; every input for a
        call the engine does not know)."""
        if self.is_unknown_call(node):
            return list(node.all_input_nodes)
        return self.declared_writes(node)

    def declared_writes(self, node: fx.Node) -> list:
        """The input nodes ``node`` writes to by what its call says: an operator's schema, an
        in-place name (``add_``, ``operator.iadd``), ``inplace=True``, ``out=``, a module's
        ``inplace``. What a call the engine does not know writes besides is not included: this is
        what a rule that names the call (and so vouches for it) removes."""
        op = node.op
        if op == "call_function":
            target = node.target
            try:
                kind = self._writes.get(target)
            except TypeError:  # an unhashable target
                return []
            if kind is None:
                kind = self._writes[target] = _function_writes(target)
            return _mutated_by_function(node, _WRITES_BY_KEYWORDS if kind == _WRITES_ALL else kind)
        if op == "call_method":
            name = node.target
            if aliasing.writes_by_name(name) and node.args and isinstance(node.args[0], fx.Node):
                return [node.args[0]]
            return []
        if op == "call_module":
            if node.args and isinstance(node.args[0], fx.Node) and self._module_effects(node.target)[0]:
                return [node.args[0]]
        return []

    def side_effect(self, node: fx.Node) -> Optional[str]:
        """Why removing ``node`` would change behaviour beyond its output, or None when it is pure:
        an effect it declares (:meth:`declared_effect`), or calling something the engine cannot
        prove pure."""
        effect = self.declared_effect(node)
        if effect is None and self.is_unknown_call(node):
            op = node.op
            if op == "call_function":
                return f"%{node.name} calls {_function_name(node.target)}, which the engine cannot prove pure"
            if op == "call_method":
                return f"%{node.name} calls method `{node.target}`, which the engine cannot prove pure"
            module = self.module_of(node.target)
            return (f"%{node.name} calls `{node.target}` ({type(module).__name__}), a module the engine cannot "
                    f"prove pure")
        return effect

    def declared_effect(self, node: fx.Node) -> Optional[str]:
        """The side effect ``node``'s call is known to have, or None: a write its call declares
        (:meth:`declared_writes`), an effectful builtin, an op torch marks impure, a module marked
        impure, with hooks, or updating its running statistics. A matched node is asked this: the
        rule names its target, so the call's being unknown to the engine is the rule's business."""
        op = node.op
        if op in ("placeholder", "output"):
            return f"%{node.name} is a graph {op}"
        if op == "call_module":
            return self._module_side_effect(node)
        if self.declared_writes(node):
            return f"%{node.name} modifies its input in place"
        return self._call_effect(node)

    def effect_besides_writes(self, node: fx.Node) -> Optional[str]:
        """The effect ``node``'s call declares other than writing its inputs in place (see
        :meth:`declared_effect`), or None: what removing an in-place call on a temporary only the
        match sees would still drop (:func:`writes_only_match_temporaries`)."""
        op = node.op
        if op in ("placeholder", "output"):
            return self.declared_effect(node)
        if op == "call_module":
            return self._module_effect_besides_writes(node)
        return self._call_effect(node)

    def _call_effect(self, node: fx.Node) -> Optional[str]:
        """What a call_function or call_method declares besides writes: an effectful method or
        builtin, an op torch marks impure, a function the engine does not know."""
        op = node.op
        if op == "call_method" and isinstance(node.target, str) and node.target in aliasing.EFFECTFUL_METHODS:
            return f"%{node.name} calls method `{node.target}`, which has a side effect"
        if op == "call_function":
            target = node.target
            try:
                known = self._impure.get(target, _UNKNOWN)
            except TypeError:  # an unhashable target
                known = _UNKNOWN
            if known is _UNKNOWN:
                known = _function_effect(target, node)
                if not fxaccess.is_higher_order_operator(target):  # these depend on the arguments
                    try:
                        self._impure[target] = known
                    except TypeError:
                        pass
            return None if known is None else f"%{node.name} {known}"
        return None

    def _module_side_effect(self, node: fx.Node) -> Optional[str]:
        module = self.module_of(node.target)
        if module is None:
            return None
        facts = self.module_facts(module)
        if not (facts.hooks or facts.writes_input or facts.impure or facts.updates_statistics) \
                and not fxaccess.global_hook_kinds():
            return None  # the usual module: none of the effects below (asked once, from its facts)
        if facts.writes_input and node.args and not self.module_hooks(module):
            return f"%{node.name} modifies its input in place"
        return self._module_effect_besides_writes(node)  # hooks are named before a write

    def _module_effect_besides_writes(self, node: fx.Node) -> Optional[str]:
        module = self.module_of(node.target)
        if module is None:
            return None
        hooks = self.module_hooks(module)
        if hooks:
            return f"%{node.name} calls `{node.target}`, which has {', '.join(hooks)}"
        facts = self.module_facts(module)
        if facts.impure:
            return f"%{node.name} calls a module marked impure"
        if facts.updates_statistics:
            return f"%{node.name} updates the running statistics of `{node.target}` (training mode)"
        return None

    def plain_module_calls(self, nodes: Iterable) -> bool:
        """Whether every one of ``nodes`` calls a plain module (:data:`_PLAIN_MODULE`: known, no hooks, writes
        nothing, not impure, updates no statistics, draws nothing) while no global module hook is registered.
        Then :func:`module_has_hooks` and :func:`drops_side_effect` have nothing to refuse in them: no hook
        of any kind, and no effect (:meth:`declared_effect` of a plain module's call is None). The planner
        asks this first of a match made of module calls, the common form of module rules, and skips those
        two checks when it holds; any other node (a function or method call, a module with any fact) says
        False, and the two checks run in full."""
        facts_of, module_of = self._facts, self.module_of
        for node in nodes:
            if node.op != "call_module":
                return False
            module = module_of(node.target)
            if module is None:
                return False
            entry = facts_of.get(id(module))
            facts = entry[1] if entry is not None and entry[0] is module else self.module_facts(module)
            if facts is not _PLAIN_MODULE:
                return False
        return not fxaccess.global_hook_kinds()

    def module_hooks(self, module: Any) -> list:
        """:func:`module_hooks` with the module's own hooks as found once for the run (the global ones
        are read each time: registering one is the caller's business, not the rewrite's)."""
        found = list(self.module_facts(module).hooks) if module is not None else []
        found.extend(f"global {kind}" for kind in fxaccess.global_hook_kinds())
        return found

    def draws_random(self, node: fx.Node) -> bool:
        """Whether calling ``node`` draws random numbers (a train-mode dropout, ``rand_like``, ...)."""
        op = node.op
        if op == "call_function":
            target = node.target
            return self._function_may_draw(target) and aliasing.function_draws_random(target, node.args, node.kwargs)
        if op == "call_method":
            return aliasing.method_draws_random(node.target)
        if op == "call_module":
            module = self.module_of(node.target)
            return module is not None and self.module_facts(module).draws_random
        return False

    def random_nodes(self, graph: fx.Graph) -> dict:
        """The nodes of ``graph`` that draw random numbers (:meth:`draws_random`), as a dict used as an
        ordered set: found by the run's one walk (:meth:`_scan`), then kept as :meth:`writers` is.
        Nothing else makes a node draw: a rewire replaces a node argument by another node, and a
        node argument counts as "may draw" either way (a node argument the planner settles to a constant can
        only stop a node drawing: the set then holds more than draws, so a check relying on it refuses
        more, never less). Empty on most graphs (inference graphs, eval-mode dropout), which lets
        :func:`changes_random_draws` skip its questions about matched nodes and unused inputs."""
        entry = self._random
        if entry is None or entry[0] is not graph:
            self._scan(graph)
            entry = self._random
        return entry[1]

    def replacement_calls(self, program: Any) -> tuple:
        """Every RCall of ``program``'s replacements (``Program.calls``, listed when it was compiled)."""
        return program.calls

    def writing_calls(self, program: Any) -> tuple:
        """The RCalls of ``program``'s replacements that may write an argument in place: all but those
        whose template alone says they write nothing (:func:`_writes_nothing`); remembered per program."""
        return self._program_calls(program)[0]

    def drawing_calls(self, program: Any) -> tuple:
        """The RCalls of ``program``'s replacements that may draw random numbers: all but those whose
        template alone says they draw none (:func:`_draws_nothing`); remembered per program."""
        return self._program_calls(program)[1]

    def _program_calls(self, program: Any) -> tuple:
        """(the calls that may write, the calls that may draw) of ``program``, remembered for the run."""
        entry = self._programs.get(id(program))
        if entry is None or entry[0] is not program:
            calls = program.calls
            entry = self._programs[id(program)] = (program, (
                tuple(c for c in calls if not _writes_nothing(c, self)),
                tuple(c for c in calls if not _draws_nothing(c))))
        return entry[1]

    # -- tensors the graph writes ------------------------------------------------------
    def written_storages(self, graph: fx.Graph) -> Any:
        """The storage keys (:func:`aliasing.storage_key`) of the parameters, buffers and constants
        that some node of ``graph`` writes in place (through any alias, tied tensors included),
        that a train-mode norm updates, that a module the engine does not know (or one with
        hooks) holds, or :data:`EVERYTHING` while global module hooks are registered (code run
        around every module call). A function the engine does not know is taken to write the
        tensors it is passed, not model state it reaches through globals.

        The writes of nodes to their inputs are found once per run: the planner keeps them valid,
        as a rewrite never drops a write to anything but a temporary only the match sees
        (``drops-side-effect``, :func:`writes_only_match_temporaries`), never redirects one to other
        storage (``replaced-node-mutated``), and never adds one to an existing value
        (``replacement-writes-input``). What module calls write is looked up per call_module node
        (and remembered per node and module), so a module a rewrite makes is seen.
        """
        if fxaccess.global_hook_kinds():  # code run around every module call: it may write anything
            return EVERYTHING
        found = set(self._input_writes(graph))
        for keys in self._module_writes(graph):
            found.update(keys)
        return frozenset(found)

    def is_written(self, graph: fx.Graph, tensor: Any) -> bool:
        """Whether ``graph`` may write ``tensor``'s storage in place (see :meth:`written_storages`)."""
        if fxaccess.global_hook_kinds():
            return True
        written = self._input_writes(graph)
        modules = list(self._module_writes(graph))
        if not written and not modules:  # the usual graph: nothing written, no storage key needed
            return False
        key = aliasing.storage_key(tensor)
        return key in written or any(key in keys for keys in modules)

    def nothing_written(self, graph: fx.Graph) -> bool:
        """Whether :meth:`is_written` is False for every tensor (the usual graph: no global module hooks, no
        node writing a parameter or buffer through its inputs, no module call writing its own tensors):
        answered from the sets the run keeps, without a storage key."""
        if fxaccess.global_hook_kinds() or self._input_writes(graph):
            return False
        return not any(self._module_writes(graph))

    def _input_writes(self, graph: fx.Graph) -> frozenset:
        """Storage keys of get_attr tensors that nodes write through their inputs (once per run)."""
        if self._storages is not None and self._storages[0] is graph:
            return self._storages[1]
        keys: set = set()
        for node in list(self.writers(graph)):
            for written in self.mutated_inputs(node):
                for root in self.aliasing.roots(written):
                    if root.op == "get_attr":
                        keys.add(self.aliasing.storage_key_of(root))
                        keys.update(self.aliasing.storage_key_of(tied) for tied in self.aliasing.tied(root))
        keys.discard(None)
        found = frozenset(keys)
        self._storages = (graph, found)
        return found

    def _module_writes(self, graph: fx.Graph) -> Iterator[frozenset]:
        """For each call_module node of ``graph`` whose call writes something, the storage keys its
        module's call writes itself (a train-mode norm's statistics; every tensor of an unknown or
        hooked module). The first call walks the graph's module calls; the workpiece then reports
        each node it creates or erases (:meth:`node_created`, :meth:`node_erased`): one walk per run,
        not one per check (a walk per check made folding 1,249 conv+bn pairs take 10 s)."""
        if self._writers is None or self._writers[0] is not graph:
            self._scan(graph)
        writers = self._writers[1]
        for node in list(writers):
            entry = self._module_entry(node)  # the module at the target, as it is now
            if entry[1]:
                yield entry[1]
            else:
                del writers[node]

    def _module_entry(self, node: fx.Node) -> tuple:
        module = self.module_of(node.target)
        entry = self._module_keys.get(node)
        if entry is None or entry[0] is not module:
            entry = self._module_keys[node] = (module, self._module_call_writes(module))
        return entry

    def writers(self, graph: fx.Graph) -> dict:
        """The nodes of ``graph`` that write one of their inputs in place (:meth:`mutated_inputs` not
        empty; every call the engine does not know), as a dict used as an ordered set. The first call
        walks the graph; the workpiece then reports each node it creates or erases
        (:meth:`node_created`, :meth:`node_erased`). Nothing else makes a node a writer: its target
        never changes, a rewire replaces a node argument by another node, and a new module takes an
        existing module's name only when no node that outlives the rewrite calls that name
        (:meth:`fxrules.engine.transaction.Workpiece.take_name`)."""
        entry = self._writer_nodes
        if entry is None or entry[0] is not graph:
            self._scan(graph)
            entry = self._writer_nodes
        return entry[1]

    def writes_after(self, node: fx.Node) -> bool:
        """Whether some node after ``node`` in its graph writes an input in place. A write that a check
        looks for among the users of ``node``'s values, or after ``node``, can only be there: users come
        after what they read. Asked in place of walking those users where no writer follows (an
        exported module's ``_guards_fn`` call at the top of the graph is a writer to the engine, a
        module it does not know, and every check would otherwise walk). The last writer is remembered
        until the set of writers changes; no rewrite moves a node."""
        writers = self.writers(node.graph)
        if not writers:
            return False
        last = self._last_writer
        if last is _UNKNOWN:
            last = None
            for writer in writers:
                if last is None or last < writer:
                    last = writer
            self._last_writer = last
        return last is not None and node < last

    def writers_between(self, graph: fx.Graph, after: Optional[fx.Node], before: Optional[fx.Node]) -> list:
        """The nodes of :meth:`writers` strictly after ``after`` and strictly before ``before`` (None: no
        bound), in graph order: two bisections of the writers sorted once per change of the set (no rewrite
        moves a node)."""
        writers = self.writers(graph)
        if not writers:
            return []
        entry = self._in_order
        if entry is _UNKNOWN:
            key = fxaccess.sort_key
            nodes = sorted(writers, key=key)
            entry = self._in_order = (nodes, [key(n) for n in nodes])
        nodes, keys = entry
        low = 0 if after is None else bisect.bisect_right(keys, fxaccess.sort_key(after))
        high = len(nodes) if before is None else bisect.bisect_left(keys, fxaccess.sort_key(before))
        return nodes[low:high]

    def storage_ancestors(self, node: fx.Node) -> set:
        """:meth:`Aliasing.ancestors` of ``node``, remembered until the graph is next edited (:attr:`edits`
        changes: the workpiece adds one for each node it makes, erases or rewires)."""
        edits, known = self._ancestors
        if edits != self.edits:
            known = {}
            self._ancestors = (self.edits, known)
        found = known.get(node)
        if found is None:
            found = known[node] = self.aliasing.ancestors(node)
        return found

    def _scan(self, graph: fx.Graph) -> None:
        """The one walk of a run that finds both kinds of writer: the nodes that write an input in place
        (:meth:`writers`) and the module calls that write their module's own tensors
        (:meth:`_module_writes`), and the nodes that draw random numbers. Per node it asks what
        :meth:`mutated_inputs`, :meth:`draws_random` and :meth:`_module_entry` ask, answered per function
        target (:meth:`_function_scan`), method name (:meth:`_method_scan`) and module object
        (:meth:`module_facts`) from this run's caches: the common node (a call with no keywords to a
        function that writes only through ``inplace=``/``out=`` and never draws, a method that neither
        writes nor draws, a plain module) costs a dictionary lookup."""
        writer_nodes: dict = {}
        module_writers: dict = {}
        random: dict = {}
        functions, methods, facts_of = self._function_scans, self._method_scans, self._facts
        module_of = self.module_of
        for node in graph.nodes:
            op = node.op
            if op == "call_function":
                scan = _scan_of(functions, node.target, self._function_scan)
                if scan is _SCAN_NOTHING_WITHOUT_KEYWORDS and not node.kwargs or scan is _SCAN_NOTHING_AT_ALL:
                    continue  # writes only through inplace=/out= and has no keywords (or an op that writes
                    # nothing by its schema), and never draws
                if scan[1] and self.draws_random(node):
                    random[node] = None
                if (scan[0] != _WRITES_BY_KEYWORDS or node.kwargs) and self.mutated_inputs(node):
                    writer_nodes[node] = None
            elif op == "call_module":
                module = module_of(node.target)
                if module is None:
                    continue
                entry = facts_of.get(id(module))
                facts = entry[1] if entry is not None and entry[0] is module else self.module_facts(module)
                if facts is _PLAIN_MODULE:
                    continue  # known, no hooks, writes nothing, draws nothing
                if not facts.known:
                    if node.all_input_nodes:
                        writer_nodes[node] = None
                elif facts.writes_input and node.args and isinstance(node.args[0], fx.Node):
                    writer_nodes[node] = None
                if facts.hooks or not facts.known or facts.updates_statistics:
                    entry = self._module_entry(node)
                    if entry[1]:
                        module_writers[node] = entry
                if facts.draws_random:
                    random[node] = None
            elif op == "call_method":
                scan = _scan_of(methods, node.target, self._method_scan)
                if scan is _SCAN_NOTHING:
                    continue
                if scan[0] and self.mutated_inputs(node):
                    writer_nodes[node] = None
                if scan[1] and aliasing.method_draws_random(node.target):
                    random[node] = None
        self._writer_nodes = (graph, writer_nodes)
        self._last_writer = self._in_order = _UNKNOWN
        self._writers = (graph, module_writers)
        self._random = (graph, random)

    def _function_scan(self, target: Any) -> tuple:
        """(how ``target`` writes its inputs, whether some call of it may draw random numbers), remembered
        per target for the run; :data:`_SCAN_NOTHING_WITHOUT_KEYWORDS` for the common target, which writes
        only through ``inplace=``/``out=`` and never draws."""
        kind = self._writes.get(target)
        if kind is None:
            kind = self._writes[target] = _function_writes(target)
        scan = (kind, self._function_may_draw(target))
        if scan == _SCAN_NOTHING_WITHOUT_KEYWORDS:
            scan = _SCAN_NOTHING_WITHOUT_KEYWORDS
        elif scan == _SCAN_NOTHING_AT_ALL:
            scan = _SCAN_NOTHING_AT_ALL
        self._function_scans[target] = scan
        return scan

    def _method_scan(self, name: Any) -> tuple:
        """(whether a call of method ``name`` may write an input: an in-place name, or a method the engine
        does not know; whether it draws random numbers), remembered per name for the run;
        :data:`_SCAN_NOTHING` for a known method that does neither."""
        scan = (not aliasing.method_is_known(name) or aliasing.writes_by_name(name), aliasing.method_draws_random(name))
        if scan == _SCAN_NOTHING:
            scan = _SCAN_NOTHING
        self._method_scans[name] = scan
        return scan

    def _function_may_draw(self, target: Any) -> bool:
        """Whether some call of ``target`` may draw random numbers (:func:`aliasing.function_may_draw_random`),
        remembered per target for the run; an unhashable target is asked each time."""
        try:
            known = self._may_draw.get(target)
        except TypeError:
            return True
        if known is None:
            known = self._may_draw[target] = aliasing.function_may_draw_random(target)
        return known

    def _note_writer(self, node: fx.Node) -> None:
        """``node`` (made, or given a new module) joins or leaves the writers and the random draws, asked
        as :meth:`_scan` asks: a call to a function that writes only through ``inplace=``/``out=`` and has
        no keywords, or to one that never draws, is settled by a lookup per target."""
        call = node.op not in _NOT_CALLS
        function = call and node.op == "call_function"
        entry = self._writer_nodes
        if entry is not None and node.graph is entry[0]:
            writes = call
            if function and not node.kwargs:
                try:
                    kind = self._writes.get(node.target)
                    writes = kind != _WRITES_BY_KEYWORDS and kind != ()
                except TypeError:  # an unhashable target: asked the long way
                    pass
            if writes and self.mutated_inputs(node):
                entry[1][node] = None
                self._last_writer = self._in_order = _UNKNOWN
            elif entry[1].pop(node, _ABSENT) is not _ABSENT:
                self._last_writer = self._in_order = _UNKNOWN
        entry = self._random
        if entry is not None and node.graph is entry[0]:
            if call and self.draws_random(node):  # a function that never draws: one lookup per target
                entry[1][node] = None
            else:
                entry[1].pop(node, None)

    def node_created(self, node: fx.Node) -> None:
        """A node the rewrite made (or kept): a module call that writes joins the writers."""
        self._note_writer(node)
        if node.op == "call_module" and self._writers is not None and node.graph is self._writers[0]:
            entry = self._module_entry(node)
            if entry[1]:
                self._writers[1][node] = entry

    def node_erased(self, node: fx.Node) -> None:
        self._module_keys.pop(node, None)
        if self._writer_nodes is not None and self._writer_nodes[1].pop(node, _ABSENT) is not _ABSENT:
            self._last_writer = self._in_order = _UNKNOWN
        if self._random is not None:
            self._random[1].pop(node, None)
        if self._writers is not None:
            self._writers[1].pop(node, None)

    def _module_call_writes(self, module: Any) -> frozenset:
        if module is None:
            return _NOTHING
        facts = self.module_facts(module)
        if facts.hooks or not facts.known:
            return frozenset(aliasing.storage_key(t) for t in fxaccess.tensors(module))
        if facts.updates_statistics:
            return frozenset(aliasing.storage_key(t) for t in module.buffers())  # a fused norm's too
        return _NOTHING

    def is_unknown_call(self, node: fx.Node) -> bool:
        """Whether ``node`` calls something the engine does not know (see :mod:`fxrules.engine.aliasing`):
        an unknown function or method, or a module that is not a torch.nn class (or one computing as it)."""
        op = node.op
        if op == "call_function":
            target = node.target
            try:
                kind = self._writes.get(target)
            except TypeError:  # an unhashable target
                return True
            if kind is None:
                kind = self._writes[target] = _function_writes(target)
            return kind == _WRITES_ALL
        if op == "call_method":
            name = node.target
            try:
                known = self._methods.get(name)
            except TypeError:  # an unhashable target
                return not aliasing.method_is_known(name)
            if known is None:
                known = self._methods[name] = aliasing.method_is_known(name)
            return not known
        if op == "call_module":
            module = self.module_of(node.target)
            return module is not None and not self.module_facts(module).known
        return False


def module_hooks(module: Any) -> list:
    """The hooks that run when ``module`` is called: its own (``forward_hooks``, ...) and the global
    module hooks (``global forward_hooks``, ...); ``module`` None asks for the global ones only."""
    found = [] if module is None else fxaccess.hooked_kinds(module)
    found.extend(f"global {kind}" for kind in fxaccess.global_hook_kinds())
    return found


class ModuleFacts(NamedTuple):
    """What the planner asks of one module object, found once per run (:meth:`Effects.module_facts`).
    A named tuple rather than a dataclass: one is made per module of the graph, and a tuple is made
    in a sixth of the time."""

    known: bool  # computes as a torch.nn class (and its instance overrides none of the class's code)
    hooks: tuple  # the kinds of hook registered on the module itself (fxaccess.hooked_kinds)
    writes_input: bool  # `inplace` is True: a call writes its input
    impure: bool  # marked impure (`_is_impure`)
    updates_statistics: bool  # a train-mode norm that tracks running statistics
    draws_random: bool  # a train-mode dropout (aliasing.module_draws_random)


_UNKNOWN = object()
_NOTHING: frozenset = frozenset()
_FLAGS = ("inplace", fxaccess.IMPURE_MODULE_FLAG)
"""The two names by which a module says, as an attribute or a registered member, that it writes its
input or has an effect (see :meth:`Effects.module_facts`)."""

_PLAIN_MODULE = ModuleFacts(True, (), False, False, False, False)
"""The facts of a plain module (:meth:`Effects._watched_names`): known, no hooks, no flags, no state."""


class _Watch(NamedTuple):
    """How :meth:`Effects.module_facts` asks the modules of one class (:meth:`Effects._watched_names`)."""

    names: frozenset  # instance attributes that make a module of the class not plain
    stateful: bool  # a norm or dropout: its own state decides part of its facts


_WRITES_INPUT_MODULE = ModuleFacts(True, (), True, False, False, False)
"""The facts of a plain module whose ``inplace`` is True (``nn.ReLU(inplace=True)``): it writes its input."""

_STATEFUL_FACTS = {(w, u, d): ModuleFacts(True, (), w, False, u, d)
                   for w in (False, True) for u in (False, True) for d in (False, True)}
_STATEFUL_FACTS[(False, False, False)] = _PLAIN_MODULE  # an eval-mode norm or dropout: what _scan skips
_STATEFUL_FACTS[(True, False, False)] = _WRITES_INPUT_MODULE


def _stateful_facts(writes_input: bool, updates_statistics: bool, draws_random: bool) -> ModuleFacts:
    """The facts of a plain norm or dropout (known, no hooks, not impure), one shared object per answer."""
    return _STATEFUL_FACTS[(writes_input, updates_statistics, draws_random)]

_SCAN_NOTHING = (False, False)
"""What :meth:`Effects._method_scan` says of a method that writes nothing and draws nothing (this object)."""

_SCAN_UNHASHABLE = (True, True)


def _scan_of(cache: dict, target: Any, scan: Callable[[Any], tuple]) -> tuple:
    """What :meth:`Effects._scan` knows of a call target: ``cache[target]``, else ``scan(target)`` (which
    remembers it); an unhashable target is :data:`_SCAN_UNHASHABLE` (asked the long way, each time)."""
    try:
        found = cache.get(target)
    except TypeError:
        return _SCAN_UNHASHABLE
    return found if found is not None else scan(target)
"""What :meth:`Effects._scan` assumes of an unhashable target: the long way (:meth:`Effects.mutated_inputs`,
:meth:`Effects.draws_random`) decides."""


def _module_attr_of_class(cls: type, name: str, classes: dict) -> Any:
    """What :func:`_module_attr` knows of ``name`` from ``cls`` alone (remembered in ``classes``): its plain
    value, ``_ABSENT``, or ``_NOT_PLAIN``."""
    key = (cls, name)
    known = classes.get(key, _UNKNOWN)
    if known is _UNKNOWN:
        known = classes[key] = _class_attr(cls, name)
    return known
_NOT_CALLS = frozenset({"placeholder", "output", "get_attr"})


def _module_attr(module: Any, name: str, default: Any, classes: Optional[dict] = None) -> Any:
    """``getattr(module, name, default)`` for an ``nn.Module``, without the cost of a miss.

    Most modules have neither ``inplace`` nor ``_is_impure``, and a miss goes through
    ``nn.Module.__getattr__``, which formats an AttributeError message that ``getattr``
    then discards (microseconds per module). This looks where that lookup would: the
    instance, the class, then parameters, buffers and submodules; a class with its own
    ``__getattr__``/``__getattribute__`` or a descriptor under that name gets plain ``getattr``.
    What the class says is remembered in ``classes`` (``(class, name) -> answer``) when given.
    """
    cls = type(module)
    key = (cls, name)
    known = classes.get(key, _UNKNOWN) if classes is not None else _UNKNOWN
    if known is _UNKNOWN:
        known = _class_attr(cls, name)
        if classes is not None:
            classes[key] = known
    if known is _NOT_PLAIN:
        return getattr(module, name, default)
    own = module.__dict__
    value = own.get(name, _UNKNOWN)
    if value is not _UNKNOWN:
        return value
    if known is not _ABSENT:
        return known
    return fxaccess.registered_member(module, name, default)


_NOT_PLAIN, _ABSENT = object(), object()


def _class_attr(cls: type, name: str) -> Any:
    """The plain value ``cls`` gives ``name`` (``_ABSENT`` if none), or ``_NOT_PLAIN`` when only
    ``getattr`` can say (not an nn.Module, its own attribute hooks, a descriptor)."""
    if not issubclass(cls, torch.nn.Module) or cls.__getattr__ is not torch.nn.Module.__getattr__ \
            or cls.__getattribute__ is not object.__getattribute__:
        return _NOT_PLAIN
    found = getattr(cls, name, _ABSENT)
    if found is not _ABSENT and hasattr(type(found), "__get__"):  # a property, method or other descriptor
        return _NOT_PLAIN
    return found


_WRITES_FIRST, _WRITES_BY_KEYWORDS, _WRITES_ALL = "first", "keywords", "all"
"""How a call_function target writes its inputs: always its first argument (``operator.iadd``,
``torch.relu_``), only when called with ``inplace=True`` or ``out=``, or any of them (a function the
engine does not know). An OpOverload's kind is instead the tuple of the arguments its schema marks
written (:func:`aliasing.schema_write_positions`; empty: it writes none, whatever its keywords)."""

_SCAN_NOTHING_WITHOUT_KEYWORDS = (_WRITES_BY_KEYWORDS, False)
"""What :meth:`Effects._function_scan` says of the common target (this object): it writes only through
``inplace=``/``out=`` and never draws random numbers."""

_SCAN_NOTHING_AT_ALL = ((), False)
"""What :meth:`Effects._function_scan` says of an operator whose schema marks no argument written and
that never draws random numbers (this object): none of its calls writes or draws, keywords or not."""


def _function_writes(target: Any) -> Any:
    if fxaccess.is_op_overload(target):
        return aliasing.schema_write_positions(target)
    try:
        if target in _INPLACE_OPERATORS:
            return _WRITES_FIRST
        effectful = target in _EFFECTFUL_FUNCTIONS
    except TypeError:  # an unhashable target
        return _WRITES_ALL
    name = getattr(target, "__name__", "")
    if isinstance(name, str) and name.endswith("_") and not name.endswith("__"):
        return _WRITES_FIRST
    if not effectful and not aliasing.function_is_known(target):
        return _WRITES_ALL
    return _WRITES_BY_KEYWORDS


def _mutated_by_function(node: fx.Node, kind: Any) -> list:
    if kind.__class__ is tuple:  # an OpOverload: the arguments its schema marks written (Tensor(a!), Tensor(a!)[])
        return list(aliasing.nodes_at(node, kind)) if kind else []
    if kind == _WRITES_FIRST:
        return [node.args[0]] if node.args and isinstance(node.args[0], fx.Node) else []
    if kind == _WRITES_ALL:
        return list(node.all_input_nodes)
    kwargs = node.kwargs
    if kwargs:
        if kwargs.get("inplace") is True and node.args and isinstance(node.args[0], fx.Node):
            return [node.args[0]]
        out = kwargs.get("out")
        if isinstance(out, fx.Node):
            return [out]
        if isinstance(out, (list, tuple)):
            return [v for v in out if isinstance(v, fx.Node)]
    return []


def _function_effect(target: Any, node: fx.Node) -> Optional[str]:
    """Why calling ``target`` has a side effect (as the end of a sentence), or None."""
    if target in _EFFECTFUL_FUNCTIONS:
        return f"calls {getattr(target, '__name__', target)}, which has a side effect"
    try:
        if fxaccess.function_is_impure_besides_writes(target, node.args, node.kwargs):
            return "has a side effect"  # the writes its schema declares are declared_writes' (asked first)
    except Exception:
        pass
    if not aliasing.function_is_known(target):
        return f"calls {_function_name(target)}, which the engine cannot prove pure"
    return None


def _function_name(target: Any) -> str:
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    return f"{module}.{name}" if isinstance(module, str) and module not in ("builtins", "__main__") else str(name)


@dataclass(frozen=True)
class Plan:
    """Where to insert a match's replacement, and what to do with the users that only inspect its
    interior nodes (:mod:`fxrules.engine.inspection`)."""

    anchor: fx.Node  # new nodes go just before this node
    inspections: inspection.Settlement = inspection.NOTHING


def plan(match: Match, effects: Effects) -> "Plan | Refusal":
    """A Plan, or the :class:`Refusal` saying why the match must not be rewritten.

    The checks run in this order, and the first refusal wins (so a match with several
    problems always reports the same one): :func:`inspecting_users` (which
    settles the users that only inspect an interior node, or refuses as :func:`interior_used_outside`),
    :func:`module_has_hooks`, :func:`drops_side_effect`, :func:`changes_random_draws`,
    :func:`uses_replaced_node`, :func:`replacement_writes_input`, :func:`replaced_by_value`,
    :func:`reads_across_mutation`, :func:`output_alias_introduced`,
    :func:`reads_written_value`, then :func:`placement` (which refuses a cycle or places the
    replacement). Each check is pure and returns a Refusal or None; a refusal is only built
    when refusing.
    """
    settled = inspecting_users(match)
    refusal = settled if isinstance(settled, Refusal) else None
    if refusal is None and not effects.plain_module_calls(match.bindings.nodes):
        refusal = module_has_hooks(match, effects)
        if refusal is None:
            refusal = drops_side_effect(match, effects)
    if refusal is not None:
        return refusal
    inputs = _replacement_inputs(match)
    calls = match.program.calls  # (the two checks of replacement calls answer None without any)
    refusal = changes_random_draws(match, effects, inputs)
    if refusal is None:
        refusal = uses_replaced_node(match, inputs)
    if refusal is None and calls:
        refusal = replacement_writes_input(match, effects)
    if refusal is None:
        refusal = replaced_by_value(match, effects)
    if refusal is None:
        refusal = reads_across_mutation(match, effects, inputs)
    if refusal is None:
        refusal = output_alias_introduced(match, effects)
    if refusal is None and calls:
        refusal = reads_written_value(match, effects)
    if refusal is not None:
        return refusal
    placed = placement(match, inputs)
    if isinstance(placed, Plan) and settled is not inspection.NOTHING:
        return Plan(placed.anchor, settled)
    return placed


def interior_used_outside(match: Match) -> Optional[Refusal]:
    """An interior node (matched, not a root) used outside the match: removing it would break
    that user, keeping it would compute it twice. Users that only inspect it are settled instead
    (:func:`inspecting_users`)."""
    settled = inspecting_users(match)
    return settled if isinstance(settled, Refusal) else None


def inspecting_users(match: Match) -> "inspection.Settlement | Refusal":
    """The users outside the match of its interior nodes, each settled (an implied metadata assertion
    dropped, a metadata read re-pointed to a root with the same metadata: :mod:`fxrules.engine.inspection`),
    or the refusal ``interior-used-outside`` naming the first that cannot be."""
    matched = match.bindings.nodes
    roots = match.roots
    if len(matched) == 1 and len(roots) == 1 and roots[0] in matched:  # the root alone: no interior node
        return inspection.NOTHING
    settlements, after = [], None
    for node in matched:
        if node in roots:
            continue
        for user in node.users:
            if user not in matched:
                if after is None:
                    after = max(list(matched) + _replacement_inputs(match))
                settled = inspection.settle(node, user, roots, after)
                if settled is None:
                    return Refusal(RefusalCode.INTERIOR_USED_OUTSIDE,
                                   f"interior node %{node.name} is also used by %{user.name}, outside the match; "
                                   f"rewriting would duplicate or break it", (node.name, user.name))
                settlements.append(settled)
    return inspection.merge(settlements)


def module_has_hooks(match: Match, effects: Effects) -> Optional[Refusal]:
    """A matched module with hooks (its own, or global module hooks): the rewrite removes its call,
    and the hooks (user code: logging, caching activations, changing the output) with it. Refused
    whatever the rule's contract; global hooks also refuse a replacement that calls a module
    (the hooks would run a different number of times)."""
    global_hooks = fxaccess.global_hook_kinds()
    for node in match.bindings.nodes:
        if node.op == "call_module":
            module = effects.module_of(node.target)
            if module is None or (not global_hooks and not effects.module_facts(module).hooks):
                continue  # the usual module: its own hooks found once per run, and no global ones
            hooks = effects.module_hooks(module)
            if hooks:
                return Refusal(RefusalCode.MODULE_HAS_HOOKS,
                               f"module `{node.target}` (%{node.name}) has {', '.join(hooks)}; removing or replacing "
                               f"its call would drop them", (node.name,))
    hooks = module_hooks(None) if global_hooks else []
    if hooks and any(call.op == "call_module" for call in effects.replacement_calls(match.program)):
        root = match.roots[0]
        return Refusal(RefusalCode.MODULE_HAS_HOOKS,
                       f"the replacement of %{root.name} calls a module, and {', '.join(hooks)} are registered: they "
                       f"would run for it", (root.name,))
    return None


def drops_side_effect(match: Match, effects: Effects) -> Optional[Refusal]:
    """A matched node with a side effect: the rewrite removes matched nodes, and the effect with them.
    What counts is the effect the call declares (:meth:`Effects.declared_effect`): the rule names
    each matched node's target (a subclass only when it computes as the named class), so a call
    the engine does not know by itself is the rule author's to vouch for. An in-place call whose
    only effect is writing temporaries no one else sees is not refused
    (:func:`writes_only_match_temporaries`)."""
    for node in match.bindings.nodes:
        effect = effects.declared_effect(node)
        if effect is not None and not writes_only_match_temporaries(node, effects):
            return Refusal(RefusalCode.DROPS_SIDE_EFFECT,
                           f"removing the match would drop a side effect: {effect}", (node.name,))
    return None


def writes_only_match_temporaries(writer: fx.Node, effects: Effects) -> bool:
    """Whether the only effect of the matched call ``writer`` is writing, in place, values that are
    private temporaries of it (:func:`is_private_temporary`): MobileNetV3's hardswish,
    ``x * F.relu6(x + 3, inplace=True) / 6``, writes the sum ``x + 3`` that nothing else reads.

    Removing such a write is unobservable: the written storage is fresh (no input, parameter,
    buffer or other value shares it), and the writer is its only reader, so the new values are
    seen only through the writer's own result, which the match covers like any value (an
    interior node has no users outside the match; a root is replaced, and the later in-place
    writes of a root that shares storage are refused by :func:`replaced_by_value`). A call the
    engine does not know is never one: it may write more than it declares."""
    if effects.is_unknown_call(writer) or effects.effect_besides_writes(writer) is not None:
        return False
    written = effects.declared_writes(writer)
    return bool(written) and all(is_private_temporary(value, writer, effects) for value in written)


def is_private_temporary(value: fx.Node, writer: fx.Node, effects: Effects) -> bool:
    """Whether ``value`` is a temporary only ``writer`` sees: a call the engine knows, whose result
    shares storage with none of its inputs (not a view, not an in-place result, not a call that may
    return its input; so not a placeholder's, parameter's or buffer's storage), read by ``writer``
    and nothing else (so no view of it and no other reader, before or after the write, exists)."""
    return (value.op in _CALL_OPS and not effects.is_unknown_call(value) and not effects.aliasing.bases(value)
            and len(value.users) == 1 and writer in value.users)


_CALL_OPS = frozenset({"call_function", "call_method", "call_module"})


RANDOM_CONTRACTS = frozenset({"exact", "approx"})
"""The contracts under which drawing random numbers is an effect: a rule that keeps values may not
change the stream of random numbers (every later draw, in this graph or after it: the next call,
the next training step)."""


def changes_random_draws(match: Match, effects: Effects, inputs: list) -> Optional[Refusal]:
    """Under ``[exact]``/``[approx]``: a matched node that draws random numbers and that the rewrite
    removes, an input that draws them and that the rewrite would leave unused (and so remove), or a
    replacement call that draws them and is not a matched node kept as it is. Always refused,
    whatever comes after it in the graph: the random state after the forward pass is observable too.

    A matched node the rewrite keeps (:func:`kept_nodes`: the replacement reads it, by its ``as`` name or
    through a call it computes again, ``relu(relu($x)) -> relu($x)``-style) stays where it is, the same
    node with the same arguments: it draws what it drew, at the same point of the stream, and the other
    draws of the graph keep their order around it. A rewrite that keeps every drawing node it matched
    and adds none leaves every draw as it was (inductor's ``randperm`` index patterns: the permutation
    is matched, to know the index is in bounds, and kept). One that reads a root is refused: the root is
    replaced, so what it draws from (``bernoulli(p)``'s ``p``) could change."""
    contract = match.rule.contract
    if contract not in RANDOM_CONTRACTS:
        return None
    kept = None
    # the graph's drawing nodes (kept up to date through the run): a matched node draws when it is one of
    # them; most graphs have none, and then neither question below is asked node by node
    random = effects.random_nodes(match.roots[0].graph)
    drawing = effects.drawing_calls(match.program)
    if not random and not drawing:  # nothing draws, and the replacement calls nothing that may
        return None
    for node in match.bindings.nodes if random else ():
        if node in random:
            if kept is None:
                kept = kept_nodes(match)
            if node not in kept.nodes:
                return Refusal(RefusalCode.CHANGES_RANDOM_DRAWS,
                               f"%{node.name} draws random numbers; under [{contract}] a rewrite may not remove it "
                               f"(every later random draw would change)", (node.name,))
            read_root = next((n for n in node.all_input_nodes if n in match.roots), None)
            if read_root is not None:
                return Refusal(RefusalCode.CHANGES_RANDOM_DRAWS,
                               f"%{node.name} draws random numbers from %{read_root.name}, which the rewrite replaces; "
                               f"under [{contract}] what it draws could change", (node.name, read_root.name))
    # the inputs the rewrite leaves unused are found only when some node of the graph draws (most graphs: none);
    # the matched nodes it keeps (read by name, computed again) keep their inputs used
    unused = ()
    if random:
        if kept is None:
            kept = kept_nodes(match)
        unused = _left_unused(match, effects, inputs, kept.nodes)
    for node in unused:
        if effects.draws_random(node):
            return Refusal(RefusalCode.CHANGES_RANDOM_DRAWS,
                           f"%{node.name} draws random numbers and the rewrite would leave it unused; under "
                           f"[{contract}] it may not be removed (every later random draw would change)", (node.name,))
    claimed: set = set()
    for call in drawing:
        if _template_draws_random(call, match, effects):
            if kept is None:
                kept = kept_nodes(match)
            node = kept.calls.get(id(call))
            if node is not None and node not in claimed:
                claimed.add(node)
                continue  # a matched node kept as it is: no new draw
            # a new node, or a second call the rule writes of a node kept once: the rule says it draws again
            root = match.roots[call.root_index]
            return Refusal(RefusalCode.CHANGES_RANDOM_DRAWS,
                           f"the replacement of %{root.name} calls {call.label}, which draws random numbers; under "
                           f"[{contract}] a rewrite may not add a random draw", (root.name,))
    return None


class Kept(NamedTuple):
    """What of a match its rewrite keeps: ``nodes``, the matched nodes (never a root) still in the graph
    afterwards; ``calls``, the ``id`` of each replacement call that is one of them computed again, with
    that node (two calls may be one node: ``d($x) + d($x)`` keeps ``d`` once)."""

    nodes: frozenset
    calls: dict


_NOTHING_KEPT = Kept(frozenset(), types.MappingProxyType({}))  # shared: read-only


def _captures_matched(match: Match) -> bool:
    """Whether a capture of ``match`` binds a matched node (``$x`` in ``add(relu($y) as r, $x)`` may be ``r``),
    alone or inside a list, tuple or dict (``*$xs``)."""
    matched = match.bindings.nodes
    for value in match.bindings.captures.values():
        if isinstance(value, fx.Node):
            if value in matched:
                return True
        elif not isinstance(value, (int, float, bool, str, type(None))):  # a list or other container
            found: dict = {}
            _collect_nodes(value, found)
            if any(node in matched for node in found):
                return True
    return False


class ReplacementValues:
    """What a replacement's items stand for in a match, resolved one way for the three readers of a
    program's replacements: :func:`kept_nodes` (the planner's prediction, before the graph is edited),
    the transaction's writer (the edit) and the guards' dry run (the values on fake tensors). Captures
    and ``as`` names are what the match bound; literals are themselves; sequences are built with
    ``*$xs`` spliced in; a shared node (``CALL as name``) is resolved once and its later uses (``RRef``)
    are that value; a call's arguments are the rule's, or the root's own when the rule forwards them
    (``...``). What a call and a computed value (``{...}``) are is the reader's (:meth:`call`,
    :meth:`computed_value`), and so is how a value of the graph is read (:meth:`graph_value`: the node
    itself, or its fake value)."""

    def __init__(self, match: Match):
        self.match = match
        self.env = match.bindings
        self.shared: dict = {}  # name -> the value of the replacement's `CALL as name`

    def value(self, item: Any) -> Any:
        kind = type(item)  # the R* classes are final (frozen, slotted)
        if kind is RValue:
            return self.graph_value((self.env.captures if item.is_capture else self.env.names)[item.name])
        if kind is RCall:
            return self.call(item)
        if kind is RLiteral:
            return item.value
        if kind is RSeq:
            return item.kind(self.values(item.items))
        if kind is RComputed:
            return self.computed_value(item)
        if kind is RShared:  # built once; its later uses (RRef) are this value
            result = self.shared[item.name] = self.value(item.inner)
            return result
        if kind is RRef:
            return self.shared[item.name]
        raise AssertionError(item)  # pragma: no cover

    def values(self, items: tuple) -> list:
        """The values of argument or list items, with ``*$xs`` (RSplat) spliced in."""
        out: list = []
        for i in items:
            if type(i) is RSplat:
                out.extend(self.graph_value(tuple(self.env.captures[i.name])))
            else:
                out.append(self.value(i))
        return out

    def arguments(self, item: RCall, root: fx.Node) -> tuple:
        """A replacement call's ``(args, kwargs)``: the rule's (with the match's rest arguments appended
        where the rule asks for them), or the root's own when the rule gives none."""
        if item.args is None:
            return self.graph_value(tuple(root.args)), self.graph_value(dict(root.kwargs))
        value = self.value
        args = tuple(self.values(item.args))
        kwargs = {name: value(v) for name, v in item.kwargs} if item.kwargs else {}
        if item.rest and self.env.rest is not None:
            args = args + tuple(self.graph_value(tuple(self.env.rest[0])))
            kwargs.update(self.graph_value(dict(self.env.rest[1])))
        return args, kwargs

    def graph_value(self, value: Any) -> Any:
        """A value of the graph (a node, or a container of nodes and constants) as this reader reads it:
        itself, here."""
        return value

    def call(self, item: RCall) -> Any:
        raise NotImplementedError

    def computed_value(self, item: RComputed) -> Any:
        raise NotImplementedError


class _KeptPredictor(ReplacementValues):
    """:func:`kept_nodes`' reader: a call is the matched node it computes again, or a new node (a fresh
    ``object()``); a computed value is unknown here (a fresh ``object()``); every graph value a call reads,
    and every value the replacement returns, is noted in ``found``."""

    def __init__(self, match: Match):
        super().__init__(match)
        self.found: dict = {}
        self.calls: dict = {}  # id(RCall) -> the matched node it computes again

    def call(self, item: RCall) -> Any:
        if item.respells is not None:  # the compiler found it computes a matched node again (program.respelled)
            node = self.env.names[item.respells]
            self.calls[id(item)] = node
            self.found[node] = None
            return node
        root = self.match.roots[item.root_index]
        args, kwargs = self.arguments(item, root)
        _collect_nodes(args, self.found)  # what the call reads stays (forwarded root arguments included)
        _collect_nodes(kwargs, self.found)
        if item.op == "call_module":
            if type(item.target) is not RReuse:
                return object()  # a module the rule makes: always a new node
            target = self.env.names[item.target.name].target
        else:
            target = item.target
        node = matched_equal(self.match, item.op, target, args, kwargs)
        if node is None:
            return object()  # a new node
        self.calls[id(item)] = node
        self.found[node] = None
        return node

    def computed_value(self, item: RComputed) -> Any:
        return object()  # its value is computed when the rule is applied: unknown here


def kept_nodes(match: Match) -> Kept:
    """The matched nodes (not roots) a rewrite of ``match`` keeps, decided before the graph is edited:

    - the nodes the replacement reads by their ``as`` names (or as captures: a matched node a
      further root's capture binds);
    - the nodes a replacement call computes again (:func:`matched_equal`: the same op, target and
      arguments), which the transaction keeps rather than build anew; the replacement's arguments are
      resolved here as the transaction resolves them (captures, names, literals, sequences, shared
      nodes, nested calls: one kept or a new node), except computed values (``{...}``), which are
      taken for unknown (a call with one is never predicted kept; the transaction may keep it: then
      less is predicted kept than is, and a check relying on this refuses more, never less);
    - the matched nodes those read, transitively (a kept node's inputs keep a user).

    Every other matched node is left without users and erased.

    A replacement that only calls modules the rule makes and reads only captures
    (``Program.new_calls_only``) keeps nothing when no capture binds a matched node: answered
    without reading it."""
    if match.program.new_calls_only and not _captures_matched(match):
        return _NOTHING_KEPT
    predictor = _KeptPredictor(match)
    for replacement in match.program.replacements:
        _collect_nodes(predictor.value(replacement), predictor.found)  # what the replacement returns stays
    matched = match.bindings.nodes
    roots = match.roots
    kept: set = set()
    stack = [n for n in predictor.found if n in matched and n not in roots]
    while stack:
        node = stack.pop()
        if node in kept:
            continue
        kept.add(node)
        stack.extend(n for n in node.all_input_nodes if n in matched and n not in roots)
    return Kept(frozenset(kept), predictor.calls)


def matched_equal(match: Match, op: str, target: Any, args: tuple, kwargs: dict) -> Optional[fx.Node]:
    """A matched node, not a root, that computes exactly this call (same op, target and arguments:
    :func:`identical_arguments`), the first in match order; None when none does. The replacement keeps
    such a node rather than build a copy of it (the transaction, and :func:`kept_nodes` before it)."""
    roots = match.roots
    for node in match.bindings.nodes:
        if node.op != op or node in roots:
            continue
        if not (node.target is target or (type(target) is str and node.target == target)):
            continue
        if identical_arguments(node.args, args) and identical_arguments(node.kwargs, kwargs):
            return node
    return None


_SAME_KIND = {immutable_list: list, immutable_dict: dict}
"""Argument containers a new node stores as another type (a list as torch's immutable_list, a dict
as immutable_dict): equal kinds for :func:`identical_arguments`."""


def identical_arguments(a: Any, b: Any) -> bool:
    """Whether two node arguments are the same: the same nodes, and constants of the same type
    that are equal (floats: written the same, so ``-0.0`` is not ``0.0``) in containers of the
    same kind."""
    if a is b:  # the same object (a node, mostly) is the same argument
        return True
    if isinstance(a, fx.Node) or isinstance(b, fx.Node):
        return False
    kind = _SAME_KIND.get(type(a), type(a))
    if kind is not _SAME_KIND.get(type(b), type(b)):
        return False
    if kind is tuple or kind is list:
        return len(a) == len(b) and all(x is y or identical_arguments(x, y) for x, y in zip(a, b))
    if kind is dict:
        return list(a) == list(b) and all(a[k] is b[k] or identical_arguments(a[k], b[k]) for k in a)
    if kind is float or kind is complex:
        return repr(a) == repr(b)
    try:
        return bool(a == b)
    except Exception:
        return False


def uses_replaced_node(match: Match, inputs: list) -> Optional[Refusal]:
    """The replacement reads a root: the root is replaced by a value computed from itself."""
    roots = match.roots
    for node in inputs:
        if node in roots:
            return Refusal(RefusalCode.USES_REPLACED_NODE,
                           f"the replacement uses %{node.name}, the node it replaces", (node.name,))
    return None


def replacement_writes_input(match: Match, effects: Effects) -> Optional[Refusal]:
    """A replacement call that writes one of its arguments in place (``add_``, ``inplace=True``,
    ``out=``) where that argument is not a fresh value made by the replacement itself: the
    write would change a value the rest of the graph reads."""
    for call in effects.writing_calls(match.program):
        written = _template_written(call, match, effects)
        if written is None or (isinstance(written, RCall) and not _template_may_alias(written, match, effects)):
            continue
        root = match.roots[call.root_index]
        return Refusal(RefusalCode.REPLACEMENT_WRITES_INPUT,
                       f"the replacement of %{root.name} calls {call.label}, which writes in place a value that exists "
                       f"outside the replacement", (root.name,))
    return None


def replaced_by_value(match: Match, effects: Effects) -> Optional[Refusal]:
    """A root whose value (or a view of it) is modified in place later, where the replacement would
    change what that write modifies: the root is replaced by an existing value (``-> $x``: the
    write would modify ``$x``), or the root or its replacement may share storage with another
    value (a view: the write would reach that value, or no longer reach it). A root that is a
    fresh tensor, replaced by a fresh tensor, may be written later. A replacement that is a
    literal is refused too (``replaces-with-literal``). Checked root by root, literal first."""
    env = match.bindings
    roots = match.roots
    matched = env.nodes
    analysis = effects.aliasing
    # no node after the first root writes in place (inference graphs; an exported module, whose one
    # "writer" is its input guard at the top): nothing can be written later, and only the literal check is
    # left (asked first: the aliasing questions cost more than this). A write found below is by a user of
    # a view of a root, so it comes after that root.
    writes = effects.writes_after(min(roots))
    for index, replacement in enumerate(match.program.replacements):
        root = roots[index]
        value = None
        if isinstance(replacement, RValue):
            value = (env.captures if replacement.is_capture else env.names).get(replacement.name)
            if not isinstance(value, fx.Node):
                return Refusal(RefusalCode.REPLACES_WITH_LITERAL,
                               f"the replacement would replace %{root.name} by the literal {value!r}", (root.name,))
        if not writes or (value is None and not analysis.bases(root)
                          and not _template_may_alias(replacement, match, effects)):
            continue
        hit = first_write_below(effects, (root,), matched)
        if hit is None:
            continue
        written, writer = hit
        through = "" if written is root else f" through %{written.name}"
        if value is not None:
            return Refusal(RefusalCode.REPLACED_NODE_MUTATED,
                           f"%{root.name} is modified in place{through} by %{writer.name}; replacing it by "
                           f"%{value.name} would modify %{value.name} too", (root.name, writer.name, value.name))
        return Refusal(RefusalCode.REPLACED_NODE_MUTATED,
                       f"%{root.name} is modified in place{through} by %{writer.name}; %{root.name} or its "
                       f"replacement may share storage with another value, which the write would reach (or no "
                       f"longer reach)", (root.name, writer.name, root.name))
    return None


def reads_across_mutation(match: Match, effects: Effects, inputs: list) -> Optional[Refusal]:
    """An in-place mutation of a value the replacement reads (or of anything sharing its storage:
    a view, the tensor it views, a tied parameter), between the first matched node and the last
    place the replacement reads it.

    When the replacement may share storage with a value (``-> $x``, a view of ``$x``), or a
    root did (a view), the root's users may hand that storage on (eval-mode dropout returns
    its input, views alias it) to anything after them, the graph's output included: any later
    in-place mutation of it could then show, so there is no last place.
    """
    matched = match.bindings.nodes
    roots = match.roots
    if not inputs:  # nothing to read
        return None
    if not effects.writers(roots[0].graph):  # no node writes in place (most graphs): none to read across
        return None
    first = min(matched) if matched else min(roots)
    if not effects.writes_after(first):  # no node writes in place where a write could count (after=first)
        return None
    analysis = effects.aliasing
    aliases_root = any(isinstance(r, RValue) or _template_may_alias(r, match, effects) or analysis.bases(root)
                       for r, root in zip(match.program.replacements, roots))
    last = None if aliases_root else max(roots)
    for value in inputs:
        hit = first_write_below(effects, analysis.storage_tops(value), matched, after=first, before=last)
        if hit is None:
            continue
        written, writer = hit
        through = "" if written is value else f" (through %{written.name})"
        if last is None:
            return Refusal(RefusalCode.ALIAS_MUTATED_LATER,
                           f"%{value.name} is modified in place{through} by %{writer.name} after the matched nodes; "
                           f"standing in for %{roots[0].name}, it would carry that change to whatever reads "
                           f"%{roots[0].name} or an alias of it", (value.name, writer.name, roots[0].name))
        return Refusal(RefusalCode.READS_ACROSS_MUTATION,
                       f"%{value.name} is modified in place{through} by %{writer.name} between the matched nodes and "
                       f"the place the replacement reads it", (value.name, writer.name))
    return None


TREE_LIMIT = 64
"""How many nodes :func:`first_write_below` walks down a storage tree before asking the writers instead."""


def first_write_below(effects: Effects, tops: Iterable[fx.Node], skip: Any, after: Optional[fx.Node] = None,
                      before: Optional[fx.Node] = None) -> Optional[tuple]:
    """``(written node, writer)`` for the earliest node outside ``skip``, strictly after ``after`` and before
    ``before`` when given, that writes in place a node of the storage tree below ``tops`` (the
    :meth:`~Aliasing.descendants` of each), or None: :meth:`Aliasing.first_write` over that tree.

    Most trees are a few nodes (a value and its views), and are walked. A tree can be most of the graph (a
    chain of n views, an input that n views read): walking it for every match made those checks quadratic
    (a chain of transposes before an in-place add: 1.95 s at 2,000 nodes). Past :data:`TREE_LIMIT` nodes the
    question is turned around: the writers in the window, in graph order, are asked whether a node each
    writes has one of ``tops`` among the nodes its storage comes from (:meth:`Effects.storage_ancestors`,
    remembered until the graph changes, so a run of matches turned down pays for each written node once).
    The first that does is the earliest writer, as the walk finds it, so the asking stops there; the tree
    is walked after all only when the first :data:`TREE_LIMIT` writers do not write it. (Asking only where
    the window held at most that many writers walked the whole tree per match where the input is written in
    place by each of 1,600 blocks: the first writer after each block's ``x * 1`` writes the tree, 3,200 nodes
    deep.) (Where that writer writes two nodes of the tree, the walk names the first in
    the tree's order and this the first in the writer's arguments: the refusal is the same, its "through"
    may name the other.)"""
    analysis = effects.aliasing
    tree = analysis.tree_of(tops, TREE_LIMIT)
    if tree is None:
        tops = set(tops)
        graph = next(iter(tops)).graph
        # a writer of a node of the tree reads it, so comes after it, so after the first of the tops
        writers = effects.writers_between(graph, after if after is not None else min(tops), before)
        for count, writer in enumerate(writers):
            if count == TREE_LIMIT:  # many writers, none of the first ones writing the tree: walk it
                break
            if writer in skip:
                continue
            for written in effects.mutated_inputs(writer):
                if not tops.isdisjoint(effects.storage_ancestors(written)):
                    return written, writer
        else:
            return None
        tree = analysis.tree_of(tops)
    return analysis.first_write(tree, effects.mutated_inputs, skip=skip, after=after, before=before)


def output_alias_introduced(match: Match, effects: Effects) -> Optional[Refusal]:
    """A root that reaches the graph's output (itself or a view of it is returned) replaced by a
    value that may share storage with a parameter or buffer, with another output, or with a
    value of unknown origin, where the root did not: the caller would get the model's state, or
    two outputs that change together. A root that is a copy (``clone``) may not be replaced by a
    value sharing storage with an input either: the program asked for a fresh tensor."""
    roots = match.roots
    matched = match.bindings.nodes
    analysis = effects.aliasing
    for index, replacement in enumerate(match.program.replacements):
        root = roots[index]
        sources = _template_sources(replacement, match, effects)
        if not sources:
            continue
        # Whether the root reaches the output is asked one level down first (the usual root is neither
        # returned nor viewed); past that, the storage the replacement may bring that the root did not have
        # is asked before walking the root's views: in a chain of views (`x.transpose(0, 1)` n times) that
        # walk is the rest of the graph (each pair rewritten walked it: quadratic), and most replacements
        # there share only the root's own storage (`-> $x` for a view of $x). The same answer either way.
        for user in root.users:
            if user.op == "output" or root in analysis.bases(user):
                break
        else:  # neither returned nor viewed
            continue
        if all(source in analysis.bases(root) for source in sources) and not analysis.any_tied(root.graph):
            # the root views each source: their storage roots are among the root's, and with no two get_attr
            # nodes sharing a tensor _origins adds none; so nothing is new. (The get_attr index is built only
            # here, once per run: asked first, it cost a run over an export graph of 650 get_attr nodes 4%.) (A chain of views, each made a
            # `reshape` from the last up, walked up the chain per rewrite here: 2,000 views, 4.4 s.)
            continue
        before = analysis.roots(root)
        new = [origin for source in sources for origin in _origins(analysis, source) if origin not in before]
        if not new:
            continue
        reach = analysis.descendants(root)
        if not any(_returned(node) for node in reach):
            continue
        copy = _is_copy(root)
        for origin in dict.fromkeys(new):
            what = _output_alias_kind(origin, copy, reach, matched, analysis, effects)
            if what is not None:
                return Refusal(RefusalCode.OUTPUT_ALIAS_INTRODUCED,
                               f"%{root.name} is returned by the graph; its replacement would share storage with "
                               f"{what} %{origin.name}", (root.name, origin.name))
    return None


def reads_written_value(match: Match, effects: Effects) -> Optional[Refusal]:
    """A module builder that would read a parameter or buffer the graph writes in place (through any
    alias; a train-mode norm's running statistics; the tensors of a module the engine does not
    know): the module it builds would bake in the value as of now, not as of each call."""
    env = match.bindings
    for call in effects.replacement_calls(match.program):
        spec = call.target
        if not isinstance(spec, RBuilder):
            continue
        if effects.nothing_written(match.roots[0].graph):  # no tensor of the graph is written: none to read
            return None
        graph = match.roots[0].graph
        for name in spec.names:
            if name.startswith("$"):
                node = env.captures.get(name[1:])
                if not isinstance(node, fx.Node) or node.op != "get_attr":
                    continue
                tensors = [effects.attr_of(node.target)]
            else:
                node = env.names.get(name)
                module = effects.module_of(node.target) if isinstance(node, fx.Node) and \
                    node.op == "call_module" else None
                if module is None:
                    continue
                tensors = fxaccess.tensors(module)
            for tensor in tensors:
                if isinstance(tensor, torch.Tensor) and effects.is_written(graph, tensor):
                    return Refusal(RefusalCode.READS_WRITTEN_VALUE,
                                   f"builder {spec.label} would read a tensor of %{node.name} that the graph modifies "
                                   f"in place; its value is not fixed", (node.name,))
    return None


# -- what a replacement template does ------------------------------------------------


def _template_function_args(call: RCall, match: Match) -> tuple:
    """``(args, kwargs)`` of a replacement call as far as they are known before it is built:
    literals and bound values; anything the replacement computes stands as :data:`_COMPUTED`."""
    env = match.bindings
    if call.args is None:
        root = match.roots[call.root_index]
        return tuple(root.args), dict(root.kwargs)

    def known(item: Any) -> Any:
        if isinstance(item, RLiteral):
            return item.value
        if isinstance(item, RValue):
            return (env.captures if item.is_capture else env.names).get(item.name, _COMPUTED)
        return _COMPUTED

    return tuple(known(a) for a in call.args), {name: known(v) for name, v in call.kwargs}


_COMPUTED = object()


def _template_module(call: RCall, match: Match, effects: Effects) -> Any:
    """The module class (RNewModule) or module (RReuse) a call_module replacement calls; None for a builder."""
    spec = call.target
    if isinstance(spec, RNewModule):
        return spec.cls
    if isinstance(spec, RReuse):
        node = match.bindings.names.get(spec.name)
        return effects.module_of(node.target) if isinstance(node, fx.Node) else None
    return None


def _template_draws_random(call: RCall, match: Match, effects: Effects) -> bool:
    if call.op == "call_function":
        args, kwargs = _template_function_args(call, match)
        return aliasing.function_draws_random(call.target, args, kwargs)
    if call.op == "call_method":
        return aliasing.method_draws_random(call.target)
    module = _template_module(call, match, effects)
    if isinstance(module, type):  # a new module: its training mode is decided when it is made
        if not issubclass(module, aliasing.RANDOM_MODULES):
            return False
        p = dict(call.target.attrs).get("p")
        return not (isinstance(p, RLiteral) and p.value == 0)
    # a module of the graph: its facts, found once for the run (their draws_random is module_draws_random's)
    return module is not None and effects.module_facts(module).draws_random


def _writes_nothing(call: RCall, effects: Effects) -> bool:
    """Whether :func:`_template_written` is None for ``call`` whatever the match: the template alone says
    so (its own arguments, not the root's; not a module the match names). False when it cannot tell."""
    if call.op == "call_method":
        return not aliasing.writes_by_name(call.target)
    if call.op == "call_function":
        target = call.target
        if fxaccess.is_op_overload(target):
            return not aliasing.schema_write_positions(target)
        if call.args is None:
            return False
        try:
            kind = _function_writes(target)
        except Exception:
            return False
        if kind == _WRITES_FIRST:
            return False
        kwargs = dict(call.kwargs)
        inplace = kwargs.get("inplace")
        if inplace is True or (isinstance(inplace, RLiteral) and inplace.value is True):
            return False
        return kwargs.get("out") is None
    spec = call.target
    if isinstance(spec, RBuilder):
        return True  # _template_module gives no module: nothing written
    if isinstance(spec, RNewModule):
        inplace = dict(spec.attrs).get("inplace")
        return not (isinstance(inplace, RLiteral) and inplace.value is True)
    return False


def _draws_nothing(call: RCall) -> bool:
    """Whether :func:`_template_draws_random` is False for ``call`` whatever the match (its target alone
    says so). False when it cannot tell."""
    if call.op == "call_function":
        return not aliasing.function_may_draw_random(call.target)
    if call.op == "call_method":
        return not aliasing.method_draws_random(call.target)
    spec = call.target
    if isinstance(spec, RBuilder):
        return True  # _template_module gives no module: draws nothing
    if isinstance(spec, RNewModule):
        return not issubclass(spec.cls, aliasing.RANDOM_MODULES)
    return False


def _template_may_alias(item: Any, match: Match, effects: Effects) -> bool:
    """Whether a replacement's value may share storage with a value outside it (False: a fresh tensor)."""
    if isinstance(item, RLiteral):
        return False
    if not isinstance(item, RCall):
        return True  # an existing value, or a sequence of values
    return call_may_alias(item, match, effects)


def _function_result_may_alias(target: Any) -> bool:
    if fxaccess.is_op_overload(target):
        return aliasing.op_result_may_alias(target)
    return aliasing.function_kind(target) != aliasing.FRESH_KIND


def call_may_alias(call: RCall, match: Match, effects: Effects) -> bool:
    """Whether the result of one replacement call may share storage with one of its arguments."""
    if call.op == "call_function":
        if call.args is not None and not any(name in ("inplace", "out") for name, _ in call.kwargs):
            # no `inplace=`/`out=` in the template: the answer is the target's alone, remembered per
            # call for the run (asked for every match of every rule: 3% of a run at 5,000 nodes)
            known = effects.call_aliases.get(id(call))
            if known is None or known[0] is not call:
                known = effects.call_aliases[id(call)] = (call, _function_result_may_alias(call.target))
            return known[1]
        args, kwargs = _template_function_args(call, match)
        if kwargs.get("inplace") is True or "out" in kwargs:
            return True
        return _function_result_may_alias(call.target)
    if call.op == "call_method":
        name = call.target
        return not aliasing.method_is_known(name) or name in aliasing.VIEW_METHODS \
            or name in aliasing.SELF_RETURNING_METHODS or aliasing.writes_by_name(name)
    if isinstance(call.target, RBuilder):
        return False  # the builders of fxrules.builders return modules computing fresh tensors
    module = _template_module(call, match, effects)
    if module is None:
        return True
    cls = module if isinstance(module, type) else type(module)
    if issubclass(cls, aliasing.ALIASING_MODULES):
        return True
    if isinstance(module, type):
        inplace = dict(call.target.attrs).get("inplace")
        return not (inplace is None or (isinstance(inplace, RLiteral) and inplace.value is False))
    facts = effects.module_facts(module)  # its `inplace` and whether it is known, found once per module for the run
    return facts.writes_input or not facts.known


def _template_written(call: RCall, match: Match, effects: Effects) -> Any:
    """The argument (a template, or a node for forwarded arguments) a replacement call writes in
    place, or None when it writes nothing."""
    args = call.args
    first: Any = None
    if args is None:
        root_args = match.roots[call.root_index].args
        first = root_args[0] if root_args else None
    elif args:
        first = args[0]
    if call.op == "call_method":
        return first if aliasing.writes_by_name(call.target) else None
    if call.op == "call_function":
        target = call.target
        if fxaccess.is_op_overload(target):
            written = aliasing.schema_write_positions(target)
            if not written:
                return None
            i, name = written[0]  # the first argument its schema marks written
            if args is None:
                return first
            return args[i] if i < len(args) else dict(call.kwargs).get(name)
        try:  # the kind per target, remembered for the run as for the graph's own nodes
            kind = effects._writes.get(target)
            if kind is None:
                kind = effects._writes[target] = _function_writes(target)
        except TypeError:  # an unhashable target
            kind = _function_writes(target)
        if kind == _WRITES_FIRST:
            return first
        kwargs = dict(call.kwargs) if args is not None else dict(match.roots[call.root_index].kwargs)
        inplace = kwargs.get("inplace")
        if inplace is True or (isinstance(inplace, RLiteral) and inplace.value is True):
            return first
        return kwargs.get("out")
    module = _template_module(call, match, effects)
    if isinstance(module, type):
        inplace = dict(call.target.attrs).get("inplace")
        return first if isinstance(inplace, RLiteral) and inplace.value is True else None
    if module is not None and effects.module_facts(module).writes_input:  # its `inplace` is True
        return first
    return None


def _template_sources(item: Any, match: Match, effects: Effects) -> list:
    """The existing nodes a replacement's value may share storage with (through a shared node, ``CALL as
    name``, and its later uses too: those of the node it builds)."""
    env = match.bindings
    found: dict = {}
    stack = [item]
    while stack:
        current = stack.pop()
        if isinstance(current, RValue):
            value = (env.captures if current.is_capture else env.names).get(current.name)
            _collect_nodes(value, found)
        elif isinstance(current, RSplat):
            _collect_nodes(env.captures.get(current.name), found)
        elif isinstance(current, RSeq):
            stack.extend(current.items)
        elif isinstance(current, RShared):
            stack.append(current.inner)
        elif isinstance(current, RRef):
            stack.append(shared_template(match.program.replacements, current.name))
        elif isinstance(current, RCall) and call_may_alias(current, match, effects):
            if current.args is None:
                root = match.roots[current.root_index]
                _collect_nodes(root.args, found)
                _collect_nodes(root.kwargs, found)
            else:
                stack.extend(current.args)
                stack.extend(v for _, v in current.kwargs)
    return list(found)


def _origins(analysis: Aliasing, node: fx.Node) -> list:
    """The roots of ``node``'s storage, and get_attr nodes tied to them."""
    found = dict.fromkeys(analysis.roots(node))
    for root in list(found):
        if root.op == "get_attr":
            found.update(dict.fromkeys(analysis.tied(root)))
    return list(found)


def _output_alias_kind(origin: fx.Node, copy: bool, reach: dict, matched: Any, analysis: Aliasing,
                       effects: Effects) -> Optional[str]:
    """What sharing storage with ``origin`` would make a returned root alias (None: nothing it may not)."""
    if origin.op == "get_attr":
        return "the parameter or buffer"
    if copy and origin.op == "placeholder":
        return "the input"
    if effects.is_unknown_call(origin):
        return "the value of unknown origin"
    for node in analysis.descendants(origin):
        if node in reach or node in matched:
            continue
        if _returned(node):
            return "another output,"
    return None


def _returned(node: fx.Node) -> bool:
    """Whether the graph returns ``node`` (its output node is among its users): asked of the output node,
    not by walking ``node``'s users (an input read by 1,200 Linear layers, asked per match: quadratic)."""
    users = node.users
    return any(end in users for end in node.graph.find_nodes(op="output", sort=False))


def _is_copy(node: fx.Node) -> bool:
    """A node whose result is a fresh copy by contract: ``clone``."""
    if node.op == "call_method":
        return node.target == "clone"
    if node.op != "call_function":
        return False
    target = node.target
    if fxaccess.is_op_overload(target):
        return fxaccess.op_name(target) == "clone"
    try:
        return target in aliasing.COPY_FUNCTIONS
    except TypeError:
        return False


def _left_unused(match: Match, effects: Effects, inputs: list, kept: Any = ()) -> list:
    """The nodes outside the match that the rewrite would leave without users, and so erase: inputs of
    matched nodes (and their inputs) that the replacement does not read, used only by nodes that
    go (matched nodes but those in ``kept``, :func:`kept_nodes`), and pure."""
    matched = set(match.bindings.nodes) | set(match.bindings.attrs)
    keep = set(inputs)
    gone = matched.difference(kept)
    found = []
    stack = [i for n in matched for i in n.all_input_nodes if i not in matched]
    while stack:
        node = stack.pop()
        if node in gone or node in keep or node.op in ("placeholder", "output"):
            continue
        if any(user not in gone for user in node.users) or effects.side_effect(node) is not None:
            continue
        gone.add(node)
        found.append(node)
        stack.extend(node.all_input_nodes)
    return found


def placement(match: Match, inputs: list) -> "Plan | Refusal":
    """Where the replacement goes: after every input, before every user of a root; a cycle when
    an input comes after such a user."""
    roots = match.roots
    if len(roots) == 1 and not match.program.calls:
        # nothing is inserted, and every input comes before the one root: a capture or named node is
        # the root's argument or a matched node below it, or an argument of one (uses_replaced_node
        # refused the root itself); so no input is late and the anchor is the root
        return Plan(roots[0])
    matched = match.bindings.nodes
    anchor = min(roots)
    late_inputs = [n for n in inputs if not (n < anchor)]
    if late_inputs:
        users = [u for r in roots for u in r.users if u not in matched]
        limit = min(users) if users else None
        latest = max(late_inputs)
        if limit is not None and not (latest < limit):
            return Refusal(RefusalCode.WOULD_CYCLE,
                           "the replacement would have to come after a user of the nodes it replaces (a cycle)",
                           (latest.name, limit.name))
        anchor = latest.next
    return Plan(anchor)


def _replacement_inputs(match: Match) -> list:
    """Nodes the replacement reads (captures, named nodes, forwarded arguments), each once."""
    env = match.bindings
    found: dict = {}
    for kind, key in match.program.reads:
        if kind == READ_CAPTURE:
            _collect_nodes(env.captures.get(key), found)
        elif kind == READ_NAME:
            _collect_nodes(env.names.get(key), found)
        elif kind == READ_ROOT_ARGUMENTS:
            root = match.roots[key]
            _collect_nodes(root.args, found)
            _collect_nodes(root.kwargs, found)
        elif kind == READ_REST:
            if env.rest is not None:
                _collect_nodes(env.rest[0], found)
                _collect_nodes(env.rest[1], found)
        else:  # READ_MODULE_NAME: a matched module re-called or handed to a builder
            value = env.names.get(key)
            if isinstance(value, fx.Node) and value not in env.nodes:
                found[value] = None
    return list(found)


def _collect_nodes(value: Any, found: dict) -> None:
    if isinstance(value, fx.Node):
        found[value] = None
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_nodes(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _collect_nodes(item, found)
