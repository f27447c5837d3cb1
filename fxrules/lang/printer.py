"""The canonical text of a rule file: what ``fxrules fmt`` writes.

:func:`print_file` turns a :class:`fxrules.lang.ast.RuleFile` back into source text
in one fixed layout, so that formatting is a function of the AST alone::

    use torch.nn.functional as F
    default [exact]
    call_module Dropout -> call_module Identity

    rule fold_conv_bn "fold a batch norm into the conv before it" [changes]:
        call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn
        where not bn.training
        -> call_module fxrules.builders.fold_conv_bn(conv, bn)($x)

The contract with :mod:`fxrules.lang.parser` and :mod:`fxrules.lang.reductions` is the round
trip ``parse(print_file(f)) == f`` for every ``f`` the parser produces
(spans aside), and idempotence of ``print_file(parse(text))``.
``tests/lang/test_printer.py`` checks both, on the corpus and on random ASTs.

Layout
    One item per top-level line; a named rule spans several lines (header,
    patterns, one line per ``where`` clause, ``-> replacements``) and is
    separated from its neighbours by a blank line. A rule without a name
    prints on one line. Comments are not part of the AST, so they are not
    printed.

Expressions
    Alternation is always parenthesized, ``(a | b)``; a bound binding is
    parenthesized, ``(p as a) as b``. Tuples print as ``(a,)`` and ``(a, b)``.
    In an argument list, a trailing ``...`` is printed after the keyword
    arguments (``f($x, k=1, ...)``), which the parser reads back unchanged.

Conditions
    Printed with the fewest parentheses the grammar needs: ``or`` < ``and`` <
    ``not`` < comparisons (which do not chain: ``(a < b) < c``) < ``+ -`` <
    ``* / // %`` < unary ``-`` < postfix (``.attr``, ``[i]``, ``(args)``).
    ``and``/``or``/arithmetic are left-associative, so a right operand of the
    same precedence is parenthesized. An integer before ``.attr`` is followed
    by a space (``1 .real``: ``1.real`` would lex as the float ``1.``) rather
    than parenthesized, so the printer never writes more brackets or operators
    than the source had, and a condition within the parser's operator limit
    (``MAX_CONDITION_OPERATORS``) stays within it once formatted.

Literals
    Strings print double-quoted with Python escapes (``\\"``, ``\\\\``, ``\\n``,
    ``\\r``, ``\\t``, and ``\\xNN``/``\\uNNNN``/``\\UNNNNNNNN`` for every
    non-printable character, as :func:`repr` does), which the ``STRING``
    terminal accepts and :func:`ast.literal_eval` reads back to the same value.
    Floats print with :func:`repr`, which round-trips exactly. Infinity has no
    literal, but the parser produces it from an overflowing literal such as
    ``1e999``, so ``inf`` prints as ``1e999`` (and ``-inf`` as ``-1e999``),
    which reads back as infinity. NaN cannot come from any source text and
    raises :class:`ValueError`. Integers too long for :func:`str` (see
    :func:`sys.set_int_max_str_digits`) print in hexadecimal, which the parser
    reads without a length limit.

    A negative number in a pattern (``-5``) is one literal, but in a condition
    the grammar reads ``-5`` as unary minus applied to ``5``; so a negative
    :class:`~fxrules.lang.ast.CLiteral` (which the parser never produces) prints
    as ``-5`` and reads back as ``CUnary("-", CLiteral(5))``.

Shapes the parser never produces (an ``Alt`` with one option, a list in
pattern position, a call with keyword arguments but ``args is None``...) are
printed as faithfully as the syntax allows, without a round-trip guarantee. A
rule with no patterns or no replacements, or an unnamed rule with a
description, raises :class:`ValueError` rather than losing information.

Printing is iterative (an explicit stack, no recursion per nesting level), so
any depth of AST prints without touching the recursion limit.
"""

from __future__ import annotations

import math
from typing import Callable, Union

import fxrules.lang.ast as A

__all__ = ["print_file", "print_item", "print_rule", "print_expr", "print_cond", "string_literal", "literal"]

INDENT = "    "

# ---------------------------------------------------------------------------
# Files and items
# ---------------------------------------------------------------------------


