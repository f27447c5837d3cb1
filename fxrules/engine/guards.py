"""Contract guards: what a rewrite must keep, decided on fake values before the graph is edited.

A rule's contract (``[exact]``, ``[approx]``, ``[changes]``) is a promise about values. Where
the engine knows the values' metadata (``example_inputs``, a ``torch.export`` graph's
``meta['val']``, the verifier's host graphs), it checks the promise for every value a rewrite
replaces (each root) *before* it touches the graph, so a refused match leaves the workpiece as
it was. The checks, in the order they run (the first refusal wins):

* ``shape-changed``, ``dtype-changed``, ``device-changed``: under ``[exact]``/``[approx]`` the
  replacement has the root's shape, dtype and device. Under ``[changes]`` a difference is
  allowed and reported (:class:`~fxrules.engine.report.MetadataChange`).
* ``trainable-parameter-dropped``: under ``[exact]``/``[approx]``, in a model that trains, every
  parameter that requires grad and that a matched node reads is still read by the replacement.
  Needs no metadata: it runs on every graph.
* ``requires-grad-changed``: under ``[exact]``/``[approx]``, in a model that trains (see
  :func:`trainable_parameters_dropped`) and whose values were computed with autograd on, the
  replacement requires grad exactly when the root did.
* ``layout-changed``: under ``[exact]``, where a node downstream of the root reads strides
  (``view``, ``as_strided``, ``stride()``, ``is_contiguous()``, ...), or, with metadata, where the
  root flows into a graph output (the caller may read its strides), the replacement's strides
  equal the root's (dimensions of size 1 do not count: torch ignores their strides). Where the
  strides cannot be known (no metadata, or a value the dry run could not compute) such a root is
  not replaced: this one check also runs without metadata.
* ``output-alias-introduced`` (the planner's code, for what its alias tables miss): whatever the contract, a graph output the rewrite changes does not come
  to share storage with a parameter, a buffer or another output unless it did before (storage
  identity of fake tensors). Inputs are not protected: returning one's input is ordinary.

The replacement's values come from :class:`DryRun`: each call of the replacement runs on fake
tensors (modules as fake copies), never on the model's real tensors or modules; where a fake run
fails it runs on a deep copy with zero-filled inputs and forked random number generators, and the
copy is dropped. Either way nothing of the model, and no global random state, changes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

import torch
from torch import fx, nn

from fxrules.engine import fxaccess
from fxrules.engine.aliasing import ALIASING_MODULES
from fxrules.engine.budget import Budget, RealRunGuard, Unsized
from fxrules.engine.matcher import Match
from fxrules.engine.planner import ReplacementValues
from fxrules.engine.program import (RBuilder, RCall, RComputed, RNewModule, RReuse, RSeq, RShared,
                                    RRef, RSplat, RValue, shared_template)
from fxrules.engine.refusals import Refusal, RefusalCode
from fxrules.engine.report import MetadataChange

KEEPS_METADATA = frozenset({"exact", "approx"})
"""The contracts under which a replacement keeps each root's shape, dtype, device, requires_grad."""


