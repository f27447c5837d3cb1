"""Rule-set analysis, the torch-free part: findings, shadowing, impossible conditions, candidates.

``fxrules analyze`` answers questions about a rule set as a whole (docs/analyze.md). This module
holds what needs no torch, so the front end's pre-commit hook can run it:

* the finding values (:class:`Finding`, :class:`FindingCode`, :class:`RuleRef`, :class:`Witness`),
  each convertible to a :class:`~fxrules.lang.diagnostics.Diagnostic` for any renderer of
  diagnostics;
* ``unsatisfiable``: a rule whose conditions (with its pattern's module attribute constraints)
  contradict each other, decided over literal comparisons, ``in`` lists, numeric bounds,
  truthiness, dtypes and ``is_floating``;
* ``shadowed``: a rule every variant of whose pattern an earlier rule's pattern generalises,
  with that rule's conditions implied by the later rule's;
* the *candidates* the verifier confirms with torch (:mod:`fxrules.verifier.analysis`): cycles of
  rules whose replacements can produce each other's patterns (``loop``), and pairs of rules
  whose patterns can match overlapping nodes (``overlap``).

Everything is decided on the AST with names expanded through the file's aliases, never
resolved: two spellings of one function (``F.relu`` and ``torch.nn.functional.relu``) compare
equal; two functions that are the same object under different paths do not. Each decision
errs one way: a rule is reported shadowed or unsatisfiable only when that is proven; what
cannot be decided is not reported (docs/analyze.md lists what cannot).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Iterable, Iterator, Mapping, Optional, Union

import fxrules.lang.ast as A
from fxrules.lang.diagnostics import WARNING, Diagnostic
from fxrules.lang.names import builtin_path, expand
from fxrules.lang.printer import print_cond
from fxrules.lang.ruleset import CheckedRule, RuleSet


# ---------------------------------------------------------------------------
# Findings
# ---------------------------------------------------------------------------


class FindingCode(StrEnum):
    """A finding's stable code: it prints, compares and serialises as its value."""

    SHADOWED = "shadowed"
    LOOP = "loop"
    OVERLAP = "overlap"
    UNSATISFIABLE = "unsatisfiable"
    DEAD = "dead"

    @property
    def description(self) -> str:
        return FINDING_CODES[self]


FINDING_CODES: Mapping[str, str] = {
    "shadowed": "every match of the rule is taken first by an earlier rule, so it never fires",
    "loop": "rules whose replacements produce each other's patterns: apply_rules does not reach a fixpoint",
    "overlap": "two rules match overlapping nodes and the two rule orders give different outputs",
    "unsatisfiable": "the rule's conditions cannot all hold, so it never fires",
    "dead": "the rule matches nothing in any of the models it was analysed against",
}
"""Each finding code with what it means (for renderers that describe their codes, such as SARIF)."""

STATIC_CODES = (FindingCode.SHADOWED, FindingCode.UNSATISFIABLE)
"""The findings this module decides without torch (the pre-commit hook's)."""


@dataclass(frozen=True, slots=True)
class RuleRef:
    """A rule a finding involves: its name and where it is written (its name, or its first line)."""

    name: str
    path: str
    line: int
    column: int
    span: A.Span = field(compare=False, repr=False)

    @classmethod
    def of(cls, rule: CheckedRule) -> "RuleRef":
        span = rule.ast.name_span if rule.ast.name_span.line > 0 else rule.ast.span
        return cls(rule.name, span.path, span.line, span.column, span)

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"

    def to_json(self) -> dict:
        return {"name": self.name, "path": self.path, "line": self.line, "column": self.column}


@dataclass(frozen=True, slots=True)
class Witness:
    """A host graph that shows a finding, shrunk by hypothesis.

    ``problem``: what happened on it; ``facts``: its inputs and modules; ``code``: its forward;
    ``hosts_tried``: how many hosts the search drew; ``reproduce``: hypothesis'
    ``@reproduce_failure`` line and ``command`` the command line that replays exactly this host.
    """

    problem: str
    facts: tuple[str, ...]
    code: str
    hosts_tried: int
    reproduce: Optional[str] = None
    command: Optional[str] = None

    def render(self, indent: str = "    ") -> list[str]:
        lines = [self.problem, *self.facts, "host model:"]
        lines += ["  " + line for line in self.code.strip("\n").splitlines()]
        if self.command:
            lines.append(f"replay it: {self.command}")
        elif self.reproduce:
            lines.append(f"reproduce: {self.reproduce}")
        return [indent + line for line in lines]

    def to_json(self) -> dict:
        return {"problem": self.problem, "facts": list(self.facts), "code": self.code,
                "hosts_tried": self.hosts_tried, "reproduce": self.reproduce, "command": self.command}


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding: its code, the rules it involves (the first is the one it is about), why, and evidence.

    ``notes`` add detail (the conflicting conditions, the earlier rules, near misses, how many
    hosts were tried); ``witness`` is the host graph that shows it, where one exists.
    """

    code: FindingCode
    message: str
    rules: tuple[RuleRef, ...]
    notes: tuple[str, ...] = ()
    witness: Optional[Witness] = None

    @property
    def rule(self) -> RuleRef:
        return self.rules[0]

    @property
    def location(self) -> str:
        return self.rule.location

    def to_diagnostic(self) -> Diagnostic:
        """The finding as a located diagnostic (code, span, message, notes): a warning on its first rule."""
        notes = list(self.notes) + [f"rule `{r.name}` is at {r.location}" for r in self.rules[1:]]
        if self.witness is not None:
            notes.append(f"witness: {self.witness.problem}")
            if self.witness.command:
                notes.append(f"replay it: {self.witness.command}")
        return Diagnostic.at(self.rule.span, str(self.code), self.message, notes=notes, severity=WARNING)

    def render(self, source: Optional[str] = None) -> str:
        text = self.to_diagnostic().render(source)
        if self.witness is None:
            return text
        return "\n".join([text, "witness:", *self.witness.render()])

    def to_json(self) -> dict:
        return {"code": str(self.code), "message": self.message, "location": self.location,
                "rules": [r.to_json() for r in self.rules], "notes": list(self.notes),
                "witness": None if self.witness is None else self.witness.to_json()}


def finding_sort_key(finding: Finding) -> tuple:
    return (finding.rule.path, finding.rule.line, finding.rule.column, str(finding.code))


@dataclass(frozen=True, slots=True)
class Search:
    """One host-graph search: which finding it looked for, about which rules, how many hosts it tried,
    and why it tried none (``note``: no sampler, none matched)."""

    code: FindingCode
    rules: tuple[str, ...]
    hosts_tried: int
    found: bool
    note: str = ""

    def to_json(self) -> dict:
        return {"code": str(self.code), "rules": list(self.rules), "hosts_tried": self.hosts_tried,
                "found": self.found, "note": self.note}


@dataclass(frozen=True, slots=True)
class AnalysisReport:
    """What ``fxrules.analyze`` found: findings in file order, the searches behind them, timing."""

    findings: tuple[Finding, ...]
    rules: int
    searches: tuple[Search, ...] = ()
    models: tuple[str, ...] = ()
    seconds: float = 0.0
    reproduced: Optional[bool] = None  # with reproduce: whether the witness showed the finding again

    @property
    def ok(self) -> bool:
        """No findings."""
        return not self.findings

    def counts(self) -> dict[str, int]:
        return {str(code): sum(f.code is code for f in self.findings) for code in FindingCode}

    def summary(self) -> str:
        counts = ", ".join(f"{n} {code}" for code, n in self.counts().items() if n) or "no findings"
        hosts = sum(s.hosts_tried for s in self.searches)
        searched = f"; {len(self.searches)} host searches, {hosts} hosts tried" if self.searches else ""
        against = f"; against {', '.join(self.models)}" if self.models else ""
        return (f"fxrules analyze: {self.rules} rule{'s' * (self.rules != 1)}: {counts}{searched}{against} "
                f"({self.seconds:.1f} s)")

    def to_json(self) -> dict:
        return {"version": 1, "ok": self.ok, "rules": self.rules, "counts": self.counts(),
                "seconds": round(self.seconds, 3), "models": list(self.models), "reproduced": self.reproduced,
                "findings": [f.to_json() for f in self.findings], "searches": [s.to_json() for s in self.searches]}


# ---------------------------------------------------------------------------
# Names: targets compared by their full path as written
# ---------------------------------------------------------------------------


def _target(call: A.Call, aliases: Mapping[str, str]) -> str:
    """The op and full dotted path of a call's target, as the checker expands it (never resolved)."""
    parts = call.target.parts
    if call.op == "call_method":
        return f"call_method {parts[0]}"
    if call.op == "call_module":
        if len(parts) == 1 and parts[0] not in aliases:
            return f"call_module torch.nn.{parts[0]}"
        return f"call_module {expand(parts, aliases) or call.target.text}"
    if len(parts) == 1 and parts[0] not in aliases:
        return f"call_function {builtin_path(parts[0]) or expand(parts, aliases) or call.target.text}"
    return f"call_function {expand(parts, aliases) or call.target.text}"


