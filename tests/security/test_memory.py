"""Memory while loading a rule file dense with small tokens, each shape in a process of its own
(forked from tests/security/forkserver.py) under RLIMIT_AS.

Each child imports torch and fxrules, parses a small file (so lazy imports and the parse tables
are done), then limits its address space to what it has plus 50 times the file's size and loads
the file. Before the limits of SECURITY.md ("Reading is bounded") every shape here needed more
than 50x (from ~60x for many short rules, through the 64 MiB read buffer, to ~780x for a long
dotted name); now each one loads, or is refused with the located `too-large` diagnostic, within it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.security.forkserver import ForkServer

ROOT = Path(__file__).resolve().parents[2]

SIZE = 2 * 1024 * 1024


def _rules(line: str, size: int = SIZE) -> str:
    return line * (size // len(line))


def _one_rule(head: str, item: str, tail: str, size: int = SIZE) -> str:
    return head + item * ((size - len(head) - len(tail)) // len(item)) + tail


def _named_rules(size: int = SIZE) -> str:
    lines, total, i = [], 0, 0
    while total < size:
        lines.append(f"rule r{i}: call_function torch.relu($x) -> $x\n")
        total += len(lines[-1])
        i += 1
    return "".join(lines)


LOADED = {  # shape -> (text, the number of rules it loads as)
    "blank-and-comment-lines": ("#\n" * (SIZE // 2) + "call_function torch.relu($x) -> $x\n", 1),
    "long-comment-lines": (_rules("# " + "c" * 70 + "\n") + "call_function torch.relu($x) -> $x\n", 1),
    "many-named-rules": (_named_rules(), None),
}

REFUSED = {  # one statement of more tokens than the parser's limit
    "dense-int-arguments": _one_rule("rule r: call_function torch.add($x, ", "1, ", "1) -> $x\n"),
    "dense-float-arguments": _one_rule("rule r: call_function torch.add($x, ", "1.5, ", "1) -> $x\n"),
    "dense-int-list": _one_rule("rule r: call_function torch.add($x, [", "1,", "1]) -> $x\n"),
    "dense-captures": _one_rule("rule r: call_function torch.add(", "$a,", "$a) -> $a\n"),
    "dense-keywords": _one_rule("rule r: call_function torch.add($x, ", "k=1,", "k=1) -> $x\n"),
    "long-dotted-name": _one_rule("rule r: call_function ", "a.", "a($x) -> $x\n"),
    "long-alternation": _one_rule("rule r: (", "$x|", "$x) -> $x\n"),
    "long-condition-list": _one_rule("rule r: call_function torch.relu($x) where $x.ndim in [", "1,", "1] -> $x\n"),
}

def _numbered(make, size: int = SIZE) -> str:
    """Rules ``make(i)`` for i = 0, 1, ... up to ``size`` bytes: many statements, each under every
    per-statement limit, so only the file's token budget stops them."""
    lines, total, i = [], 0, 0
    while total < size:
        lines.append(make(i))
        total += len(lines[-1])
        i += 1
    return "".join(lines)


_STRINGS = ",".join(['"a"'] * 200)
_ESCAPED = ",".join(['"\\n"'] * 150)

OVER_BUDGET = {  # many statements each dense with nodes: refused by the file's token budget, within 50x
    "nested-lists": _numbered(lambda i: f"rule r{i}: call_function torch.add($x, {'[' * 200}1{']' * 200}) -> $x\n"),
    "operator-dense-conditions": _numbered(
        lambda i: f"rule r{i}: call_function torch.relu($x) where {'+'.join(['1'] * 200)} > 0 -> $x\n"),
    "negated-operands": _numbered(
        lambda i: f"rule r{i}: call_function torch.relu($x) where {'+'.join(['-1'] * 100)} > 0 -> $x\n"),
    "many-strings": _numbered(lambda i: f"rule r{i}: call_function torch.add($x, {_STRINGS}) -> $x\n"),
    "escaped-strings": _numbered(lambda i: f"rule r{i}: call_function torch.add($x, {_ESCAPED}) -> $x\n"),
    "keywords": _numbered(
        lambda i: f"rule r{i}: call_function torch.add($x, {','.join(f'k{j}=1' for j in range(200))}) -> $x\n"),
}

