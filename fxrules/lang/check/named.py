"""Named patterns: their definitions, the files that bring them in, and their expansion into rules.

``pattern matmul($a, $b) = call_function torch.matmul($a, $b) | call_method matmul($a, $b)``
defines a pattern once; ``matmul(PATTERN, PATTERN)`` uses it in any pattern after it, and in files
that ``use "this.fxr"``. A use is a macro: the checker substitutes the arguments for the parameters
(:func:`expand`) and the engine compiles the result like any pattern, so an alternation in a body
is indexed by each option's root key and costs nothing at run time that writing it out would not.

Why a macro, and what keeps it one:

* a body uses only its parameters (and ``_``), no ``as`` names: what a use binds is what its
  arguments bind, so a use site reads like a call;
* a body may use only the patterns defined before it, so expansion always ends (no recursion);
* the names in a body are made absolute where it is defined (``F.gelu`` becomes
  ``torch.nn.functional.gelu``), so the body means the same in every file that uses it;
* a parameter used more than once in one option of a body stands for one value, as a capture
  does: the argument is written at its first occurrence and referenced (a hidden ``as`` name, which
  no rule can write: it holds ``#``) at the others.

``use "ops.fxr"`` reads another rule file's definitions (its rules are not loaded). The path is
relative to the using file's directory and must stay in it or below (no absolute paths, no ``..``,
symbolic links resolved first), end in ``.fxr``, and be read like any rule file (a regular file, at
most the size cap). A file read from text (``parse_rules``) cannot use files.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import fxrules.lang.ast as A
from fxrules.lang.check.reporter import Reporter, did_you_mean
from fxrules.lang.check.scope import Aliases
from fxrules.lang.names import BUILTIN_ALIASES, builtin_path

MAX_USE_DEPTH = 8
"""Files using files using files...: deeper than this is a ``bad-use`` (cycles are reported as such)."""

MAX_EXPANDED_NODES = 20_000
"""The most pattern nodes a rule's patterns (or a body) may have once named patterns are expanded:
an argument is copied into each place its parameter stands, so uses nested in uses multiply
(``too-large`` beyond this, decided before expanding, from the sizes below)."""

HIDDEN = "#"
"""In the hidden ``as`` names expansion makes: no name a rule can write holds it."""


@dataclass(frozen=True, slots=True)
class NamedPattern:
    """A checked definition: its body with nested uses expanded and names absolute.

    ``attribute_params``: parameters used as a module attribute value; ``getattr_params``: as the
    target of ``get_attr``: their arguments must be values (a capture, a literal, a constant, `_`).
    ``ellipses``: where the body's argument lists end in ``...`` (they count at every use).
    ``heads``: the first parts of the body's absolute names (a using file must not alias them).
    """

    definition: A.PatternDef
    body: A.Expr
    attribute_params: frozenset[str] = frozenset()
    getattr_params: frozenset[str] = frozenset()
    ellipses: tuple[A.Span, ...] = ()
    heads: frozenset[str] = frozenset()
    repeated: frozenset[str] = frozenset()  # parameters written more than once in the body
    size: int = 1  # the body's nodes, expanded
    occurrences: Mapping[str, int] = field(default_factory=dict)  # parameter -> places it stands in the body
    rootable: bool = True  # its body is an operation in every option (it may be a rule's root)

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def params(self) -> tuple[str, ...]:
        return self.definition.params


@dataclass(frozen=True, slots=True)
class NamedPatterns:
    """The named patterns a rule sees: those defined above it in its file and those its file uses."""

    patterns: Mapping[str, NamedPattern] = field(default_factory=dict)

    def get(self, name: str) -> Optional[NamedPattern]:
        return self.patterns.get(name)

    def with_pattern(self, pattern: NamedPattern) -> "NamedPatterns":
        return NamedPatterns({**self.patterns, pattern.name: pattern})


NO_PATTERNS = NamedPatterns()


def uses_named(patterns: tuple[A.Expr, ...]) -> bool:
    """Whether any of ``patterns`` uses a named pattern."""
    stack = list(patterns)
    while stack:
        expr = stack.pop()
        if isinstance(expr, A.PatternUse):
            return True
        stack.extend(_children(expr))
    return False


def _children(expr: A.Expr) -> list:
    if isinstance(expr, A.Call):
        return [*(a for a in expr.args or ()), *(k.value for k in expr.kwargs),
                *(k.value for k in expr.attrs or ())]
    if isinstance(expr, (A.ListExpr, A.TupleExpr)):
        return list(expr.items)
    if isinstance(expr, A.Alt):
        return list(expr.options)
    if isinstance(expr, A.Bind):
        return [expr.expr]
    if isinstance(expr, A.PatternUse):
        return [*expr.args, *(k.value for k in expr.kwargs)]
    return []


# ---------------------------------------------------------------------------
# Definitions
# ---------------------------------------------------------------------------


def check_body(reporter: Reporter, definition: A.PatternDef) -> tuple[frozenset, frozenset]:
    """What only a body is checked for (the rest is the pattern checker's): parameters given once,
    each used; captures only of parameters; no ``as``. Returns the attribute and get_attr parameters."""
    params = definition.params
    seen: dict[str, A.Span] = {}
    for name, span in zip(params, definition.param_spans or (definition.name_span,) * len(params)):
        if name in seen:
            reporter.error(span, "duplicate-binding", f"parameter `${name}` is given twice",
                           notes=[f"first given at {seen[name]}"])
        seen.setdefault(name, span)
    used: set[str] = set()
    attribute_params: set[str] = set()
    getattr_params: set[str] = set()
    stack: list = [(definition.body, False)]
    while stack:
        expr, in_attribute = stack.pop()
        if isinstance(expr, A.Capture):
            used.add(expr.name)
            if in_attribute:
                attribute_params.add(expr.name)
            if expr.name not in seen:
                reporter.error(expr.span, "bad-pattern",
                               f"`${expr.name}` is not a parameter of the named pattern `{definition.name}`",
                               notes=["a named pattern's body uses only its parameters and `_`: add "
                                      f"`${expr.name}` to `{definition.name}(...)`, or write `_`"])
        elif isinstance(expr, A.GetAttr) and isinstance(expr.target, A.Capture):
            stack.append((expr.target, in_attribute))
            getattr_params.add(expr.target.name)
        elif isinstance(expr, A.Bind):
            reporter.error(expr.span, "bad-pattern", "a named pattern's body cannot name nodes with `as`",
                           notes=["what a use binds is what its arguments bind: pass the node as an argument"])
            stack.append((expr.expr, in_attribute))
        elif isinstance(expr, A.Call):
            stack.extend((a, in_attribute) for a in expr.args or ())
            stack.extend((k.value, in_attribute) for k in expr.kwargs)
            stack.extend((k.value, True) for k in expr.attrs or ())
        else:
            stack.extend((child, in_attribute) for child in _children(expr))
    for name in dict.fromkeys(params):
        if name not in used:
            reporter.error(seen[name], "bad-pattern",
                           f"parameter `${name}` of `{definition.name}` is not used in its body")
    return frozenset(attribute_params), frozenset(getattr_params)


def absolute(expr: A.Expr, aliases: Aliases) -> tuple[A.Expr, frozenset]:
    """``expr`` with every dotted name written as its full path (so it means the same in any file),
    and the first parts of those paths."""
    heads: set[str] = set()

    def full(dotted: A.Dotted, path: str) -> A.Dotted:
        parts = tuple(path.split("."))
        heads.add(parts[0])
        return A.Dotted(parts, dotted.span)

    def target(call: A.Call) -> A.Dotted:
        dotted = call.target
        if call.op == "call_method" or call.builder_args is not None:
            return dotted
        single = len(dotted.parts) == 1 and dotted.parts[0] not in aliases.paths
        if call.op == "call_function" and single and dotted.parts[0] not in BUILTIN_ALIASES:
            return full(dotted, builtin_path(dotted.parts[0]) or dotted.text)
        if call.op == "call_module" and single:
            return full(dotted, "torch.nn." + dotted.parts[0])
        return full(dotted, aliases.full_path(dotted))

    def walk(node: A.Expr) -> A.Expr:
        return _rebuild(node, walk, target, lambda name: A.Name(full(name.dotted, aliases.full_path(name.dotted)),
                                                               name.span))

    return walk(expr), frozenset(heads)


def _rebuild(expr: A.Expr, walk: Callable, target: Callable, dotted_name: Callable) -> A.Expr:
    """``expr`` with its sub-expressions walked (``walk``), call targets and dotted constants remade."""
    if isinstance(expr, A.Call):
        return dataclasses.replace(
            expr, target=target(expr),
            args=None if expr.args is None else tuple(walk(a) for a in expr.args),
            kwargs=tuple(dataclasses.replace(k, value=walk(k.value)) for k in expr.kwargs),
            attrs=None if expr.attrs is None else tuple(dataclasses.replace(k, value=walk(k.value))
                                                        for k in expr.attrs))
    if isinstance(expr, A.Name) and len(expr.dotted.parts) > 1:
        return dotted_name(expr)
    if isinstance(expr, (A.ListExpr, A.TupleExpr)):
        return dataclasses.replace(expr, items=tuple(walk(i) for i in expr.items))
    if isinstance(expr, A.Alt):
        return dataclasses.replace(expr, options=tuple(walk(o) for o in expr.options))
    if isinstance(expr, A.Bind):
        return dataclasses.replace(expr, expr=walk(expr.expr))
    if isinstance(expr, A.PatternUse):
        return dataclasses.replace(expr, args=tuple(walk(a) for a in expr.args))
    return expr


def body_ellipses(body: A.Expr) -> tuple[A.Span, ...]:
    found = []
    stack = [body]
    while stack:
        expr = stack.pop()
        if isinstance(expr, A.Call):
            found.extend(a.span for a in expr.args or () if isinstance(a, A.Ellipsis_))
        stack.extend(_children(expr))
    return tuple(found)


# ---------------------------------------------------------------------------
# Expansion
# ---------------------------------------------------------------------------

_SHARABLE = (A.Call, A.GetAttr, A.Bind, A.PatternUse)
"""Arguments that match a node: a parameter used again refers back to the node its first use matched."""


def rootable(body: A.Expr) -> bool:
    """Whether every option of an (expanded) body is an operation: a use may then be a pattern root."""
    while isinstance(body, A.Bind):
        body = body.expr
    if isinstance(body, A.Alt):
        return all(rootable(option) for option in body.options)
    return isinstance(body, (A.Call, A.GetAttr))


def expanded_size(patterns: tuple[A.Expr, ...], scope: NamedPatterns) -> int:
    """How many nodes ``patterns`` have once expanded, computed without expanding (a use is its body's
    size, plus each argument's size once per place its parameter stands). Unknown patterns count 1."""
    total = 0
    stack = list(patterns)
    while stack:
        expr = stack.pop()
        if isinstance(expr, A.PatternUse):
            named = scope.get(expr.name)
            if named is None:
                total += 1
                continue
            total += named.size
            for param, arg in zip(named.params, expr.args):
                total += named.occurrences.get(param, 1) * max(expanded_size((arg,), scope) - 1, 0)
                if total > MAX_EXPANDED_NODES:
                    return total
            continue
        total += 1
        stack.extend(_children(expr))
    return total


def occurrences(body: A.Expr) -> dict[str, int]:
    """Parameter -> how many places it stands in an (expanded) body."""
    counts: dict[str, int] = {}
    stack = [body]
    while stack:
        expr = stack.pop()
        if isinstance(expr, A.Capture):
            counts[expr.name] = counts.get(expr.name, 0) + 1
        elif isinstance(expr, A.GetAttr) and isinstance(expr.target, A.Capture):
            counts[expr.target.name] = counts.get(expr.target.name, 0) + 1
        stack.extend(_children(expr))
    return counts


def repeated_params(body: A.Expr) -> frozenset[str]:
    """The parameters a body writes more than once (a use shares their argument's node)."""
    counts: dict[str, int] = {}
    stack = [body]
    while stack:
        expr = stack.pop()
        if isinstance(expr, A.Capture):
            counts[expr.name] = counts.get(expr.name, 0) + 1
        elif isinstance(expr, A.GetAttr) and isinstance(expr.target, A.Capture):
            counts[expr.target.name] = counts.get(expr.target.name, 0) + 1
        stack.extend(_children(expr))
    return frozenset(name for name, count in counts.items() if count > 1)


@dataclass(slots=True)
class _Expander:
    """Expands the uses of one rule's patterns (or of a definition's body: ``prefix`` its name);
    numbers the uses, so each has hidden names of its own."""

    scope: NamedPatterns
    prefix: str = ""
    count: int = 0

    def expr(self, expr: A.Expr) -> A.Expr:
        if isinstance(expr, A.PatternUse):
            return self.use(expr)
        return _rebuild(expr, self.expr, lambda call: call.target, lambda name: name)

    def use(self, use: A.PatternUse) -> A.Expr:
        named = self.scope.get(use.name)
        if named is None:  # pragma: no cover - the checker reported it; a rule with errors is not expanded
            raise KeyError(use.name)
        self.count += 1
        tag = f"{self.prefix}{use.name}{HIDDEN}{self.count}"
        arguments = {}
        for param, arg in zip(named.params, use.args):
            arg = self.expr(arg)
            shared = None
            if isinstance(arg, _SHARABLE) and param in named.repeated:
                shared = arg.name if isinstance(arg, A.Bind) else f"{tag}${param}"
            arguments[param] = (arg, shared)
        return _Substitution(arguments, tag).expr(named.body, frozenset())[0]


@dataclass(frozen=True, slots=True)
class _Substitution:
    """The parameters of one use, each ``(argument, hidden name or None)``."""

    arguments: Mapping[str, tuple]
    tag: str  # this use's: hidden names the body holds (from uses inside it) are renamed under it

    def hidden(self, name: str) -> str:
        return f"{self.tag}/{name}"

    def expr(self, expr: A.Expr, done: frozenset) -> tuple[A.Expr, frozenset]:
        """``expr`` with parameters substituted; ``done``: those already written in this option
        (their later occurrences refer back). Returns the new expression and the new ``done``."""
        if isinstance(expr, A.Capture) and expr.name in self.arguments:
            arg, shared = self.arguments[expr.name]
            if shared is None:
                return arg, done
            if expr.name in done:
                return A.Name(A.Dotted((shared,), arg.span), arg.span), done
            if not isinstance(arg, A.Bind):
                arg = A.Bind(arg, shared, arg.span)
            return arg, done | {expr.name}
        if isinstance(expr, A.GetAttr) and isinstance(expr.target, A.Capture) and expr.target.name in self.arguments:
            arg, _ = self.arguments[expr.target.name]
            target = arg if isinstance(arg, (A.Capture, A.Wildcard)) else A.Wildcard(expr.target.span)
            return dataclasses.replace(expr, target=target), done
        if isinstance(expr, A.Bind):  # only hidden names: a body has no `as` of its own
            inner, done = self.expr(expr.expr, done)
            return dataclasses.replace(expr, expr=inner, name=self.hidden(expr.name)), done
        if isinstance(expr, A.Name) and len(expr.dotted.parts) == 1 and HIDDEN in expr.dotted.parts[0]:
            return A.Name(A.Dotted((self.hidden(expr.dotted.parts[0]),), expr.span), expr.span), done
        if isinstance(expr, A.Alt):
            options, after = [], done
            for option in expr.options:
                new, finished = self.expr(option, done)
                options.append(new)
                after = after | finished
            return dataclasses.replace(expr, options=tuple(options)), after
        if isinstance(expr, A.Call):
            args = None
            if expr.args is not None:
                args, done = self.sequence(expr.args, done)
            kwargs, done = self.keywords(expr.kwargs, done)
            attrs = None
            if expr.attrs is not None:
                attrs, done = self.keywords(expr.attrs, done)
            return dataclasses.replace(expr, args=args, kwargs=kwargs, attrs=attrs), done
        if isinstance(expr, (A.ListExpr, A.TupleExpr)):
            items, done = self.sequence(expr.items, done)
            return dataclasses.replace(expr, items=items), done
        return expr, done

    def sequence(self, items: tuple, done: frozenset) -> tuple[tuple, frozenset]:
        out = []
        for item in items:
            new, done = self.expr(item, done)
            out.append(new)
        return tuple(out), done

    def keywords(self, keywords: tuple, done: frozenset) -> tuple[tuple, frozenset]:
        out = []
        for keyword in keywords:
            new, done = self.expr(keyword.value, done)
            out.append(dataclasses.replace(keyword, value=new))
        return tuple(out), done


def expand(patterns: tuple[A.Expr, ...], scope: NamedPatterns, prefix: str = "") -> tuple[A.Expr, ...]:
    """Pattern roots (a checked rule's, or a definition's body: ``prefix`` its name and ``/``) with
    every named pattern use expanded (see the module docstring)."""
    expander = _Expander(scope, prefix)
    return tuple(expander.expr(p) for p in patterns)


def report_unknown_pattern(reporter: Reporter, use: A.PatternUse, scope: NamedPatterns) -> None:
    known = sorted(scope.patterns)
    notes = [f"named patterns here: {', '.join(known)}" if known else
             "no named pattern is defined above this rule (`pattern NAME($a) = ...`, or `use \"file.fxr\"`)"]
    reporter.error(use.name_span, "unknown-pattern", f"`{use.name}` is not a named pattern defined above",
                   notes=notes + did_you_mean(use.name, known))


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------


def used_file(using: str, written: str) -> tuple[Optional[str], str]:
    """The real path of the file ``use "written"`` names in the file at ``using``, or None and why not."""
    if not os.path.isfile(using):
        return None, "a rule file read from text cannot use other files; load it from a file"
    if os.path.isabs(written) or written.startswith(("/", "\\")) or "\\" in written:
        return None, "the path must be relative to this file's directory, with `/` between its parts"
    parts = written.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return None, "the path may not contain `..`, `.` or empty parts: it stays in this file's directory or below"
    if not written.endswith(".fxr"):
        return None, "the used file must be a rule file ending in `.fxr`"
    root = os.path.realpath(os.path.dirname(os.path.abspath(using)))
    path = os.path.realpath(os.path.join(root, *parts))
    if os.path.commonpath([root, path]) != root:
        return None, "the path leads out of this file's directory (through a symbolic link)"
    if not os.path.isfile(path):
        return None, "no such file in this file's directory"
    return path, ""
