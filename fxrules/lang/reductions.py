"""The grammar's reductions: what each rule of ``grammar/fxr.lark`` makes, bottom-up, as it is parsed.

The one AST builder. Both of the parser's loops (:mod:`fxrules.lang.parser`: the fast direct
loop, and Lark's own LALR loop it falls back to for a text it gives up on) call the same
reductions, :func:`reduction` of each grammar rule, with the same values: a terminal's scanner
``re.Match`` and, for a rule, what its own reduction made. So the parser returns the AST on
both paths, and every grammar rule exists twice only: in the grammar and here.

What a text can have wrong that the grammar cannot say (an integer literal with too many
digits, an invalid escape in a string, a positional argument after a keyword argument) the
reductions record as a *problem* and go on with a stand-in value; :meth:`Reductions.result`
then raises the first problem in the text (a ``RuleFileError``). A problem never stops the
parse, so a syntax error anywhere in the file is what is reported, as when these were
found by a walk over a finished parse tree.
"""

from __future__ import annotations

import ast as _pyast
import bisect
import dataclasses
import re
import sys
import warnings
from typing import Callable, NamedTuple, Optional

import fxrules.lang.ast as A
from fxrules.lang.diagnostics import Diagnostic, RuleFileError
from fxrules.lang.source import Source

_INVALID_LITERAL = (ValueError, SyntaxError, DeprecationWarning, SyntaxWarning, UnicodeError)


def _literal_value(literal: str) -> object:
    """The value of a STRING token's text; raises one of _INVALID_LITERAL if it is not a valid literal.

    Not ``ast.literal_eval``: each call of it makes a cycle of nested functions, garbage that only
    the cyclic collector frees, and loading runs with the collector paused (fxrules.lang.runtime):
    a file of many strings held ~300 bytes per byte of it."""
    if "\\" not in literal:  # quoted, without escapes (the lexer's STRING): the text between the quotes
        return literal[1:-1]
    with warnings.catch_warnings():  # an unknown escape such as "\d" is an error, not a warning
        warnings.simplefilter("error")
        # a STRING token only (one quoted string): the expression is that string's constant
        return _pyast.parse(literal, mode="eval").body.value


_INVALID_ESCAPE = ("invalid escape sequence in this string (valid: \\\\ \\\" \\' \\n \\t \\r "
                   "\\xHH \\uHHHH \\N{name} ...)")
_POSITIONAL_AFTER_KEYWORD = "a positional argument cannot follow a keyword argument"


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


class _Problem(NamedTuple):
    """Something wrong that the grammar cannot say, found by a reduction; ordered as the text reads."""

    line: int
    column: int
    rank: int  # at one position: 0 (a misplaced argument) before 1 (a bad literal inside it)
    span: A.Span
    message: str