class Unknown:
    """A value the dry run could not compute (its metadata is unknown: no guard is decided on it)."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why


@dataclass(frozen=True)
class Prospect:
    """What the dry run computed: per root the replacement's value, per replacement call its value
    (keyed by ``id`` of the :class:`RCall`, for the new nodes' ``meta['val']``), and the notes."""

    values: tuple
    made: Mapping[int, Any]
    notes: tuple


# ---------------------------------------------------------------------------
# The dry run: the replacement's values, computed on fake tensors
# ---------------------------------------------------------------------------


class DryRun(ReplacementValues):
    """Evaluates a match's replacement templates on the graph's fake values (nothing is built): the
    guards' reader of a replacement (:class:`planner.ReplacementValues`), a graph value read as its
    fake value (:meth:`of`)."""

    def __init__(self, work: Any, match: Match, modules: Mapping[int, nn.Module], computed: Mapping[int, Any]):
        super().__init__(match)
        self.work = work
        self.computed = computed  # id(RComputed) -> its value (the writer computed them first)
        self.modules = modules  # id(RCall) -> the module a builder or constructor made for it
        self.mode = work.fake_mode()
        self.made: dict = {}
        self.notes: list = []

    def run(self) -> Prospect:
        values = tuple(self.value(r) for r in self.match.program.replacements)
        return Prospect(values, self.made, tuple(self.notes))

    def _grad_mode(self) -> Any:
        """Autograd as the graph's values were computed: on where they track ``requires_grad``
        (example inputs), off otherwise. Entered where the dry run makes a value (a call, a fake
        copy of an attribute), not around the run: most replacements (``-> $x``, a matched node the
        rewrite keeps) make none, and entering it costs microseconds per match."""
        return torch.enable_grad() if self.work.tracks_grad else torch.no_grad()

    def computed_value(self, item: RComputed) -> Any:
        return self.computed[id(item)]

    def graph_value(self, value: Any) -> Any:
        return self.of(value)

    def of(self, value: Any) -> Any:
        """A graph value's metadata stand-in: a node's ``meta['val']`` (a get_attr: its tensor, made
        fake), containers item by item, constants as they are."""
        if isinstance(value, fx.Node):
            if "val" in value.meta:
                return value.meta["val"]
            if value.op == "get_attr":
                return self.fake(self.work.attr_of(value.target))
            return Unknown(f"%{value.name} has no meta['val']")
        if isinstance(value, (list, tuple)):
            return type(value)(self.of(v) for v in value)
        if isinstance(value, dict):
            return {k: self.of(v) for k, v in value.items()}
        return value

    def fake(self, value: Any) -> Any:
        if self.mode is not None and isinstance(value, torch.Tensor) and not fxaccess.is_fake_tensor(value):
            with self._grad_mode():
                return self.mode.from_tensor(value)
        return value

    def call(self, item: RCall) -> Any:
        if item.respells is not None:  # a matched node the rewrite keeps: its own value, where it has one
            result = self.of(self.env.names[item.respells])
            if not isinstance(result, Unknown):
                self.made[id(item)] = result
                return result
        result = self.made[id(item)] = self.evaluate(item)
        return result

    def evaluate(self, item: RCall) -> Any:
        with self._grad_mode():
            return self._evaluate(item)

    def _evaluate(self, item: RCall) -> Any:
        args, kwargs = self.arguments(item, self.match.roots[item.root_index])
        unknown = _first_unknown((args, kwargs))
        if unknown is not None:
            return unknown
        module = self.module(item) if item.op == "call_module" else None
        try:
            return self.fake_call(item, module, args, kwargs)
        except Exception as fake_error:
            try:
                return self.copy_call(item, module, args, kwargs)
            except Exception as exc:
                why = f"{type(fake_error).__name__}: {fake_error}; on a copy: {type(exc).__name__}: {exc}"
                self.notes.append(f"could not compute the value of {item.label} (rule `{self.match.rule.name}`): "
                                  f"{why}")
                return Unknown(why)

    def module(self, item: RCall) -> nn.Module:
        spec = item.target
        if isinstance(spec, RReuse):
            return self.work.module_of(self.env.names[spec.name].target)
        return self.modules[id(item)]

    def fake_call(self, item: RCall, module: Optional[nn.Module], args: tuple, kwargs: dict) -> Any:
        """The call on fake tensors; a module is called as a fake copy (its state changes nowhere), one
        per kind of module for the run (a thousand folded conv+bn modules of one shape: one copy)."""
        mode = self.mode
        if mode is None:
            raise RuntimeError("the graph's values are not fake tensors")
        if module is not None:
            module = fxaccess.fake_module_to_run(mode, module, self.work.fake_runs(mode))
        with mode:
            args, kwargs = fxaccess.to_fake(mode, args), fxaccess.to_fake(mode, kwargs)
            return _function(item, module, args)(*_rest(item, args), **kwargs)

    def copy_call(self, item: RCall, module: Optional[nn.Module], args: tuple, kwargs: dict) -> Any:
        """The call on zero-filled real tensors of the values' metadata, a module as a deep copy, with
        the random number generators forked: what it changes is dropped with the copy. The result is
        returned as fake tensors of the graph's mode (meta tensors where the graph's values are)."""
        if module is None and not _holds_tensor((args, kwargs)):
            # literals only: their size is the rule's to choose, not the example's (SECURITY.md)
            raise RuntimeError("a call on literals only is not run for real")
        if module is not None:
            module = copy.deepcopy(module)
        with torch.random.fork_rng(devices=[]):
            args, kwargs = _materialise(args), _materialise(kwargs)
            # sized on fake tensors op by op before it runs, as every real run of the engine is
            budget = Budget.for_model(module if module is not None else nn.Module(), (args, kwargs))
            with RealRunGuard(budget, Unsized.RUN_AND_COUNT):
                result = _function(item, module, args)(*_rest(item, args), **kwargs)
        return fxaccess.to_fake(self.mode, result) if self.mode is not None else _as_meta(result)


def _function(item: RCall, module: Optional[nn.Module], args: tuple) -> Callable:
    if item.op == "call_function":
        return item.target
    if item.op == "call_method":
        return getattr(args[0], item.target)
    return fxaccess.hooks_call(module)


def _rest(item: RCall, args: tuple) -> tuple:
    return tuple(args[1:]) if item.op == "call_method" else args


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    return False


def _first_unknown(value: Any) -> Optional[Unknown]:
    if isinstance(value, Unknown):
        return value
    if isinstance(value, (list, tuple)):
        for v in value:
            found = _first_unknown(v)
            if found is not None:
                return found
    elif isinstance(value, dict):
        return _first_unknown(tuple(value.values()))
    return None


def _materialise(value: Any) -> Any:
    """Zero-filled real tensors with a value's shape, strides, dtype and requires_grad (meta and
    fake tensors become CPU tensors; real ones are copied, never handed over)."""
    if isinstance(value, torch.Tensor):
        device = value.device if value.device.type != "meta" else torch.device("cpu")
        shape = tuple(int(d) for d in value.shape)
        stride = tuple(int(s) for s in value.stride())
        made = torch.zeros_like(torch.empty_strided(shape, stride, dtype=value.dtype, device=device))
        if value.requires_grad and (made.is_floating_point() or made.is_complex()):
            made.requires_grad_(True)
        return made
    if isinstance(value, (list, tuple)):
        return type(value)(_materialise(v) for v in value)
    if isinstance(value, dict):
        return {k: _materialise(v) for k, v in value.items()}
    return value


def _as_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        meta = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        return meta.requires_grad_(True) if value.requires_grad else meta
    if isinstance(value, (list, tuple)):
        return type(value)(_as_meta(v) for v in value)
    return value


# ---------------------------------------------------------------------------
# The guards
# ---------------------------------------------------------------------------


def check(work: Any, match: Match, modules: Mapping[int, nn.Module],
          prospect: Optional[Prospect]) -> "Refusal | tuple[MetadataChange, ...]":
    """A Refusal, or the metadata changes a ``[changes]`` rewrite makes (empty otherwise).

    ``prospect``: the dry run's values (None when the graph has no values: only the trainable
    parameter guard, which needs none, runs then)."""
    contract = match.rule.contract
    keeps = contract in KEEPS_METADATA
    changes: tuple = ()
    if prospect is not None:
        found = metadata_changes(work, match, prospect.values)
        if keeps:
            refusal = next((_refusal(match, c) for c in found if c.what != "requires_grad"), None)
            if refusal is None:
                refusal = trainable_parameters_dropped(work, match, modules)
            if refusal is None:
                refusal = next((_refusal(match, c) for c in found), None)
            if refusal is None and contract == "exact":
                refusal = layout_changed(match, prospect.values, work.stride_readers)
            if refusal is not None:
                return refusal
        else:
            changes = tuple(c for c in found if c.what != "requires_grad")
        refusal = output_aliased(work, match, prospect.values)
        if refusal is not None:
            return refusal
    elif keeps:
        refusal = trainable_parameters_dropped(work, match, modules)
        if refusal is None and contract == "exact":
            refusal = layout_unknown(work, match)
        if refusal is not None:
            return refusal
    return changes


_CODES = {"shape": RefusalCode.SHAPE_CHANGED, "dtype": RefusalCode.DTYPE_CHANGED,
          "device": RefusalCode.DEVICE_CHANGED, "requires_grad": RefusalCode.REQUIRES_GRAD_CHANGED}


def _refusal(match: Match, change: MetadataChange) -> Refusal:
    nodes = (change.root,) + ((change.replacement[1:],) if change.replacement.startswith("%") else ())
    return Refusal(_CODES[change.what],
                   f"[{match.rule.contract}] rule `{match.rule.name}` would replace %{change.root} "
                   f"({change.before}) by {change.replacement} ({change.after}): its {change.what} changes",
                   nodes)


def _described(match: Match, index: int) -> str:
    """How the report names root ``index``'s replacement: ``%node`` for an existing value, else the call."""
    item = match.program.replacements[index]
    if isinstance(item, RValue):
        bound = (match.bindings.captures if item.is_capture else match.bindings.names)[item.name]
        if isinstance(bound, fx.Node):
            return f"%{bound.name}"
    if isinstance(item, RCall):
        return f"a new {item.op} {item.label}"
    return "its replacement"


def metadata_changes(work: Any, match: Match, values: tuple) -> tuple:
    """Each difference in shape, dtype, device (and requires_grad, where it is tracked and the
    model trains) between a root's value and its replacement's, roots in order."""
    found = []
    grad = work.tracks_grad and work.trains
    for index, (root, value) in enumerate(zip(match.roots, values)):
        before = root.meta.get("val")
        for old, new in _paired(before, value):
            if old.dtype == new.dtype and old.device == new.device and _same_shape(old.shape, new.shape) \
                    and (not grad or old.requires_grad == new.requires_grad):
                continue  # the common case, asked without building the four comparisons below
            for what, a, b in (("shape", _shape(old), _shape(new)), ("dtype", old.dtype, new.dtype),
                               ("device", _device(old), _device(new)),
                               ("requires_grad", old.requires_grad, new.requires_grad)):
                if what == "requires_grad" and not grad:
                    continue
                if what == "shape" and _same_shape(a, b):
                    continue
                if what != "shape" and a == b:
                    continue
                found.append(MetadataChange(match.rule.name, match.rule.source, root.name,
                                            _described(match, index), what, _text(old), _text(new)))
    return tuple(found)


def _paired(before: Any, after: Any) -> Iterable[tuple]:
    """The (root tensor, replacement tensor) pairs to compare: both tensors, or sequences of the
    same length item by item; anything unknown is skipped."""
    if isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor):
        yield before, after
    elif isinstance(before, (list, tuple)) and isinstance(after, (list, tuple)) and len(before) == len(after):
        for a, b in zip(before, after):
            yield from _paired(a, b)


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def _device(t: torch.Tensor) -> str:
    return str(t.device)


