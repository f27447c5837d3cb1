"""Evaluating ``where`` conditions on a match.

What names mean in a condition:

* ``$x`` bound to a node: its tensor metadata (``shape``, ``ndim``, ``dtype``,
  ``device``, ``numel``, ...) from ``node.meta['val']`` or
  ``node.meta['tensor_meta']``; bound to a ``get_attr`` node: the parameter or
  buffer itself; bound to a literal: the literal.
* a name bound with ``as`` to a ``call_module`` node: the module, so
  ``bn.training`` and ``conv.weight.shape`` read it; to any other node: like a
  capture.
* dotted names: constants such as ``torch.float32``; calls: built-in
  predicates (``is_zero``), pure builtins (``len``) or a function by dotted path
  (allowed by the import policy).

A condition that needs metadata the graph does not have raises
:class:`MissingMetadata`; the engine turns it into an error naming the rule.

Values as of the match point: a parameter or buffer that the graph writes in place (through
any alias, anywhere in the graph: a write after the match changes what the next call reads
before it) has no fixed value. Reading it gives a :class:`WrittenTensor`, which has the
tensor's metadata (shape, dtype, ...) but no values: a predicate, a comparison or an index
that would read its values makes the whole ``where`` line false (unknown), whatever ``not``s
surround it.

Rule files are untrusted, and a condition runs for every candidate match: what one
condition may build is bounded (:data:`MAX_SEQUENCE`, :data:`MAX_INT_BITS`,
:data:`MAX_NDIGITS`), checked *before* an operation allocates. Exceeding the budget
raises :class:`ConditionRefused`, which the engine reports naming the rule; it is
never an out-of-memory. Dotted names are decided by the allow-list
(:mod:`fxrules.lang.allowlist`) again here, so a rule set that skipped the checker
cannot call what the checker would refuse.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import fx, nn

import fxrules.lang.ast as A
from fxrules.lang import allowlist
from fxrules.lang.diagnostics import FxrulesError
from fxrules.lang.names import expand
from fxrules.engine.predicates import PREDICATES
from fxrules.lang.names import BINDING_PREDICATES, CONDITION_FUNCTIONS, MAX_CONDITION_ITEMS, USER_FUNCTIONS

MAX_SEQUENCE = MAX_CONDITION_ITEMS
"""The most items (or characters) a list, tuple or string built by a condition may have, nested items
counted: ``[[0] * 60000] * 60000`` holds 60,000 references to one list, cheap to build, but comparing
or concatenating it walks 3.6e9 items, so a sequence's budget is its :func:`_weight`."""

MAX_INT_BITS = 1 << 14
"""The most bits an integer computed by a condition may have (a 4,000-digit literal has 13,288)."""

MAX_NDIGITS = 1000
"""``round(x, n)`` with ``|n|`` beyond this is refused (Python computes ``10 ** |n|``)."""


class ConditionRefused(Exception):
    """A condition asked for more than the evaluation budget allows, or for a name the allow-list refuses."""


class ConditionRaised(Exception):
    """A condition's own operation raised on this match's values (``$s * 1.0`` where ``$s`` is a
    tensor's metadata: TypeError; an index out of range; a division by zero). The condition
    does not hold, and the engine refuses the match with ``condition-raised`` and the error,
    rather than abort the run: the rule is wrong for this match, the model is not. A function a
    rule names by dotted path (an allowed import) that raises is the caller's code failing, and
    stays an error."""

    def __init__(self, cond: A.Cond, error: Exception):
        super().__init__(f"{type(error).__name__}: {error}")
        self.cond = cond
        self.error = error


RAISED_BY_OPERATIONS = (TypeError, ValueError, ArithmeticError, LookupError, AttributeError, RuntimeError)
"""What an operation of the condition language raises on values it does not apply to (``RuntimeError``:
torch's, comparing tensors of other shapes): :class:`ConditionRaised`."""


class MissingMetadata(Exception):
    """A condition read shape/dtype of a node that has neither meta['val'] nor meta['tensor_meta']."""

    def __init__(self, node: fx.Node, attr: str):
        super().__init__(node, attr)
        self.node = node
        self.attr = attr


class NotApplicable(Exception):
    """A condition asked a value for something it does not have (the dtype of an int): it does not hold."""


