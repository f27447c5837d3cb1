"""Deciding whether a match may be rewritten, and where the replacement goes.

A match is refused with a :class:`~fxrules.engine.refusals.Refusal` (a stable code, the
message the report shows, the nodes concerned) when, checked in this order:

* an interior node (matched, not a root) has a user outside the match
  (``interior-used-outside``);
* a matched node has a side effect (removing it would drop the effect:
  ``drops-side-effect``): see :meth:`Effects.side_effect`; torch's own ``Node.is_impure``
  misses in-place method calls such as ``buf.add_(1)`` and ``print`` in symbolic_trace
  graphs, so this module has its own test;
* the replacement uses a node the rewrite removes (``uses-replaced-node``), replaces a node
  by a literal (``replaces-with-literal``), or replaces a node that is later modified in
  place by a value that would then be modified instead (``replaced-node-mutated``);
* the rewrite would move a read of a captured value across an in-place mutation of that
  value (the replacement reads it at a later point than the matched nodes did:
  ``reads-across-mutation``; or the value stands in for a root and is modified after
  the match: ``alias-mutated-later``);
* the replacement would need a node before one of its own inputs (``would-cycle``).
"""

from __future__ import annotations

import builtins
import operator
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import fx

from fxrules.engine import fxaccess
from fxrules.engine.matcher import Match
from fxrules.engine.program import READ_CAPTURE, READ_NAME, READ_REST, READ_ROOT_ARGUMENTS, RValue
from fxrules.engine.refusals import Refusal, RefusalCode

_INPLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                      operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift,
                      operator.irshift, operator.imatmul, operator.setitem, operator.delitem}
_EFFECTFUL_FUNCTIONS = {builtins.print, builtins.input, builtins.setattr, builtins.delattr, builtins.exec,
                        builtins.eval, builtins.open}


class Effects:
    """Which nodes write to their inputs or have other side effects, for one run over one graph.

    What a ``call_function`` target does (whether it writes its first argument, whether torch
    lists it as impure) does not depend on the node, so it is looked up once per target and
    remembered for the run. Modules are read per node (a rewrite may put a new module under an
    old name), what their class says about ``inplace``/``_is_impure`` once per class.
    """

    def __init__(self, module_of: Callable[[str], Any]):
        self.module_of = module_of
        self._impure: dict = {}  # call_function target -> why calling it has an effect, or None
        self._writes: dict = {}  # call_function target -> _WRITES_* kind
        self._classes: dict = {}  # (module class, attribute) -> what the class says (see _module_attr)

    def _module_effects(self, target: str) -> tuple:
        """(writes its input, marked impure) for the module ``target`` names now."""
        module = self.module_of(target)
        if module is None:
            return (False, False)
        return (_module_attr(module, "inplace", False, self._classes) is True,
                bool(_module_attr(module, fxaccess.IMPURE_MODULE_FLAG, False, self._classes)))

    def mutated_inputs(self, node: fx.Node) -> list:
        """The input nodes ``node`` writes to in place (empty for a pure node)."""
        op = node.op
        if op == "call_function":
            target = node.target
            try:
                kind = self._writes.get(target)
            except TypeError:  # an unhashable target
                return _mutated_by_function(node, _function_writes(target))
            if kind is None:
                kind = self._writes[target] = _function_writes(target)
            return _mutated_by_function(node, kind)
        if op == "call_method":
            name = node.target
            if isinstance(name, str) and name.endswith("_") and not name.endswith("__") and node.args:
                return [node.args[0]]
            return []
        if op == "call_module":
            if node.args and self._module_effects(node.target)[0]:
                return [node.args[0]]
        return []

    def side_effect(self, node: fx.Node) -> Optional[str]:
        """Why removing ``node`` would change behaviour beyond its output, or None when it is pure."""
        op = node.op
        if op in ("placeholder", "output"):
            return f"%{node.name} is a graph {op}"
        if op == "call_module":  # mutated_inputs's question and this one's, from one lookup
            writes, impure = self._module_effects(node.target)
            if writes and node.args:
                return f"%{node.name} modifies its input in place"
            return f"%{node.name} calls a module marked impure" if impure else None
        if self.mutated_inputs(node):
            return f"%{node.name} modifies its input in place"
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


_UNKNOWN = object()


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


_WRITES_SCHEMA, _WRITES_FIRST, _WRITES_BY_KEYWORDS = "schema", "first", "keywords"
"""How a call_function target writes its inputs: as its schema says (an OpOverload), always its
first argument (``operator.iadd``, ``torch.relu_``), or only when called with ``inplace=True``
or ``out=``."""


def _function_writes(target: Any) -> str:
    if fxaccess.is_op_overload(target):
        return _WRITES_SCHEMA
    try:
        if target in _INPLACE_OPERATORS:
            return _WRITES_FIRST
    except TypeError:  # an unhashable target
        pass
    name = getattr(target, "__name__", "")
    if isinstance(name, str) and name.endswith("_") and not name.endswith("__"):
        return _WRITES_FIRST
    return _WRITES_BY_KEYWORDS


def _mutated_by_function(node: fx.Node, kind: str) -> list:
    if kind == _WRITES_SCHEMA:
        written = []
        for i, argument in enumerate(fxaccess.op_schema(node.target).arguments):
            info = argument.alias_info
            if info is not None and info.is_write:
                value = node.args[i] if i < len(node.args) else node.kwargs.get(argument.name)
                if isinstance(value, fx.Node):
                    written.append(value)
        return written
    if kind == _WRITES_FIRST:
        return [node.args[0]] if node.args else []
    kwargs = node.kwargs
    if kwargs:
        if kwargs.get("inplace") is True and node.args:
            return [node.args[0]]
        out = kwargs.get("out")
        if isinstance(out, fx.Node):
            return [out]
    return []