def _constant(dotted: A.Dotted, aliases: Mapping[str, str]) -> str:
    return _DTYPE_SYNONYMS.get(full := expand(dotted.parts, aliases) or dotted.text, full)


_DTYPE_SYNONYMS = {"torch.float": "torch.float32", "torch.double": "torch.float64", "torch.half": "torch.float16",
                   "torch.long": "torch.int64", "torch.int": "torch.int32", "torch.short": "torch.int16",
                   "torch.cfloat": "torch.complex64", "torch.cdouble": "torch.complex128"}
_FLOATING = frozenset({"torch.float32", "torch.float64", "torch.float16", "torch.bfloat16",
                       "torch.float8_e4m3fn", "torch.float8_e5m2", "torch.float8_e4m3fnuz", "torch.float8_e5m2fnuz"})


# ---------------------------------------------------------------------------
# Alternatives: a pattern as the list of its alternation-free variants
# ---------------------------------------------------------------------------

MAX_VARIANTS = 256
"""A pattern with more alternation-free variants than this is not analysed for shadowing."""


def variants(expr: A.Expr, limit: int = MAX_VARIANTS) -> Optional[list[A.Expr]]:
    """Every alternation-free pattern ``expr`` stands for (each option of each ``|`` chosen), or None past ``limit``."""
    found = list(itertools.islice(_variants(expr), limit + 1))
    return None if len(found) > limit else found


def _variants(expr: A.Expr) -> Iterator[A.Expr]:
    if isinstance(expr, A.Alt):
        for option in expr.options:
            yield from _variants(option)
    elif isinstance(expr, A.Bind):
        for inner in _variants(expr.expr):
            yield A.Bind(inner, expr.name, expr.span)
    elif isinstance(expr, (A.ListExpr, A.TupleExpr)):
        for items in _products(expr.items):
            yield type(expr)(items, expr.span)
    elif isinstance(expr, A.Call) and (expr.args or expr.kwargs or expr.attrs):
        args = expr.args or ()
        kw_values = tuple(k.value for k in expr.kwargs)
        attr_values = tuple(k.value for k in expr.attrs or ())
        for chosen in _products(args + kw_values + attr_values):
            n, m = len(args), len(kw_values)
            kwargs = tuple(A.Keyword(k.name, v, k.span) for k, v in zip(expr.kwargs, chosen[n:n + m]))
            attrs = None if expr.attrs is None else tuple(
                A.Keyword(k.name, v, k.span) for k, v in zip(expr.attrs, chosen[n + m:]))
            yield A.Call(expr.op, expr.target, None if expr.args is None else chosen[:n], kwargs, attrs,
                         expr.builder_args, expr.span)
    else:
        yield expr


def _products(items: tuple) -> Iterator[tuple]:
    if not items:
        yield ()
        return
    for head in _variants(items[0]):
        for tail in _products(items[1:]):
            yield (head,) + tail


# ---------------------------------------------------------------------------
# Generalisation: does pattern `a` match every node pattern `b` matches?
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Mapping:
    """What one generalisation decided: ``a``'s captures and ``as`` names -> the parts of ``b`` they take."""

    captures: dict = field(default_factory=dict)
    names: dict = field(default_factory=dict)