class TensorInfo:
    """Shape, dtype and device of a node's value, read from its meta."""

    __slots__ = ("shape", "dtype", "device", "requires_grad", "_contiguous")

    def __init__(self, shape, dtype, device, requires_grad=False, contiguous=True):
        self.shape = tuple(int(d) if _is_int(d) else d for d in shape)
        self.dtype = dtype
        self.device = device
        self.requires_grad = requires_grad
        self._contiguous = contiguous

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def is_contiguous(self) -> bool:
        return self._contiguous

    def dim(self) -> int:
        return self.ndim

    def size(self, dim: Optional[int] = None):
        return self.shape if dim is None else self.shape[dim]


class WrittenTensor(TensorInfo):
    """A parameter or buffer the graph writes in place: its metadata, and no values to read."""

    __slots__ = ()

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "WrittenTensor":
        try:
            contiguous = bool(tensor.is_contiguous())
        except Exception:
            contiguous = True
        return cls(tensor.shape, tensor.dtype, tensor.device, bool(tensor.requires_grad), contiguous)


METADATA_PREDICATES = frozenset({"is_floating", "is_scalar"})
"""Predicates that read only a value's metadata: they may be asked about a :class:`WrittenTensor`."""


def _is_int(d: Any) -> bool:
    try:
        int(d)
        return True
    except Exception:
        return False


def tensor_info(node: fx.Node) -> Optional[TensorInfo]:
    val = node.meta.get("val")
    if val is not None and hasattr(val, "shape") and hasattr(val, "dtype"):
        try:
            contiguous = bool(val.is_contiguous())
        except Exception:
            contiguous = True
        return TensorInfo(val.shape, val.dtype, getattr(val, "device", None),
                          bool(getattr(val, "requires_grad", False)), contiguous)
    meta = node.meta.get("tensor_meta")
    if meta is not None and hasattr(meta, "shape"):
        return TensorInfo(meta.shape, meta.dtype, None, bool(getattr(meta, "requires_grad", False)),
                          bool(getattr(meta, "is_contiguous", True)))
    return None


