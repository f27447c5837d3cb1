"""Parse tree to rule AST. The only module that knows the shapes of Lark's trees.

Two ways to the same AST:

* :func:`build_direct` (what the front end uses): the parser's LALR loop calls
  :class:`_Reductions` at each reduction, so AST nodes are made bottom-up as the text is
  parsed, with no Lark tokens or trees in between. It gives up (:class:`NotDirect`) on
  anything wrong with the text.
* :func:`build` (the reference): walks the Lark tree of :func:`fxrules.lang.parser.parse_tree`
  top-down. The front end takes this path when the direct one gives up, so every
  diagnostic comes from here; tests check that both make the same AST, spans included.
"""

from __future__ import annotations

import ast as _pyast
import bisect
import dataclasses
import re
import sys
import warnings
from typing import Callable, Optional, Union

from lark import Token, Tree

import fxrules.lang.ast as A
import fxrules.lang.parser as _parser
from fxrules.lang.diagnostics import Diagnostic, RuleFileError
from fxrules.lang.source import Source

_Child = Union[Tree, Token]


class _TreeReader:
    def __init__(self, source: Source):
        self.path = source.path
        self.source = source

    # -- spans ---------------------------------------------------------------
    def span(self, node: _Child) -> A.Span:
        """A token's own span; a tree's from its first to its last token (the parser keeps no positions)."""
        if isinstance(node, Token):
            return A.Span(self.path, node.line, node.column, node.end_line, node.end_column)
        first = last = node
        while isinstance(first, Tree):
            if not first.children:
                return A.Span(self.path, 0, 0, 0, 0)
            first = first.children[0]
        while isinstance(last, Tree):
            last = last.children[-1]
        return A.Span(self.path, first.line, first.column, last.end_line, last.end_column)

    def span_between(self, first: _Child, last: _Child) -> A.Span:
        a, b = self.span(first), self.span(last)
        return A.Span(self.path, a.line, a.column, b.end_line, b.end_column)

    def error(self, node: _Child, code: str, message: str) -> RuleFileError:
        return RuleFileError([Diagnostic.at(self.span(node), code, message)], {self.path: self.source.text})

    # -- file and items ----------------------------------------------------------
    def file(self, tree: Tree) -> A.RuleFile:
        items = []
        for child in tree.children:
            kind = child.data
            if kind == "use_decl":
                items.append(self.use(child))
            elif kind == "default_decl":
                items.append(A.DefaultContract(self.contract(child.children[1]), self.span(child)))
            elif kind == "rule":
                items.append(self.rule(child))
            elif kind == "oneline_rule":
                items.append(self.oneline_rule(child))
            elif kind == "example":
                example = self.example(child)
                if items and isinstance(items[-1], A.Rule):  # an example belongs to the rule above it
                    rule = items[-1]
                    items[-1] = dataclasses.replace(rule, examples=rule.examples + (example,))
                else:  # none: kept as an item, so the checker reports it with every other error
                    items.append(example)
            else:  # pragma: no cover - the grammar has no other items
                raise AssertionError(kind)
        return A.RuleFile(self.path, tuple(items))

    def use(self, tree: Tree) -> A.Use:
        _use, dotted, _as, alias = tree.children
        return A.Use(self.dotted(dotted), str(alias), self.span(tree))

    def contract(self, tree: Tree) -> A.Contract:
        return A.Contract(str(tree.children[1]), self.span(tree))

    def rule(self, tree: Tree) -> A.Rule:
        name_token = tree.children[1]
        description = None
        contract = None
        body = tree.children[-1]
        for child in tree.children[2:-1]:
            if isinstance(child, Tree) and child.data == "description":
                description = self.string(child.children[0])
            elif isinstance(child, Tree) and child.data == "contract":
                contract = self.contract(child)
        patterns, conditions, replacements = self.body(body)
        return A.Rule(str(name_token), description, contract, patterns, conditions, replacements,
                      self.span(tree), self.span(name_token))

    def oneline_rule(self, tree: Tree) -> A.Rule:
        contract = None
        if len(tree.children) == 2:
            contract = self.contract(tree.children[0])
        patterns, conditions, replacements = self.body(tree.children[-1])
        span = self.span(tree)
        return A.Rule(None, None, contract, patterns, conditions, replacements, span, span)

    def example(self, tree: Tree) -> A.Example:
        count = mode = None
        mode_span = A.NO_SPAN
        outputs: tuple = ()
        inputs: tuple = ()
        for child in tree.children:
            if _is_token(child, "INT"):
                count = self.integer(child)
            elif _is_token(child, "NAME"):
                mode, mode_span = str(child), self.span(child)
            elif isinstance(child, Tree) and child.data == "example_outputs":
                outputs = self.exprs(child)
            elif isinstance(child, Tree) and child.data == "given":
                inputs = tuple(self.input_spec(c) for c in child.children if isinstance(c, Tree))
        return A.Example(count, mode, outputs, inputs, self.span(tree), mode_span)

    def input_spec(self, tree: Tree) -> A.InputSpec:
        name = str(tree.children[0])[1:]
        dtype = None
        shape: tuple = ()
        fill = None
        for child in tree.children[1:]:
            if _is_token(child, "NAME"):
                dtype = str(child)
            elif isinstance(child, Tree) and child.data == "shape":
                shape = tuple(self.integer(t) for t in child.children if _is_token(t, "INT"))
            elif isinstance(child, Tree):
                fill = self.literal(child)
        return A.InputSpec(name, dtype, shape, fill, self.span(tree))

    def body(self, tree: Tree):
        patterns: tuple = ()
        conditions = []
        replacements: tuple = ()
        for child in tree.children:
            if isinstance(child, Token):
                continue
            if child.data == "patterns":
                patterns = self.exprs(child)
            elif child.data == "where_clause":
                conditions.append(self.cond(child.children[1]))
            elif child.data == "replacements":
                replacements = self.exprs(child)
        return patterns, tuple(conditions), replacements

    def exprs(self, tree: Tree) -> tuple:
        return tuple(self.expr(c) for c in tree.children if not _is_token(c, "COMMA"))

    # -- patterns and replacements ---------------------------------------------------
    def expr(self, node: _Child) -> A.Expr:
        if isinstance(node, Token):  # pragma: no cover - every expression token is wrapped in a rule
            raise AssertionError(node)
        kind = node.data
        span = self.span(node)
        ch = node.children
        if kind == "alt":
            return A.Alt(tuple(self.expr(c) for c in ch if not _is_token(c, "BAR")), span)
        if kind == "bind":
            return A.Bind(self.expr(ch[0]), str(ch[2]), span)
        if kind == "capture":
            return A.Capture(str(ch[0])[1:], span)
        if kind == "wildcard":
            return A.Wildcard(span)
        if kind == "name":
            return A.Name(self.dotted(ch[0]), span)
        if kind == "group":
            return self.expr(ch[1])
        if kind == "call_function":
            args, kwargs = self.arglist(ch[2]) if len(ch) > 2 else (None, ())
            return A.Call("call_function", self.dotted(ch[1]), args, kwargs, span=span)
        if kind == "call_method":
            args, kwargs = self.arglist(ch[2]) if len(ch) > 2 else (None, ())
            return A.Call("call_method", A.Dotted((str(ch[1]),), self.span(ch[1])), args, kwargs, span=span)
        if kind == "call_module":
            return self.call_module(node, span)
        if kind == "getattr":
            target = ch[1]
            if _is_token(target, "CAPTURE"):
                t = A.Capture(str(target)[1:], self.span(target))
            elif _is_token(target, "WILDCARD"):
                t = A.Wildcard(self.span(target))
            else:
                t = self.dotted(target)
            return A.GetAttr(t, span)
        if kind == "ellipsis":
            return A.Ellipsis_(span)
        if kind == "list":
            return A.ListExpr(self.values(ch), span)
        if kind == "tuple":
            return A.TupleExpr(self.values(ch), span)
        return A.Literal(self.literal(node), span)

    def values(self, children: list) -> tuple:
        return tuple(self.expr(c) for c in children if isinstance(c, Tree))

    def call_module(self, node: Tree, span: A.Span) -> A.Call:
        ch = node.children
        attrs = None
        lists = []
        for child in ch[2:]:
            if child.data == "attrs":
                attrs = tuple(self.keyword(k) for k in child.children if isinstance(k, Tree))
            else:
                lists.append(child)
        args, kwargs, builder_args = None, (), None
        if len(lists) == 2:
            builder_pos, builder_kw = self.arglist(lists[0])
            builder_args = builder_pos + builder_kw  # the checker refuses keywords here, with the others
            args, kwargs = self.arglist(lists[1])
        elif len(lists) == 1:
            args, kwargs = self.arglist(lists[0])
        return A.Call("call_module", self.dotted(ch[1]), args, kwargs, attrs, builder_args, span)

    def arglist(self, tree: Tree) -> tuple[tuple, tuple]:
        args = []
        kwargs = []
        for child in tree.children:
            if isinstance(child, Token):
                continue
            if child.data == "kwarg":
                kwargs.append(self.keyword(child))
            else:
                if kwargs and child.data != "ellipsis":
                    raise self.error(child, "unexpected-token",
                                     "a positional argument cannot follow a keyword argument")
                args.append(self.expr(child))
        return tuple(args), tuple(kwargs)

    def keyword(self, tree: Tree) -> A.Keyword:
        name, _eq, value = tree.children
        return A.Keyword(str(name), self.expr(value), self.span(tree))

    def dotted(self, tree: Tree) -> A.Dotted:
        return A.Dotted(tuple(str(t) for t in tree.children if _is_token(t, "NAME")), self.span(tree))

    def integer(self, token: Token) -> int:
        """An INT token's value; too many digits to convert is an ``unexpected-token`` diagnostic at the token."""
        value = _int(str(token))
        if value is None:
            raise self.error(token, "unexpected-token", _too_many_digits(str(token)))
        return value

    def literal(self, tree: Tree):
        kind = tree.data
        ch = tree.children
        if kind == "int":
            return self.integer(ch[0])
        if kind == "neg_int":
            return -self.integer(ch[1])
        if kind == "float":
            return float(ch[0])
        if kind == "neg_float":
            return -float(ch[1])
        if kind == "string":
            return self.string(ch[0])
        if kind == "true":
            return True
        if kind == "false":
            return False
        if kind == "none":
            return None
        raise AssertionError(kind)  # pragma: no cover

    def string(self, token: Token) -> str:
        try:
            value = _literal_value(str(token))
        except _INVALID_LITERAL:
            raise self.error(token, "unexpected-token",
                             "invalid escape sequence in this string (valid: \\\\ \\\" \\' \\n \\t \\r "
                             "\\xHH \\uHHHH \\N{name} ...)") from None
        if not isinstance(value, str):  # pragma: no cover - the STRING terminal admits only str literals
            raise self.error(token, "unexpected-token", "invalid string literal")
        return value

    # -- conditions ------------------------------------------------------------------
    def cond(self, node: _Child) -> A.Cond:
        kind = node.data
        span = self.span(node)
        ch = node.children
        if kind in ("or_cond", "and_cond"):
            operands = [c for c in ch if not _is_token(c, "OR") and not _is_token(c, "AND")]
            op = "or" if kind == "or_cond" else "and"
            result = self.cond(operands[0])
            for operand in operands[1:]:
                right = self.cond(operand)
                result = A.CBinary(op, result, right, A.Span(self.path, span.line, span.column,
                                                              right.span.end_line, right.span.end_column))
            return result
        if kind == "c_not":
            return A.CUnary("not", self.cond(ch[1]), span)
        if kind == "c_neg":
            return A.CUnary("-", self.cond(ch[1]), span)
        if kind == "c_compare":
            op = " ".join(str(t) for t in ch[1].children)
            return A.CBinary(op, self.cond(ch[0]), self.cond(ch[2]), span)
        if kind == "c_binop":
            return A.CBinary(str(ch[1]), self.cond(ch[0]), self.cond(ch[2]), span)
        if kind == "c_attr":
            return A.CAttr(self.cond(ch[0]), str(ch[2]), span)
        if kind == "c_index":
            return A.CIndex(self.cond(ch[0]), self.cond(ch[2]), span)
        if kind == "c_call":
            return A.CCall(self.cond(ch[0]), tuple(self.cond(c) for c in ch[1:] if isinstance(c, Tree)), span)
        if kind == "c_capture":
            return A.CCapture(str(ch[0])[1:], span)
        if kind == "c_name":
            return A.CName(str(ch[0]), span)
        if kind == "c_list":
            return A.CList(tuple(self.cond(c) for c in ch if isinstance(c, Tree)), span)
        if kind == "primary":  # ( cond )
            return self.cond(ch[1])
        return A.CLiteral(self.literal(node), span)