class _Generaliser:
    """``a`` generalises ``b`` (both alternation-free) when every node ``b`` matches, ``a`` matches too.

    Decided structurally: a capture or ``_`` of ``a`` takes any part of ``b`` (a capture used twice
    must take equal parts, and an ``_`` of ``b`` equals nothing); calls need the same op and target
    path and argument lists that line up as written (``a``'s ``...`` takes what ``b`` has beyond
    it); module attribute constraints of ``a`` must each be one of ``b``'s, generalised.
    """

    def __init__(self, a_aliases: Mapping[str, str], b_aliases: Mapping[str, str]):
        self.a_aliases, self.b_aliases = a_aliases, b_aliases
        self.mapping = _Mapping()

    def general(self, a: A.Expr, b: A.Expr) -> bool:
        if isinstance(a, A.Bind):
            if not self.general(a.expr, b):
                return False
            self.mapping.names[a.name] = b
            return True
        if isinstance(a, A.Wildcard):
            return True
        if isinstance(a, A.Capture):
            seen = self.mapping.captures.get(a.name)
            if seen is None:
                self.mapping.captures[a.name] = b
                return True
            return _same_value(_unbound(seen), _unbound(b))
        if isinstance(b, A.Bind):
            return self.general(a, b.expr)
        if isinstance(a, A.Literal):
            return isinstance(b, A.Literal) and a == b
        if isinstance(a, A.Name):
            if len(a.dotted.parts) == 1:  # a reference to a node `a` bound with `as`
                bound = self.mapping.names.get(a.dotted.parts[0])
                return isinstance(b, A.Name) and isinstance(bound, A.Bind) and b.dotted.parts == (bound.name,)
            return (isinstance(b, A.Name) and len(b.dotted.parts) > 1
                    and _constant(a.dotted, self.a_aliases) == _constant(b.dotted, self.b_aliases))
        if isinstance(a, (A.ListExpr, A.TupleExpr)):
            return (isinstance(b, (A.ListExpr, A.TupleExpr)) and len(a.items) == len(b.items)
                    and all(self.general(x, y) for x, y in zip(a.items, b.items)))
        if isinstance(a, A.GetAttr):
            if not isinstance(b, A.GetAttr):
                return False
            if isinstance(a.target, A.Dotted):
                return isinstance(b.target, A.Dotted) and a.target.parts == b.target.parts
            if isinstance(a.target, A.Capture):
                return self.general(A.Capture(a.target.name), b)
            return True
        if isinstance(a, A.Call):
            return isinstance(b, A.Call) and self.call(a, b)
        return False

    def call(self, a: A.Call, b: A.Call) -> bool:
        if _target(a, self.a_aliases) != _target(b, self.b_aliases):
            return False
        if a.attrs:
            b_attrs = {k.name: k.value for k in b.attrs or ()}
            for k in a.attrs:
                if k.name not in b_attrs or not self.general(k.value, b_attrs[k.name]):
                    return False
        if a.args is None:
            return True
        if b.args is None:
            return False
        a_pos = [x for x in a.args if not isinstance(x, A.Ellipsis_)]
        b_pos = [x for x in b.args if not isinstance(x, A.Ellipsis_)]
        b_kw = {k.name: k.value for k in b.kwargs}
        if a.has_ellipsis:
            if len(b_pos) < len(a_pos) or not {k.name for k in a.kwargs} <= set(b_kw):
                return False
        elif b.has_ellipsis or len(a_pos) != len(b_pos) or {k.name for k in a.kwargs} != set(b_kw):
            return False
        return (all(self.general(x, y) for x, y in zip(a_pos, b_pos))
                and all(self.general(k.value, b_kw[k.name]) for k in a.kwargs))


def _unbound(expr: A.Expr) -> A.Expr:
    while isinstance(expr, A.Bind):
        expr = expr.expr
    return expr


def _same_value(x: A.Expr, y: A.Expr) -> bool:
    """Two parts of one pattern that surely match the same value: equal, with no ``_`` in them."""
    return x == y and not _has_wildcard(x)


def _has_wildcard(expr: A.Expr) -> bool:
    if isinstance(expr, A.Wildcard):
        return True
    if isinstance(expr, A.GetAttr):
        return isinstance(expr.target, A.Wildcard)
    if isinstance(expr, A.Bind):
        return _has_wildcard(expr.expr)
    if isinstance(expr, (A.ListExpr, A.TupleExpr)):
        return any(_has_wildcard(i) for i in expr.items)
    if isinstance(expr, A.Call):
        return (any(_has_wildcard(i) for i in expr.args or ()) or any(_has_wildcard(k.value) for k in expr.kwargs)
                or any(_has_wildcard(k.value) for k in expr.attrs or ()))
    return False


# ---------------------------------------------------------------------------
# Conditions: atoms, negation, and a decision procedure for contradictions
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Atom:
    """``subject OP value`` over one subject (printed canonically): ``$x.ndim >= 2``, ``d.p == 0.5``,
    ``$x.dtype in {float32, ...}``, ``bn.training is truthy``. ``text`` is how the source wrote it."""

    subject: str
    op: str  # "==" "!=" "<" "<=" ">" ">=" "in" "not in" "truthy"
    value: object  # a constant; a frozenset for in/not in; a bool for truthy
    text: str


@dataclass(frozen=True, slots=True)
class _Const:
    """A dotted constant in a condition (``torch.float32``), by its full path."""

    path: str

    def __repr__(self) -> str:
        return self.path


_NEGATED = {"==": "!=", "!=": "==", "<": ">=", "<=": ">", ">": "<=", ">=": "<", "in": "not in", "not in": "in"}
_FLIPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_BOOL_ATTRS = frozenset({"training", "inplace", "affine", "track_running_stats", "requires_grad", "ceil_mode",
                         "count_include_pad", "batch_first", "bidirectional"})
MAX_BRANCHES = 64
"""How many ``or`` branches the decision procedure explores before it gives up (undecided)."""