def print_file(rule_file: A.RuleFile) -> str:
    """The canonical text of a whole file: items in order, a final newline (none if empty)."""
    chunks: list[str] = []
    previous: object = None
    for item in rule_file.items:
        if chunks and (_is_named_rule(item) or _is_named_rule(previous)):
            chunks.append("\n")  # a blank line around every multi-line rule
        chunks.append(print_item(item))
        chunks.append("\n")
        previous = item
    return "".join(chunks)


def print_item(item: A.Item) -> str:
    """One top-level item (a ``use``, a ``default`` or a rule), without the final newline."""
    if isinstance(item, A.Use):
        return f"use {item.path.text} as {item.alias}"
    if isinstance(item, A.DefaultContract):
        return f"default {_contract(item.contract)}"
    if isinstance(item, A.UseFile):
        return f"use {string_literal(item.path)}"
    if isinstance(item, A.PatternDef):
        return print_pattern_def(item)
    if isinstance(item, A.Rule):
        return print_rule(item)
    if isinstance(item, A.Example):
        return print_example(item)
    raise TypeError(f"not a rule file item: {item!r}")


def print_rule(rule: A.Rule) -> str:
    """A rule, without the final newline: multi-line when named, one line otherwise."""
    if not rule.patterns:
        raise ValueError("a rule needs at least one pattern")
    if not rule.replacements:
        raise ValueError("a rule needs at least one replacement")
    patterns = ", ".join(print_expr(p) for p in rule.patterns)
    replacements = "-> " + ", ".join(print_expr(r) for r in rule.replacements)
    wheres = ["where " + print_cond(c) for c in rule.conditions]
    if rule.name is None:
        if rule.description is not None:
            raise ValueError("a rule without a name cannot carry a description")
        head = [_contract(rule.contract)] if rule.contract is not None else []
        return "".join([" ".join(head + [patterns] + wheres + [replacements])]
                       + ["\n" + INDENT + print_example(e) for e in rule.examples])
    header = "rule " + rule.name
    if rule.description is not None:
        header += " " + string_literal(rule.description)
    if rule.contract is not None:
        header += " " + _contract(rule.contract)
    if len(INDENT + patterns) > WIDTH:
        patterns = ", ".join(print_expr_wrapped(p, INDENT) for p in rule.patterns)
    if len(INDENT + replacements) > WIDTH:
        replacements = "-> " + ", ".join(print_expr_wrapped(r, INDENT) for r in rule.replacements)
    lines = [header + ":", patterns, *wheres, replacements]
    return ("\n" + INDENT).join(lines + [print_example(e, INDENT) for e in rule.examples])


def print_pattern_def(definition: A.PatternDef) -> str:
    """``pattern NAME($a, ...) = BODY`` on one line, or with its body broken inside brackets
    when longer than :data:`WIDTH` (an alternation prints in parentheses, so it may wrap)."""
    head = f"pattern {definition.name}({', '.join('$' + p for p in definition.params)}) = "
    body = print_expr(definition.body)
    if len(head) + len(body) > WIDTH:  # continuation lines under the body's first character
        body = print_expr_wrapped(definition.body, " " * len(head))
    return head + body


def print_example(example: A.Example, indent: str = "") -> str:
    """``example 2 train: MODEL given $x: float64[2, 3]``: one line, or the model's calls broken
    over lines (inside their brackets) when that line would be longer than :data:`WIDTH`."""
    head = "example"
    if example.count is not None:
        head += f" {example.count}"
    if example.mode is not None:
        head += f" {example.mode}"
    outputs = ", ".join(print_expr(e) for e in example.outputs)
    if len(indent + head + ": " + outputs) > WIDTH:
        outputs = ", ".join(print_expr_wrapped(e, indent) for e in example.outputs)
    text = head + ": " + outputs
    if example.inputs:
        text += " given " + ", ".join(print_input(i) for i in example.inputs)
    return text


def print_input(spec: A.InputSpec) -> str:
    text = f"${spec.name}: {spec.dtype or ''}[{', '.join(str(d) for d in spec.shape)}]"
    if spec.fill is not None:
        text += " = " + literal(spec.fill)
    return text


def _contract(contract: A.Contract) -> str:
    return f"[{contract.word}]"


