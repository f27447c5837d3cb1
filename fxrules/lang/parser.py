"""Text to AST: the LALR parser for ``grammar/fxr.lark``, and syntax diagnostics.

Newlines end statements except inside brackets; the lexer drops them there (as
Python does) and enforces nesting limits, so no input can make the later,
recursive stages overflow the stack.

Two loops drive the same LALR table with the same reductions
(:mod:`fxrules.lang.reductions`, the one AST builder), so :func:`parse` returns the AST either
way. :func:`parse_direct` (the fast path) scans and parses in one loop; it gives up
(:class:`NotDirect`) on anything wrong with the text. :func:`parse_lark` is Lark's own LALR
loop with :class:`_Lexer`, calling the reductions as its callbacks: for a text with a syntax
error, Lark finds it and this module words the diagnostic. :func:`parse` tries the first and
falls back to the second.

This module changes no process-wide state: the recursion limit and the garbage collector are
:mod:`fxrules.lang.runtime`'s, entered by the API's entry points.
"""

from __future__ import annotations

import functools
import itertools
import re
import threading
from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple, Optional

import fxrules.lang.ast as A
from fxrules.lang import packaged
from fxrules.lang.diagnostics import Diagnostic, RuleFileError
from fxrules.lang.reductions import Reductions, reduction
from fxrules.lang.source import Source

if TYPE_CHECKING:  # Lark is imported where it runs (Lark's loop, the tables' build): a file that the
    # direct loop parses on the shipped tables imports no Lark (40-60 ms of every cold start)
    import lark
    from lark.exceptions import UnexpectedInput

MAX_DEPTH = 256
"""Brackets nested deeper than this are a ``too-deep`` diagnostic."""

MAX_CONDITION_OPERATORS = 200
"""Operators in one condition (`where` to `->`) beyond this are a ``too-deep`` diagnostic."""

MAX_STATEMENT_TOKENS = 100_000
"""Tokens in one statement (a rule, a ``use``, an example; newlines in brackets and comments do not count)
beyond this are a ``too-large`` diagnostic. A statement's tokens are held (as values on the parse stack, a
few hundred bytes each) until it reduces, so this bounds what any one statement costs while it is parsed
(SECURITY.md, "Reading"). The largest statement of the bundled library and the test corpus has a few
hundred tokens."""

MIN_FILE_TOKENS = 200_000
BYTES_PER_TOKEN = 3
"""A file may hold ``max(MIN_FILE_TOKENS, size // BYTES_PER_TOKEN)`` tokens, an operator in a condition
counting twice (it makes a node of its own besides its operand's); beyond that is a ``too-large``
diagnostic at the first token over. The AST keeps a node and a span (a few hundred bytes) per token
for as long as the file's rules live, so this, not the byte cap, is what keeps the memory of loading a
file within 50 times its size (SECURITY.md, "Reading"); the allowance keeps any file of fewer tokens
out of it. The bundled library averages ~5 bytes a token, its densest file 3.6."""