class _Conditions:
    """Turns a rule's ``where`` clauses into atoms and decides whether a set of them can hold together.

    ``bound``: the rule's ``as`` names (a dotted name starting with one is a subject, not a constant).
    A clause it cannot read (a call other than ``is_floating``/``len``/``dim``, arithmetic, two
    subjects compared) is *opaque*: it may hold or not, so it never makes a contradiction.
    """

    def __init__(self, aliases: Mapping[str, str], bound: frozenset):
        self.aliases, self.bound = aliases, bound

    # -- reading ---------------------------------------------------------------------
    def subject(self, cond: A.Cond) -> Optional[str]:
        if isinstance(cond, A.CCall) and not cond.args and isinstance(cond.func, A.CAttr) \
                and cond.func.attr == "dim":
            return self.subject(A.CAttr(cond.func.value, "ndim"))
        if isinstance(cond, A.CCall) and len(cond.args) == 1 and isinstance(cond.func, A.CName) \
                and cond.func.name == "len" and isinstance(cond.args[0], A.CAttr) and cond.args[0].attr == "shape":
            return self.subject(A.CAttr(cond.args[0].value, "ndim"))
        root = cond
        while isinstance(root, (A.CAttr, A.CIndex)):
            if isinstance(root, A.CIndex) and self.value(root.index) is None:
                return None
            root = root.value
        if isinstance(root, A.CCapture) or (isinstance(root, A.CName) and root.name in self.bound):
            return print_cond(cond)
        return None

    def value(self, cond: A.Cond) -> Optional[tuple]:
        """``(constant,)`` for a literal, a dotted constant or a list of them; None otherwise."""
        if isinstance(cond, A.CLiteral):
            return (cond.value,)
        if isinstance(cond, A.CUnary) and cond.op == "-" and isinstance(cond.operand, A.CLiteral) \
                and isinstance(cond.operand.value, (int, float)) and not isinstance(cond.operand.value, bool):
            return (-cond.operand.value,)
        if isinstance(cond, A.CList):
            items = [self.value(i) for i in cond.items]
            return None if any(i is None for i in items) else (tuple(i[0] for i in items),)
        chain = A.name_chain(cond)
        if chain is not None and len(chain) > 1 and chain[0] not in self.bound:
            return (_Const(_constant(A.Dotted(chain), self.aliases)),)
        return None

    def atoms(self, cond: A.Cond, positive: bool = True) -> Union[list, None, bool]:
        """The clause as a disjunction of conjunctions of atoms: a list of lists; True/False for a
        clause that is constant; None when it cannot be read (opaque)."""
        text = print_cond(cond)
        if isinstance(cond, A.CUnary) and cond.op == "not":
            return self.atoms(cond.operand, not positive)
        if isinstance(cond, A.CBinary) and cond.op in ("and", "or"):
            left, right = self.atoms(cond.left, positive), self.atoms(cond.right, positive)
            conjunction = (cond.op == "and") == positive
            return _combine(left, right, conjunction)
        if isinstance(cond, A.CBinary) and cond.op in _NEGATED:
            op = cond.op if positive else _NEGATED[cond.op]
            left_subject, right_subject = self.subject(cond.left), self.subject(cond.right)
            left_value, right_value = self.value(cond.left), self.value(cond.right)
            if left_value is not None and right_value is not None:
                return _constant_compare(left_value[0], op, right_value[0])
            if left_subject is not None and right_value is not None:
                return [[self.atom(left_subject, op, right_value[0], text, positive)]]
            if right_subject is not None and left_value is not None and op in _FLIPPED:
                return [[self.atom(right_subject, _FLIPPED[op], left_value[0], text, positive)]]
            return None
        if isinstance(cond, A.CCall) and isinstance(cond.func, A.CName) and cond.func.name == "is_floating" \
                and len(cond.args) == 1:
            subject = self.subject(A.CAttr(cond.args[0], "dtype"))
            if subject is None:
                return None
            return [[_Atom(subject, "in" if positive else "not in", frozenset(_Const(d) for d in _FLOATING),
                           text if positive else f"not {text}")]]
        value = self.value(cond)
        if value is not None and not isinstance(value[0], (_Const, tuple)):
            return bool(value[0]) == positive
        subject = self.subject(cond)
        if subject is not None and isinstance(cond, A.CAttr) and cond.attr in _BOOL_ATTRS:
            return [[_Atom(subject, "truthy", positive, text if positive else f"not {text}")]]
        return None

    def atom(self, subject: str, op: str, value: object, text: str, positive: bool) -> _Atom:
        if op in ("in", "not in"):
            value = frozenset(value) if isinstance(value, tuple) else frozenset((value,))
        return _Atom(subject, op, value, text if positive else f"not ({text})")


def _constant_compare(left: object, op: str, right: object) -> Union[bool, None]:
    try:
        if op in ("in", "not in"):
            inside = left in right  # type: ignore[operator]
            return inside if op == "in" else not inside
        return {"==": left == right, "!=": left != right, "<": left < right, "<=": left <= right,  # type: ignore
                ">": left > right, ">=": left >= right}[op]  # type: ignore[operator]
    except TypeError:
        return None


def _combine(left, right, conjunction: bool):
    """Two clauses joined by and (``conjunction``) or or, in disjunctive normal form."""
    if conjunction:
        if left is False or right is False:
            return False
        if left is True or left is None:
            return right if left is True else (None if right is True or right is None else right)
        if right is True or right is None:
            return left
        product = [l + r for l in left for r in right]
        return product if len(product) <= MAX_BRANCHES else None
    if left is True or right is True:
        return True
    if left is None or right is None:
        return None  # an opaque branch may hold: the disjunction is undecided
    if left is False:
        return right
    if right is False:
        return left
    joined = left + right
    return joined if len(joined) <= MAX_BRANCHES else None