_INVALID_LITERAL = (ValueError, SyntaxError, DeprecationWarning, SyntaxWarning, UnicodeError)


def _literal_value(literal: str) -> object:
    """The value of a STRING token's text; raises one of _INVALID_LITERAL if it is not a valid literal."""
    with warnings.catch_warnings():  # an unknown escape such as "\d" is an error, not a warning
        warnings.simplefilter("error")
        return _pyast.literal_eval(literal)  # a string token only: no names, no calls


def _is_token(node: _Child, kind: str) -> bool:
    return isinstance(node, Token) and node.type == kind


MAX_INT_DIGITS = 4000
"""Longer decimal integer literals are refused (Python itself refuses to convert more than
``sys.get_int_max_str_digits()``, 4300 by default; a lower limit set there is the limit).
Hexadecimal literals have no limit: Python converts them in linear time, and the printer
writes integers too long for :func:`str` in hexadecimal."""


_ALWAYS_CONVERTIBLE = 640
"""Python's int/str limit can be set no lower than this (or to 0, no limit)."""


def _digit_limit() -> int:
    """The most digits a decimal integer literal may have: MAX_INT_DIGITS, or Python's lower limit."""
    python = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
    return min(MAX_INT_DIGITS, python) if python else MAX_INT_DIGITS


