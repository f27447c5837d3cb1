"""The rule AST: frozen, slotted dataclasses with a source span on every node.

Only :mod:`fxrules.lang.reductions` creates these (as the parser reduces), and only
:mod:`fxrules.lang.printer` turns them back into text. Spans are excluded from
equality, so ``parse(print(ast)) == ast`` compares structure, not positions.

Two expression families:

* pattern/replacement expressions (``Expr``): what a rule matches and builds;
* condition expressions (``Cond``): what a ``where`` clause computes.

Names are kept as written (aliases unexpanded); :mod:`fxrules.lang.check`
resolves them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Union

CONTRACTS = ("exact", "approx", "changes")
"""Contract words, strictest first. ``approx`` is the default."""

OPCODES = ("call_function", "call_method", "call_module", "get_attr")


class Span(NamedTuple):
    """A region of a source file; lines and columns are 1-based, end exclusive.

    A named tuple rather than a dataclass: the builder makes one per AST node, and tuples
    are several times cheaper to create.
    """

    path: str
    line: int
    column: int
    end_line: int
    end_column: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"

    @property
    def location(self) -> str:
        """``path:line`` (the form rule names and reports use)."""
        return f"{self.path}:{self.line}"


NO_SPAN = Span("<none>", 0, 0, 0, 0)


def _span() -> Span:
    return field(default=NO_SPAN, compare=False, repr=False)


# ---------------------------------------------------------------------------
# Pattern and replacement expressions
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dotted:
    """A dotted name as written, e.g. ``torch.relu`` or ``F.leaky_relu``."""

    parts: tuple[str, ...]
    span: Span = _span()

    @property
    def text(self) -> str:
        return ".".join(self.parts)


@dataclass(frozen=True, slots=True)
class Capture:
    """``$x``: binds any argument (a node or a literal); the same name binds the same value."""

    name: str  # without the ``$``
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Wildcard:
    """``_``: matches anything without binding it."""

    span: Span = _span()


def _literal_key(value: object) -> tuple:
    """Equality of literal nodes: same type and same spelling (1, 1.0 and True differ; so do 0.0 and -0.0)."""
    return (type(value), repr(value) if isinstance(value, float) else value)


@dataclass(frozen=True, slots=True, eq=False)
class Literal:
    """An int, float, str, bool or None, matched by value (``1`` does not match ``True``)."""

    value: Union[int, float, str, bool, None]
    span: Span = _span()

    def __eq__(self, other: object) -> bool:
        return type(other) is Literal and _literal_key(self.value) == _literal_key(other.value)

    def __hash__(self) -> int:
        return hash(_literal_key(self.value))


@dataclass(frozen=True, slots=True)
class Name:
    """A bare or dotted name in argument position.

    A single part that a pattern binds with ``as`` is a reference to that node;
    otherwise it names a Python constant such as ``torch.float32``. The checker decides.
    """

    dotted: Dotted
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class ListExpr:
    """A list ``[a, b]`` in a pattern or replacement."""

    items: tuple["Expr", ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class TupleExpr:
    """A tuple ``(a, b)`` or ``(a,)`` in a pattern or replacement."""

    items: tuple["Expr", ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Ellipsis_:
    """``...`` as the last argument: accept (pattern) or forward (replacement) the rest."""

    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Variadic:
    """``*$xs`` as the last positional argument or list item: in a pattern, binds the rest (any
    number, as a tuple); in a replacement, splices what it bound."""

    name: str  # without the ``$``
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Keyword:
    """``name=value`` in an argument list or an attribute block."""

    name: str
    value: "Expr"
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Call:
    """A ``call_function``, ``call_method`` or ``call_module`` node.

    ``args is None`` is the bare form (``call_module Linear``): in a pattern it
    matches any arguments; in a replacement it forwards the matched node's
    arguments unchanged. ``attrs`` are module attribute constraints (pattern) or
    constructor arguments (replacement). ``builder_args`` is set only for a
    replacement ``call_module path.to.builder(refs...)(args...)``.
    """

    op: str
    target: Dotted
    args: Optional[tuple["Expr", ...]] = None
    kwargs: tuple[Keyword, ...] = ()
    attrs: Optional[tuple[Keyword, ...]] = None
    builder_args: Optional[tuple["Expr", ...]] = None
    span: Span = _span()

    @property
    def has_ellipsis(self) -> bool:
        return bool(self.args) and isinstance(self.args[-1], Ellipsis_)


@dataclass(frozen=True, slots=True)
class GetAttr:
    """``get_attr $p`` (any attribute, bound), ``get_attr _`` or ``get_attr a.b`` (by name)."""

    target: Union[Capture, Wildcard, Dotted]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Alt:
    """``(p | q | ...)``: the first option that matches, in order."""

    options: tuple["Expr", ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Bind:
    """``pattern as name``: names the matched node for conditions, later references and the replacement."""

    expr: "Expr"
    name: str
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class PatternUse:
    """``matmul($a, $b)``: a use of the named pattern ``matmul`` (a :class:`PatternDef`), its
    parameters given by the arguments, which are patterns. Patterns only; the checker expands it."""

    name: str
    args: tuple["Expr", ...]
    kwargs: tuple[Keyword, ...] = ()  # always refused by the checker (parameters are positional)
    span: Span = _span()
    name_span: Span = _span()


@dataclass(frozen=True, slots=True)
class Computed:
    """``{max($lo, 0)}``: a value a replacement computes from the match, in the condition language
    (the same allow-list and evaluator as ``where``), when the rewrite is made. Replacements only."""

    cond: "Cond"
    span: Span = _span()


Expr = Union[Capture, Wildcard, Literal, Name, ListExpr, TupleExpr, Ellipsis_, Call, GetAttr, Alt, Bind, PatternUse,
             Computed, Variadic]


# ---------------------------------------------------------------------------
# Condition expressions
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CCapture:
    """``$name`` in a condition: the value the pattern bound."""

    name: str
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class CName:
    """A bare name: a node bound with ``as``, a predicate, or the head of a dotted constant."""

    name: str
    span: Span = _span()


@dataclass(frozen=True, slots=True, eq=False)
class CLiteral:
    """A literal in a condition. Equal to another only of the same kind (``1``, ``1.0`` and ``True`` differ)."""

    value: Union[int, float, str, bool, None]
    span: Span = _span()

    def __eq__(self, other: object) -> bool:
        return type(other) is CLiteral and _literal_key(self.value) == _literal_key(other.value)

    def __hash__(self) -> int:
        return hash(_literal_key(self.value))


@dataclass(frozen=True, slots=True)
class CAttr:
    """``value.attr`` in a condition (a tensor's metadata, a module's attribute)."""

    value: "Cond"
    attr: str
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class CIndex:
    """``value[index]`` in a condition (the index may be a :class:`CSlice`)."""

    value: "Cond"
    index: "Cond"
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class CSlice:
    """``start:stop:step``, each part optional (None): the index of a :class:`CIndex` only (``$x.shape[1:]``).
    Its parts evaluate to ints or None (fxrules.engine.conditions); a slice never makes a sequence longer."""

    start: Optional["Cond"] = None
    stop: Optional["Cond"] = None
    step: Optional["Cond"] = None
    span: Span = _span()

    def parts(self) -> tuple:
        """The parts written, in order."""
        return tuple(p for p in (self.start, self.stop, self.step) if p is not None)


@dataclass(frozen=True, slots=True)
class CCall:
    """A call in a condition: a predicate or an allowed function, with its arguments."""

    func: "Cond"
    args: tuple["Cond", ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class CList:
    """A list ``[a, b]`` or, with ``parens``, a tuple ``(a, b)``/``(a,)``. Both compare equal to a
    shape or any other sequence with the same items (fxrules/engine/conditions.py)."""
    items: tuple["Cond", ...]
    span: Span = _span()
    parens: bool = False


@dataclass(frozen=True, slots=True)
class CUnary:
    """``not x`` or ``-x`` in a condition."""

    op: str  # "not" | "-"
    operand: "Cond"
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class CBinary:
    """A binary operation, comparison or boolean connective in a condition."""

    op: str  # "and" "or" "==" "!=" "<" "<=" ">" ">=" "in" "not in" "+" "-" "*" "/" "//" "%"
    left: "Cond"
    right: "Cond"
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class CGenerator:
    """``ELEMENT for VAR in ITERABLE [if FILTER]``: the only argument of a call (``all(d > 0 for d in $dims)``).
    ``VAR`` names each item in ``element`` and ``filter`` (as a name bound with ``as`` would); what it
    iterates is bounded (fxrules.engine.conditions: every item counted against one budget)."""

    element: "Cond"
    var: str
    iterable: "Cond"
    filter: Optional["Cond"] = None
    span: Span = _span()


Cond = Union[CCapture, CName, CLiteral, CAttr, CIndex, CSlice, CCall, CList, CUnary, CBinary, CGenerator]


def bound_names(exprs) -> frozenset:
    """The names ``as`` binds anywhere in these pattern (or replacement) expressions."""
    names: set[str] = set()
    stack = list(exprs)
    while stack:
        expr = stack.pop()
        if isinstance(expr, Bind):
            names.add(expr.name)
            stack.append(expr.expr)
        elif isinstance(expr, Alt):
            stack.extend(expr.options)
        elif isinstance(expr, Call):
            stack.extend(expr.args or ())
            stack.extend(k.value for k in expr.kwargs)
        elif isinstance(expr, (ListExpr, TupleExpr)):
            stack.extend(expr.items)
        elif isinstance(expr, PatternUse):  # a use binds what its arguments bind
            stack.extend(expr.args)
    return frozenset(names)


def name_chain(cond: Cond) -> Optional[tuple[str, ...]]:
    """``a.b.c`` as ``("a", "b", "c")`` when ``cond`` is an attribute chain on a bare name, else None."""
    parts: list[str] = []
    while isinstance(cond, CAttr):
        parts.append(cond.attr)
        cond = cond.value
    if isinstance(cond, CName):
        parts.append(cond.name)
        return tuple(reversed(parts))
    return None


# ---------------------------------------------------------------------------
# Rules and files
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Contract:
    """A rule's contract as written (``[exact]``, ``[approx]``, ``[changes]``)."""

    word: str  # as written; the checker rejects words outside CONTRACTS
    span: Span = _span()


DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
          "complex64", "complex128")
"""The dtype names an example input may declare (``$x: float64[2, 3]``); ``float32`` when none is written."""

EXAMPLE_MODES = ("eval", "train")


@dataclass(frozen=True, slots=True)
class InputSpec:
    """``$x: float64[2, 3]`` or ``$b: [8] = 0`` after ``given`` in an example.

    ``dtype`` is None for the default (float32); ``fill`` is None for random (seeded) values.
    """

    name: str
    dtype: Optional[str]
    shape: tuple[int, ...]
    fill: Optional[Union[int, float, bool]] = None
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Example:
    """``example [COUNT] [MODE]: MODEL given INPUTS``: a model the rule must rewrite (or leave alone).

    ``count`` None means "at least once", 0 a negative example, N exactly N rewrites.
    ``mode`` is ``eval`` (the default, None) or ``train``. ``outputs`` are expressions in the
    replacement language whose captures are the declared inputs.
    """

    count: Optional[int]
    mode: Optional[str]
    outputs: tuple[Expr, ...]
    inputs: tuple[InputSpec, ...]
    span: Span = _span()
    mode_span: Span = _span()


@dataclass(frozen=True, slots=True)
class Rule:
    """One rewrite rule.

    ``name is None`` for the one-line form; the rule set names it ``<file>:<line>``.
    ``contract is None`` means "the file's default" (``approx`` unless declared).
    Several patterns are a multi-root rule: all roots share captures and are
    replaced together, the i-th replacement taking the i-th root's place.
    """

    name: Optional[str]
    description: Optional[str]
    contract: Optional[Contract]
    patterns: tuple[Expr, ...]
    conditions: tuple[Cond, ...]
    replacements: tuple[Expr, ...]
    span: Span = _span()
    name_span: Span = _span()
    examples: tuple[Example, ...] = ()


@dataclass(frozen=True, slots=True)
class Use:
    """``use torch.nn.functional as F``."""

    path: Dotted
    alias: str
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class DefaultContract:
    """``default [changes]``: the contract of the rules after it that declare none."""

    contract: Contract
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class UseFile:
    """``use "attention.fxr"``: the named patterns of another rule file, for the patterns below.

    ``path`` as written: relative, under the directory of the file that uses it."""

    path: str
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class PatternDef:
    """``pattern matmul($a, $b) = BODY``: a named pattern with parameters, usable in the patterns
    after it (and in files that ``use`` this one) as ``matmul(PATTERN, PATTERN)``."""

    name: str
    params: tuple[str, ...]  # capture names, without the ``$``
    body: Expr
    span: Span = _span()
    name_span: Span = _span()
    param_spans: tuple[Span, ...] = field(default=(), compare=False, repr=False)


Item = Union[Use, UseFile, PatternDef, DefaultContract, Rule, Example]  # an Example item: one with no rule above it (an error)


@dataclass(frozen=True, slots=True)
class RuleFile:
    """A parsed file: its items in source order."""

    path: str
    items: tuple[Item, ...]

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(item for item in self.items if isinstance(item, Rule))