def _numeric(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def conflict(atoms: Iterable[_Atom]) -> Optional[tuple[_Atom, ...]]:
    """Atoms of ``atoms`` that cannot hold together (one contradiction), or None when none is found."""
    by_subject: dict[str, list[_Atom]] = {}
    for atom in atoms:
        by_subject.setdefault(atom.subject, []).append(atom)
    for subject, group in by_subject.items():
        found = _subject_conflict(subject, group)
        if found is not None:
            return found
    return None


def _subject_conflict(subject: str, group: list[_Atom]) -> Optional[tuple[_Atom, ...]]:
    equal = [a for a in group if a.op == "=="]
    for first, second in itertools.combinations(equal, 2):
        if _known_different(first.value, second.value):
            return (first, second)
    for eq in equal:
        for other in group:
            if other is not eq and not _admits(other, eq.value):
                return (eq, other)
    integral = subject.endswith(".ndim")
    low, high = (0, None) if integral else (None, None)  # (value, atom, strict)
    low_atom = high_atom = None
    low_strict = high_strict = False
    for atom in group:
        if atom.op in ("<", "<=", ">", ">=") and _numeric(atom.value):
            value = atom.value
            if atom.op in (">", ">="):
                strict = atom.op == ">"
                if low is None or value > low or (value == low and strict):
                    low, low_atom, low_strict = value, atom, strict
            else:
                strict = atom.op == "<"
                if high is None or value < high or (value == high and strict):
                    high, high_atom, high_strict = value, atom, strict
    if low is not None and high is not None:
        empty = low > high or (low == high and (low_strict or high_strict))
        if integral and not empty:  # no integer strictly between two consecutive integers
            lo = math.floor(low) + 1 if low_strict else math.ceil(low)
            hi = math.ceil(high) - 1 if high_strict else math.floor(high)
            empty = lo > hi
        if empty:
            return tuple(a for a in (low_atom, high_atom) if a is not None) or (group[0],)
    allowed: Optional[set] = None
    allowed_by: list[_Atom] = []
    for atom in group:
        if atom.op == "in":
            allowed = set(atom.value) if allowed is None else {v for v in allowed if v in atom.value}
            allowed_by.append(atom)
    if allowed is not None:
        remaining = {v for v in allowed if all(_admits(a, v) for a in group if a.op != "in")}
        if not remaining:
            excluding = [a for a in group if a.op != "in" and any(not _admits(a, v) for v in allowed)]
            return tuple(allowed_by + excluding)
    truthy = {a.value: a for a in group if a.op == "truthy"}
    if True in truthy and False in truthy:
        return (truthy[True], truthy[False])
    return None


def _known_different(x: object, y: object) -> bool:
    """Two constants that are surely different values (a constant path and a literal are not comparable)."""
    if isinstance(x, _Const) != isinstance(y, _Const):
        return False
    try:
        return bool(x != y)
    except Exception:  # pragma: no cover - constants compare
        return False


def _admits(atom: _Atom, value: object) -> bool:
    """Whether ``value`` of the subject satisfies ``atom`` (True when that cannot be told)."""
    op = atom.op
    if op == "==":
        return not _known_different(value, atom.value)
    if op == "!=":
        return _known_different(value, atom.value) or isinstance(value, _Const) != isinstance(atom.value, _Const)
    if op == "in":
        return any(not _known_different(value, v) for v in atom.value)
    if op == "not in":
        return all(_known_different(value, v) or isinstance(value, _Const) != isinstance(v, _Const)
                   for v in atom.value)
    if op == "truthy":
        return isinstance(value, _Const) or bool(value) == atom.value
    if _numeric(value) and _numeric(atom.value):
        return {"<": value < atom.value, "<=": value <= atom.value, ">": value > atom.value,  # type: ignore
                ">=": value >= atom.value}[op]  # type: ignore[operator]
    return True


def contradiction(clauses: Iterable, facts: Iterable[_Atom] = ()) -> Optional[tuple[_Atom, ...]]:
    """Whether the clauses (each as :meth:`_Conditions.atoms` reads it) with ``facts`` cannot all hold.

    Returns the atoms of one contradiction when every branch of the disjunctive normal form has one
    (a constant false clause gives an empty tuple), else None: satisfiable, or undecided.
    """
    branches: list[list[_Atom]] = [list(facts)]
    for clause in clauses:
        if clause is True or clause is None:
            continue
        if clause is False:
            return ()
        branches = [b + extra for b in branches for extra in clause]
        if len(branches) > MAX_BRANCHES:
            return None
    found: list[_Atom] = []
    for branch in branches:
        hit = conflict(branch)
        if hit is None:
            return None
        found.extend(a for a in hit if a not in found)
    return tuple(found)


# ---------------------------------------------------------------------------
# Per rule: its bound names, its pattern's facts, its conditions read
# ---------------------------------------------------------------------------


def _pattern_facts(expr: A.Expr) -> list[_Atom]:
    """``name.attr == literal`` for every module attribute constraint written with a literal on a node
    bound with ``as`` (an alternation-free pattern)."""
    facts: list[_Atom] = []
    stack = [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, A.Bind):
            inner = _unbound(item)
            if isinstance(inner, A.Call):
                for k in inner.attrs or ():
                    if isinstance(k.value, A.Literal):
                        facts.append(_Atom(f"{item.name}.{k.name}", "==", k.value.value,
                                           f"{item.name}.{k.name} == {k.value.value!r} (the pattern's "
                                           f"{{{k.name}=...}})"))
            stack.append(item.expr)
        elif isinstance(item, A.Call):
            stack.extend(item.args or ())
            stack.extend(k.value for k in item.kwargs)
        elif isinstance(item, (A.ListExpr, A.TupleExpr)):
            stack.extend(item.items)
    return facts


def _clauses(rule: CheckedRule, reader: _Conditions) -> list:
    return [reader.atoms(c) for c in rule.ast.conditions]


def unsatisfiable(rule: CheckedRule) -> Optional[Finding]:
    """An ``unsatisfiable`` finding when the rule's conditions contradict each other or its pattern."""
    if not rule.ast.conditions:
        return None
    reader = _Conditions(rule.aliases, A.bound_names(rule.ast.patterns))
    clauses = _clauses(rule, reader)
    root_variants = [variants(p) for p in rule.ast.patterns]
    if any(v is None for v in root_variants):
        root_variants = [[p] for p in rule.ast.patterns]
    found: list[_Atom] = []
    for combination in itertools.product(*root_variants):
        facts = [f for p in combination for f in _pattern_facts(p)]
        hit = contradiction(clauses, facts)
        if hit is None:
            return None
        found.extend(a for a in hit if a not in found)
    notes = [f"contradicting: {' / '.join(dict.fromkeys(a.text for a in found))}"] if found else \
        ["a condition is always false"]
    return Finding(FindingCode.UNSATISFIABLE, f"the conditions of rule `{rule.name}` can never all hold, so it "
                   f"never fires", (RuleRef.of(rule),), tuple(notes))


# ---------------------------------------------------------------------------
# Shadowing
# ---------------------------------------------------------------------------


class _Renamer:
    """An earlier rule's condition in the later rule's terms, through a generalisation's mapping."""

    def __init__(self, mapping: _Mapping, bound: frozenset, aliases: Mapping[str, str]):
        self.mapping, self.bound, self.aliases = mapping, bound, aliases

    def cond(self, cond: A.Cond) -> Optional[A.Cond]:
        if isinstance(cond, A.CCapture):
            return self.term(self.mapping.captures.get(cond.name))
        if isinstance(cond, A.CName):
            if cond.name in self.mapping.names:
                return self.term(self.mapping.names[cond.name])
            if cond.name in self.bound:
                return None  # a name an option the variant did not choose binds
            return cond  # a predicate or the head of a dotted constant
        chain = A.name_chain(cond)
        if chain is not None and len(chain) > 1 and chain[0] not in self.bound:
            full = expand(chain, self.aliases) or ".".join(chain)  # a constant, by its full path
            restated: A.Cond = A.CName(full.split(".")[0])
            for part in full.split(".")[1:]:
                restated = A.CAttr(restated, part)
            return restated
        if isinstance(cond, A.CLiteral):
            return cond
        if isinstance(cond, A.CAttr):
            value = self.cond(cond.value)
            return None if value is None else A.CAttr(value, cond.attr)
        if isinstance(cond, A.CIndex):
            value, index = self.cond(cond.value), self.cond(cond.index)
            return None if value is None or index is None else A.CIndex(value, index)
        if isinstance(cond, A.CCall):
            func = self.cond(cond.func)
            args = [self.cond(a) for a in cond.args]
            return None if func is None or any(a is None for a in args) else A.CCall(func, tuple(args))
        if isinstance(cond, A.CList):
            items = [self.cond(i) for i in cond.items]
            return None if any(i is None for i in items) else A.CList(tuple(items), parens=cond.parens)
        if isinstance(cond, A.CUnary):
            operand = self.cond(cond.operand)
            return None if operand is None else A.CUnary(cond.op, operand)
        if isinstance(cond, A.CBinary):
            left, right = self.cond(cond.left), self.cond(cond.right)
            return None if left is None or right is None else A.CBinary(cond.op, left, right)
        return None

    @staticmethod
    def term(expr: Optional[A.Expr]) -> Optional[A.Cond]:
        if isinstance(expr, A.Capture):
            return A.CCapture(expr.name)
        if isinstance(expr, A.Bind):
            return A.CName(expr.name)
        if isinstance(expr, A.Literal):
            return A.CLiteral(expr.value)
        return None  # `_`, a call without a name, a constant: the condition cannot be restated


def _implied(earlier: CheckedRule, later: CheckedRule, later_variant: A.Expr, mapping: _Mapping) -> bool:
    """Whether every condition of ``earlier`` holds wherever ``later`` (this variant) matches and its
    conditions hold: each is restated in ``later``'s terms and is one of its conditions, or its
    negation contradicts them. Anything else is undecided, which counts as not implied."""
    if not earlier.ast.conditions:
        return True
    renamer = _Renamer(mapping, A.bound_names(earlier.ast.patterns), earlier.aliases)
    later_reader = _Conditions(later.aliases, A.bound_names(later.ast.patterns))
    later_clauses = _clauses(later, later_reader)
    facts = _pattern_facts(later_variant)
    for condition in earlier.ast.conditions:
        restated = renamer.cond(condition)
        if restated is None:
            return False
        if restated in later.ast.conditions:
            continue
        negated = later_reader.atoms(restated, positive=False)
        if negated is None or contradiction(later_clauses + [negated], facts) is None:
            return False
    return True


def _may_decline(rule: CheckedRule) -> bool:
    """A rule whose replacement calls a module builder: the builder may decline a match (the rule then
    takes nothing), so it cannot be relied on to shadow another."""
    stack = list(rule.ast.replacements)
    while stack:
        expr = stack.pop()
        if isinstance(expr, A.Call):
            if expr.builder_args is not None:
                return True
            stack.extend(expr.args or ())
            stack.extend(k.value for k in expr.kwargs)
        elif isinstance(expr, (A.ListExpr, A.TupleExpr)):
            stack.extend(expr.items)
    return False


def shadowing(rule_set: RuleSet) -> list[Finding]:
    """``shadowed`` findings: rules each of whose pattern variants an earlier rule takes first.

    Single-root rules only (a multi-root rule's matches depend on how its roots meet). The earlier
    rule must match the later's root node wherever the later matches (its pattern generalises the
    later's variant), its conditions must follow from the later's, and its replacement must not
    call a builder (which may decline). Different variants may be taken by different earlier rules.
    """
    rules = [r for r in rule_set.rules if not r.is_multi_root]
    expanded = {r.name: variants(r.ast.patterns[0]) for r in rules}
    index = _TakerIndex(rules, expanded)
    findings: list[Finding] = []
    for position, later in enumerate(rules):
        later_variants = expanded[later.name]
        if later_variants is None or position == 0:
            continue
        takers: list[CheckedRule] = []
        for variant in later_variants:
            taker = _first_taker(index.candidates(position, variant, later.aliases), expanded, later, variant)
            if taker is None:
                break
            if taker not in takers:
                takers.append(taker)
        else:
            names = ", ".join(f"`{t.name}` ({RuleRef.of(t).location})" for t in takers)
            findings.append(Finding(
                FindingCode.SHADOWED,
                f"rule `{later.name}` never fires: every node it matches is rewritten first by {names}",
                (RuleRef.of(later), *(RuleRef.of(t) for t in takers)),
                ("earlier rules take a node first (rule order is match priority); move this rule above them, "
                 "or narrow theirs",)))
    return findings


def _root_key(pattern: A.Expr, aliases: Mapping[str, str]) -> Optional[tuple]:
    """``(target, literals)`` of a pattern's root call (``as`` names unwrapped): its op and target as
    :func:`_target` spells it, and the frozenset of its literal arguments, ``(position, literal)`` and
    ``(keyword, literal)``; None when the root is not a call."""
    while isinstance(pattern, A.Bind):
        pattern = pattern.expr
    if not isinstance(pattern, A.Call):
        return None
    found = []
    positional = [x for x in pattern.args or () if not isinstance(x, A.Ellipsis_)]
    for i, arg in enumerate(positional):
        while isinstance(arg, A.Bind):
            arg = arg.expr
        if isinstance(arg, A.Literal):
            found.append((i, arg))
    for keyword in pattern.kwargs:
        value = keyword.value
        while isinstance(value, A.Bind):
            value = value.expr
        if isinstance(value, A.Literal):
            found.append((keyword.name, value))
    return _target(pattern, aliases), frozenset(found)


class _TakerIndex:
    """The rules that may take a variant's node first, found without trying every earlier rule: one whose
    every option has another root target, or a literal argument the variant does not have at the same
    place, cannot generalise it (:meth:`_Generaliser.general` compares root targets, then a literal only
    with an equal literal), so it takes nothing and is left out. Rule files of hundreds of rules on one
    root made the pairwise search quadratic in its costly part (1,000 rules `add($x, i)`: 3.6 s)."""

    def __init__(self, rules: list[CheckedRule], expanded: dict):
        self.rules = rules
        self.by_target: dict = {}  # target -> [(position, rule, literal sets of its options on that target)]
        self.unindexed: list = []  # (position, rule) whose options have a root that is not a call
        for position, rule in enumerate(rules):
            options = expanded[rule.name]
            if options is None or _may_decline(rule):
                continue  # takes nothing (see _first_taker)
            keys = [_root_key(option, rule.aliases) for option in options]
            if any(key is None for key in keys):
                self.unindexed.append((position, rule))
                continue
            per_target: dict = {}
            for target, literals in keys:
                per_target.setdefault(target, []).append(literals)
            for target, literal_sets in per_target.items():
                self.by_target.setdefault(target, []).append((position, rule, literal_sets))

    def candidates(self, position: int, variant: A.Expr, aliases: Mapping[str, str]) -> list[CheckedRule]:
        """The rules before ``position`` that may generalise ``variant``, in rule order."""
        key = _root_key(variant, aliases)
        if key is None:  # (a checked rule's root is a call): every earlier rule, as _first_taker would try them
            return self.rules[:position]
        target, literals = key
        found = [(p, r) for p, r, sets in self.by_target.get(target, ())
                 if p < position and any(s <= literals for s in sets)]
        found += [(p, r) for p, r in self.unindexed if p < position]
        found.sort(key=lambda item: item[0])
        return [r for _, r in found]


def _first_taker(earlier: list[CheckedRule], expanded: dict, later: CheckedRule, variant: A.Expr
                 ) -> Optional[CheckedRule]:
    for candidate in earlier:
        if _may_decline(candidate) or expanded[candidate.name] is None:
            continue
        unifier = _Unifier(candidate.aliases, later.aliases)
        for option in expanded[candidate.name]:
            generaliser = _Generaliser(candidate.aliases, later.aliases)
            if generaliser.general(option, variant) and _implied(candidate, later, variant, generaliser.mapping):
                return candidate
            if candidate.ast.conditions and unifier.unify(option, variant):
                # The engine takes an alternation's first option that matches and evaluates the
                # conditions with its bindings: an earlier option that may match this node may
                # bind differently and fail the conditions, so no later option can be relied on.
                break
    return None


def static_findings(rule_set: RuleSet) -> tuple[Finding, ...]:
    """Every finding decided without torch: ``unsatisfiable`` and ``shadowed``, in file order.

    A rule found unsatisfiable is not also reported shadowed (it never fires either way).
    """
    impossible = [f for f in (unsatisfiable(r) for r in rule_set.rules) if f is not None]
    never = {f.rule.name for f in impossible}
    shadowed = [f for f in shadowing(rule_set) if f.rule.name not in never]
    return tuple(sorted(impossible + shadowed, key=finding_sort_key))


# ---------------------------------------------------------------------------
# Candidates for the verifier: loops and overlaps
# ---------------------------------------------------------------------------


def _calls(expr: A.Expr) -> Iterator[A.Call]:
    """Every call in a pattern or replacement (all options of every alternation)."""
    stack = [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, A.Call):
            yield item
            stack.extend(item.args or ())
            stack.extend(k.value for k in item.kwargs)
            stack.extend(k.value for k in item.attrs or ())
        elif isinstance(item, (A.Bind,)):
            stack.append(item.expr)
        elif isinstance(item, A.Alt):
            stack.extend(item.options)
        elif isinstance(item, (A.ListExpr, A.TupleExpr)):
            stack.extend(item.items)


class _Unifier:
    """Whether two terms can stand for one node (each side's captures and ``_`` stand for anything).

    An over-approximation used to pick candidates, which the verifier then tries on host graphs:
    captures are not kept consistent, and argument lists are compared where both are written.
    A replacement's builder call or bare call matches any module or arguments.
    """

    def __init__(self, x_aliases: Mapping[str, str], y_aliases: Mapping[str, str]):
        self.x_aliases, self.y_aliases = x_aliases, y_aliases

    def unify(self, x: A.Expr, y: A.Expr) -> bool:
        x, y = _unbound(x), _unbound(y)
        if isinstance(x, A.Alt):
            return any(self.unify(o, y) for o in x.options)
        if isinstance(y, A.Alt):
            return any(self.unify(x, o) for o in y.options)
        if _free(x) or _free(y):
            return True
        if isinstance(x, A.Literal) or isinstance(y, A.Literal):
            return x == y
        if isinstance(x, A.Name) and isinstance(y, A.Name):
            return _constant(x.dotted, self.x_aliases) == _constant(y.dotted, self.y_aliases)
        if isinstance(x, (A.ListExpr, A.TupleExpr)) and isinstance(y, (A.ListExpr, A.TupleExpr)):
            return len(x.items) == len(y.items) and all(self.unify(a, b) for a, b in zip(x.items, y.items))
        if isinstance(x, A.GetAttr) and isinstance(y, A.GetAttr):
            return not (isinstance(x.target, A.Dotted) and isinstance(y.target, A.Dotted)
                        and x.target.parts != y.target.parts)
        if isinstance(x, A.Call) and isinstance(y, A.Call):
            return self.call(x, y)
        return False

    def call(self, x: A.Call, y: A.Call) -> bool:
        if x.op != y.op:
            return False
        if not (x.builder_args is not None or y.builder_args is not None) \
                and _target(x, self.x_aliases) != _target(y, self.y_aliases):
            return False
        if x.args is None or y.args is None:
            return True
        x_pos = [a for a in x.args if not isinstance(a, A.Ellipsis_)]
        y_pos = [a for a in y.args if not isinstance(a, A.Ellipsis_)]
        if not all(self.unify(a, b) for a, b in zip(x_pos, y_pos)):
            return False
        y_kw = {k.name: k.value for k in y.kwargs}
        return all(self.unify(k.value, y_kw[k.name]) for k in x.kwargs if k.name in y_kw)


def _free(expr: A.Expr) -> bool:
    """A part that stands for any value: a capture, ``_``, or a node name (a reference or a replacement's value)."""
    return isinstance(expr, (A.Capture, A.Wildcard)) or (isinstance(expr, A.Name) and len(expr.dotted.parts) == 1)


def produces(producer: CheckedRule, consumer: CheckedRule) -> bool:
    """Whether ``producer``'s replacement can make a node ``consumer``'s pattern matches: a call the
    replacement writes unifies with a call of the consumer's pattern (the consumer may match the new
    node itself, or a node above or below it that now reads it)."""
    unifier = _Unifier(producer.aliases, consumer.aliases)
    made = [c for r in producer.ast.replacements for c in _calls(r)]
    wanted = [c for p in consumer.ast.patterns for c in _calls(p)]
    return any(unifier.unify(m, w) for m in made for w in wanted)


def _call_key(call: A.Call, aliases: Mapping[str, str]) -> tuple:
    """What :meth:`_Unifier.call` compares before unifying arguments, for a cheap test and an index:
    ``(op, target or None for a builder call, literal arguments)``, the literals as ``{position or
    keyword: literal}`` (none for a bare call, which unifies with any arguments)."""
    target = None if call.builder_args is not None else _target(call, aliases)
    literals: dict = {}
    if call.args is not None:
        positional = [a for a in call.args if not isinstance(a, A.Ellipsis_)]
        for i, arg in enumerate(positional):
            arg = _unbound(arg)
            if isinstance(arg, A.Literal):
                literals[i] = arg
        for keyword in call.kwargs:
            value = _unbound(keyword.value)
            if isinstance(value, A.Literal):
                literals[keyword.name] = value
    return call.op, target, literals


def _may_unify(x: tuple, y: tuple) -> bool:
    """False when two calls (:func:`_call_key`) surely do not unify: another op, another target (neither a
    builder call), or another literal where both have one (:meth:`_Unifier.unify`: a literal unifies only
    with an equal literal or a part that stands for anything)."""
    if x[0] != y[0] or (x[1] is not None and y[1] is not None and x[1] != y[1]):
        return False
    small, large = (x[2], y[2]) if len(x[2]) <= len(y[2]) else (y[2], x[2])
    for place, literal in small.items():
        other = large.get(place)
        if other is not None and other != literal:
            return False
    return True


class _CallIndex:
    """Calls of rules, by op and target, to find the rules that have a call that may unify with a given
    one (:func:`_may_unify`) without trying every rule: :func:`loop_candidates` and
    :func:`overlap_candidates` compared every pair of rules (1,000 rules on one target: 6 s each)."""

    def __init__(self) -> None:
        self.by_target: dict = {}  # (op, target) -> [(rule position, key)]
        # (op, target) -> {place: ({literal: [(rule position, key)] with that literal there},
        #                          [(rule position, key)] with none there)}, filled when first asked
        self.by_place: dict = {}
        self.by_op: dict = {}  # op -> [(rule position, key)] of every call of that op
        # builder calls (any target); the checker allows them only in replacements, which are not indexed,
        # but a RuleSet made without it may have one in a pattern
        self.anything: list = []

    def add(self, position: int, key: tuple) -> None:
        """A pattern's call."""
        op, target, _ = key
        self.by_op.setdefault(op, []).append((position, key))
        if target is None:
            self.anything.append((position, key))
        else:
            self.by_target.setdefault((op, target), []).append((position, key))
            self.by_place.pop((op, target), None)

    def rules_meeting(self, key: tuple) -> set:
        """The positions of the rules with a call that may unify with the call ``key`` (a replacement's
        builder call, which may make any module, meets every call of its op)."""
        op, target, literals = key
        entries = self.by_op.get(op, ()) if target is None else self._same_literal(op, target, literals)
        found = {position for position, other in entries if _may_unify(key, other)}
        found.update(position for position, other in self.anything if _may_unify(key, other))
        return found

    def _same_literal(self, op: str, target: str, literals: dict) -> list:
        """The calls of ``target`` that have, at one place where ``literals`` has a literal, the same
        literal or none (all of them when ``literals`` is empty): the others surely do not unify."""
        entries = self.by_target.get((op, target), [])
        if not literals or len(entries) < 16:
            return entries
        places = self.by_place.get((op, target))
        if places is None:
            places = self.by_place[(op, target)] = {}
        place = next(iter(literals))
        split = places.get(place)
        if split is None:
            having: dict = {}
            lacking: list = []
            for entry in entries:
                literal = entry[1][2].get(place)
                if literal is None:
                    lacking.append(entry)
                else:
                    having.setdefault(literal, []).append(entry)
            split = places[place] = (having, lacking)
        return split[0].get(literals[place], []) + split[1]


def _root_calls(pattern: A.Expr) -> Optional[list]:
    """The calls a root pattern is (each option of an alternation), or None when an option is not a call."""
    stack, found = [pattern], []
    while stack:
        item = _unbound(stack.pop())
        if isinstance(item, A.Alt):
            stack.extend(item.options)
        elif isinstance(item, A.Call):
            found.append(item)
        else:
            return None
    return found


def loop_candidates(rule_set: RuleSet) -> list[tuple[str, ...]]:
    """Groups of rules that may rewrite forever: the cycles (strongly connected components, and rules
    that produce their own pattern) of the :func:`produces` graph, in rule order."""
    rules = list(rule_set.rules)
    wanted = _CallIndex()
    for position, rule in enumerate(rules):
        for pattern in rule.ast.patterns:
            for call in _calls(pattern):
                wanted.add(position, _call_key(call, rule.aliases))
    edges = {}
    for rule in rules:
        meeting: set = set()
        for replacement in rule.ast.replacements:
            for call in _calls(replacement):
                meeting |= wanted.rules_meeting(_call_key(call, rule.aliases))
        edges[rule.name] = [rules[i].name for i in sorted(meeting) if produces(rule, rules[i])]
    order = {r.name: i for i, r in enumerate(rules)}
    groups = []
    for component in _components(edges, [r.name for r in rules]):
        if len(component) > 1 or component[0] in edges[component[0]]:
            groups.append(tuple(sorted(component, key=order.__getitem__)))
    return sorted(groups, key=lambda g: order[g[0]])


def _components(edges: dict, nodes: list) -> list[list]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict = {}
    low: dict = {}
    on_stack: set = set()
    stack: list = []
    found: list[list] = []
    counter = itertools.count()
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = next(counter)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = next(counter)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(edges[successor])))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(component)
    return found