def _sequence_eq(a: Any, b: Any) -> Any:
    """``==`` where a list, a tuple and a ``torch.Size`` with the same items are equal (Python says
    ``torch.Size([7, 5]) != [7, 5]``, which made ``$x.shape == [7, 5]`` a condition that never holds)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(bool(_sequence_eq(x, y)) for x, y in zip(a, b))
    return a == b


def _sequence_in(a: Any, b: Any) -> bool:
    if isinstance(b, (list, tuple)):
        return any(a is item or bool(_sequence_eq(a, item)) for item in b)
    return a in b


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "==": _sequence_eq, "!=": lambda a, b: not _sequence_eq(a, b), "<": operator.lt, "<=": operator.le, ">": operator.gt,
    ">=": operator.ge, "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "in": _sequence_in, "not in": lambda a, b: not _sequence_in(a, b),
}

_CAPTURE_ATTRS = frozenset({"shape", "ndim", "dtype", "device", "numel", "requires_grad", "is_contiguous"})

_DTYPE_ATTRS = frozenset({"itemsize", "is_floating_point", "is_complex", "is_signed"})
"""What a condition may read of a dtype (``$x.dtype.itemsize``, ``$d.is_floating_point`` for a dtype
literal ``$d``; of a tensor or its metadata, its dtype's: ``$x.itemsize``): plain data, properties of
``torch.dtype``. A value that is neither (an int, a list) has none of them: the condition is false."""


@dataclass(frozen=True, slots=True)
class ModuleFlag:
    """A ``where`` line of the form ``name.attr`` or ``not name.attr`` (``d.training``, ``not
    bn.training``): a flag of the module an ``as`` name calls, the commonest condition of all. It
    is answered straight from the module (:meth:`holds`) when the name is bound to a call_module
    node whose module has that attribute as a bool, which is what :class:`Evaluator` would
    compute for it; anything else (another kind of node, no such module or attribute, a value
    that is not a bool) is left to the evaluator (None), which gives the usual answer or error."""

    name: str
    attr: str
    negated: bool

    def holds(self, names: dict, module_of: Callable[[str], Any]) -> Optional[bool]:
        node = names.get(self.name)
        if node is None or type(node) is not fx.Node or node.op != "call_module":
            return None
        try:
            value = getattr(module_of(node.target), self.attr, None)
        except Exception:  # a property that raises: the evaluator reports it as it does
            return None
        if type(value) is not bool:
            return None
        return value is not self.negated


def module_flag(cond: A.Cond) -> Optional[ModuleFlag]:
    """``cond`` as a :class:`ModuleFlag`, or None when it has another form."""
    negated = type(cond) is A.CUnary and cond.op == "not"
    if negated:
        cond = cond.operand
    if type(cond) is not A.CAttr or type(cond.value) is not A.CName:
        return None
    attr = cond.attr
    if attr.startswith("_") or attr in _CAPTURE_ATTRS or attr in _DTYPE_ATTRS:
        return None  # the evaluator reads these otherwise (metadata, dtypes) or refuses them
    return ModuleFlag(cond.value.name, attr, negated)


class Evaluator:
    """Evaluates one rule's conditions against one match."""

    def __init__(self, captures: dict, names: dict, module_of: Callable[[str], Any],
                 attr_of: Callable[[str], Any], aliases: dict, resolver, effects: Optional[Any] = None):
        """``effects``: the run's :class:`fxrules.engine.planner.Effects` (which remembers what the
        graph writes); one is made for this evaluation when not given."""
        self.captures = captures
        self.names = names
        self.module_of = module_of
        self.attr_of = attr_of
        self.aliases = aliases
        self.resolver = resolver
        self._effects = effects
        self._state = _EvaluationState()  # shared with the copies a generator's items are read in

    def effects(self) -> Any:
        if self._effects is None:
            from fxrules.engine.planner import Effects

            self._effects = Effects(self.module_of, self.attr_of)
        return self._effects

    @property
    def read_graph(self) -> bool:
        """Whether what this evaluation read could change while the nodes a match bound stay as they are: a
        node's users (``users($x)``, ``user_targets``, ``used_only_by``), whether the graph writes a tensor in
        place (:meth:`tensor_at`), or a node handed to a function as itself. A condition that read none of
        these (metadata, literals, module flags, constants) gives the same answer until the match itself
        changes: the driver does not send its match back when a node it read changes (:meth:`fxrules.engine.
        driver._Session.rewrite`)."""
        return self._state.read_graph

    def tensor_at(self, node: fx.Node, value: Any) -> Any:
        """``value`` (read from a get_attr node or a module called by ``node``) as a condition sees it:
        a :class:`WrittenTensor` when the graph writes its storage in place."""
        if isinstance(value, torch.Tensor) and node.graph is not None:
            self._state.read_graph = True
            if self.effects().is_written(node.graph, value):
                return WrittenTensor.of(value)
        return value

    def attribute(self, node: fx.Node) -> Any:
        """The parameter, buffer or constant a get_attr node reads, as of the match point."""
        return self.tensor_at(node, self.attr_of(node.target))

    def holds(self, cond: A.Cond) -> bool:
        """A whole `where` line: a value without the metadata it asks for (an int's dtype) makes it false,
        whatever `not`s surround that read."""
        self._state.items_left = MAX_CONDITION_ITEMS
        try:
            return self.truth(cond)
        except NotApplicable:
            return False
        except RAISED_BY_OPERATIONS as exc:
            if exc is self._state.raised_by_function or isinstance(exc, (RecursionError, FxrulesError)):
                raise  # the caller's function, or fxrules' own error: not the condition's
            raise ConditionRaised(cond, exc) from exc

    def truth(self, cond: A.Cond) -> bool:
        return bool(self.value(cond))

    def node_value(self, node: Any, attr: Optional[str] = None) -> Any:
        """What a node stands for in a condition (see the module docstring)."""
        if not isinstance(node, fx.Node):
            return node
        if node.op == "get_attr":
            return self.attribute(node)
        if node.op == "call_module" and attr not in _CAPTURE_ATTRS:
            return self.module_of(node.target)
        info = tensor_info(node)
        if info is not None:
            return info
        if "val" in node.meta:  # not a tensor: the value itself
            return node.meta["val"]
        raise MissingMetadata(node, attr or "value")

    def value(self, cond: A.Cond) -> Any:
        kind = type(cond)
        if kind is A.CLiteral:
            return cond.value
        if kind is A.CCapture:  # a captured value: a parameter, tensor metadata, or a literal
            value = self.captures[cond.name]
            if isinstance(value, fx.Node):
                if value.op == "get_attr":
                    return self.attribute(value)
                info = tensor_info(value)
                if info is not None:
                    return info
                if "val" in value.meta:  # a node whose value is not a tensor (an int from x.size(0))
                    return value.meta["val"]
                raise MissingMetadata(value, "shape/dtype")
            return value
        if kind is A.CName:
            if cond.name in self.names:
                return self.names[cond.name]
            return self.constant((cond.name,))
        if kind is A.CAttr:
            chain = A.name_chain(cond)
            if chain is not None and chain[0] not in self.names:
                return self.constant(chain)
            base = self.value(cond.value)
            from_module = isinstance(base, fx.Node) and base.op == "call_module" and cond.attr not in _CAPTURE_ATTRS
            node = base if from_module else None
            if isinstance(base, fx.Node):
                base = self.node_value(base, cond.attr)
            if cond.attr.startswith("__"):  # the checker refuses these; never evaluate one
                raise NameError(f"a condition may not read `{cond.attr}`")
            if cond.attr in _CAPTURE_ATTRS:
                if not hasattr(base, cond.attr):
                    raise NotApplicable(cond.attr)
            elif cond.attr in _DTYPE_ATTRS and not from_module:
                dtype = base if isinstance(base, torch.dtype) else getattr(base, "dtype", None)  # a tensor's
                if not isinstance(dtype, torch.dtype):
                    raise NotApplicable(cond.attr)
                return getattr(dtype, cond.attr)
            elif isinstance(base, WrittenTensor):
                raise NotApplicable(cond.attr)  # a view of a written tensor (`.T`): no values either
            elif not (from_module or isinstance(base, (nn.Module, torch.Tensor))):
                raise NameError(f"a condition may read only tensor metadata from a computed value, not `{cond.attr}`")
            result = getattr(base, cond.attr)
            if node is not None:  # a module's parameter or buffer, as of the match point
                result = self.tensor_at(node, result)
            if cond.attr in ("numel",) and callable(result):
                return result()
            if cond.attr not in _CAPTURE_ATTRS and callable(result) and not isinstance(result, torch.Tensor):
                raise NameError(f"a condition may read data attributes of modules, not the method `{cond.attr}`")
            return result
        if kind is A.CIndex:
            base = self.value(cond.value)
            if isinstance(base, fx.Node):
                base = self.node_value(base)
            if isinstance(base, WrittenTensor):
                raise NotApplicable("values")
            index = self.value(cond.index)
            if isinstance(base, torch.Tensor):
                _check_tensor_index(base, index)
            return _bounded(base[index])
        if kind is A.CSlice:  # the index of a CIndex: `$x.shape[1:]`
            return slice(*(None if part is None else _slice_bound(_plain(self, self.value(part)))
                           for part in (cond.start, cond.stop, cond.step)))
        if kind is A.CCall:
            return self.call(cond)
        if kind is A.CList:
            items = [self.value(i) for i in cond.items]  # each item is bounded: its weight is cheap
            return _bounded(tuple(items) if cond.parens else items)
        if kind is A.CUnary:
            if cond.op == "not":
                return not self.truth(cond.operand)
            return _bounded(-_plain(self, self.value(cond.operand)))
        if kind is A.CBinary:
            if cond.op == "and":
                return self.truth(cond.left) and self.truth(cond.right)
            if cond.op == "or":
                return self.truth(cond.left) or self.truth(cond.right)
            left, right = _plain(self, self.value(cond.left)), _plain(self, self.value(cond.right))
            _check_binary(cond.op, left, right)
            return _bounded(_BINARY[cond.op](left, right))
        raise AssertionError(kind)  # pragma: no cover

    def call(self, cond: A.CCall) -> Any:
        if isinstance(cond.func, A.CName) and cond.func.name in USER_FUNCTIONS:
            return self.user_function(cond)
        if isinstance(cond.func, A.CName) and cond.func.name in BINDING_PREDICATES:
            return self.is_literal(cond)
        if cond.args and isinstance(cond.args[0], A.CGenerator):
            return self.generator_call(cond)
        # A captured node passed straight to a function need not have metadata: the function
        # gets the node itself then (built-in predicates answer False for it).
        args = [self.captures[a.name] if isinstance(a, A.CCapture) and _bare_node(self.captures[a.name])
                else self.value(a) for a in cond.args]
        func = cond.func
        if isinstance(func, A.CName) and func.name in PREDICATES:
            values = [self.predicate_arg(a) for a in args]
            if func.name not in METADATA_PREDICATES:
                _check_readable(values)
            return PREDICATES[func.name](*values)
        if isinstance(func, A.CName) and func.name in CONDITION_FUNCTIONS:
            plain = [_plain(self, a) for a in args]
            _check_builtin(func.name, plain)
            return _bounded(CONDITION_FUNCTIONS[func.name](*plain))
        if isinstance(func, A.CAttr) and A.name_chain(func) is None:  # a method on a value: `$x.is_contiguous()`
            base = self.value(func.value)
            if isinstance(base, fx.Node):
                base = self.node_value(base, func.attr)
            if func.attr not in _CAPTURE_ATTRS or not isinstance(base, (TensorInfo, torch.Tensor)):
                raise NameError(f"a condition may call only metadata methods of a value, not `{func.attr}`")
            return getattr(base, func.attr)(*args)
        chain = A.name_chain(func)
        path = expand(chain, self.aliases) or ".".join(chain)
        refusal = allowlist.refuse_condition_call(path, self.resolver.packages)
        if refusal is not None:
            raise ConditionRefused(refusal)
        function = self.resolved(path)
        values = [self.predicate_arg(a) for a in args]
        _check_readable(values)
        if any(isinstance(v, fx.Node) for v in values):  # the function may read anything of it
            self._state.read_graph = True
        try:
            return function(*values)
        except BaseException as exc:  # noqa: BLE001 - re-raised: holds() tells it from the language's own errors
            self._state.raised_by_function = exc
            raise

    def generator_call(self, cond: A.CCall) -> Any:
        """``all(ELEMENT for VAR in ITERABLE if FILTER)`` (any, sum, min, max, tuple): the builtin
        consumes the items as Python's generator would (``all`` stops at the first false one), each
        counted against the evaluation's budget of :data:`MAX_CONDITION_ITEMS`."""
        func = cond.func.name
        if func not in CONDITION_FUNCTIONS:  # the checker allows generators only in these
            raise NameError(f"`{func}` does not take a generator")
        generator = cond.args[0]
        iterable = _plain(self, self.value(generator.iterable))
        if isinstance(iterable, torch.Tensor):
            _check_builtin(func, [iterable])
        items = self._generated(generator, iter(iterable))
        try:
            return _bounded(CONDITION_FUNCTIONS[func](items))
        finally:
            items.close()

    def _generated(self, generator: A.CGenerator, iterator: Any) -> Any:
        scoped = self.scoped(generator.var)
        for item in iterator:
            self._state.take_item()
            scoped.names[generator.var] = item
            if generator.filter is not None and not scoped.truth(generator.filter):
                continue
            yield scoped.value(generator.element)

    def scoped(self, var: str) -> "Evaluator":
        """A copy that reads ``var`` as a name too (a generator's item), sharing the item budget."""
        inner = Evaluator(self.captures, {**self.names, var: None}, self.module_of, self.attr_of, self.aliases,
                          self.resolver, self._effects)
        inner._state = self._state
        return inner

    def is_literal(self, cond: A.CCall) -> bool:
        """``is_literal($k)``: whether ``$k`` is bound to a literal argument (a number, string, bool,
        None, dtype, ..., or a list or tuple holding no node), not a graph node."""
        value = self.captures[cond.args[0].name]
        return not _holds_node(value)

    def user_function(self, cond: A.CCall) -> Any:
        """``users``, ``user_targets``, ``used_only_by`` (fxrules.lang.names.USER_FUNCTIONS): about the
        users of the node the first argument is bound to; a literal has none (the condition is false)."""
        first = cond.args[0]
        node = self.captures.get(first.name) if isinstance(first, A.CCapture) else self.names.get(first.name)
        if not isinstance(node, fx.Node):
            raise NotApplicable("users")
        self._state.read_graph = True
        if cond.func.name == "users":
            return len(node.users)
        targets = _bounded([self.user_target(user) for user in node.users])
        if cond.func.name == "user_targets":
            return targets
        allowed = [self.value(arg) for arg in cond.args[1:]]
        return all(any(t is a or _equal(t, a) for a in allowed) for t in targets)

    def user_target(self, user: fx.Node) -> Any:
        """What ``user_targets`` lists for a user: its function, method name, module class, or ``"output"``."""
        if user.op == "call_module":
            return type(self.module_of(user.target))
        if user.op == "output":
            return "output"
        return user.target

    def predicate_arg(self, value: Any) -> Any:
        if isinstance(value, fx.Node):
            if value.op in ("get_attr", "call_module"):
                return self.node_value(value)
            info = tensor_info(value)
            return info if info is not None else value
        return value

    def constant(self, chain: tuple) -> Any:
        path = expand(chain, self.aliases) or ".".join(chain)
        refusal = allowlist.refuse_constant(path, self.resolver.packages)
        if refusal is not None:
            raise ConditionRefused(refusal)
        return self.resolved(path)

    def resolved(self, path: str) -> Any:
        resolution = self.resolver.resolve(path)
        if not resolution.ok:
            raise NameError(resolution.message or f"`{path}` does not resolve")
        if isinstance(resolution.value, type(operator)):
            raise NameError(f"a condition may not use the module `{path}` as a value")
        return resolution.value


_SEQUENCES = (str, bytes, list, tuple)


def _size(value: Any) -> int:
    """How many items an operand contributes to a sequence result (a tensor: its elements)."""
    if isinstance(value, _SEQUENCES):
        return len(value)
    if isinstance(value, torch.Tensor):
        return value.numel()
    return 1


def _weight(value: Any) -> int:
    """The items a sequence stands for, nested sequences' items included (each occurrence counted).

    What walking the value costs (comparing, concatenating, ``in``), whatever its sharing. Every
    sequence a condition builds is checked against :data:`MAX_SEQUENCE` by this measure, so walking
    an operand stops early: at most ``MAX_SEQUENCE + 1`` items are visited.
    """
    if isinstance(value, (str, bytes)):
        return len(value)
    if not isinstance(value, (list, tuple)):
        return 1
    total = len(value)
    for item in value:
        if total > MAX_SEQUENCE:
            break
        if isinstance(item, _SEQUENCES):
            total += _weight(item)
    return total


def _check_binary(op: str, left: Any, right: Any) -> None:
    """Refuse, before computing it, a result beyond the budget."""
    if op == "*":
        if isinstance(left, _SEQUENCES) or isinstance(right, _SEQUENCES):
            seq, count = (left, right) if isinstance(left, _SEQUENCES) else (right, left)
            if isinstance(count, int) and _weight(seq) * max(count, 0) > MAX_SEQUENCE:
                raise ConditionRefused(f"a condition may build sequences of at most {MAX_SEQUENCE} items "
                                       f"(repeating {_weight(seq)} items {count} times)")
        elif isinstance(left, int) and isinstance(right, int):
            if abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS:
                raise ConditionRefused(f"a condition may compute integers of at most {MAX_INT_BITS} bits")
    elif op == "+" and isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES):
        if _weight(left) + _weight(right) > MAX_SEQUENCE:
            raise ConditionRefused(f"a condition may build sequences of at most {MAX_SEQUENCE} items")
    elif op == "%" and isinstance(left, (str, bytes)):
        raise ConditionRefused("a condition may not format strings with `%`")
    if (isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor)) and op not in ("in", "not in"):
        _check_broadcast(left, right)