def file_token_limit(text: str) -> int:
    """How many (weighted) tokens a file of this text may hold: see :data:`BYTES_PER_TOKEN`."""
    return max(MIN_FILE_TOKENS, len(text) // BYTES_PER_TOKEN)


_CONDITION_OPERATORS = {"NOT", "AND", "OR", "PLUS", "MINUS", "STAR", "SLASH", "DSLASH", "PERCENT", "DOT", "LSQB",
                        "LPAR", "EQEQ", "NOTEQ", "LT", "LE", "GT", "GE", "IN"}
_OPEN = {"LPAR", "LSQB", "LBRACE"}
_UNREAD = frozenset({"COMMA", "DOT", "BAR"})
"""Separators: no reduction reads their tokens, so both loops shift None for them, not the scanner's
``re.Match`` (~800 bytes: a slot per terminal of the scanner). A long argument list, list or dotted
name kept one per item until its rule reduced: that was most of the memory of a file of small tokens."""
_CLOSE = {"RPAR", "RSQB", "RBRACE"}


def grammar_text() -> str:
    """The grammar as shipped inside the package (identical to ``grammar/fxr.lark``)."""
    return packaged.read_text("fxr.lark")


class _TooDeep(Exception):
    """A limit of the lexer's, met at ``token``: a located diagnostic of code ``code``."""

    def __init__(self, token: lark.Token, what: str, code: str = "too-deep"):
        self.token = token
        self.what = what
        self.code = code


class _Context:
    """Where the post-lexer is in the current statement; read by syntax error messages."""

    __slots__ = ("prev", "last", "brackets", "popped", "statement", "ended", "seen_arrow", "seen_as",
                 "in_condition")

    def __init__(self) -> None:
        self.prev = self.last = None
        self.popped: Optional[str] = None  # the bracket the last token closed
        self.brackets: list[str] = []  # open bracket token types, innermost last
        self.statement: Optional[str] = None  # type of the statement's first token
        self.ended: Optional[str] = None  # ... of the statement a newline just ended
        self.seen_arrow = self.seen_as = self.in_condition = False


_CLOSER = {"LPAR": "RPAR", "LSQB": "RSQB", "LBRACE": "RBRACE"}


_CONTEXT = threading.local()  # this thread's current _Context, read by error messages


def _context() -> _Context:
    return getattr(_CONTEXT, "context", None) or _Context()


_REGEX_ORDER = ("_NL", "WS", "LINE_CONTINUATION", "COMMENT", "STRING", "FLOAT", "INT", "CAPTURE", "NAME")
"""Where the grammar's regular-expression terminals go in the lexer's alternation (the first that matches wins)."""


def _terminals(lexer_conf) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The grammar's terminals as the lexers use them: keywords (word -> terminal) and the ordered alternatives.

    The alternatives are (terminal, regular expression) pairs, tried in order: the regex
    terminals in :data:`_REGEX_ORDER`, then punctuation, the longest first (`->` over `-`,
    `//` over `/`). Keywords are not alternatives: a word lexes as NAME, and the lexer makes it
    a keyword where the parser accepts that keyword.
    """
    from lark.lexer import PatternStr

    word = re.compile(r"[^\W\d]\w*\Z")
    keywords: dict[str, str] = {}
    punctuation, regexes = [], {}
    for terminal in lexer_conf.terminals:
        pattern = terminal.pattern
        if isinstance(pattern, PatternStr) and word.match(pattern.value):
            keywords[pattern.value] = terminal.name
        elif isinstance(pattern, PatternStr):
            punctuation.append((terminal.name, pattern.value))
        else:
            regexes[terminal.name] = pattern.to_regexp()
    missing = set(regexes) ^ set(_REGEX_ORDER)
    if missing:  # a new regex terminal in the grammar must be placed here deliberately
        raise AssertionError(f"fxrules.lang.parser._Lexer does not know where to put {sorted(missing)}")
    alternatives = [(name, regexes[name]) for name in _REGEX_ORDER]
    alternatives += [(name, re.escape(value)) for name, value in sorted(punctuation, key=lambda item: -len(item[1]))]
    return keywords, alternatives


class _Lexer:
    """The lexer (given to Lark as :func:`_lark_lexer`, this class with Lark's ``Lexer`` base): the grammar's terminals as one regular expression, keywords chosen by parser state.

    The terminal patterns come from the grammar; this class adds only what a lexer decides:
    the longest punctuation wins (`->` over `-`, `//` over `/`), a word is a keyword only
    where the parser accepts that keyword (`torch.where`, `call_method where` and
    `default=` stay names, as with Lark's contextual lexer), newlines inside brackets are
    whitespace and runs of newlines are one, and nesting is bounded. It is several times
    faster than Lark's contextual lexer, which tries a regular expression per parser state.
    """

    __future_interface__ = 2

    def __init__(self, lexer_conf) -> None:
        self.ignore = frozenset(lexer_conf.ignore)
        self.keywords, terminals = _terminals(lexer_conf)
        self.master = re.compile("|".join(f"(?P<{name}>{regex})" for name, regex in terminals))

    def lex(self, lexer_state, parser_state) -> Iterator[lark.Token]:
        text_slice = lexer_state.text
        text, pos, end = text_slice.text, text_slice.start, text_slice.end
        states = parser_state.parse_conf.parse_table.states
        from lark import Token
        from lark.exceptions import UnexpectedCharacters

        ctx = _CONTEXT.context = _Context()
        brackets = ctx.brackets
        keywords, ignore, match = self.keywords, self.ignore, self.master.match
        new_token = Token._future_new  # skips Token.__new__'s keyword-compatibility shim
        line, line_start = 1, 0
        operators = 0  # in the current condition: chains build nested trees, so they are bounded too
        tokens = 0  # in the current statement
        budget = file_token_limit(text)  # weighted tokens the file may still hold
        while pos < end:
            m = match(text, pos)
            if m is None:
                raise UnexpectedCharacters(text, pos, line, pos - line_start + 1,
                                           allowed=set(states[parser_state.position]), state=parser_state)
            kind = m.lastgroup
            value = m.group()
            start = pos
            pos = m.end()
            if kind in ignore:
                newlines = value.count("\n")
                if newlines:
                    line += newlines
                    line_start = start + value.rindex("\n") + 1
                continue
            column = start - line_start + 1
            if kind == "_NL":
                token = new_token(kind, value, start, line, column, line, column + 1, pos)
                line += value.count("\n")
                line_start = start + value.rindex("\n") + 1
                if brackets or ctx.last is None or ctx.last.type == "_NL":
                    continue
                if ctx.last.type not in ("ARROW", "COLON"):  # after those, the statement goes on
                    ctx.ended, ctx.statement = ctx.statement, None
                    ctx.seen_arrow = ctx.seen_as = ctx.in_condition = False
                    tokens = 0
            else:
                if kind == "NAME":
                    keyword = keywords.get(value)
                    if keyword is not None and keyword in states[parser_state.position]:
                        kind = keyword
                token = new_token(kind, value, start, line, column, line, column + len(value), pos)
                tokens += 1
                if tokens > MAX_STATEMENT_TOKENS:
                    raise _TooDeep(token, f"a statement of more than {MAX_STATEMENT_TOKENS} tokens", "too-large")
                if ctx.statement is None:
                    ctx.statement = kind
                if kind == "WHERE":
                    ctx.in_condition, operators = True, 0
                elif kind == "ARROW":
                    ctx.in_condition, ctx.seen_arrow = False, True
                elif kind == "AS":
                    ctx.seen_as = True
                elif ctx.in_condition and kind in _CONDITION_OPERATORS:
                    operators += 1
                    budget -= 1
                    if operators > MAX_CONDITION_OPERATORS:
                        raise _TooDeep(token, f"a condition with more than {MAX_CONDITION_OPERATORS} operators")
                if kind in _OPEN:
                    brackets.append(kind)
                    if len(brackets) > MAX_DEPTH:
                        raise _TooDeep(token, f"brackets nested more than {MAX_DEPTH} deep")
                elif kind in _CLOSE and brackets:
                    ctx.popped = brackets.pop()
            budget -= 1  # every token the parser sees, as the direct loop counts them
            if budget < 0:
                raise _TooDeep(token, _too_many_tokens(text), "too-large")
            ctx.prev, ctx.last = ctx.last, token
            yield token


def _lark_lexer() -> type:
    """:class:`_Lexer` as Lark takes it: a subclass of Lark's ``Lexer``."""
    from lark.lexer import Lexer

    return type("_Lexer", (_Lexer, Lexer), {"__module__": __name__, "__doc__": _Lexer.__doc__})


_lock = threading.Lock()
_parser: Optional[lark.Lark] = None


def _get_parser() -> lark.Lark:
    global _parser
    with _lock:
        if _parser is None:
            import lark

            _parser = lark.Lark(
                grammar_text(),
                parser="lalr",
                lexer=_lark_lexer(),
                propagate_positions=False,  # fxrules.lang.reductions derives spans from tokens: much faster
                maybe_placeholders=False,
                cache=False,
            )
        return _parser


class NotDirect(Exception):
    """The direct loop met something it leaves to Lark's loop (a syntax error, a nesting limit)."""


def _lark_rows(parser: lark.Lark) -> tuple[dict, int, int]:
    """Lark's LALR table recoded as plain dicts: ``(rows, start state, end state)``.

    A row maps a terminal or rule name to the next state (an int: shift, or goto after a
    reduction) or to ``(size, reduction(rule), rule name)`` (reduce by a rule of that many
    symbols). Lark's own loop looks its callbacks up by ``Rule`` objects, whose ``__hash__``
    and ``__eq__`` are Python functions: a third of its time on long files. Raises if this
    Lark is not laid out as expected (another version; ``tests/lang/test_parse_speed.py`` says so).
    """
    from lark.parsers.lalr_analysis import Shift

    table = parser.parser.parser.parser.parse_table  # Lark -> ParsingFrontend -> LALR_Parser -> _Parser
    start = parser.options.start[0]
    rows: dict = {}
    for state, actions in table.states.items():
        if type(state) is not int:
            raise TypeError(f"LALR state {state!r}")
        row = rows[state] = {}
        for name, (action, arg) in actions.items():
            # plain str keys: Lark's are often its Token (a str subclass whose __eq__ is Python)
            if action is Shift:
                if type(arg) is not int:
                    raise TypeError(f"LALR shift to {arg!r}")
                row[str(name)] = arg
            else:
                row[str(name)] = (len(arg.expansion), reduction(arg), str(arg.origin.name))
    return rows, table.start_states[start], table.end_states[start]


# ---------------------------------------------------------------------------
# The tables both loops run on
# ---------------------------------------------------------------------------

_SCAN_FIRST = ("NAME", "WS")
"""Terminals the scanner tries before the lexer's order. They are the most frequent, and no
other terminal can begin with what they begin with (a letter or `_`; a space, tab or form
feed), so trying them first changes no token. The first alternatives that do not fail at
once are the costly ones: Python's regex engine skips an alternative after one character
only when it begins with a literal or a character class."""


class Tables(NamedTuple):
    """The parse table with the reductions of :mod:`fxrules.lang.reductions`, and the scanner: built once."""

    rows: list  # per state: terminal or rule name -> next state, or (size, Reduction or None, rule name)
    start: int
    end: int
    keywords: dict  # word -> keyword terminal (a NAME is that keyword where the state accepts it)
    ignore: frozenset  # terminals that are only whitespace and comments
    scanner: re.Pattern  # .finditer(text): one re.Match per token, each with its terminal as lastgroup
    units: dict  # (state below, state, terminal) -> the state after the unit reductions there (filled as met)
    by_rule: dict  # Lark Rule -> its Reduction, or None (a unit rule): Lark's loop's callbacks
    terminals: tuple  # every terminal's name: Lark's loop's callbacks on a shift


@functools.lru_cache(maxsize=None)
def tables() -> Tables:
    """The tables :func:`parse_direct` runs on: the shipped ones (``fxrules/lang/parse_tables.json``,
    made by ``python -m fxrules.tools.indexes``) when they were made from this grammar, so a
    process that parses only valid files never builds Lark's parser (~0.25 s of a cold
    ``fxrules check``); else :func:`lark_tables`. The shipped tables have no ``by_rule`` or
    ``terminals``: Lark's loop runs on :func:`lark_tables` only.
    """
    return shipped_tables() or lark_tables()


@functools.lru_cache(maxsize=None)
def lark_tables() -> Tables:
    """The tables :func:`parse_lark` runs on (and :func:`parse_direct`, when no shipped table fits the
    grammar), with :func:`fxrules.lang.reductions.reduction` as each grammar rule's reduction (None for
    a unit rule of one symbol, whose value is its symbol's: then only the state changes). Raises if
    this Lark is not laid out as expected.
    """
    parser = _get_parser()
    rows, start, end = _lark_rows(parser)
    _check_unit_rules(rows.values())
    table: list = [None] * (max(rows) + 1)
    for state, row in rows.items():
        table[state] = row
    keywords, terminals = _terminals(parser.lexer_conf)
    return Tables(table, start, end, keywords, frozenset(parser.lexer_conf.ignore), _scanner(terminals), {},
                  {rule: reduction(rule) for rule in parser.rules},
                  tuple(terminal.name for terminal in parser.lexer_conf.terminals))


def _check_unit_rules(rows) -> None:
    for row in rows:
        for entry in row.values():
            if type(entry) is tuple and entry[1] is None and entry[0] != 1:
                raise AssertionError(f"rule {entry[2]}: only a rule of one symbol can hand its value up")


def _scanner(terminals: list[tuple[str, str]]) -> re.Pattern:
    """The lexer's alternatives (``_terminals``) as one pattern, NAME and WS first (see _SCAN_FIRST)."""
    ordered = [t for t in terminals if t[0] in _SCAN_FIRST] + [t for t in terminals if t[0] not in _SCAN_FIRST]
    # Each alternative ends in an empty group named after its terminal, so `lastgroup` names it
    # and the alternative itself begins with its first character (see _SCAN_FIRST); a last
    # alternative takes any other character, so the tokens tile the text and a character no
    # terminal takes becomes the token `_UNLEXABLE`, which no parser state accepts.
    pattern = "|".join(f"(?:{regex})(?P<{name}>)" for name, regex in ordered) + r"|(?P<_UNLEXABLE>[\s\S])"
    return re.compile(pattern)


# ---------------------------------------------------------------------------
# The shipped tables: Lark's LALR table as plain data, made once by the generator
# ---------------------------------------------------------------------------


class SymbolShape(NamedTuple):
    """A grammar symbol as :func:`fxrules.lang.reductions.reduction` reads it (Lark's ``Symbol``)."""

    name: str
    is_term: bool
    filter_out: bool


class _Named(NamedTuple):
    name: str


class _Options(NamedTuple):
    expand1: bool


class RuleShape(NamedTuple):
    """A grammar rule as :func:`fxrules.lang.reductions.reduction` reads it (Lark's ``Rule``): the
    shipped tables name rules this way, so loading them needs no Lark."""

    origin: _Named
    expansion: tuple
    alias: Optional[str]
    options: _Options

    @classmethod
    def of(cls, data: tuple) -> "RuleShape":
        origin, alias, expand1, symbols = data
        return cls(_Named(origin), tuple(SymbolShape(*s) for s in symbols), alias, _Options(expand1))


def table_data() -> dict:
    """The direct loop's tables as plain data, from Lark's parser for the shipped grammar: what
    ``python -m fxrules.tools.indexes`` writes to ``fxrules/lang/parse_tables.json``.

    Lark numbers LALR states in an order that depends on string hashing (it differs between
    processes), so the states are renumbered canonically (breadth first from the start state,
    symbols in sorted order) and rules are named by their place in a sorted list: the same
    grammar always gives the same data, and a test can compare the shipped file with a fresh one.
    """
    parser = _get_parser()
    rows, start, end = _lark_rows(parser)
    keys = {rule: _rule_data(rule) for rule in parser.rules}
    rule_list = sorted(set(keys.values()), key=repr)
    rule_ids = {data: i for i, data in enumerate(rule_list)}
    order, seen = [start], {start: 0}
    for state in order:
        for name in sorted(rows[state]):
            target = rows[state][name]
            if type(target) is int and target not in seen:
                seen[target] = len(order)
                order.append(target)
    table = parser.parser.parser.parser.parse_table
    canonical = []
    for state in order:
        row = {}
        for name, (action, arg) in table.states[state].items():
            if type(arg) is int:
                row[str(name)] = seen[arg]
            else:
                row[str(name)] = ("r", rule_ids[keys[arg]])
        canonical.append(dict(sorted(row.items())))
    keywords, terminals = _terminals(parser.lexer_conf)
    return {"grammar": grammar_text(), "rules": tuple(rule_list), "rows": tuple(canonical), "start": seen[start],
            "end": seen[end], "keywords": dict(sorted(keywords.items())), "terminals": tuple(terminals),
            "ignore": tuple(sorted(parser.lexer_conf.ignore))}


def _rule_data(rule) -> tuple:
    """A Lark ``Rule`` as plain data: (origin, alias, expand1, ((symbol, is_term, filter_out), ...))."""
    return (str(rule.origin.name), None if rule.alias is None else str(rule.alias), bool(rule.options.expand1),
            tuple((str(s.name), bool(s.is_term), bool(getattr(s, "filter_out", False))) for s in rule.expansion))


def shipped_tables(data: Optional[dict] = None) -> Optional[Tables]:
    """The tables of ``fxrules/lang/parse_tables.json`` (``data``: that file's object, read when not
    given), or None when they were made from another grammar (the grammar changed and
    ``python -m fxrules.tools.indexes`` was not run: Lark's are built instead)."""
    shipped = data if data is not None else packaged.read_json(PARSE_TABLES_FILE)
    if shipped["grammar"] != grammar_text():
        return None
    rules = [RuleShape.of(rule) for rule in shipped["rules"]]
    entries = [(len(rule.expansion), reduction(rule), rule.origin.name) for rule in rules]
    rows = [{name: target if type(target) is int else entries[target[1]] for name, target in row.items()}
            for row in shipped["rows"]]
    _check_unit_rules(rows)
    return Tables(rows, shipped["start"], shipped["end"], dict(shipped["keywords"]), frozenset(shipped["ignore"]),
                  _scanner([(name, regex) for name, regex in shipped["terminals"]]), {}, {}, ())


PARSE_TABLES_FILE = "parse_tables.json"
"""The shipped tables' file in ``fxrules/lang`` (:mod:`fxrules.lang.packaged`)."""


def _after_units(rows: list, below: int, origin: str, kind: str) -> int:
    """The state after a chain of unit reductions, the first of them to ``origin``, with ``kind`` next.

    A unit rule's reduction pops one state and pushes the goto from the state below, so a
    chain of them (``$x`` is an atom, a named, an alt, an expr, a value, an arg) depends only
    on that state below, the state where it starts and the next terminal: the loop keeps the
    answer for each and follows the chain once.
    """
    state = rows[below][origin]
    entry = rows[state].get(kind)
    while type(entry) is tuple and entry[1] is None:
        state = rows[below][entry[2]]
        entry = rows[state].get(kind)
    return state


class _EndOfInput:
    """The token after the last: reduce until the start rule is complete."""

    lastgroup = "$END"


def _parse_direct(text: str, tables: Tables, target: Reductions) -> object:
    """Parse ``text`` (ending in a newline) with the reductions in ``tables``; returns what the start rule made.

    The same tokens as :class:`_Lexer` (the same alternatives, keywords by parser state, the
    same newlines dropped in brackets and after newlines) and the same shifts and reductions as
    Lark's LALR loop. It does less per token than ``_Lexer`` feeding Lark's loop: no
    ``Token`` objects (a reduction reads the ``re.Match``), no generator between scanner and
    parser, no context kept for error messages, no call for a unit rule. Anything it does not
    handle, a syntax error or a nesting limit above all, raises :class:`NotDirect`, and so does
    any exception from a reduction: the caller then takes Lark's loop, which says what is wrong.
    """
    rows, start, end, keywords, ignore, scanner, units = tables[:7]
    state = start
    state_stack = [start]
    value_stack: list = []
    push_state, push_value = state_stack.append, value_stack.append
    last = None  # the terminal of the last token fed to the parser
    depth = 0  # open brackets
    in_condition = False  # between `where` and `->` or the end of the statement
    operators = 0  # in the current condition
    tokens = 0  # in the current statement
    budget = file_token_limit(text)  # weighted tokens the file may still hold
    for m in itertools.chain(scanner.finditer(text), (_EndOfInput,)):
        kind = m.lastgroup
        if kind == "NAME":  # the most common first
            keyword = keywords.get(m.group())
            if keyword is not None and keyword in rows[state]:
                kind = keyword
                if kind == "WHERE":
                    in_condition, operators = True, 0
                elif in_condition and kind in _CONDITION_OPERATORS:
                    operators += 1
                    budget -= 1
                    if operators > MAX_CONDITION_OPERATORS:
                        raise NotDirect()  # too deep: Lark's loop says so
        elif kind in ignore:
            continue
        elif kind == "_NL":
            if depth or last is None or last == "_NL":  # inside brackets, at the start, or a second newline
                continue
            if last != "ARROW" and last != "COLON":  # after those the statement goes on
                in_condition = False
                tokens = 0
        else:
            if kind == "ARROW":
                in_condition = False
            elif in_condition and kind in _CONDITION_OPERATORS:
                operators += 1
                budget -= 1
                if operators > MAX_CONDITION_OPERATORS:
                    raise NotDirect()
            if kind in _OPEN:
                depth += 1
                if depth > MAX_DEPTH:
                    raise NotDirect()
            elif kind in _CLOSE and depth:
                depth -= 1
        last = kind
        tokens += 1
        budget -= 1
        if tokens > MAX_STATEMENT_TOKENS or budget < 0:
            raise NotDirect()  # too large: Lark's loop says so
        while True:
            entry = rows[state].get(kind)
            if entry is None:  # a syntax error (or `_UNLEXABLE`)
                raise NotDirect()
            if type(entry) is int:
                if kind == "$END":
                    raise NotDirect()
                state = entry
                push_state(state)
                push_value(None if kind in _UNREAD else m)
                break
            size, reduce, origin = entry
            if reduce is None:  # unit rules: their value is their symbol's, only the state changes
                below = state_stack[-2]
                key = (below, state, kind)
                after = units.get(key)
                if after is None:
                    after = units[key] = _after_units(rows, below, origin, kind)
                state = state_stack[-1] = after
                continue
            if size:
                values = value_stack[-size:]
                del value_stack[-size:]
                del state_stack[-size:]
            else:
                values = []
            try:
                push_value(reduce(target, values))
            except Exception:
                raise NotDirect() from None
            state = rows[state_stack[-1]][origin]
            push_state(state)
            if state == end and kind == "$END":  # reduced up to the start rule
                return value_stack[-1]
    raise NotDirect()  # pragma: no cover - $END always ends in the end state or a fallback


def _with_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def parse(source: Source) -> A.RuleFile:
    """One file's text to its AST; raises RuleFileError with one diagnostic (syntax, or a problem
    the reductions found). The direct loop first; Lark's loop for a text the direct one gives up on."""
    try:
        return parse_direct(source)
    except NotDirect:
        pass
    # Outside the handler: the exception's traceback holds the direct loop's stacks (all of the
    # file's AST so far), which would stay alive through the second parse.
    return parse_lark(source)


def parse_direct(source: Source) -> A.RuleFile:
    """The fast path of :func:`parse`: raises :class:`NotDirect` where it gives up (every syntax
    error and nesting limit), RuleFileError for a problem the reductions found."""
    text = _with_newline(source.text)
    target = Reductions(source.path, text)
    return target.result(_parse_direct(text, tables(), target), source)


def parse_lark(source: Source) -> A.RuleFile:
    """The fallback of :func:`parse`, and what the tests hold the direct loop to: Lark's LALR loop,
    with :class:`_Lexer` and the same reductions as its callbacks (a shift's value is the
    scanner's ``re.Match`` for the token, as in the direct loop). Lark finds any syntax error;
    this module words it."""
    from lark.exceptions import UnexpectedInput
    from lark.lexer import LexerThread
    from lark.parsers.lalr_parser import _Parser as _LarkLoop  # Lark's LALR loop, given our callbacks

    text = _with_newline(source.text)
    parser, table = _get_parser(), lark_tables()
    target = Reductions(source.path, text)
    match_at = functools.partial(_match_at, table.scanner.match, text)
    callbacks: dict = dict.fromkeys(table.terminals, match_at)
    callbacks.update(dict.fromkeys(_UNREAD, _unread))
    for rule, reduce in table.by_rule.items():
        callbacks[rule] = _hand_up if reduce is None else functools.partial(reduce, target)
    frontend = parser.parser  # Lark -> ParsingFrontend (its lexer) -> LALR_Parser -> _Parser (its table)
    loop = _LarkLoop(frontend.parser.parser.parse_table, callbacks)
    try:
        rule_file = loop.parse(LexerThread.from_text(frontend.lexer, text), parser.options.start[0])
    except _TooDeep as exc:
        tok = exc.token
        raise RuleFileError(
            [Diagnostic(source.path, tok.line, tok.column, exc.code, exc.what,
                        end_line=tok.line, end_column=tok.column + 1)],
            {source.path: source.text},
        ) from None
    except UnexpectedInput as exc:
        raise RuleFileError([_syntax_diagnostic(source, text, exc)], {source.path: source.text}) from None
    return target.result(rule_file, source)


def _too_many_tokens(text: str) -> str:
    return (f"a file of more than {file_token_limit(text)} tokens (one per {BYTES_PER_TOKEN} bytes of the file, "
            f"at least {MIN_FILE_TOKENS}; an operator in a condition counts twice)")


def _match_at(match: Callable, text: str, token: lark.Token) -> re.Match:
    """The scanner's ``re.Match`` for a token of :class:`_Lexer` (the same token: see _SCAN_FIRST)."""
    return match(text, token.start_pos)


def _unread(token: lark.Token) -> None:
    """A separator's value in Lark's loop, as in the direct loop (see _UNREAD)."""
    return None


def _hand_up(values: list) -> object:
    """A unit rule's callback in Lark's loop: its value is its one symbol's."""
    return values[0]


# ---------------------------------------------------------------------------
# Syntax errors in words
# ---------------------------------------------------------------------------

_WORDS = {
    "ARROW": "`->`", "COLON": "`:`", "COMMA": "`,`", "DOT": "`.`", "ELLIPSIS": "`...`", "BAR": "`|`",
    "EQUAL": "`=`", "LPAR": "`(`", "RPAR": "`)`", "LSQB": "`[`", "RSQB": "`]`", "LBRACE": "`{`",
    "RBRACE": "`}`", "EQEQ": "`==`", "NOTEQ": "`!=`", "LE": "`<=`", "GE": "`>=`", "LT": "`<`", "GT": "`>`",
    "PLUS": "`+`", "MINUS": "`-`", "STAR": "`*`", "SLASH": "`/`", "DSLASH": "`//`", "PERCENT": "`%`",
    "RULE": "`rule`", "USE": "`use`", "PATTERN": "`pattern`", "AS": "`as`", "DEFAULT": "`default`", "WHERE": "`where`",
    "EXAMPLE": "`example`", "GIVEN": "`given`",
    "NOT": "`not`", "AND": "`and`", "OR": "`or`", "IN": "`in`", "TRUE": "`True`", "FALSE": "`False`",
    "NONE": "`None`", "CALL_FUNCTION": "`call_function`", "CALL_METHOD": "`call_method`",
    "CALL_MODULE": "`call_module`", "GET_ATTR": "`get_attr`", "WILDCARD": "`_`",
    "CAPTURE": "a capture such as `$x`", "NAME": "a name", "INT": "an integer", "FLOAT": "a number",
    "STRING": "a string", "_NL": "the end of the line", "$END": "the end of the file",
}

_EXPR_START = {"CALL_FUNCTION", "CALL_METHOD", "CALL_MODULE", "GET_ATTR", "CAPTURE", "WILDCARD"}


def _found(token: lark.Token) -> str:
    if token.type == "_NL":
        return "the end of the line"
    if token.type == "$END":
        return "the end of the file"
    value = str(token)
    if len(value) > 30:
        value = value[:27] + "..."
    return f"`{value}`"


def _expected_words(expected: set[str]) -> str:
    expected = {e for e in expected if not e.startswith("__")}
    if expected & _EXPR_START and "ARROW" not in expected:
        if "CALL_FUNCTION" in expected:
            return "a pattern (`call_function ...`, `call_module ...`, `$x`, a name or a literal)"
        return "an expression"
    words = sorted(_WORDS.get(e, e) for e in expected)
    if len(words) == 1:
        return words[0]
    if len(words) == 2:
        return f"{words[0]} or {words[1]}"
    if len(words) > 6:
        return "one of " + ", ".join(words[:6]) + ", ..."
    return "one of " + ", ".join(words[:-1]) + " or " + words[-1]


def _expectation(expected: set[str], previous: Optional[lark.Token]) -> str:
    """Phrase the common cases the way a person would."""
    prev = previous.type if previous is not None else None
    if prev == "RULE":
        return "expected the rule's name after `rule`"
    if prev == "USE":
        return "expected a dotted module path (`use torch.nn as nn`) or a rule file (`use \"ops.fxr\"`) after `use`"
    if prev == "PATTERN":
        return "expected the pattern's name after `pattern`, as in `pattern matmul($a, $b) = ...`"
    if prev == "AS":
        return "expected a name after `as`"
    if prev == "DEFAULT":
        return "expected `[` and a contract after `default`, as in `default [changes]`"
    if prev in ("CALL_FUNCTION", "CALL_MODULE"):
        return f"expected a target name after `{previous}`"
    if prev == "CALL_METHOD":
        return "expected a method name after `call_method`"
    if prev == "GET_ATTR":
        return "expected `$name`, `_` or an attribute path after `get_attr`"
    if prev == "WHERE":
        return "expected a condition after `where`"
    if prev == "GIVEN":
        return "expected an input declaration after `given`, as in `given $x: [2, 8]`"
    if prev == "EXAMPLE":
        return "expected `:` after `example` (or a rewrite count and a mode, as in `example 2 train:`)"
    if prev == "ARROW":
        return "expected a replacement after `->`"
    if prev == "EQUAL":
        return "expected a value after `=`"
    if expected and expected <= {"DOT", "AS"}:
        return "expected `as` and an alias after the module path"
    if "ARROW" in expected and "WHERE" in expected:
        return "expected `->` after the pattern (or `where` and a condition)"
    if "ARROW" in expected:
        return "expected `->` after the pattern"
    if "COLON" in expected and "EXAMPLE" in (_context().statement, _context().ended):
        return "expected `:` to end the example's header, as in `example:`, `example 2:` or `example 0 train:`"
    if "COLON" in expected and prev in ("NAME", "RSQB", "STRING") and "LPAR" not in expected:
        return "expected `:` after the rule's name"
    return "expected " + _expected_words(expected)


_VALUE_END = {"NAME", "INT", "FLOAT", "STRING", "CAPTURE", "RPAR", "RSQB", "RBRACE", "TRUE", "FALSE", "NONE",
              "WILDCARD", "ELLIPSIS"}


def _state_expected(exc: UnexpectedInput, fallback: set[str]) -> set[str]:
    """What may come next: the parser state's terminals, narrowed by what the post-lexer knows.

    LALR merges states, so a state's lookaheads can name tokens that cannot follow here
    (`->` inside brackets, `]` closing a `(`); the bracket stack and the statement's
    progress remove those.
    """
    state = getattr(exc, "state", None)
    expected = set(fallback)
    try:
        expected = set(state.parse_conf.parse_table.states[state.position].keys())
    except Exception:
        pass
    ctx = _context()
    brackets = list(ctx.brackets)
    token = getattr(exc, "token", None)
    if token is not None and token is ctx.last:  # the bracket state before the offending token
        if token.type in _OPEN and brackets:
            brackets.pop()
        elif token.type in _CLOSE and ctx.popped:
            brackets.append(ctx.popped)
    expected = {e for e in expected if e.isupper() or e in ("_NL", "$END")}
    if brackets:  # inside brackets: statements cannot end here, only the innermost bracket closes
        expected -= {"ARROW", "WHERE", "_NL", "$END", "COLON"}
        expected -= {c for c in _CLOSE if c != _CLOSER[brackets[-1]]}
        previous = _previous(token)
        if not ctx.in_condition and previous is not None and previous.type in _VALUE_END:
            narrowed = expected & {"COMMA", _CLOSER[brackets[-1]], "BAR", "AS", "DOT", "LPAR", "LBRACE", "EQUAL"}
            expected = narrowed or expected
    else:
        expected -= _CLOSE
    if ctx.seen_arrow:
        expected -= {"ARROW", "WHERE", "AS", "BAR"}
    if ctx.statement == "USE":
        expected = expected & {"DOT", "AS", "NAME", "_NL", "$END"} if not ctx.seen_as else {"NAME"} & expected or expected
        if not ctx.seen_as:
            expected.discard("_NL")
            expected.discard("$END")
    return expected or set(fallback)


def _previous(exc_token: Optional[lark.Token]) -> Optional[lark.Token]:
    ctx = _context()
    return ctx.prev if (exc_token is not None and ctx.last is exc_token) else ctx.last


def _syntax_diagnostic(source: Source, text: str, exc: UnexpectedInput) -> Diagnostic:
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedToken

    path = source.path
    if isinstance(exc, UnexpectedCharacters):
        line, column = exc.line, exc.column
        char = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else ""
        if char in "\"'":
            return Diagnostic(path, line, column, "unterminated-string",
                              "this string is not closed before the end of the line",
                              end_line=line, end_column=column + 1)
        if char == "$":
            return Diagnostic(path, line, column, "invalid-character",
                              "`$` must be followed by a capture name, as in `$x`",
                              end_line=line, end_column=column + 1)
        shown = char if char.isprintable() and not char.isspace() else f"U+{ord(char):04X}" if char else "?"
        expected = _state_expected(exc, set(exc.allowed or ()))
        return Diagnostic(path, line, column, "invalid-character",
                          f"unexpected character `{shown}`; {_expectation(expected, _previous(None))}",
                          end_line=line, end_column=column + 1)
    if isinstance(exc, UnexpectedToken):
        token = exc.token
        previous = _previous(token)
        expected = _state_expected(exc, set(exc.expected or ()))
        if token.type == "$END":
            line, column = _after(previous) if previous is not None else _end_position(source.text)
            message = "the file ends in the middle of a rule; " + _expectation(expected, previous)
            if source.text.rstrip().endswith("\\"):
                message = "the file ends with a line continuation `\\` that continues nothing"
            return Diagnostic(path, line, column, "unexpected-end", message,
                              end_line=line, end_column=column + 1)
        line, column = token.line, token.column
        end_line = getattr(token, "end_line", line) or line
        end_column = getattr(token, "end_column", column + 1) or column + 1
        if token.type == "_NL":  # the caret goes just after the line's last token
            if previous is not None:
                line, column = _after(previous)
            end_line, end_column = line, column + 1
        message = f"{_expectation(expected, previous)}, found {_found(token)}"
        if previous is not None and previous.type == "NAME" and str(previous) in ("rule", "use", "default"):
            message = (f"`{previous}` is read as a name here, so the line before it must be unfinished "
                       f"(nothing after `->`?); {message}")
        if token.type == "LSQB" and previous is not None and previous.type == "COLON":
            message += " (a rule's contract goes before the colon: `rule NAME [exact]:`)"
        return Diagnostic(path, line, column, "unexpected-token", message,
                          end_line=end_line, end_column=end_column)
    if isinstance(exc, UnexpectedEOF):
        previous = _previous(None)
        line, column = _after(previous) if previous is not None else _end_position(source.text)
        return Diagnostic(path, line, column, "unexpected-end",
                          "the file ends in the middle of a rule; expected " + _expected_words(set(exc.expected or ())),
                          end_line=line, end_column=column + 1)
    return Diagnostic(path, 1, 1, "unexpected-token", str(exc).splitlines()[0] if str(exc) else "syntax error")


def _after(token: lark.Token) -> tuple[int, int]:
    """The position just after a token."""
    if token.type == "_NL":
        return token.line, token.column
    return token.end_line or token.line, token.end_column or token.column + 1


def _end_position(text: str) -> tuple[int, int]:
    stripped = text.rstrip()
    line = stripped.count("\n") + 1
    column = len(stripped) - (stripped.rfind("\n") + 1) + 1
    return line, max(1, column)