PRELUDE = textwrap.dedent("""
    import resource, sys
    import torch, fxrules

    fxrules.parse_rules("rule warm: call_function torch.add($x, [1], 1.5, k=$x) where $x.ndim in [1] -> $x\\n")
    path, size = PATH, SIZE
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + 50 * size, vm + 50 * size))
    try:
        rules = fxrules.load_rules(path)
        print("loaded", len(rules))
    except fxrules.RuleFileError as exc:
        print("refused", ";".join(f"{d.code}@{d.line}:{d.column}" for d in exc.diagnostics))
""")


def _load_within_50x(tmp_path: Path, text: str) -> str:
    path = tmp_path / "dense.fxr"
    path.write_text(text, encoding="utf-8")
    size = path.stat().st_size
    assert size >= SIZE * 0.95
    code = f"PATH, SIZE = {str(path)!r}, {size}\n" + PRELUDE
    run = ForkServer.ask({"kind": "code", "code": code}, timeout=300)  # a process of its own, forked
    assert run.returncode == 0 and run.stdout, run.stderr[-3000:]
    return run.stdout.strip()


@pytest.mark.parametrize("shape", sorted(LOADED))
@pytest.mark.slow
def test_a_file_of_small_tokens_loads_within_50_times_its_size(tmp_path, shape):
    text, count = LOADED[shape]
    expected = text.count("\n") if count is None else count
    assert _load_within_50x(tmp_path, text) == f"loaded {expected}"


@pytest.mark.parametrize("shape", sorted(REFUSED))
@pytest.mark.slow
def test_a_statement_of_too_many_tokens_is_refused_within_50_times_its_size(tmp_path, shape):
    from fxrules.lang.parser import MAX_STATEMENT_TOKENS

    text = REFUSED[shape]
    assert len(text) // 2 > MAX_STATEMENT_TOKENS  # (at least two bytes a token: "1,")
    out = _load_within_50x(tmp_path, text)
    assert out.startswith("refused too-large@1:") and ";" not in out, out
    column = int(out.rsplit(":", 1)[1])
    assert 100_000 < column < len(text)  # located at the token over the limit, not at the file's start


@pytest.mark.parametrize("shape", sorted(OVER_BUDGET))
@pytest.mark.slow
def test_a_file_dense_with_nodes_is_refused_by_its_token_budget_within_50_times_its_size(tmp_path, shape):
    out = _load_within_50x(tmp_path, OVER_BUDGET[shape])
    assert out.startswith("refused too-large@") and ";" not in out, out
    line = int(out.split("@")[1].split(":")[0])
    assert line > 100  # at the statement where the budget ran out, not at the file's start


@pytest.mark.slow
def test_the_file_token_budget_admits_the_library_and_is_the_same_on_both_parse_loops():
    from fxrules.lang import parser
    from fxrules.lang.diagnostics import RuleFileError
    from fxrules.lang.source import Source

    line = "$a -> $a\n"  # four tokens (the newline ends a statement) in nine bytes
    text = line * (parser.MIN_FILE_TOKENS // 4 + 10_000)
    assert len(text) // parser.BYTES_PER_TOKEN < parser.MIN_FILE_TOKENS < text.count("\n") * 4
    source = Source("many.fxr", text)
    with pytest.raises(parser.NotDirect):
        parser.parse_direct(source)
    with pytest.raises(RuleFileError) as info:
        parser.parse_lark(source)
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "too-large" and "tokens" in diagnostic.message
    assert diagnostic.line == parser.MIN_FILE_TOKENS // 4 + 1  # the line of the first token over
    fits = line * (parser.MIN_FILE_TOKENS // 4 - 1)
    assert len(parser.parse_direct(Source("fits.fxr", fits)).items) == fits.count("\n")


def test_the_largest_statements_of_the_library_and_the_corpus_are_far_below_the_limit():
    import re

    from fxrules.lang.parser import MAX_STATEMENT_TOKENS, tables

    scanner = tables().scanner
    largest = 0
    for path in [*ROOT.glob("fxrules/**/*.fxr"), *ROOT.glob("tests/corpus/**/*.fxr"), *ROOT.glob("docs/**/*.fxr")]:
        if path.name.startswith("too_large"):
            continue
        for statement in re.split(r"\n(?=\S)", path.read_text(encoding="utf-8", errors="replace")):
            tokens = sum(1 for m in scanner.finditer(statement) if m.lastgroup not in ("WS", "COMMENT", "_NL"))
            largest = max(largest, tokens)
    assert 0 < largest * 20 < MAX_STATEMENT_TOKENS, largest