def _check_broadcast(left: Any, right: Any) -> None:
    """Tensor arithmetic may not make a result larger than its largest operand (or the sequence budget)."""
    shapes = [tuple(v.shape) if isinstance(v, torch.Tensor) else () for v in (left, right)]
    if any(isinstance(v, _SEQUENCES) and len(v) > MAX_SEQUENCE for v in (left, right)):
        raise ConditionRefused(f"a condition may build sequences of at most {MAX_SEQUENCE} items")
    try:
        result = torch.broadcast_shapes(*shapes)
    except RuntimeError:
        return  # the operation itself reports the mismatch
    numel = 1
    for d in result:
        numel *= d
    if numel > max(MAX_SEQUENCE, _size(left), _size(right)):
        raise ConditionRefused(f"a condition may not broadcast tensors into {numel} elements")


def _check_tensor_index(base: torch.Tensor, index: Any) -> None:
    """Indexing a tensor with lists gathers a copy (``w[[[0] * 255] * 255]`` is 65,025 rows of ``w``):
    the result may not be larger than the tensor (or the sequence budget), decided on the meta device."""
    try:
        numel = torch.empty(base.shape, dtype=base.dtype, device="meta")[index].numel()
    except Exception:  # noqa: BLE001 - a boolean mask (data-dependent) or a bad index: never larger than the tensor
        return
    if numel > max(MAX_SEQUENCE, base.numel()):
        raise ConditionRefused(f"a condition may not index a tensor of {base.numel()} elements into {numel}")


