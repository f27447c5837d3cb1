"""What a replacement (or an example) brings into a graph that its pattern did not have: literal
sizes over the allocation budget, random numbers, devices.

Three checks, each a located diagnostic (SECURITY.md, docs/language.md):

* ``allocation-budget``: a call whose size arguments (a factory's shape, ``new_*``, ``resize_``,
  ``expand``, ``repeat``, ``view``/``reshape`` targets, ``arange``/``linspace`` counts, ...) are
  literals whose product is over :data:`MAX_LITERAL_ELEMENTS`. The value is the rule file's alone,
  and building it costs that much memory wherever the rewritten graph runs. Checked in
  replacements and examples. (What sizes computed from the data ask for is bounded when fxrules
  runs a graph: :mod:`fxrules.engine.budget`.)
* ``random-state``: an ``[exact]`` or ``[approx]`` replacement that calls a random-number op
  (flagged ``RANDOM_*`` in the allow-list) its pattern does not call: its outputs cannot equal the
  original's, and it draws from the global generator. ``[changes]`` rules may. Dropout-like calls
  count only when their training argument is not the literal ``False`` (``p=0`` for attention's
  ``dropout_p``). Patterns and examples may name them (matching dropout is how it is removed).
* ``device-move``: a replacement that names a device its pattern does not (a device string
  ``"cuda:3"``, a ``device=`` value, an integer device index to ``to``, ``pin_memory=True``, the
  ``cpu`` method): a rewrite must not move a model's values to another device. Examples may name
  only ``"cpu"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Optional

import fxrules.lang.ast as A
from fxrules.lang import allowlist
from fxrules.lang.check.reporter import Reporter
from fxrules.lang.check.scope import Aliases
from fxrules.lang.names import BUILTIN_ALIASES, builtin_path

MAX_LITERAL_ELEMENTS = 1 << 24
"""The most elements literal sizes may ask for: 16M (64 MiB of float32, the allocation budget's floor)."""

ALLOCATION_CODE, RANDOM_CODE, DEVICE_CODE = "allocation-budget", "random-state", "device-move"

NEUTRAL_CONTRACTS = ("exact", "approx")
"""Contracts under which a replacement may not introduce random numbers."""


@dataclass(frozen=True, slots=True)
class Sizes:
    """Where a call's sizes are: the positional arguments ``first`` on (ints or lists of ints) when
    ``rest``, else only those at ``indices``; and the keywords in ``keywords``."""

    indices: tuple[int, ...] = ()
    first: int = 0
    rest: bool = False
    keywords: tuple[str, ...] = ("size",)


@dataclass(frozen=True, slots=True)
class SizeList:
    """The size is the one list or tuple among the positional arguments (or ``size=``)."""


@dataclass(frozen=True, slots=True)
class Count:
    """An element count from (start, end, step) literals, as ``arange`` takes them."""


@dataclass(frozen=True, slots=True)
class Square:
    """``eye(n, m)``: n x m elements, n x n when ``m`` is not given."""


@dataclass(frozen=True, slots=True)
class Steps:
    """An element count given as one argument (``linspace``'s ``steps``)."""

    index: int
    keyword: str = "steps"


_ALL = Sizes(rest=True)
_AFTER_SELF = Sizes(first=1, rest=True, keywords=("size", "shape", "sizes", "dims"))
_FIRST = Sizes(indices=(0,))
_SECOND = Sizes(indices=(1,))

SIZE_ARGUMENTS: dict[str, object] = {
    **dict.fromkeys(("zeros", "ones", "empty", "rand", "randn"), _ALL),
    **dict.fromkeys(("full", "empty_strided", "randperm"), _FIRST),
    "eye": Square(),
    **dict.fromkeys(("tril_indices", "triu_indices"), Sizes(indices=(0, 1), keywords=("row", "col"))),
    "randint": SizeList(),  # randint(high, size) or randint(low, high, size): the size is the list
    **dict.fromkeys(("new_zeros", "new_ones", "new_empty", "expand", "repeat", "view", "reshape", "resize_",
                     "tile", "broadcast_to", "_unsafe_view"), _AFTER_SELF),
    **dict.fromkeys(("new_full", "new_empty_strided"), _SECOND),
    "arange": Count(),
    **dict.fromkeys(("linspace", "logspace"), Steps(2)),
}
"""The calls whose literal size arguments are checked, by the name of the function, method or op."""


@dataclass(frozen=True, slots=True)
class RandomUnless:
    """A call that draws random numbers unless its argument at ``index`` (or keyword in ``keywords``)
    is a literal in ``off``; when it is not given, ``default_off`` says whether it draws."""

    index: int
    keywords: tuple[str, ...]
    off: tuple = (False,)
    default_off: bool = False


_TRAINING = RandomUnless(2, ("training", "train"))
RANDOM_UNLESS: dict[str, RandomUnless] = {
    **dict.fromkeys(("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
                     "feature_dropout", "native_dropout"), _TRAINING),
    "rrelu": RandomUnless(3, ("training",), default_off=True),
    "scaled_dot_product_attention": RandomUnless(4, ("dropout_p",), off=(0, 0.0), default_off=True),
}
"""Random-number calls that draw only in training (or with a dropout probability), by name."""

DEVICE_STRING = re.compile(r"(cpu|cuda|meta|mps|xpu|xla|hpu|ipu|mtia|lazy|vulkan|hip|ve|fpga|maia|ort|mkldnn|opengl|"
                           r"opencl|ideep|privateuseone)(:\d+)?\Z")
"""A string naming a device, as ``torch.device`` parses it."""

DEVICE_METHODS = frozenset({"cpu", "cuda", "xpu", "ipu", "mtia", "hpu", "mps", "pin_memory"})
"""Tensor methods that move a value to a device (those on the allow-list: ``cpu``)."""

TO_NAMES = frozenset({"to", "_to_copy"})
"""``to``: its first argument after the tensor may be a device (a string, or an integer index)."""


@dataclass(frozen=True, slots=True)
class Callee:
    """What a call names, for these checks: ``key`` identifies it (the full path of a function, the
    op without its overload, ``method NAME``, the module type); ``name`` is the short name the tables
    use; ``random`` whether the allow-list flags it as drawing random numbers."""

    key: str
    name: str
    random: bool


def callee(call: A.Call, aliases: Aliases) -> Optional[Callee]:
    """The callee of a call_function, call_method or constructed call_module; None for a matched
    module (``call_module name(...)``) or a builder."""
    if call.op == "call_method":
        name = call.target.parts[0]
        return Callee(f"method {name}", name, allowlist.random_method(name))
    if call.op == "call_function":
        path = _function_path(call.target, aliases)
        parts = path.split(".")
        if path.startswith("torch.ops.") and len(parts) >= 4:
            return Callee(".".join(parts[:4]), parts[3], allowlist.random_function(path))
        if path.startswith("torch.Tensor.") and len(parts) == 3:
            return Callee(f"method {parts[2]}", parts[2], allowlist.random_method(parts[2]))
        return Callee(path, parts[-1], allowlist.random_function(path))
    if call.builder_args is None and call.attrs is not None:
        path = "torch.nn." + call.target.parts[0] if len(call.target.parts) == 1 else aliases.full_path(call.target)
        return Callee(path, path.rsplit(".", 1)[-1], allowlist.random_module_type(path))
    return None


def _function_path(target: A.Dotted, aliases: Aliases) -> str:
    head = target.parts[0]
    if len(target.parts) == 1 and head not in aliases.paths and head not in BUILTIN_ALIASES:
        return builtin_path(head) or target.text
    return aliases.full_path(target)


@dataclass(frozen=True, slots=True)
class PatternFacts:
    """What a rule's patterns call (callee keys, module types matched) and the literals they hold."""

    callees: frozenset
    literals: frozenset

    @classmethod
    def of(cls, patterns: tuple, aliases: Aliases) -> "PatternFacts":
        callees, literals = set(), set()
        for node in _nodes(patterns):
            if isinstance(node, A.Call):
                if node.op == "call_module" and node.builder_args is None:
                    path = ("torch.nn." + node.target.parts[0] if len(node.target.parts) == 1
                            else aliases.full_path(node.target))
                    callees.add(path)
                else:
                    found = callee(node, aliases)
                    if found is not None:
                        callees.add(found.key)
            elif isinstance(node, A.Literal):
                literals.add(node)
        return cls(frozenset(callees), frozenset(literals))


NOTHING = PatternFacts(frozenset(), frozenset())
"""An example's "pattern": it names nothing, so every device it names is its own."""


def _nodes(roots) -> Iterator[object]:
    """Every expression under ``roots`` (arguments, keywords, attributes, options, list items), each once.
    A pattern shares subtrees (a named pattern, or the options of nested alternatives, is one object
    wherever it is used): the library's 105 rules hold 2,124 distinct expressions but 114,236 paths to
    them, and walking every path was most of ``fxrules check``'s time."""
    stack = list(roots)
    seen: set = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        if isinstance(node, A.Call):
            stack.extend(a for a in node.args or ())
            stack.extend(k.value for k in node.kwargs)
            stack.extend(k.value for k in node.attrs or ())
            stack.extend(node.builder_args or ())
        elif isinstance(node, (A.ListExpr, A.TupleExpr)):
            stack.extend(node.items)
        elif isinstance(node, A.Alt):
            stack.extend(node.options)
        elif isinstance(node, A.Bind):
            stack.append(node.expr)


# ---------------------------------------------------------------------------
# Literal sizes
# ---------------------------------------------------------------------------


def check_literal_sizes(reporter: Reporter, call: A.Call, found: Callee) -> None:
    """``allocation-budget`` when the call's literal sizes ask for more than :data:`MAX_LITERAL_ELEMENTS`."""
    spec = SIZE_ARGUMENTS.get(found.name)
    if spec is None or call.args is None:
        return
    elements = _elements(spec, call)
    if elements is not None and elements > MAX_LITERAL_ELEMENTS:
        reporter.error(call.span, ALLOCATION_CODE,
                       f"`{found.key.removeprefix('method ')}` with these literal sizes asks for "
                       f"{_shown(elements)} elements, over fxrules' budget of {MAX_LITERAL_ELEMENTS:,}",
                       notes=["a size written in the rule file costs that much memory wherever the rewritten graph "
                              "runs; see SECURITY.md (bounded evaluation)"])


def _shown(n: int) -> str:
    return f"{n:,}" if n < 10 ** 30 else f"more than 10^{len(str(n)) - 1}"


def _elements(spec: object, call: A.Call) -> Optional[int]:
    if isinstance(spec, Count):
        return _arange_count(call)
    if isinstance(spec, SizeList):
        spec = Sizes(indices=tuple(i for i, a in enumerate(call.args) if isinstance(a, (A.ListExpr, A.TupleExpr))))
    elif isinstance(spec, Square):
        n, m = _int(_argument(call, 0, ("n",))), _argument(call, 1, ("m",))
        columns = n if m is None else _int(m)
        return None if n is None else n * (1 if columns is None else columns)
    if isinstance(spec, Steps):
        value = _argument(call, spec.index, (spec.keyword,))
        return _int(value)
    assert isinstance(spec, Sizes)
    values = [a for i, a in enumerate(call.args) if (i >= spec.first if spec.rest else i in spec.indices)]
    values += [k.value for k in call.kwargs if k.name in spec.keywords]
    total = 1
    for value in values:
        for size in _sizes(value):
            total *= size
            if total > MAX_LITERAL_ELEMENTS:
                return total  # enough to refuse: no product of thousand-digit literals
    return total


def _sizes(value: A.Expr) -> Iterator[int]:
    """The positive int literals of a size argument (an int, or a list or tuple of them)."""
    items = value.items if isinstance(value, (A.ListExpr, A.TupleExpr)) else (value,)
    for item in items:
        number = _int(item)
        if number is not None and number > 0:
            yield number


def _int(expr: Optional[A.Expr]) -> Optional[int]:
    if isinstance(expr, A.Literal) and type(expr.value) is int:
        return expr.value
    return None


def _number(expr: Optional[A.Expr]) -> Optional[float | int]:
    if isinstance(expr, A.Literal) and type(expr.value) in (int, float):
        return expr.value
    return None


def _argument(call: A.Call, index: int, keywords: tuple[str, ...]) -> Optional[A.Expr]:
    for keyword in call.kwargs:
        if keyword.name in keywords:
            return keyword.value
    args = call.args or ()
    return args[index] if index < len(args) and not isinstance(args[index], A.Ellipsis_) else None


def _arange_count(call: A.Call) -> Optional[int]:
    positional = [_number(a) for a in call.args or () if not isinstance(a, A.Ellipsis_)]
    keywords = {k.name: _number(k.value) for k in call.kwargs}
    start, end, step = 0, None, 1
    if len(positional) == 1:
        end = positional[0]
    elif len(positional) >= 2:
        start, end = positional[0], positional[1]
        step = positional[2] if len(positional) >= 3 else step
    start, end, step = keywords.get("start", start), keywords.get("end", end), keywords.get("step", step)
    if start is None or end is None or step is None or step == 0:
        return None
    try:
        if all(type(v) is int for v in (start, end, step)):
            return max(0, -((start - end) // step))
        count = (float(end) - float(start)) / float(step)
    except (OverflowError, ValueError):
        return MAX_LITERAL_ELEMENTS + 1  # a float over 10^308 elements
    return int(count) + 1 if count == count and count > 0 and count != float("inf") else (
        MAX_LITERAL_ELEMENTS + 1 if count == float("inf") else 0)


# ---------------------------------------------------------------------------
# Random numbers
# ---------------------------------------------------------------------------


def draws_random(call: A.Call, found: Callee) -> bool:
    """Whether the call draws random numbers (its training argument allowing)."""
    if not found.random:
        return False
    unless = RANDOM_UNLESS.get(found.name)
    if unless is None or call.args is None:
        return True
    value = _argument(call, unless.index, unless.keywords)
    if value is None:
        return not unless.default_off
    return not (isinstance(value, A.Literal) and value in [A.Literal(v) for v in unless.off])


def check_random(reporter: Reporter, call: A.Call, found: Callee, contract: str, pattern: PatternFacts) -> None:
    """``random-state`` for an ``[exact]``/``[approx]`` replacement's random call its pattern does not make."""
    if contract not in NEUTRAL_CONTRACTS or found.key in pattern.callees or not draws_random(call, found):
        return
    reporter.error(call.target.span, RANDOM_CODE,
                   f"an [{contract}] replacement may not call `{found.key.removeprefix('method ')}`, which draws "
                   f"random numbers, unless its pattern does",
                   notes=["its outputs could not equal the original's, and it changes the global random number "
                          "generator's state; a rule that introduces randomness is [changes]"])


# ---------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------


def check_devices(reporter: Reporter, call: A.Call, found: Optional[Callee], pattern: PatternFacts,
                  allowed: frozenset = frozenset()) -> None:
    """``device-move`` for a device the call names that neither the pattern nor ``allowed`` (device
    strings and method names an example may use) names."""
    if (found is not None and found.key.startswith("method ") and found.name in DEVICE_METHODS
            and found.key not in pattern.callees and found.name not in allowed
            and found.name in allowlist.TENSOR_METHODS):  # the others are `not-allowed` already
        reporter.error(call.target.span, DEVICE_CODE,
                       f"a replacement may not move values with `{found.name}` unless its pattern does",
                       notes=_DEVICE_NOTES)
        return
    for value, why in _device_arguments(call, found):
        if isinstance(value, A.Capture):
            continue  # the pattern's own device
        if isinstance(value, A.Literal) and (value in pattern.literals or value.value in allowed):
            continue
        reporter.error(value.span, DEVICE_CODE, f"{why} names a device the pattern does not", notes=_DEVICE_NOTES)


_DEVICE_NOTES = ["a rewrite keeps values on their devices: capture the device in the pattern (`$d`) to reuse it"]


def _device_arguments(call: A.Call, found: Optional[Callee]) -> Iterator[tuple[A.Expr, str]]:
    """The call's own arguments that name a device (nested calls are checked on their own)."""
    for keyword in call.kwargs:
        if keyword.name == "device" and not (isinstance(keyword.value, A.Literal) and keyword.value.value is None):
            yield keyword.value, "`device=`"
        elif keyword.name == "pin_memory" and isinstance(keyword.value, A.Literal) and keyword.value.value is True:
            yield keyword.value, "`pin_memory=True` (page-locked memory for a device)"
    args = [a for a in call.args or () if not isinstance(a, A.Ellipsis_)]
    if found is not None and found.name in TO_NAMES and len(args) > 1 and _int(args[1]) is not None:
        yield args[1], "a literal device index"
    stack = args + [k.value for k in call.kwargs if k.name not in ("device", "pin_memory")]
    while stack:
        node = stack.pop()
        if isinstance(node, (A.ListExpr, A.TupleExpr)):
            stack.extend(node.items)
        elif isinstance(node, A.Literal) and isinstance(node.value, str) and DEVICE_STRING.match(node.value):
            yield node, f"the string {node.value!r}"