class Reductions:
    """One file's reductions: ``r_NAME`` makes the AST node of a grammar rule aliased or named NAME.

    ``r_NAME`` takes the rule's children as Lark's tree builder would give them (newline
    tokens dropped, the children of inlined ``_rules`` and ``(...)*`` repetitions spliced in;
    :func:`reduction` does that), except that a child is already what its own reduction made
    and a token is the scanner's ``re.Match``. Problems go to ``problems`` (see the module's
    docstring); :meth:`result` turns the start rule's value into the file's AST or raises.

    Spans: a node's span runs from its first to its last token. A child node's span gives
    those tokens' positions, except for an expression in parentheses: its node keeps the span
    inside them while a parent's span reaches over them, so ``parenthesized`` records, by node
    id, the span with them.
    """

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.parenthesized: dict[int, tuple[object, A.Span]] = {}  # id -> (node, kept alive; its outer span)
        self.problems: list[_Problem] = []

    def result(self, rule_file: A.RuleFile, source: Source) -> A.RuleFile:
        """The parsed file's AST; raises RuleFileError with the first problem in the text, if any."""
        if not self.problems:
            return rule_file
        first = min(self.problems)
        raise RuleFileError([Diagnostic.at(first.span, "unexpected-token", first.message)],
                            {source.path: source.text})

    def _problem(self, span: A.Span, rank: int, message: str) -> None:
        self.problems.append(_Problem(span.line, span.column, rank, span, message))

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

    def r_use_file(self, ch: list) -> A.UseFile:  # USE STRING
        return A.UseFile(self._string(ch[1]), self._tokens_span(ch[0], ch[1]))

    def r_pattern_def(self, ch: list) -> A.PatternDef:  # PATTERN NAME LPAR (CAPTURE (COMMA CAPTURE)* COMMA?)? RPAR EQUAL expr
        params = [token for token in ch[3:-3] if token is not None]  # separators shift None
        return A.PatternDef(ch[1].group(), tuple(token.group()[1:] for token in params), ch[-1],
                            self._span(ch[0], ch[-1]), self._token_span(ch[1]),
                            tuple(self._token_span(token) for token in params))

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

    def r_pattern_use(self, ch: list) -> A.PatternUse:  # NAME arglist
        arguments = ch[1]
        return A.PatternUse(ch[0].group(), arguments.args, arguments.kwargs,
                            self._tokens_span(ch[0], arguments.end), self._token_span(ch[0]))

    def r_computed(self, ch: list) -> A.Computed:  # LBRACE cond RBRACE
        return A.Computed(ch[1], self._tokens_span(ch[0], ch[2]))

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

    def r_variadic(self, ch: list) -> A.Variadic:  # STAR CAPTURE
        return A.Variadic(ch[1].group()[1:], self._tokens_span(ch[0], ch[1]))

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
            else:
                if kwargs and type(value) is not A.Ellipsis_:
                    self._problem(self._span(value, value), 0, _POSITIONAL_AFTER_KEYWORD)
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
        """An INT token's value (a literal, a count, a size); too many digits is a problem (value 0)."""
        value = _int(token.group())
        if value is None:
            self._problem(self._token_span(token), 1, _too_many_digits(token.group()))
            return 0
        return value

    def _string(self, token) -> str:
        """A STRING token's value; an invalid escape is a problem (value "")."""
        try:
            value = _literal_value(token.group())
        except _INVALID_LITERAL:
            self._problem(self._token_span(token), 1, _INVALID_ESCAPE)
            return ""
        if not isinstance(value, str):  # pragma: no cover - the STRING terminal admits only str literals
            self._problem(self._token_span(token), 1, "invalid string literal")
            return ""
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

    def r_c_slice(self, ch: list) -> A.CIndex:  # postfix LSQB cond? COLON cond? (COLON cond?)? RSQB
        parts: list = [None, None, None]
        position = 0
        for item in ch[2:-1]:
            if isinstance(item, re.Match):  # a COLON
                position += 1
            else:
                parts[position] = item
        bounds = A.CSlice(*parts, self._tokens_span(ch[1], ch[-1]))
        return A.CIndex(ch[0], bounds, self._span(ch[0], ch[-1]))

    def r_c_call(self, ch: list) -> A.CCall:  # postfix LPAR (cond (COMMA cond)* COMMA?)? RPAR
        return A.CCall(ch[0], tuple(ch[2:-1:2]), self._span(ch[0], ch[-1]))

    def r_c_generator_call(self, ch: list) -> A.CCall:  # postfix LPAR cond FOR NAME IN or_cond (IF or_cond)? RPAR
        condition = ch[8] if len(ch) == 10 else None
        generator = A.CGenerator(ch[2], ch[4].group(), ch[6], condition, self._span(ch[2], ch[-2]))
        return A.CCall(ch[0], (generator,), self._span(ch[0], ch[-1]))

    def r_c_capture(self, ch: list) -> A.CCapture:  # CAPTURE
        return A.CCapture(ch[0].group()[1:], self._token_span(ch[0]))

    def r_c_name(self, ch: list) -> A.CName:  # NAME
        return A.CName(ch[0].group(), self._token_span(ch[0]))

    def r_c_list(self, ch: list) -> A.CList:  # LSQB (cond (COMMA cond)* COMMA?)? RSQB
        return A.CList(tuple(ch[1:-1:2]), self._tokens_span(ch[0], ch[-1]))

    def r_c_tuple(self, ch: list) -> A.CList:  # LPAR cond COMMA (cond (COMMA cond)* COMMA?)? RPAR
        return A.CList(tuple(ch[1:-1:2]), self._tokens_span(ch[0], ch[-1]), parens=True)

    def r_c_empty_tuple(self, ch: list) -> A.CList:  # LPAR RPAR
        return A.CList((), self._tokens_span(ch[0], ch[-1]), parens=True)

    r_primary = r_group  # LPAR cond RPAR


Reduction = Callable[[Reductions, list], object]
"""What a grammar rule's reduction makes from its symbols' values: ``reduce(target, values)``.

``values`` holds one value per symbol of the rule's expansion, in order: for a terminal the
scanner's ``re.Match`` (its text, offsets and nothing else), for a rule what its own
reduction made. ``target`` is the file's :class:`Reductions`.
"""


def reduction(rule) -> Optional[Reduction]:
    """The reduction of a Lark grammar rule (``lark.grammar.Rule``), which both parse loops call.

    It does what Lark's tree builder does for the rule, with :class:`Reductions` making the
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
        return Reductions.r_literal_condition
    if origin.startswith("_"):  # inlined into its parent: its value is its children
        return (lambda target, values: values) if children is None else (lambda target, values: children(values))
    if single and len(kept) == 1 and not kept[0][1]:
        if len(expansion) == 1:
            return None
        index = kept[0][0]
        return lambda target, values: values[index]
    make = getattr(Reductions, "r_" + str(rule.alias or origin))
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