def _int(text: str) -> Optional[int]:
    """The value of an INT token's text, or None if it has more decimal digits than :func:`_digit_limit`."""
    if text[:2] in ("0x", "0X"):
        return int(text, 16)
    if len(text) > _ALWAYS_CONVERTIBLE and len(text) > _digit_limit():  # (most literals are short)
        return None
    try:
        return int(text)
    except ValueError:  # Python's limit, lowered since the check above (in another thread)
        return None


def _too_many_digits(text: str) -> str:
    return f"an integer literal of {len(text)} digits; the limit is {_digit_limit()}"


def build(tree: Tree, source: Source) -> A.RuleFile:
    """Turn a parse tree into a :class:`fxrules.lang.ast.RuleFile` (may raise RuleFileError)."""
    return _TreeReader(source).file(tree)


# ---------------------------------------------------------------------------
# The direct path: AST nodes made by the parser's reductions
# ---------------------------------------------------------------------------


class NotDirect(Exception):
    """The direct path gave up on a text (a syntax error, a limit, an invalid literal, ...).

    The caller builds it the reference way, ``build(parse_tree(source), source)``, which
    reports the problem, or builds it if the direct path gave up on something valid.
    """


_Match = type(re.match("", ""))
_new_tuple = tuple.__new__  # makes a Span without namedtuple's Python-level __new__: one per node adds up
_bisect_right = bisect.bisect_right