def _same_shape(a: tuple, b: tuple) -> bool:
    """Equal shapes; symbolic sizes compare by their expression."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, int) and isinstance(y, int):
            if x != y:
                return False
        elif str(x) != str(y):
            return False
    return True


def _text(t: torch.Tensor) -> str:
    dtype = str(t.dtype).removeprefix("torch.")
    grad = ", requires_grad" if t.requires_grad else ""
    return f"{dtype}[{', '.join(str(d) for d in t.shape)}] on {t.device}{grad}"


# -- layout ------------------------------------------------------------------------

_STRIDE_METHODS = frozenset({"view", "view_as", "as_strided", "stride", "is_contiguous", "data_ptr",
                             "storage_offset", "unflatten", "untyped_storage", "storage", "is_set_to"})
"""Tensor methods whose result (or whether they succeed) depends on the input's strides."""


_STRIDE_FUNCTIONS = frozenset({torch.Tensor.view, torch.Tensor.view_as, torch.Tensor.as_strided, torch.as_strided,
                               torch.Tensor.stride, torch.Tensor.is_contiguous, torch.Tensor.data_ptr,
                               torch.Tensor.storage_offset, torch.Tensor.unflatten, torch.unflatten,
                               torch.Tensor.untyped_storage})
"""The same, as call_function targets."""


