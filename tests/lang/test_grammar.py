"""The grammar file: one source of truth, shipped in the package, conflict-free."""

from importlib import resources
from pathlib import Path

import lark
import pytest

import fxrules.lang.parser as parser

ROOT = Path(__file__).resolve().parents[2]


def test_packaged_grammar_is_identical_to_the_source():
    packaged = resources.files("fxrules.lang").joinpath("fxr.lark").read_bytes()
    assert packaged == (ROOT / "grammar" / "fxr.lark").read_bytes()
    assert parser.grammar_text().encode("utf-8") == packaged


def test_grammar_has_no_lalr_conflicts_or_terminal_collisions():
    pytest.importorskip("interegular")  # a declared test dependency; lark's strict mode needs it
    lark.Lark(parser.grammar_text(), parser="lalr", lexer="contextual", strict=True)


def test_every_terminal_is_named():
    """No message may ever show an anonymous terminal such as __ANON_0."""
    grammar = lark.Lark(parser.grammar_text(), parser="lalr")
    names = [t.name for t in grammar.terminals]
    assert not [n for n in names if n.startswith("__")], names


def test_a_2000_rule_file_parses():
    """Speed is measured by benchmarks/; here only that it parses, every rule in order."""
    from fxrules.lang.source import Source

    text = "".join(f"rule r{i}:\n    call_function torch.relu(call_function torch.relu($x)) -> "
                   f"call_function torch.relu($x)\n" for i in range(2000))
    src = Source("big.fxr", text)
    rule_file = parser.parse_lark(src)  # Lark's loop: the direct one is tests/lang/test_parse_speed.py's
    assert len(rule_file.rules) == 2000
    assert rule_file.rules[-1].name == "r1999"