def _function_effect(target: Any, node: fx.Node) -> Optional[str]:
    """Why calling ``target`` has a side effect (as the end of a sentence), or None."""
    if target in _EFFECTFUL_FUNCTIONS:
        return f"calls {getattr(target, '__name__', target)}, which has a side effect"
    try:
        if fxaccess.function_is_impure(target, node.args, node.kwargs):
            return "has a side effect"
    except Exception:
        pass
    return None


@dataclass(frozen=True)
class Plan:
    """Where to insert a match's replacement."""

    anchor: fx.Node  # new nodes go just before this node


def plan(match: Match, effects: Effects) -> "Plan | Refusal":
    """A Plan, or the :class:`Refusal` saying why the match must not be rewritten.

    The checks run in this order, and the first refusal wins (so a match with several
    problems always reports the same one): :func:`interior_used_outside`,
    :func:`drops_side_effect`, :func:`uses_replaced_node`, :func:`replaced_by_value`,
    :func:`reads_across_mutation`, then :func:`placement` (which refuses a cycle or places
    the replacement). Each check is pure and returns a Refusal or None; a refusal is only
    built when refusing.
    """
    refusal = interior_used_outside(match)
    if refusal is None:
        refusal = drops_side_effect(match, effects)
    if refusal is not None:
        return refusal
    inputs = _replacement_inputs(match)
    refusal = uses_replaced_node(match, inputs)
    if refusal is None:
        refusal = replaced_by_value(match, effects)
    if refusal is None:
        refusal = reads_across_mutation(match, effects, inputs)
    if refusal is not None:
        return refusal
    return placement(match, inputs)


def interior_used_outside(match: Match) -> Optional[Refusal]:
    """An interior node (matched, not a root) used outside the match: removing it would break
    that user, keeping it would compute it twice."""
    matched = match.bindings.nodes
    roots = match.roots
    for node in matched:
        if node in roots:
            continue
        for user in node.users:
            if user not in matched:
                return Refusal(RefusalCode.INTERIOR_USED_OUTSIDE,
                               f"interior node %{node.name} is also used by %{user.name}, outside the match; "
                               f"rewriting would duplicate or break it", (node.name, user.name))
    return None


def drops_side_effect(match: Match, effects: Effects) -> Optional[Refusal]:
    """A matched node with a side effect: the rewrite removes matched nodes, and the effect with them."""
    for node in match.bindings.nodes:
        effect = effects.side_effect(node)
        if effect is not None:
            return Refusal(RefusalCode.DROPS_SIDE_EFFECT,
                           f"removing the match would drop a side effect: {effect}", (node.name,))
    return None


def uses_replaced_node(match: Match, inputs: list) -> Optional[Refusal]:
    """The replacement reads a root: the root is replaced by a value computed from itself."""
    roots = match.roots
    for node in inputs:
        if node in roots:
            return Refusal(RefusalCode.USES_REPLACED_NODE,
                           f"the replacement uses %{node.name}, the node it replaces", (node.name,))
    return None


def replaced_by_value(match: Match, effects: Effects) -> Optional[Refusal]:
    """A root replaced by an existing value (``-> $x``): the value must be a node, and the root
    must not be modified in place later (the value would be modified instead). Checked root
    by root, literal first."""
    env = match.bindings
    roots = match.roots
    for index, replacement in enumerate(match.program.replacements):
        if isinstance(replacement, RValue):
            root = roots[index]
            value = (env.captures if replacement.is_capture else env.names).get(replacement.name)
            if not isinstance(value, fx.Node):
                return Refusal(RefusalCode.REPLACES_WITH_LITERAL,
                               f"the replacement would replace %{root.name} by the literal {value!r}", (root.name,))
            for user in root.users:
                if root in effects.mutated_inputs(user):
                    return Refusal(RefusalCode.REPLACED_NODE_MUTATED,
                                   f"%{root.name} is modified in place by %{user.name}; replacing it by "
                                   f"%{value.name} would modify %{value.name} too", (root.name, user.name, value.name))
    return None


def reads_across_mutation(match: Match, effects: Effects, inputs: list) -> Optional[Refusal]:
    """An in-place mutation of a value the replacement reads, between the first matched node and
    the last place the replacement reads it.

    When an existing value takes a root's place, the root's users may hand that value on
    (eval-mode dropout returns its input, views alias it) to anything after them, the graph's
    output included: any later in-place mutation of the value could then show, so there is
    no last place.
    """
    matched = match.bindings.nodes
    roots = match.roots
    first = min(matched) if matched else min(roots)
    aliases_root = any(isinstance(r, RValue) for r in match.program.replacements)
    last = None if aliases_root else max(roots)
    for value in inputs:
        for user in value.users:
            if user in matched or not first < user or (last is not None and not user < last):
                continue
            if value in effects.mutated_inputs(user):
                if last is None:
                    return Refusal(RefusalCode.ALIAS_MUTATED_LATER,
                                   f"%{value.name} is modified in place by %{user.name} after the matched nodes; "
                                   f"standing in for %{roots[0].name}, it would carry that change to whatever reads "
                                   f"%{roots[0].name} or an alias of it", (value.name, user.name, roots[0].name))
                return Refusal(RefusalCode.READS_ACROSS_MUTATION,
                               f"%{value.name} is modified in place by %{user.name} between the matched nodes and "
                               f"the place the replacement reads it", (value.name, user.name))
    return None


def placement(match: Match, inputs: list) -> "Plan | Refusal":
    """Where the replacement goes: after every input, before every user of a root; a cycle when
    an input comes after such a user."""
    matched = match.bindings.nodes
    roots = match.roots
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