_ITERATING = frozenset({"tuple", "sum", "all", "any", "min", "max"})


class _EvaluationState:
    """What one evaluation shares with the copies its generators read items in: how many more items
    they may visit (:data:`MAX_CONDITION_ITEMS` in all: nested generators multiply, so they count
    together), and the exception a function named by path raised (an error, not the condition's)."""

    __slots__ = ("items_left", "raised_by_function", "read_graph")

    def __init__(self) -> None:
        self.items_left = MAX_CONDITION_ITEMS
        self.raised_by_function: Optional[BaseException] = None
        self.read_graph = False  # see Evaluator.read_graph

    def take_item(self) -> None:
        self.items_left -= 1
        if self.items_left < 0:
            raise ConditionRefused(f"a condition's generators may visit at most {MAX_CONDITION_ITEMS} items in all")


def _slice_bound(value: Any) -> Any:
    """A slice's part: an int (a bool too, as in Python) or None; anything else raises, as Python's slicing of a
    sequence would (``$x.shape[1.5:]``: TypeError, so the match is refused with condition-raised). A
    slice builds nothing larger than what it slices, so it needs no budget of its own."""
    if value is None or isinstance(value, int):
        return value
    raise TypeError(f"slice indices must be integers or None, not {type(value).__name__}")


def _holds_node(value: Any) -> bool:
    if isinstance(value, fx.Node):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_node(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_node(v) for v in value.values())
    return False