class _Arguments:
    """An argument list: ``args`` and ``kwargs`` as in A.Call, and its closing parenthesis (its last token)."""

    __slots__ = ("args", "kwargs", "end")

    def __init__(self, args: tuple, kwargs: tuple, end: object) -> None:
        self.args, self.kwargs, self.end = args, kwargs, end


class _Attributes:
    """An attribute block ``{k=v, ...}``: its keywords and its closing brace (its last token)."""

    __slots__ = ("keywords", "end")

    def __init__(self, keywords: tuple, end: object) -> None:
        self.keywords, self.end = keywords, end


class _Reductions:
    """One file's reductions: ``r_NAME`` makes what :class:`_TreeReader` makes from a tree named NAME.

    NAME is the grammar rule's alias, else its name, as in the Lark tree; ``r_NAME`` takes
    that tree's children as Lark would give them (newline tokens dropped, the children of
    inlined ``_rules`` and ``(...)*`` repetitions spliced in), except that a child tree is
    already what its own reduction made and a token is the scanner's ``re.Match``. Anything
    the reference builder would report raises :class:`NotDirect`, so the reference reports it.

    Spans: a node's span runs from the first to the last token of its tree, as in the
    reference. A child node's span gives those tokens' positions, except for an expression in
    parentheses: its node keeps the span inside them (as the reference does) while a parent's
    span reaches over them, so ``parenthesized`` records, by node id, the span with them.
    """

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.parenthesized: dict[int, tuple[object, A.Span]] = {}  # id -> (node, kept alive; its outer span)

    # -- positions and spans ------------------------------------------------------
    # (Inlined by hand: a span per node, two ends per span, so calls here add up.)
    def _first(self, child) -> tuple[int, int]:
        """(line, column) where a token or a node (with its parentheses, if any) starts."""
        if type(child) is _Match:
            offset = child.start()
            starts = self.line_starts
            line = _bisect_right(starts, offset)  # lines end at "\n", as the lexer counts them
            return line, offset - starts[line - 1] + 1
        span = self.parenthesized[id(child)][1] if id(child) in self.parenthesized else child.span
        return span[1], span[2]

    def _last(self, child) -> tuple[int, int]:
        """(line, column) where a token or a node (with its parentheses, if any) ends."""
        if type(child) is _Match:
            offset = child.end()  # a token never holds a newline: it ends on the line it starts on
            starts = self.line_starts
            line = _bisect_right(starts, offset)
            return line, offset - starts[line - 1] + 1
        span = self.parenthesized[id(child)][1] if id(child) in self.parenthesized else child.span
        return span[3], span[4]

    def _span(self, first, last) -> A.Span:
        """From the start of ``first`` to the end of ``last`` (each a token or a node)."""
        return _new_tuple(A.Span, (self.path,) + self._first(first) + self._last(last))

    def _token_span(self, token) -> A.Span:
        start, end = token.span()
        starts = self.line_starts
        line = _bisect_right(starts, start)
        column = start - starts[line - 1] + 1
        return _new_tuple(A.Span, (self.path, line, column, line, column + end - start))

    def _tokens_span(self, first, last) -> A.Span:
        """From the start of token ``first`` to the end of token ``last``."""
        start = first.start()
        end = last.end()
        starts = self.line_starts
        line = _bisect_right(starts, start)
        line_start = starts[line - 1]
        end_line, end_line_start = line, line_start
        if line < len(starts) and end >= starts[line]:  # it ends on a later line
            end_line = _bisect_right(starts, end)
            end_line_start = starts[end_line - 1]
        return _new_tuple(A.Span, (self.path, line, start - line_start + 1, end_line, end - end_line_start + 1))

    # -- file and items -----------------------------------------------------------
    def r_start(self, ch: list) -> A.RuleFile:
        items: list = []
        for item in ch:
            if type(item) is A.Example and items and isinstance(items[-1], A.Rule):
                rule = items[-1]  # an example belongs to the rule above it
                items[-1] = dataclasses.replace(rule, examples=rule.examples + (item,))
            else:
                items.append(item)
        return A.RuleFile(self.path, tuple(items))

    def r_use_decl(self, ch: list) -> A.Use:  # USE dotted AS NAME
        return A.Use(ch[1], ch[3].group(), self._tokens_span(ch[0], ch[3]))

    def r_default_decl(self, ch: list) -> A.DefaultContract:  # DEFAULT contract
        return A.DefaultContract(ch[1], self._span(ch[0], ch[1]))

    def r_contract(self, ch: list) -> A.Contract:  # LSQB NAME RSQB
        return A.Contract(ch[1].group(), self._tokens_span(ch[0], ch[2]))

    def r_rule(self, ch: list) -> A.Rule:  # RULE NAME description? contract? COLON body
        description = contract = None
        for child in ch[2:-1]:
            if type(child) is str:
                description = child
            elif type(child) is A.Contract:
                contract = child
        patterns, conditions, replacements = ch[-1]
        return A.Rule(ch[1].group(), description, contract, patterns, conditions, replacements,
                      self._span(ch[0], replacements[-1]), self._token_span(ch[1]))

    def r_description(self, ch: list) -> str:  # STRING
        return self._string(ch[0])

    def r_oneline_rule(self, ch: list) -> A.Rule:  # contract? body
        patterns, conditions, replacements = ch[-1]
        contract = ch[0] if len(ch) == 2 else None
        span = self._span(ch[0] if len(ch) == 2 else patterns[0], replacements[-1])
        return A.Rule(None, None, contract, patterns, conditions, replacements, span, span)

    def r_body(self, ch: list) -> tuple:  # patterns where_clause* ARROW replacements
        return ch[0], tuple(ch[1:-2]), ch[-1]

    def r_patterns(self, ch: list) -> tuple:  # expr (COMMA expr)*
        return tuple(ch[::2])

    r_replacements = r_example_outputs = r_patterns

    def r_where_clause(self, ch: list) -> A.Cond:  # WHERE cond
        return ch[1]

    def r_example(self, ch: list) -> A.Example:  # EXAMPLE INT? NAME? COLON example_outputs given?
        count = mode = None
        mode_span = A.NO_SPAN
        lists = []  # example_outputs, then given
        for child in ch[1:]:
            if type(child) is not _Match:
                lists.append(child)
            elif child.lastgroup == "INT":
                count = self._int_literal(child)
            elif child.lastgroup == "NAME":
                mode, mode_span = child.group(), self._token_span(child)
        outputs = lists[0]
        inputs = lists[1] if len(lists) > 1 else ()
        return A.Example(count, mode, outputs, inputs, self._span(ch[0], (inputs or outputs)[-1]), mode_span)

    def r_given(self, ch: list) -> tuple:  # GIVEN input_spec (COMMA input_spec)*
        return tuple(ch[1::2])

    def r_input_spec(self, ch: list) -> A.InputSpec:  # CAPTURE COLON NAME? shape (EQUAL literal)?
        dtype = fill = None
        at = 2
        if type(ch[2]) is _Match:
            dtype = ch[2].group()
            at = 3
        shape, end = ch[at]
        if len(ch) > at + 1:
            end = ch[at + 2]
            fill = end.value
        return A.InputSpec(ch[0].group()[1:], dtype, shape, fill, self._span(ch[0], end))

    def r_shape(self, ch: list) -> tuple:  # LSQB (INT (COMMA INT)* COMMA?)? RSQB
        return tuple([self._int_literal(token) for token in ch[1:-1:2]]), ch[-1]

    # -- patterns and replacements ------------------------------------------------------
    def r_alt(self, ch: list) -> A.Alt:  # named (BAR named)+
        return A.Alt(tuple(ch[::2]), self._span(ch[0], ch[-1]))

    def r_bind(self, ch: list) -> A.Bind:  # atom AS NAME
        return A.Bind(ch[0], ch[2].group(), self._span(ch[0], ch[2]))

    def r_capture(self, ch: list) -> A.Capture:  # CAPTURE
        return A.Capture(ch[0].group()[1:], self._token_span(ch[0]))

    def r_wildcard(self, ch: list) -> A.Wildcard:  # WILDCARD
        return A.Wildcard(self._token_span(ch[0]))

    def r_name(self, ch: list) -> A.Name:  # dotted
        return A.Name(ch[0], ch[0].span)

    def r_group(self, ch: list) -> A.Expr:  # LPAR expr RPAR
        inner = ch[1]
        self.parenthesized[id(inner)] = (inner, self._span(ch[0], ch[2]))
        return inner

    def r_call_function(self, ch: list) -> A.Call:  # CALL_FUNCTION dotted arglist?
        if len(ch) == 2:
            return A.Call("call_function", ch[1], None, (), None, None, self._span(ch[0], ch[1]))
        arguments = ch[2]
        return A.Call("call_function", ch[1], arguments.args, arguments.kwargs, None, None,
                      self._tokens_span(ch[0], arguments.end))

    def r_call_method(self, ch: list) -> A.Call:  # CALL_METHOD NAME arglist?
        target = A.Dotted((ch[1].group(),), self._token_span(ch[1]))
        if len(ch) == 2:
            return A.Call("call_method", target, None, (), None, None, self._tokens_span(ch[0], ch[1]))
        arguments = ch[2]
        return A.Call("call_method", target, arguments.args, arguments.kwargs, None, None,
                      self._tokens_span(ch[0], arguments.end))

    def r_call_module(self, ch: list) -> A.Call:  # CALL_MODULE dotted attrs? arglist? arglist?
        attrs = None
        lists = []
        for child in ch[2:]:
            if type(child) is _Attributes:
                attrs = child.keywords
            else:
                lists.append(child)
        args, kwargs, builder_args = None, (), None
        if len(lists) == 2:
            builder_args = lists[0].args + lists[0].kwargs  # the checker refuses keywords here, with the others
            args, kwargs = lists[1].args, lists[1].kwargs
        elif len(lists) == 1:
            args, kwargs = lists[0].args, lists[0].kwargs
        span = self._tokens_span(ch[0], ch[-1].end) if len(ch) > 2 else self._span(ch[0], ch[1])
        return A.Call("call_module", ch[1], args, kwargs, attrs, builder_args, span)

    def r_getattr(self, ch: list) -> A.GetAttr:  # GET_ATTR (CAPTURE | WILDCARD | dotted)
        target = ch[1]
        if type(target) is _Match:
            span = self._token_span(target)
            target = A.Capture(target.group()[1:], span) if target.lastgroup == "CAPTURE" else A.Wildcard(span)
            return A.GetAttr(target, self._tokens_span(ch[0], ch[1]))
        return A.GetAttr(target, self._span(ch[0], target))

    def r_ellipsis(self, ch: list) -> A.Ellipsis_:  # ELLIPSIS
        return A.Ellipsis_(self._token_span(ch[0]))

    def r_list(self, ch: list) -> A.ListExpr:  # LSQB (value (COMMA value)* COMMA?)? RSQB
        return A.ListExpr(tuple(ch[1:-1:2]), self._tokens_span(ch[0], ch[-1]))

    def r_tuple(self, ch: list) -> A.TupleExpr:  # LPAR value COMMA (value (COMMA value)* COMMA?)? RPAR
        return A.TupleExpr(tuple(ch[1:-1:2]), self._tokens_span(ch[0], ch[-1]))

    def r_arglist(self, ch: list) -> _Arguments:  # LPAR (arg (COMMA arg)* COMMA?)? RPAR
        values = ch[1:-1:2]
        args = []
        kwargs = []
        for value in values:
            if type(value) is A.Keyword:
                kwargs.append(value)
            elif kwargs and type(value) is not A.Ellipsis_:
                raise NotDirect("a positional argument after a keyword argument")
            else:
                args.append(value)
        return _Arguments(tuple(args), tuple(kwargs), ch[-1])

    def r_attrs(self, ch: list) -> _Attributes:  # LBRACE (kwarg (COMMA kwarg)* COMMA?)? RBRACE
        return _Attributes(tuple(ch[1:-1:2]), ch[-1])

    def r_kwarg(self, ch: list) -> A.Keyword:  # NAME EQUAL value
        return A.Keyword(ch[0].group(), ch[2], self._span(ch[0], ch[2]))

    def r_dotted(self, ch: list) -> A.Dotted:  # NAME (DOT NAME)*
        if len(ch) == 1:
            return A.Dotted((ch[0].group(),), self._token_span(ch[0]))
        if len(ch) == 3:
            return A.Dotted((ch[0].group(), ch[2].group()), self._tokens_span(ch[0], ch[2]))
        return A.Dotted(tuple([token.group() for token in ch[::2]]), self._tokens_span(ch[0], ch[-1]))

    # -- literals: an expression's Literal (r_literal_condition makes a condition's) ------------
    def _int_literal(self, token) -> int:
        """An INT token's value (a literal, a count, a size); the reference path reports too many digits."""
        value = _int(token.group())
        if value is None:
            raise NotDirect("an integer literal with too many digits")
        return value

    def _string(self, token) -> str:
        value = _literal_value(token.group())
        if not isinstance(value, str):  # pragma: no cover - the STRING terminal admits only str literals
            raise NotDirect("not a string literal")
        return value

    def r_int(self, ch: list) -> A.Literal:  # INT
        return A.Literal(self._int_literal(ch[0]), self._token_span(ch[0]))

    def r_neg_int(self, ch: list) -> A.Literal:  # MINUS INT
        return A.Literal(-self._int_literal(ch[1]), self._tokens_span(ch[0], ch[1]))

    def r_float(self, ch: list) -> A.Literal:  # FLOAT
        return A.Literal(float(ch[0].group()), self._token_span(ch[0]))

    def r_neg_float(self, ch: list) -> A.Literal:  # MINUS FLOAT
        return A.Literal(-float(ch[1].group()), self._tokens_span(ch[0], ch[1]))

    def r_string(self, ch: list) -> A.Literal:  # STRING
        return A.Literal(self._string(ch[0]), self._token_span(ch[0]))

    def r_true(self, ch: list) -> A.Literal:  # TRUE
        return A.Literal(True, self._token_span(ch[0]))

    def r_false(self, ch: list) -> A.Literal:  # FALSE
        return A.Literal(False, self._token_span(ch[0]))

    def r_none(self, ch: list) -> A.Literal:  # NONE
        return A.Literal(None, self._token_span(ch[0]))

    def r_literal_condition(self, ch: list) -> A.CLiteral:  # plain_literal, in a condition
        return A.CLiteral(ch[0].value, ch[0].span)

    # -- conditions ---------------------------------------------------------------------
    def _chain(self, op: str, operands: list) -> A.Cond:
        """``a or b or c`` as ((a or b) or c); each link from the chain's first token to its right operand's end."""
        line, column = self._first(operands[0])
        result = operands[0]
        for right in operands[1:]:
            end = right.span
            result = A.CBinary(op, result, right, _new_tuple(A.Span, (self.path, line, column, end[3], end[4])))
        return result

    def r_or_cond(self, ch: list) -> A.Cond:  # and_cond (OR and_cond)+
        return self._chain("or", ch[::2])

    def r_and_cond(self, ch: list) -> A.Cond:  # not_cond (AND not_cond)+
        return self._chain("and", ch[::2])

    def r_c_not(self, ch: list) -> A.CUnary:  # NOT not_cond
        return A.CUnary("not", ch[1], self._span(ch[0], ch[1]))

    def r_c_neg(self, ch: list) -> A.CUnary:  # MINUS unary
        return A.CUnary("-", ch[1], self._span(ch[0], ch[1]))

    def r_c_compare(self, ch: list) -> A.CBinary:  # sum compare_op sum
        return A.CBinary(ch[1], ch[0], ch[2], self._span(ch[0], ch[2]))

    def r_compare_op(self, ch: list) -> str:  # EQEQ | ... | NOT IN
        return " ".join(token.group() for token in ch)

    def r_c_binop(self, ch: list) -> A.CBinary:  # sum (PLUS | MINUS) product, product (STAR | ...) unary
        return A.CBinary(ch[1].group(), ch[0], ch[2], self._span(ch[0], ch[2]))

    def r_c_attr(self, ch: list) -> A.CAttr:  # postfix DOT NAME
        return A.CAttr(ch[0], ch[2].group(), self._span(ch[0], ch[2]))

    def r_c_index(self, ch: list) -> A.CIndex:  # postfix LSQB cond RSQB
        return A.CIndex(ch[0], ch[2], self._span(ch[0], ch[3]))

    def r_c_call(self, ch: list) -> A.CCall:  # postfix LPAR (cond (COMMA cond)* COMMA?)? RPAR
        return A.CCall(ch[0], tuple(ch[2:-1:2]), self._span(ch[0], ch[-1]))

    def r_c_capture(self, ch: list) -> A.CCapture:  # CAPTURE
        return A.CCapture(ch[0].group()[1:], self._token_span(ch[0]))

    def r_c_name(self, ch: list) -> A.CName:  # NAME
        return A.CName(ch[0].group(), self._token_span(ch[0]))

    def r_c_list(self, ch: list) -> A.CList:  # LSQB (cond (COMMA cond)* COMMA?)? RSQB
        return A.CList(tuple(ch[1:-1:2]), self._tokens_span(ch[0], ch[-1]))

    r_primary = r_group  # LPAR cond RPAR