def _is_named_rule(item: object) -> bool:
    return isinstance(item, A.Rule) and item.name is not None


# ---------------------------------------------------------------------------
# The engine: expand nodes into pieces on an explicit stack
# ---------------------------------------------------------------------------

# A piece is text, or a (node, context) pair still to be expanded. The meaning of
# the context depends on the family: for patterns it says whether the position
# is an `atom` (the operand of `as`); for conditions it is the lowest precedence
# level that may appear there without parentheses.
_Piece = Union[str, tuple]


def _render(node: object, context: int, expand: Callable[[object, int], list]) -> str:
    out: list[str] = []
    stack: list[_Piece] = [(node, context)]
    while stack:
        piece = stack.pop()
        if isinstance(piece, str):
            out.append(piece)
        else:
            stack.extend(reversed(expand(*piece)))
    return "".join(out)


def _joined(nodes, context: int, separator: str = ", ") -> list:
    pieces: list = []
    for i, node in enumerate(nodes):
        if i:
            pieces.append(separator)
        pieces.append((node, context))
    return pieces


# ---------------------------------------------------------------------------
# Patterns and replacements
# ---------------------------------------------------------------------------

_ANY = 0  # any expression, list or tuple (a pattern, an argument, an item, a keyword's value)
_ATOM = 1  # the operand of `as`: a binding must be parenthesized there


def print_expr(expr: Union[A.Expr, A.Keyword]) -> str:
    """A pattern or replacement expression (or a ``name=value`` keyword)."""
    return _render(expr, _ANY, _expand_expr)


WIDTH = 100
"""Lines of a multi-line rule longer than this are broken inside brackets (:func:`print_expr_wrapped`)."""

_WRAP_DEPTH = 24  # deeper than this, expressions are printed on one line (a bound on the recursion)


def print_expr_wrapped(expr: Union[A.Expr, A.Keyword], indent: str, depth: int = 0) -> str:
    """``print_expr``, with alternations and argument lists broken over lines (one option or one
    argument a line, inside the brackets, where newlines do not end the statement) until each
    part fits in :data:`WIDTH` after ``indent``. The same AST either way."""
    flat = print_expr(expr)
    if len(indent) + len(flat) <= WIDTH or depth > _WRAP_DEPTH:
        return flat
    inner = indent + INDENT
    if isinstance(expr, A.Alt):
        options = [print_expr_wrapped(o, indent + "   ", depth + 1) for o in expr.options]
        return "(" + ("\n" + indent + " | ").join(options) + ")"
    if isinstance(expr, A.Bind) and not isinstance(expr.expr, A.Bind):
        return print_expr_wrapped(expr.expr, indent, depth + 1) + " as " + expr.name
    if isinstance(expr, A.Keyword):
        return expr.name + "=" + print_expr_wrapped(expr.value, indent, depth + 1)
    if isinstance(expr, A.Call) and (expr.args or expr.kwargs):
        head = f"{expr.op} {expr.target.text}"
        if expr.attrs is not None:
            head += "{" + ", ".join(print_expr(k) for k in expr.attrs) + "}"
        if expr.builder_args is not None:
            head += _wrapped_list([print_expr(a) for a in expr.builder_args], indent, inner, len(head))
        args = expr.args or ()
        trailing = len(args)
        while expr.kwargs and trailing and isinstance(args[trailing - 1], A.Ellipsis_):
            trailing -= 1
        arguments = [*args[:trailing], *expr.kwargs, *args[trailing:]]
        last_line = head.rsplit("\n", 1)[-1]
        start = len(last_line) if "\n" in head else len(indent) + len(head)
        flat_args = [print_expr(a) for a in arguments]
        if start + 2 + len(", ".join(flat_args)) <= WIDTH:
            return head + "(" + ", ".join(flat_args) + ")"
        if len(inner) + len(", ".join(flat_args)) + 1 <= WIDTH:  # all arguments on one line of their own
            return head + "(\n" + inner + ", ".join(flat_args) + ",\n" + indent + ")"
        lines = [inner + print_expr_wrapped(a, inner, depth + 1) + "," for a in arguments]
        return head + "(\n" + "\n".join(lines) + "\n" + indent + ")"
    return flat


