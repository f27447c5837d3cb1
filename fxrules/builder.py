"""Parse tree to rule AST. The only module that knows the shapes of Lark's trees."""

from __future__ import annotations

import ast as _pyast
import dataclasses
import warnings
from typing import Union

from lark import Token, Tree

from . import ast as A
from .errors import Diagnostic, RuleFileError
from .source import Source

_Child = Union[Tree, Token]


class _Builder:
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
                count = _int(child)
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
                shape = tuple(_int(t) for t in child.children if _is_token(t, "INT"))
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

    def literal(self, tree: Tree):
        kind = tree.data
        ch = tree.children
        if kind in ("int", "neg_int"):
            token = ch[-1]
            if len(token) > MAX_INT_DIGITS and token[:2] not in ("0x", "0X"):
                raise self.error(token, "unexpected-token",
                                 f"an integer literal of {len(token)} digits; the limit is {MAX_INT_DIGITS}")
        if kind == "int":
            return _int(ch[0])
        if kind == "neg_int":
            return -_int(ch[1])
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
            with warnings.catch_warnings():  # an unknown escape such as "\d" is an error, not a warning
                warnings.simplefilter("error")
                value = _pyast.literal_eval(str(token))  # a string token only: no names, no calls
        except (ValueError, SyntaxError, DeprecationWarning, SyntaxWarning, UnicodeError):
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


def _is_token(node: _Child, kind: str) -> bool:
    return isinstance(node, Token) and node.type == kind


MAX_INT_DIGITS = 4000
"""Longer integer literals are refused (Python itself refuses to convert more than 4300 digits)."""


def _int(token: Token) -> int:
    text = str(token)
    return int(text, 16) if text[:2] in ("0x", "0X") else int(text)


def build(tree: Tree, source: Source) -> A.RuleFile:
    """Turn a parse tree into a :class:`fxrules.ast.RuleFile` (may raise RuleFileError)."""
    return _Builder(source).file(tree)