def _reduction(rule) -> Optional[Callable]:
    """The reduction of a Lark grammar rule for :func:`fxrules.lang.parser.parse_direct`.

    It does what Lark's tree builder does for the rule, with :class:`_Reductions` making the
    nodes: terminals whose names start with `_` (newlines) are dropped, the children of rules
    whose names start with `_` (``_item``, repetitions) are spliced into their parent's, and a
    `?rule` without an alias that has one child is that child (None: the loop hands it up).
    One exception: a literal in a condition is a CLiteral, though Lark's rule there is the unit
    rule ``primary: plain_literal`` whose child also serves expressions (as a Literal).
    """
    origin = str(rule.origin.name)
    expansion = rule.expansion
    kept = [(i, not symbol.is_term and symbol.name.startswith("_"))  # (index, spliced)
            for i, symbol in enumerate(expansion) if not (symbol.is_term and symbol.filter_out)]
    children = _children(kept, len(expansion))
    single = rule.options.expand1 and not rule.alias
    if origin == "primary" and [symbol.name for symbol in expansion] == ["plain_literal"]:
        return _Reductions.r_literal_condition
    if origin.startswith("_"):  # inlined into its parent: its value is its children
        return (lambda target, values: values) if children is None else (lambda target, values: children(values))
    if single and len(kept) == 1 and not kept[0][1]:
        if len(expansion) == 1:
            return None
        index = kept[0][0]
        return lambda target, values: values[index]
    make = getattr(_Reductions, "r_" + str(rule.alias or origin))
    if single:  # one child after splicing is that child, as Lark's ExpandSingleChild does
        if children is None:
            return lambda target, values: values[0] if len(values) == 1 else make(target, values)

        def reduce(target, values):
            values = children(values)
            return values[0] if len(values) == 1 else make(target, values)
        return reduce
    if children is None:
        return make
    return lambda target, values: make(target, children(values))


def _children(kept: list, size: int) -> Optional[Callable[[list], list]]:
    """How a rule's children are made from its symbols' values, or None if they are the values themselves."""
    if len(kept) == size and not any(spliced for _, spliced in kept):
        return None
    if not any(spliced for _, spliced in kept):
        indices = [i for i, _ in kept]
        return lambda values: [values[i] for i in indices]

    def children(values: list) -> list:
        out: list = []
        for position, (i, spliced) in enumerate(kept):
            if spliced and position == 0:
                out = values[i]  # a left-recursive repetition: extend its list rather than copy it
            elif spliced:
                out.extend(values[i])
            else:
                out.append(values[i])
        return out
    return children


def build_direct(source: Source) -> A.RuleFile:
    """Text to AST in one pass (see the module's docstring); raises :class:`NotDirect` when it gives up."""
    text = source.text if source.text.endswith("\n") else source.text + "\n"
    try:
        return _parser.parse_direct(text, _parser.direct_tables(_reduction), _Reductions(source.path, text))
    except Exception as exc:
        raise NotDirect(str(exc)) from exc
