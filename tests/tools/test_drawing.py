"""Pictures of a rewrite (fxrules.tools.drawing): which nodes are marked, the DOT text, the files written.

The DOT text is checked by a small linter here (every line a statement Graphviz reads,
every string properly quoted), and rendering is checked with a fake ``dot`` (a script
that records what it was given), so the tests mean the same with or without Graphviz
installed. ``fxrules apply --graph`` through the real CLI is tested in test_cli_apply.py.
"""

from __future__ import annotations

import re
import stat
import sys
from pathlib import Path

import pytest
import torch
from torch import fx, nn

import fxrules
import fxrules.tools.drawing as drawing
from fxrules.tools.drawing import DrawError, draw, marks, to_dot

RULES = """
rule remove_dropout [exact]:
    call_module Dropout($x) as d where not d.training -> $x
rule relu_idempotent [exact]:
    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)
rule double_neg [exact]:
    call_function torch.neg(call_function torch.neg($x)) -> $x
rule add_self [exact]:
    call_function operator.add($x, $x) -> call_function operator.mul($x, 2)
"""


class Net(nn.Module):
    """Dropout and a double neg (rewritten), a relu pair whose inner relu is used twice (refused)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        a = torch.relu(x)
        b = torch.relu(a)
        c = torch.neg(torch.neg(self.drop(self.fc(b))))
        d = c + c
        return d + a


@pytest.fixture(scope="module")
def rewrite():
    torch.manual_seed(0)
    before = fx.symbolic_trace(Net().eval())
    result = fxrules.apply_rules(before, fxrules.parse_rules(RULES, "net.fxr"))
    return before, result


def _node_lines(dot: str, prefix: str) -> dict[str, str]:
    """Node statements of one cluster: {node name: the statement's attribute text}."""
    found = {}
    for line in dot.splitlines():
        m = re.match(rf'\s*"{prefix}:(\w+)" \[(.*)\];$', line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def _label(attrs: str) -> list[str]:
    m = re.search(r'label="((?:[^"\\]|\\.)*)"', attrs)
    assert m, attrs
    return m.group(1).replace('\\"', '"').replace("\\\\", "\\").split("\\n")


STRING = r'"(?:[^"\\]|\\.)*"'
ATTR = rf'\w+=(?:{STRING}|[\w.#-]+)'
STATEMENTS = [
    re.compile(r"^digraph fxrules \{$"),
    re.compile(r"^\}$"),
    re.compile(r"^\s*\}$"),
    re.compile(r"^\s*subgraph cluster_\w+ \{$"),
    re.compile(rf"^\s*(graph|node|edge) \[{ATTR}(, {ATTR})*\];$"),
    re.compile(rf"^\s*{ATTR}(; {ATTR})*;$"),
    re.compile(rf"^\s*{STRING} \[{ATTR}(, {ATTR})*\];$"),
    re.compile(rf"^\s*{STRING} -> {STRING}( \[{ATTR}(, {ATTR})*\])?;$"),
]


def _lint(dot: str) -> None:
    """Every line is a DOT statement of a form Graphviz reads; braces balance."""
    depth = 0
    for number, line in enumerate(dot.splitlines(), 1):
        assert any(p.match(line) for p in STATEMENTS), f"line {number}: {line!r}"
        depth += line.count("{") - line.count("}") if not re.search(STRING, line) else 0
    assert depth == 0


# ---------------------------------------------------------------------------
# What is marked
# ---------------------------------------------------------------------------


def test_marks_follow_the_report(rewrite):
    before, result = rewrite
    found = marks(before, result.module, result.report)
    assert found["matched"] == {"drop": ["remove_dropout"], "neg": ["double_neg"], "neg_1": ["double_neg"],
                                "add": ["add_self"]}
    assert found["refused"] == {"relu": ["relu_idempotent"], "relu_1": ["relu_idempotent"]}
    created = {a.created[0] for a in result.report.applied if a.rule == "add_self"}
    assert found["created"] == {name: ["add_self"] for name in created}
    # Dropout($x) -> $x: %fc now stands where %drop was, and again where the neg pair was
    assert found["stands_in"] == {"fc": ["replaces %drop: remove_dropout", "replaces %neg_1: double_neg"]}
    # every marked name is a node of the graph it is drawn in
    before_names = {n.name for n in before.graph.nodes}
    after_names = {n.name for n in result.module.graph.nodes}
    assert set(found["matched"]) | set(found["refused"]) <= before_names
    assert set(found["created"]) | set(found["stands_in"]) <= after_names


def test_dot_text_labels_and_colours(rewrite):
    before, result = rewrite
    dot = to_dot(before, result.module, result.report, title="Net")
    _lint(dot)
    b = _node_lines(dot, "b")
    a = _node_lines(dot, "a")
    assert set(b) == {n.name for n in before.graph.nodes}
    assert set(a) == {n.name for n in result.module.graph.nodes}
    assert _label(b["drop"]) == ["%drop", "drop: Dropout", "matched: remove_dropout"]
    assert f'fillcolor="{drawing.MATCHED[0]}"' in b["drop"]
    assert _label(b["relu_1"]) == ["%relu_1", "torch.relu", "refused: relu_idempotent"]
    assert "dashed" in b["relu_1"] and f'color="{drawing.REFUSED[1]}"' in b["relu_1"]
    assert _label(b["fc"]) == ["%fc", "fc: Linear"] and "fillcolor" not in b["fc"]  # untouched before
    assert _label(b["add"])[:2] == ["%add", "operator.add"]
    new = next(n for n in result.module.graph.nodes if n.target is __import__("operator").mul)
    assert _label(a[new.name]) == [f"%{new.name}", "operator.mul", "new: add_self"]
    assert f'fillcolor="{drawing.CREATED[0]}"' in a[new.name]
    assert _label(a["fc"]) == ["%fc", "fc: Linear", "replaces %drop: remove_dropout", "replaces %neg_1: double_neg"]
    assert f'fillcolor="{drawing.STANDS_IN[0]}"' in a["fc"]
    assert "shape=ellipse" in a["x"] and "shape=ellipse" in a["output"]
    # one edge per input use, in each cluster
    edges = re.findall(r'"(b|a):(\w+)" -> "\1:(\w+)"', dot)
    assert ("b", "relu", "add_1") in edges and ("b", "relu", "relu_1") in edges
    assert sum(1 for e in edges if e[0] == "b") == sum(len(n.all_input_nodes) for n in before.graph.nodes)
    assert sum(1 for e in edges if e[0] == "a") == sum(len(n.all_input_nodes) for n in result.module.graph.nodes)
    assert 'label="before: 10 nodes, 6 marked"' in dot  # drop, neg, neg_1, add matched; relu, relu_1 refused
    assert f'label="after: {len(result.module.graph.nodes)} nodes, 2 marked"' in dot
    assert "cluster_legend" in dot


def test_dot_strings_are_escaped():
    assert drawing._quote('a "b" \\ c\nd') == '"a \\"b\\" \\\\ c\\nd"'

    class Weird(nn.Module):
        def forward(self, x):
            return x.reshape(-1)

    gm = fx.symbolic_trace(Weird())
    dot = to_dot(gm, gm, fxrules.Report(), title='say "hi"\\ there\nnext')
    _lint(dot)
    assert 'label="say \\"hi\\"\\\\ there\\nnext"' in dot


def test_export_graph_names_are_aten_ops():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    program = torch.export.export(model.eval(), (torch.randn(2, 4),))
    module = program.module()
    dot = to_dot(module, module, fxrules.Report())
    _lint(dot)
    labels = {name: _label(attrs)[1] for name, attrs in _node_lines(dot, "b").items()}
    assert "aten.linear.default" in labels.values() and "aten.relu.default" in labels.values()


# ---------------------------------------------------------------------------
# Files: .dot, and .svg/.png/.html with a fake dot, a failing dot and no dot
# ---------------------------------------------------------------------------

FAKE_DOT = """\
import os, sys
data = sys.stdin.read()
with open(os.environ["FAKE_DOT_LOG"], "w") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n" + data)
if os.environ.get("FAKE_DOT_FAIL"):
    sys.stderr.write("Error: <stdin>: syntax error in line 3 near 'x'\\n")
    sys.exit(1)
if sys.argv[1:] == ["-Tsvg"]:
    sys.stdout.write('<?xml version="1.0"?>\\n<!DOCTYPE svg>\\n<svg xmlns="http://www.w3.org/2000/svg">'
                     '<text>%d statements</text></svg>\\n' % data.count("["))
elif sys.argv[1:] == ["-Tpng"]:
    sys.stdout.buffer.write(b"\\x89PNG\\r\\n\\x1a\\nfake")
else:
    sys.exit(3)
"""


def make_fake_dot(directory: Path) -> Path:
    """An executable named dot that records its arguments and input in $FAKE_DOT_LOG."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "dot"
    path.write_text(f"#!{sys.executable}\n" + FAKE_DOT, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def fake_dot(tmp_path, monkeypatch):
    dot = make_fake_dot(tmp_path / "bin")
    log = tmp_path / "dot.log"
    monkeypatch.setenv("FAKE_DOT_LOG", str(log))
    monkeypatch.setattr(drawing, "find_dot", lambda: str(dot))
    return log


@pytest.fixture
def no_dot(monkeypatch):
    monkeypatch.setattr(drawing, "find_dot", lambda: None)


def test_dot_file_is_the_dot_text(rewrite, tmp_path, no_dot):
    before, result = rewrite
    out = draw(tmp_path / "g.dot", before, result.module, result.report, title="Net")
    assert out.path == tmp_path / "g.dot" and not out.rendered and out.hint is None
    assert out.path.read_text() == to_dot(before, result.module, result.report, title="Net")


def test_svg_and_png_are_rendered_by_dot(rewrite, tmp_path, fake_dot):
    before, result = rewrite
    svg = draw(tmp_path / "g.svg", before, result.module, result.report)
    assert svg.rendered and svg.hint is None and svg.dot_path is None
    assert svg.path.read_text().startswith('<?xml version="1.0"?>')
    arguments, _, text = fake_dot.read_text().partition("\n")
    assert arguments == "-Tsvg" and text == to_dot(before, result.module, result.report)
    png = draw(tmp_path / "g.PNG", before, result.module, result.report)  # the suffix in any case
    assert png.rendered and png.path.read_bytes().startswith(b"\x89PNG")
    assert fake_dot.read_text().startswith("-Tpng\n")
    assert not (tmp_path / "g.dot").exists()


def test_html_embeds_the_svg_and_the_tables(rewrite, tmp_path, fake_dot):
    before, result = rewrite
    page = draw(tmp_path / "g.html", before, result.module, result.report, title="Net <1>")
    assert page.rendered
    text = page.path.read_text()
    assert text.startswith("<!doctype html>") and "<title>Net &lt;1&gt;</title>" in text
    assert "<svg xmlns=" in text and "<?xml" not in text and "<!DOCTYPE svg>" not in text
    assert "<td>remove_dropout</td>" in text and "<td>relu_idempotent</td>" in text  # applied and refused
    assert "interior node %relu is also used by %add_1" in text
    assert "<pre" not in text


def test_without_dot_svg_becomes_dot_with_a_hint(rewrite, tmp_path, no_dot):
    before, result = rewrite
    out = draw(tmp_path / "pic.svg", before, result.module, result.report)
    assert not out.rendered and out.path == tmp_path / "pic.dot" == out.dot_path
    assert out.hint == f"dot not found; wrote {tmp_path / 'pic.dot'} (install graphviz to render)"
    assert not (tmp_path / "pic.svg").exists()
    _lint(out.path.read_text())
    assert out.to_json() == {"file": str(tmp_path / "pic.dot"), "rendered": False,
                             "dot_file": str(tmp_path / "pic.dot"), "hint": out.hint}


def test_without_dot_html_holds_the_dot_text(rewrite, tmp_path, no_dot):
    before, result = rewrite
    out = draw(tmp_path / "pic.html", before, result.module, result.report)
    assert not out.rendered and out.path == tmp_path / "pic.html" and out.dot_path is None
    assert out.hint.startswith("dot not found; wrote ") and "install graphviz" in out.hint
    text = out.path.read_text()
    assert "<svg" not in text and "install graphviz" in text
    dot = re.search(r'<pre id="dot">(.*)</pre>', text, re.S).group(1)
    import html

    assert html.unescape(dot) == to_dot(before, result.module, result.report)


def test_a_failing_dot_is_one_error_and_leaves_the_dot_text(rewrite, tmp_path, fake_dot, monkeypatch):
    before, result = rewrite
    monkeypatch.setenv("FAKE_DOT_FAIL", "1")
    with pytest.raises(DrawError) as caught:
        draw(tmp_path / "g.svg", before, result.module, result.report)
    message = str(caught.value)
    assert message == (f"dot failed (exit 1: Error: <stdin>: syntax error in line 3 near 'x'); "
                       f"wrote {tmp_path / 'g.dot'}")
    assert "\n" not in message and (tmp_path / "g.dot").exists() and not (tmp_path / "g.svg").exists()


def test_unknown_suffix_is_refused(rewrite, tmp_path):
    before, result = rewrite
    with pytest.raises(DrawError, match=r"ending in \.svg, \.png, \.html, \.dot, got '.*g\.jpg'"):
        draw(tmp_path / "g.jpg", before, result.module, result.report)
    assert not list(tmp_path.iterdir())


def test_graphviz_on_this_machine(rewrite, tmp_path):
    """With the real environment: a real SVG when Graphviz is installed, the .dot fallback when not."""
    before, result = rewrite
    out = draw(tmp_path / "real.svg", before, result.module, result.report)
    if drawing.find_dot() is not None:
        text = out.path.read_text()
        assert out.rendered and "<svg" in text
        for name in ("b:drop", "a:fc", "legend:matched"):  # Graphviz titles each node with its id
            assert f"<title>{name}</title>" in text
    else:
        assert not out.rendered and out.path.suffix == ".dot" and out.hint