def _check_builtin(name: str, args: list) -> None:
    if name == "range" and all(isinstance(a, int) for a in args) and 1 <= len(args) <= 3 \
            and not (len(args) == 3 and args[2] == 0) and len(range(*args)) > MAX_SEQUENCE:
        raise ConditionRefused(f"`range` in a condition has at most {MAX_SEQUENCE} items")
    if name in _ITERATING and any(_size(a) > MAX_SEQUENCE for a in args if isinstance(a, torch.Tensor)):
        raise ConditionRefused(f"`{name}` in a condition may iterate over at most {MAX_SEQUENCE} items")
    if name == "sum" and any(isinstance(a, _SEQUENCES) for a in args[1:] + _items(args)):
        # sum(lists, []) concatenates one by one: quadratic, and its result is not built by `+`'s check
        raise ConditionRefused("`sum` in a condition adds numbers, not sequences")
    if name == "round" and len(args) > 1 and isinstance(args[1], int) and abs(args[1]) > MAX_NDIGITS:
        raise ConditionRefused(f"`round` in a condition takes at most {MAX_NDIGITS} digits")


def _items(args: list) -> list:
    """The items of a sequence argument (what ``sum`` adds), none for anything else."""
    return list(args[0]) if args and isinstance(args[0], (list, tuple)) else []


def _bounded(value: Any) -> Any:
    """A computed value, checked against the budget (sizes that were checked before are checked again)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > MAX_INT_BITS:
        raise ConditionRefused(f"a condition may compute integers of at most {MAX_INT_BITS} bits")
    if isinstance(value, _SEQUENCES) and _weight(value) > MAX_SEQUENCE:
        raise ConditionRefused(f"a condition may build sequences of at most {MAX_SEQUENCE} items")
    return value


def _equal(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - a target whose == raises is not the one
        return False


def _bare_node(value: Any) -> bool:
    """A node without tensor metadata or a value (predicate_arg decides what to pass for it)."""
    return isinstance(value, fx.Node) and value.op != "get_attr" and tensor_info(value) is None \
        and "val" not in value.meta


def _plain(evaluator: Evaluator, value: Any) -> Any:
    if isinstance(value, fx.Node):
        value = evaluator.node_value(value)
    if isinstance(value, WrittenTensor):
        raise NotApplicable("values")  # compared, computed with or counted: its values are unknown
    return value


def _check_readable(values: list) -> None:
    """A function about to read its arguments' values: none may be a :class:`WrittenTensor`."""
    for value in values:
        if isinstance(value, WrittenTensor):
            raise NotApplicable("values")