def _wrapped_list(items: list, indent: str, inner: str, used: int) -> str:
    """``(a, b, c)`` on one line when it fits after ``used`` characters, else one line of its own
    (or one item a line) inside the parentheses."""
    joined = ", ".join(items)
    if not items or len(indent) + used + len(joined) + 2 <= WIDTH:  # `()` is never broken: `(\n,\n)` is no list
        return "(" + joined + ")"
    if len(inner) + len(joined) + 1 <= WIDTH:
        return "(\n" + inner + joined + ",\n" + indent + ")"
    return "(\n" + "\n".join(inner + item + "," for item in items) + "\n" + indent + ")"


def _expand_expr(node: object, context: int) -> list:
    match node:
        case A.Capture(name=name):
            return ["$" + name]
        case A.Wildcard():
            return ["_"]
        case A.Literal(value=value):
            return [literal(value)]
        case A.Name(dotted=dotted):
            return [dotted.text]
        case A.Ellipsis_():
            return ["..."]
        case A.Variadic(name=name):
            return ["*$" + name]
        case A.Keyword(name=name, value=value):
            return [name + "=", (value, _ANY)]
        case A.ListExpr(items=items):
            return ["[", *_joined(items, _ANY), "]"]
        case A.TupleExpr(items=items):
            if len(items) == 1:
                return ["(", (items[0], _ANY), ",)"]
            return ["(", *_joined(items, _ANY), ")"]
        case A.Alt(options=options):
            return ["(", *_joined(options, _ANY, " | "), ")"]
        case A.Bind(expr=inner, name=name):
            if context == _ATOM:
                return ["(", (node, _ANY), ")"]
            return [(inner, _ATOM), " as " + name]
        case A.GetAttr(target=target):
            return ["get_attr ", (target, _ANY)]
        case A.Dotted():  # only as the target of get_attr
            return [node.text]
        case A.Call():
            return _expand_call(node)
        case A.Computed(cond=cond):
            return ["{" + print_cond(cond) + "}"]
        case A.PatternUse(name=name, args=args, kwargs=kwargs):
            return [name + "(", *_joined((*args, *kwargs), _ANY), ")"]
    raise TypeError(f"not a pattern expression: {node!r}")


def _expand_call(call: A.Call) -> list:
    pieces: list = [f"{call.op} {call.target.text}"]
    if call.attrs is not None:
        pieces += ["{", *_joined(call.attrs, _ANY), "}"]
    if call.builder_args is not None:
        pieces += ["(", *_joined(call.builder_args, _ANY), ")"]
    if call.args is None and not call.kwargs and call.builder_args is None:
        return pieces  # the bare form: any arguments / forward them
    args = call.args or ()
    # The builder accepts `...` after keyword arguments and keeps it in `args`;
    # printing a trailing `...` last reads the way rules are written.
    trailing = len(args)
    while call.kwargs and trailing and isinstance(args[trailing - 1], A.Ellipsis_):
        trailing -= 1
    arguments = [*args[:trailing], *call.kwargs, *args[trailing:]]
    return pieces + ["(", *_joined(arguments, _ANY), ")"]


# ---------------------------------------------------------------------------
# Conditions
# ---------------------------------------------------------------------------

# Precedence levels, loosest first (the grammar's or_cond ... primary).
_OR, _AND, _NOT, _COMPARE, _SUM, _PRODUCT, _NEG, _POSTFIX, _PRIMARY = range(1, 10)

_BINARY_LEVELS = {
    "or": _OR,
    "and": _AND,
    **{op: _COMPARE for op in ("==", "!=", "<", "<=", ">", ">=", "in", "not in")},
    "+": _SUM,
    "-": _SUM,
    **{op: _PRODUCT for op in ("*", "/", "//", "%")},
}


def print_cond(cond: A.Cond) -> str:
    """A ``where`` condition, with the parentheses its structure needs."""
    return _render(cond, 0, _expand_cond)