def overlap_candidates(rule_set: RuleSet, skip: Iterable[str] = ()) -> list[tuple[str, str]]:
    """Pairs of single-root rules (earlier first) that may match overlapping nodes: one's root pattern
    unifies with a call of the other's pattern. Rules in ``skip`` (shadowed, unsatisfiable) are left out."""
    left_out = set(skip)
    rules = [r for r in rule_set.rules if not r.is_multi_root and r.name not in left_out]
    # (_overlap(x, y): x's root unifies with a call of y's pattern.) The rules whose pattern has a call
    # that may unify with a root call of each rule, and those whose root may unify with each call of it
    calls, roots, unindexed = _CallIndex(), _CallIndex(), set()
    keys = []
    for position, rule in enumerate(rules):
        pattern = rule.ast.patterns[0]
        mine = [_call_key(call, rule.aliases) for call in _calls(pattern)]
        root_calls = _root_calls(pattern)
        if root_calls is None:
            unindexed.add(position)  # a root that is not a call: tried with every rule
            root_keys = []
        else:
            root_keys = [_call_key(call, rule.aliases) for call in root_calls]
        keys.append((mine, root_keys))
        for key in mine:
            calls.add(position, key)
        for key in root_keys:
            roots.add(position, key)
    pairs = []
    for i, first in enumerate(rules):
        mine, root_keys = keys[i]
        if i in unindexed:
            meeting = set(range(i + 1, len(rules)))
        else:
            meeting = set(unindexed)
            for key in root_keys:
                meeting |= calls.rules_meeting(key)
            for key in mine:
                meeting |= roots.rules_meeting(key)
        for j in sorted(meeting):
            if j > i:
                second = rules[j]
                if _overlap(first, second) or _overlap(second, first):
                    pairs.append((first.name, second.name))
    return pairs


def _overlap(x: CheckedRule, y: CheckedRule) -> bool:
    unifier = _Unifier(x.aliases, y.aliases)
    root = x.ast.patterns[0]
    return any(unifier.unify(root, call) for call in _calls(y.ast.patterns[0]))