def _reads_strides(node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in _STRIDE_METHODS
    if node.op == "call_function":
        target = node.target
        if fxaccess.is_op_overload(target):
            name = target.overloadpacket.__name__
            return name in _STRIDE_METHODS or name == "_unsafe_view"
        try:
            return target in _STRIDE_FUNCTIONS
        except TypeError:  # an unhashable target
            return False
    return False


def stride_reader(root: fx.Node, *, outputs_read: bool = False,
                  known: "Optional[StrideWalks]" = None) -> Optional[fx.Node]:
    """A node downstream of ``root`` (through any chain of users: views, and elementwise ops,
    pass their input's layout on) that reads strides; None when there is none.

    ``outputs_read``: whether the graph's ``output`` node counts as a reader. The caller of the
    model may ``.view`` what it returns, so where the strides are known to differ (metadata) an
    output reached from the root is protected like an in-graph ``view``; without metadata it is
    not (every existing-value replacement feeding an output would be refused; docs/semantics.md).

    The reader named is the first in a depth-first walk that takes each node's users last first.
    ``known``: what earlier walks found, for this ``outputs_read`` (:class:`StrideWalks`, kept by
    :meth:`fxrules.engine.transaction.Workpiece.stride_readers` through the run's edits), filled as
    the walk finishes nodes: the matches of a chain each asking walked the rest of the chain (a chain
    of 4,000 ``+ 0`` before a ``view``, without metadata: 3.4 s)."""
    if known is None:
        known = StrideWalks(outputs_read)
    for user in reversed(root.users):
        found = _reader_at_or_below(user, outputs_read, known)
        if found is not None:
            return found
    return None


class StrideWalks:
    """What :func:`stride_reader`'s walks found below nodes, for one graph and one ``outputs_read``:
    ``found``, node -> the first reader at or below it in the walk's order; ``none``, the nodes with no
    reader at or below them.

    Kept through edits where it still holds, told of each by the workpiece:

    * a reader found below a node holds until the next edit (any edit may take it away, or put
      another first in the walk's order): ``found`` is dropped at every edit;
    * "no reader below" holds through every edit that only takes users away (an erase, a node whose
      users move elsewhere), and through one that gives a value users with no reader at or below them
      (:meth:`gave`) or makes a node that reads no strides (:meth:`made`: a node is made without
      users): what the value reaches gains no reader. Any other edit drops ``none``.

    (Dropped at every edit, the walks of a chain of views made ``reshape`` from the last up, each view
    above turned down until the one below went, walked the rest of the chain per rewrite: 2,000 views,
    4.9 s.)"""

    __slots__ = ("outputs_read", "found", "none")

    def __init__(self, outputs_read: bool):
        self.outputs_read = outputs_read
        self.found: dict = {}
        self.none: set = set()

    def made(self, node: fx.Node) -> None:
        """``node`` was made (with no users yet): its inputs reach it. (A rewrite never makes an output node.)"""
        self.found = {}
        if self.none and _reads_strides(node):
            self.none = set()

    def gave(self, users: Iterable[fx.Node]) -> None:
        """A value became an input of each of ``users`` (``replace_uses``: the replaced node's users;
        ``repoint``: the one user)."""
        self.found = {}
        none = self.none
        if none and any(user not in none for user in users):
            self.none = set()

    def took(self) -> None:
        """Users were taken away (a node erased): nothing more is reached."""
        self.found = {}


_DONE = object()


def _reader_at_or_below(start: fx.Node, outputs_read: bool, known: StrideWalks) -> Optional[fx.Node]:
    """``start`` if it reads strides, else the first reader below it (see :func:`stride_reader`), or None;
    each node the walk finishes is entered in ``known``."""
    found, none = known.found, known.none
    if start in none:
        return None
    hit = found.get(start)
    if hit is not None:
        return hit
    if _reads_strides(start) or (outputs_read and start.op == "output"):
        found[start] = start
        return start
    stack = [(start, iter(reversed(start.users)))]
    while stack:
        user = next(stack[-1][1], _DONE)
        if user is _DONE:  # nothing reads strides below this node
            none.add(stack.pop()[0])
            continue
        if user in none:
            continue
        hit = found.get(user)
        if hit is None:
            if _reads_strides(user) or (outputs_read and user.op == "output"):
                hit = found[user] = user
            else:
                stack.append((user, iter(reversed(user.users))))
                continue
        for node, _ in stack:  # the first reader below each node on the way down is this one
            found[node] = hit
        return hit
    return None


def _layout_key(t: torch.Tensor) -> tuple:
    """The strides that matter: those of dimensions longer than 1 (symbolic ones by their expression)."""
    return tuple((i, str(s)) for i, (d, s) in enumerate(zip(t.shape, t.stride())) if str(d) != "1")


_INT = frozenset({int})


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` have the same strides where it matters (:func:`_layout_key`). Plain
    integer sizes and strides compare as integers; anything symbolic compares by its expression."""
    shape, strides, other_shape, other_strides = a.shape, a.stride(), b.shape, b.stride()
    if set(map(type, (*shape, *strides, *other_shape, *other_strides))) <= _INT:
        return [(i, s) for i, (d, s) in enumerate(zip(shape, strides)) if d != 1] \
            == [(i, s) for i, (d, s) in enumerate(zip(other_shape, other_strides)) if d != 1]
    return _layout_key(a) == _layout_key(b)


def layout_changed(match: Match, values: tuple,
                   known: Optional[Callable[[bool], StrideWalks]] = None) -> Optional[Refusal]:
    """``known(outputs_read)``: what :func:`stride_reader` may read and fill (the workpiece's
    ``stride_readers``); without it each question walks anew."""
    known = known if known is not None else _walk_anew
    for index, (root, value) in enumerate(zip(match.roots, values)):
        before = root.meta.get("val")
        if isinstance(before, torch.Tensor) != isinstance(value, torch.Tensor) \
                and (isinstance(value, Unknown) or before is None):
            refusal = _layout_unknown(match, index, root, known(False))  # one side's strides cannot be known
            if refusal is not None:
                return refusal
            continue
        if not (isinstance(before, torch.Tensor) and isinstance(value, torch.Tensor)):
            continue
        try:
            same = _same_layout(before, value)
        except Exception:  # a tensor without strides (sparse, nested): nothing to compare
            continue
        if same:
            continue
        reader = stride_reader(root, outputs_read=True, known=known(True))
        if reader is not None:
            described = _described(match, index)
            nodes = (root.name, reader.name) + ((described[1:],) if described.startswith("%") else ())
            who = ("the model's output (its caller may depend on the strides: `.view`)" if reader.op == "output"
                   else f"%{reader.name}")
            return Refusal(RefusalCode.LAYOUT_CHANGED,
                           f"[exact] rule `{match.rule.name}` would replace %{root.name} (strides "
                           f"{tuple(before.stride())}) by {described} (strides {tuple(value.stride())}), and "
                           f"{who} depends on the strides", nodes)
    return None


def has_stride_reader(graph: fx.Graph) -> bool:
    """Whether any node of ``graph`` reads strides (:func:`is_stride_reader`)."""
    return count_stride_readers(graph) > 0


def count_stride_readers(graph: fx.Graph) -> int:
    """How many nodes of ``graph`` read strides: one pass over its nodes. The workpiece counts once per
    run and then keeps the count as nodes come and go (``Workpiece.has_stride_reader``). A call_function
    target is classified once (:func:`_reads_strides` decides, per target)."""
    count = 0
    functions: dict = {}  # call_function target -> whether its calls read strides
    for node in graph.nodes:
        op = node.op
        if op == "call_function":
            target = node.target
            try:
                reads = functions.get(target)
            except TypeError:  # an unhashable target
                reads = _reads_strides(node)
            if reads is None:
                reads = functions[target] = _reads_strides(node)
        elif op == "call_method":
            reads = node.target in _STRIDE_METHODS  # what _reads_strides answers for a method
        else:
            continue
        if reads:
            count += 1
    return count


is_stride_reader = _reads_strides
"""Whether ``node`` is of a kind :func:`count_stride_readers` counts (the one classifier)."""


def layout_unknown(work: Any, match: Match) -> Optional[Refusal]:
    """Without metadata (no ``example_inputs``, no ``meta['val']``) strides cannot be compared: under
    ``[exact]`` a root that a later node reads the strides of is not replaced by an existing value
    (``-(-x) -> x``: the root is a fresh, contiguous tensor, x may be strided), nor by new calls that
    choose their layout by their input's (:func:`_chooses_layout`: ``reshape``, ``contiguous``, casts, unknown
    functions). Other new calls lay their result out as the root's ops did, and a module that returns its
    input (eval dropout) has its input's layout: those are not refused. So the layout guard
    holds in every mode: a rule is never applied where a stride reader could see a changed layout (with
    metadata only where the strides differ; without, wherever such a reader exists). The verifier relies
    on this to count a ``layout-changed`` refusal on a host as a non-application (docs/verify.md)."""
    if not match.roots:
        return None
    graph = match.roots[0].graph
    known = getattr(work, "has_stride_reader", None)  # the workpiece keeps a count as nodes come and go
    if not (known() if known is not None and graph is work.graph else has_stride_reader(graph)):
        return None
    for index, root in enumerate(match.roots):
        item = match.program.replacements[index]
        if isinstance(item, RValue) and _returns_its_input(work, root):
            continue  # an alias of x is x's layout
        if not isinstance(item, RValue) and not _chooses_layout(item, match.program.replacements):
            continue  # new calls that lay their result out as the root's ops did (see _chooses_layout)
        refusal = _layout_unknown(match, index, root, work.stride_readers(False))
        if refusal is not None:
            return refusal
    return None


LAYOUT_CHOOSING_METHODS = frozenset({
    "reshape", "reshape_as", "flatten", "ravel", "to", "type", "type_as", "float", "double", "half", "bfloat16",
    "int", "long", "short", "char", "byte", "bool", "cfloat", "cdouble", "cpu", "cuda",
})
"""Tensor methods whose result is a view of the input, or the input itself, when its strides or dtype allow,
and a fresh copy otherwise (contiguous, or only dense layouts kept): on a strided input the same call gives
the input's strides or new ones depending on what came before it (reviewed). Not ``contiguous`` (always
contiguous), ``clone`` and elementwise ops (a dense input's layout, else contiguous: applying them again
changes nothing), views (their strides compose)."""

LAYOUT_CHOOSING_OPS = frozenset({"reshape", "flatten", "ravel", "to"})
"""``torch.*`` functions and aten ops (by name or overload packet) of the same kind as
:data:`LAYOUT_CHOOSING_METHODS`."""


def _chooses_layout(item: Any, replacements: tuple) -> bool:
    """Whether a replacement template builds a call whose layout can differ from the root's where the rule
    is right about values: a :data:`LAYOUT_CHOOSING_METHODS` or :data:`LAYOUT_CHOOSING_OPS` call anywhere in
    it (``reshape(reshape(x, a), b) -> reshape(x, b)``: the chain copied a strided x, the new reshape may
    view it), or a function the engine does not know. Elementwise ops (their result follows a dense
    input's layout, else is contiguous, whatever came before), views (strides compose exactly) and modules
    (their ops decide) are not: ``relu(relu(x)) -> relu(x)`` keeps the layout. The verifier checks the
    rest: with metadata, a ``layout-changed`` refusal on a host is replayed without it
    (``fxrules.verifier.driver._layout_without_metadata``)."""
    from fxrules.engine import aliasing

    if isinstance(item, RShared):
        return _chooses_layout(item.inner, replacements)
    if isinstance(item, RRef):  # a later use of a shared node: what its call chooses
        return _chooses_layout(shared_template(replacements, item.name), replacements)
    if isinstance(item, RSeq):
        return any(_chooses_layout(i, replacements) for i in item.items)
    if not isinstance(item, RCall):
        return False
    if item.op == "call_method":
        if item.target in LAYOUT_CHOOSING_METHODS:
            return True
    elif item.op == "call_function":
        target = item.target
        packet = getattr(target, "overloadpacket", None)
        name = getattr(packet if packet is not None else target, "__name__", None)
        if name in LAYOUT_CHOOSING_OPS or not aliasing.function_is_known(target):
            return True
    return any(_chooses_layout(a, replacements) for a in (item.args or ())) or \
        any(_chooses_layout(v, replacements) for _, v in item.kwargs)


def _returns_its_input(work: Any, root: fx.Node) -> bool:
    """Whether ``root`` is a module call of a kind that returns its input itself in eval mode (dropout,
    identity): replacing it by that input keeps the layout."""
    if root.op != "call_module":
        return False
    module = work.module_of(root.target)
    return isinstance(module, ALIASING_MODULES) and not isinstance(module, (nn.Flatten, nn.Unflatten))


def _walk_anew(outputs_read: bool) -> StrideWalks:
    return StrideWalks(outputs_read)


def _layout_unknown(match: Match, index: int, root: fx.Node,
                    known: Optional[StrideWalks] = None) -> Optional[Refusal]:
    reader = stride_reader(root, known=known)
    if reader is None:
        return None
    described = _described(match, index)
    nodes = (root.name, reader.name) + ((described[1:],) if described.startswith("%") else ())
    return Refusal(RefusalCode.LAYOUT_CHANGED,
                   f"[exact] rule `{match.rule.name}` would replace %{root.name} by {described}, whose strides "
                   f"cannot be compared (no metadata: pass example_inputs), and %{reader.name} depends on the "
                   f"strides", nodes)


# -- what a refusal read beyond the match ------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadBeyond:
    """What a guard's refusal read outside the match's own nodes and bound values (on which the driver's
    wait sends a refused match back): for ``layout-changed``, the graph below the root (whether some node
    there reads strides, by the walk that found the reader the refusal names: with the graph's output
    counted as a reader or not); for the guard's ``output-alias-introduced``, the graph's outputs (the
    output node's ``args`` as they were). A rewrite far from the match can take either away (a ``view``
    below a chain rewritten into a ``reshape``; another output replaced): the driver asks
    :meth:`may_have_lapsed` when its worklist runs dry, and tries the match again where the answer is yes,
    so a run ends at a fixpoint (before, the next run found such a match)."""

    root: fx.Node
    outputs_read: bool
    outputs: Any  # the output node's args when refused (output-alias-introduced); None for a layout refusal
    reader: Optional[fx.Node] = None  # the stride reader the refusal named (a layout refusal)

    def watched(self) -> tuple:
        """Nodes whose loss of a user shows the reader named going (it is erased, or reads another value):
        the reader's inputs, one of which is on the walk's path from the root. The driver sends the match
        back when one of them loses a user (a chain of views each turned down for the view two levels
        below, rewritten from the last up, waited otherwise for a sweep per rewrite: quadratic). None for
        the output node (never erased; it reads every output) or the outputs."""
        reader = self.reader
        if reader is None or reader.op == "output":
            return ()
        return tuple(reader.all_input_nodes)

    def may_have_lapsed(self, work: Any) -> bool:
        """Whether the refusal may no longer hold: the outputs changed, or no node below the root reads
        strides now (by the same walk). False is exact: what the refusal read is as it was; what it read
        inside the match is what the driver's wait watches."""
        if self.outputs is not None:
            return self.root.graph.output_node().args is not self.outputs
        return stride_reader(self.root, outputs_read=self.outputs_read,
                             known=work.stride_readers(self.outputs_read)) is None


def read_beyond(work: Any, match: Match, refusal: Refusal) -> Optional[ReadBeyond]:
    """What ``refusal`` (of :func:`check`, for ``match``, on ``work`` as it is: nothing edited since) read
    beyond the match; None when it read only the match's nodes and bound values. ``work``: the workpiece,
    whose kept walks find the reader again (None: walk anew). A layout refusal names the root first and
    the stride reader second (:func:`layout_changed`, :func:`_layout_unknown`): a reader that is the output
    was found with the output counted; any other reader is found by the walk without it too (which finds a
    reader exactly when neither walk may pass the match: the walk with the output counted finds one
    whenever it does)."""
    code = refusal.code
    if code is not RefusalCode.LAYOUT_CHANGED and code is not RefusalCode.OUTPUT_ALIAS_INTRODUCED:
        return None
    name = refusal.nodes[0]
    root = next((r for r in match.roots if r.name == name), match.roots[0])
    output = root.graph.output_node()
    if code is RefusalCode.OUTPUT_ALIAS_INTRODUCED:
        return ReadBeyond(root, True, output.args)
    outputs_read = len(refusal.nodes) > 1 and refusal.nodes[1] == output.name
    known = work.stride_readers(outputs_read) if work is not None else None
    return ReadBeyond(root, outputs_read, None, stride_reader(root, outputs_read=outputs_read, known=known))


# -- aliasing ----------------------------------------------------------------------


def _storage(value: Any) -> Optional[int]:
    """The identity of a fake tensor's storage (views share it); None for anything else."""
    if not isinstance(value, torch.Tensor) or not fxaccess.is_fake_tensor(value):
        return None  # meta values (a real run's) carry no storage identity: nothing to compare
    try:
        return fxaccess.storage_key(value)
    except Exception:
        return None


def output_aliased(work: Any, match: Match, values: tuple) -> Optional[Refusal]:
    """A graph output that shares storage with a root (the root itself, or a view of it) would share
    the replacement's storage instead: refused when that storage is a parameter's, a buffer's or
    another output's and the root's was not.

    The outputs sharing the root's storage (``old``) are the ones affected (the root among them, when it is
    returned); what shares ``old`` besides them is parameters and buffers only, and no output sharing the
    replacement's storage (``new``, not ``old``) is affected. So the storage the rewrite would add is that of
    the parameters and buffers sharing ``new``, then of the outputs sharing it: the first of them is the one
    named. Both are read from :class:`OutputStorages` (a graph returning thousands of values asked this per
    match walked them all: 1,200 returned ``relu(relu(x))``, 4.1 s)."""
    index = None
    for position, (root, value) in enumerate(zip(match.roots, values)):
        old, new = _storage(root.meta.get("val")), _storage(value)
        if new is None or new == old:
            continue
        if index is None:
            index = OutputStorages.of(work)
        if not index.outputs:
            return None
        if old is None or not index.counts.get(old):  # no output shares the root's storage
            continue
        added = index.first_sharing(work, new)
        if added is not None:
            described = _described(match, position)
            return Refusal(RefusalCode.OUTPUT_ALIAS_INTRODUCED,
                           f"rule `{match.rule.name}` would make the graph output %{index.first_output(old).name} "
                           f"share storage with {added}: %{root.name} is replaced by {described}",
                           (root.name,) + ((described[1:],) if described.startswith("%") else ()))
    return None


class OutputStorages:
    """The graph's output values by storage identity (:func:`_storage`), and its parameters and buffers
    (``get_attr`` nodes) by the same, for :func:`output_aliased`; kept in ``work.output_storages``.

    Kept through the run by the workpiece's edits, which tell it of each output value replaced by another
    (:meth:`rewired`: ``replace_uses`` and ``repoint``) and of a value given to a returned node
    (:meth:`revalued`: ``set_value``); no rewrite makes or erases an output node, and a node made gets its
    value before anything reads it. An output node whose ``args`` changed otherwise (another object than
    the one last seen) makes it anew. (Made anew per rewire, or checked value by value per match, it was
    itself a walk of every output per rewrite: 1,200 returned values, 2.6 times torch's own cost of
    rewiring the output node.) The first output of a storage is found by walking the outputs, when a
    refusal names it. The get_attr nodes are indexed once: rewrites erase get_attr nodes but never make
    one (an erased one is left out when read)."""

    __slots__ = ("graph", "ends", "outputs", "where", "counts", "keys", "attrs")

    def __init__(self, graph: fx.Graph, keys: dict, attrs: Optional[dict]):
        self.graph = graph
        self.ends = [(node, node.args) for node in graph.find_nodes(op="output")]
        outputs: list = []
        for _, args in self.ends:
            fx.node.map_arg(args, outputs.append)
        self.outputs = outputs  # the values returned, in order (a value returned twice: twice)
        self.keys = keys  # node -> (its meta['val'], that value's storage identity)
        self.attrs = attrs  # storage identity -> get_attr nodes in graph order, made on first use
        where: dict = {}  # value -> its positions in outputs
        counts: dict = {}  # storage identity -> how many positions hold a value of that storage
        for position, node in enumerate(outputs):
            where.setdefault(node, []).append(position)
            key = self.key_of(node)
            if key is not None:
                counts[key] = counts.get(key, 0) + 1
        self.where, self.counts = where, counts

    @classmethod
    def of(cls, work: Any) -> "OutputStorages":
        kept = work.output_storages
        graph = work.graph
        if kept is not None and kept.graph is graph and all(node.args is args for node, args in kept.ends):
            return kept
        made = work.output_storages = cls(graph, kept.keys if kept is not None else {},
                                          kept.attrs if kept is not None else None)
        return made

    def key_of(self, node: fx.Node) -> Optional[int]:
        val = node.meta.get("val")
        known = self.keys.get(node)
        if known is None or known[0] is not val:
            known = self.keys[node] = (val, _storage(val))
        return known[1]

    def _count(self, key: Optional[int], change: int) -> None:
        if key is not None:
            self.counts[key] = self.counts.get(key, 0) + change

    def rewired(self, old: fx.Node, new: fx.Node) -> None:
        """Every use of ``old`` became a use of ``new`` (told after the edit): the outputs that were ``old``
        are ``new``."""
        positions = self.where.pop(old, None)
        if positions is None:
            return
        for position in positions:
            self.outputs[position] = new
        self._count(self.key_of(old), -len(positions))
        self._count(self.key_of(new), len(positions))
        self.where[new] = sorted(self.where.get(new, []) + positions)
        self.ends = [(node, node.args) for node, _ in self.ends]

    def revalued(self, node: fx.Node) -> None:
        """``node`` has another ``meta['val']`` (told after the edit)."""
        positions = self.where.get(node)
        known = self.keys.get(node)
        if positions is None or known is None:
            return
        self._count(known[1], -len(positions))
        self._count(self.key_of(node), len(positions))

    def first_output(self, key: int) -> fx.Node:
        """The first output of storage ``key`` (one exists: :attr:`counts`)."""
        return next(node for node in self.outputs if self.key_of(node) == key)

    def first_sharing(self, work: Any, key: int) -> Optional[str]:
        """The first parameter or buffer (in graph order), else the first output, whose storage is ``key``,
        described; None when there is none."""
        if self.attrs is None:
            attrs: dict = {}
            for node in self.graph.find_nodes(op="get_attr"):
                found = _storage(node.meta.get("val"))
                if found is not None:
                    attrs.setdefault(found, []).append(node)
            self.attrs = attrs
        for node in self.attrs.get(key, ()):
            if not fxaccess.erased(node):
                kind = "parameter" if isinstance(work.attr_of(node.target), nn.Parameter) else "buffer"
                return f"the {kind} `{node.target}`"
        return f"the output %{self.first_output(key).name}" if self.counts.get(key) else None


# -- trainable parameters ------------------------------------------------------------------


def trainable_parameters_dropped(work: Any, match: Match, modules: Mapping[int, nn.Module]) -> Optional[Refusal]:
    """A parameter that requires grad, read by a matched node, that the replacement no longer reads:
    the rewritten model would not train it (along this path, or at all). Only in a model that
    trains (``work.trains``: an ``nn.Module`` or ``GraphModule`` in training mode)."""
    if not work.trains:
        return None
    env = match.bindings
    # get_attr values bound by captures count too: matched nodes read them, and a builder that
    # consumes one (a fold's `$beta`) takes it off the gradient path unless the replacement forwards it
    captured: list = []
    _nodes_in(list(env.captures.values()), captured)
    read = _trainable_read(work, list(env.nodes) + list(env.attrs) + [n for n in captured if n.op == "get_attr"])
    if not read:
        return None
    kept = _kept_parameters(work, match, modules)
    for name, parameter in read:
        if id(parameter) not in kept:
            return Refusal(RefusalCode.TRAINABLE_PARAMETER_DROPPED,
                           f"[{match.rule.contract}] rule `{match.rule.name}` would drop the trainable parameter "
                           f"`{name}` (requires_grad=True) from the gradient path; the model is in training mode "
                           f"(a rule may say `where frozen(...)`, or freeze the parameters, or rewrite in eval mode)",
                           (match.roots[0].name,))
    return None


def _trainable_read(work: Any, nodes: Iterable[fx.Node]) -> list:
    """(name, parameter) for each parameter requiring grad that these nodes read."""
    found: dict = {}
    for node in nodes:
        if node.op == "get_attr":
            value = work.attr_of(node.target)
            if isinstance(value, torch.Tensor) and value.requires_grad:
                found.setdefault(id(value), (node.target, value))
        elif node.op == "call_module":
            module = work.module_of(node.target)
            if isinstance(module, nn.Module):
                for name, p in module.named_parameters():
                    if p.requires_grad:
                        found.setdefault(id(p), (f"{node.target}.{name}", p))
    return list(found.values())


def _kept_parameters(work: Any, match: Match, modules: Mapping[int, nn.Module]) -> set:
    """ids of the parameters the replacement reads: get_attr values and modules it uses, the
    matched nodes it names (and what they read inside the match), modules it re-calls or builds."""
    env = match.bindings
    matched = env.nodes
    kept: set = set()
    nodes: list = []
    stack = list(match.program.replacements)
    while stack:
        item = stack.pop()
        if isinstance(item, RValue):
            _nodes_in((env.captures if item.is_capture else env.names).get(item.name), nodes)
        elif isinstance(item, RSeq):
            stack.extend(item.items)
        elif isinstance(item, RShared):
            stack.append(item.inner)
        elif isinstance(item, RSplat):
            _nodes_in(env.captures.get(item.name), nodes)
        elif isinstance(item, RCall):
            if item.args is None:
                root = match.roots[item.root_index]
                _nodes_in((root.args, root.kwargs), nodes)
            else:
                stack.extend(item.args)
                stack.extend(v for _, v in item.kwargs)
                if item.rest and env.rest is not None:
                    _nodes_in(env.rest, nodes)
            target = item.target
            if isinstance(target, RReuse):
                nodes.append(env.names[target.name])
            elif isinstance(target, (RBuilder, RNewModule)) and id(item) in modules:
                kept.update(id(p) for p in modules[id(item)].parameters())
    seen: set = set()
    while nodes:
        node = nodes.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "get_attr":
            kept.add(id(work.attr_of(node.target)))
        elif node.op == "call_module":
            module = work.module_of(node.target)
            if isinstance(module, nn.Module):
                kept.update(id(p) for p in module.parameters())
        if node in matched:  # a matched node the replacement keeps: what it reads stays
            nodes.extend(n for n in node.all_input_nodes if n in matched or n in env.attrs)
    return kept


def _nodes_in(value: Any, found: list) -> None:
    if isinstance(value, fx.Node):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _nodes_in(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _nodes_in(item, found)