def _level(cond: object) -> int:
    match cond:
        case A.CBinary(op=op):
            try:
                return _BINARY_LEVELS[op]
            except KeyError:
                raise ValueError(f"unknown condition operator {op!r}") from None
        case A.CUnary(op="not"):
            return _NOT
        case A.CUnary(op="-"):
            return _NEG
        case A.CUnary(op=op):
            raise ValueError(f"unknown unary operator {op!r}")
        case A.CAttr() | A.CIndex() | A.CCall():
            return _POSTFIX
        case A.CLiteral(value=value) if _is_negative_number(value):
            return _NEG  # prints as `-5`, which reads as unary minus
    return _PRIMARY


def _expand_cond(node: object, minimum: int) -> list:
    level = _level(node)
    if level < minimum:
        return ["(", (node, 0), ")"]
    match node:
        case A.CBinary(op=op, left=left, right=right):
            if level == _COMPARE:  # comparisons do not chain
                return [(left, _SUM), f" {op} ", (right, _SUM)]
            return [(left, level), f" {op} ", (right, level + 1)]  # left-associative
        case A.CUnary(op="not", operand=operand):
            return ["not ", (operand, _NOT)]
        case A.CUnary(operand=operand):
            return ["-", (operand, _NEG)]
        case A.CAttr(value=value, attr=attr):
            if _is_plain_int(value):
                return [(value, _POSTFIX), " ." + attr]  # `1.real` would lex as `1.` `real`
            return [(value, _POSTFIX), "." + attr]
        case A.CIndex(value=value, index=index):
            return [(value, _POSTFIX), "[", (index, 0), "]"]
        case A.CSlice(start=start, stop=stop, step=step):  # inside a CIndex's brackets
            parts: list = [] if start is None else [(start, 0)]
            parts += [":"] + ([] if stop is None else [(stop, 0)])
            return parts + ([] if step is None else [":", (step, 0)])
        case A.CCall(func=func, args=args):
            return [(func, _POSTFIX), "(", *_joined(args, 0), ")"]
        case A.CList(items=items, parens=True):
            return ["(", *_joined(items, 0), ",)" if len(items) == 1 else ")"]  # `()` when empty
        case A.CList(items=items):
            return ["[", *_joined(items, 0), "]"]
        case A.CGenerator(element=element, var=var, iterable=iterable, filter=None):
            return [(element, 0), f" for {var} in ", (iterable, _OR)]
        case A.CGenerator(element=element, var=var, iterable=iterable, filter=condition):
            return [(element, 0), f" for {var} in ", (iterable, _OR), " if ", (condition, _OR)]
        case A.CCapture(name=name):
            return ["$" + name]
        case A.CName(name=name):
            return [name]
        case A.CLiteral(value=value):
            return [literal(value)]
    raise TypeError(f"not a condition: {node!r}")


# ---------------------------------------------------------------------------
# Literals
# ---------------------------------------------------------------------------


def literal(value: Union[int, float, str, bool, None]) -> str:
    """The source text of a literal value (see the module docstring for numbers)."""
    if value is None:
        return "None"
    if value is True:
        return "True"
    if value is False:
        return "False"
    if isinstance(value, int):
        try:
            return str(value)
        except ValueError:  # more digits than int/str conversion allows
            return hex(value)
    if isinstance(value, float):
        if math.isnan(value):
            raise ValueError("NaN has no literal in a rule file")
        if math.isinf(value):
            return "1e999" if value > 0 else "-1e999"
        return repr(value)
    if isinstance(value, str):
        return string_literal(value)
    raise TypeError(f"not a literal value: {value!r}")


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def string_literal(text: str) -> str:
    """``text`` as a double-quoted literal that the ``STRING`` terminal reads back exactly."""
    if text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'
    out = ['"']
    for ch in text:
        escaped = _ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            if code < 0x100:
                out.append(f"\\x{code:02x}")
            elif code < 0x10000:
                out.append(f"\\u{code:04x}")
            else:
                out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _is_plain_int(cond: object) -> bool:
    """A condition that prints as digits only, such as ``1`` (not ``True``, not ``-1``)."""
    if not isinstance(cond, A.CLiteral):
        return False
    value = cond.value
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_negative_number(value: object) -> bool:
    """True for a number that prints with a leading minus (``-0.0`` and ``-inf`` included)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value < 0
    if isinstance(value, float):
        return math.copysign(1.0, value) < 0
    return False
