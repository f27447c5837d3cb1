"""Pictures of a rewrite: the graph before and after, side by side (``fxrules apply --graph FILE``).

Matched nodes (before) and the nodes that replaced them (after) are coloured and
labelled with the rule's name:

- before, red: a node a rule matched and rewrote ("matched: rule");
- before, orange, dashed: a node in a match the planner refused ("refused: rule");
- after, green: a node a rewrite created ("new: rule");
- after, blue: an existing node that now stands in for a replaced one
  ("replaces %drop: rule"), as ``$x`` does in ``Dropout($x) -> $x``.

How: we write the DOT text ourselves and run Graphviz's ``dot`` binary when it is on
PATH. ``torch.fx.passes.graph_drawer.FxGraphDrawer`` needs the ``pydot`` package (a
dependency we would add for a picture), draws one graph per call with its own styling
(no way to mark a node with the rule that matched it, no before/after pair) and
still needs ``dot`` to render. DOT text from our own code needs nothing installed,
colours and labels exactly what the report says, and is still useful without
Graphviz: when ``dot`` is missing we write the ``.dot`` file and say how to render it.

Outputs by suffix: ``.dot`` (the DOT text), ``.svg`` and ``.png`` (rendered by ``dot``),
``.html`` (a page with the SVG inline and the table of rewrites; without ``dot``, the
page holds the DOT text and the hint instead).
"""

from __future__ import annotations

import html
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from fxrules.lang.diagnostics import FxrulesError

SUFFIXES = (".svg", ".png", ".html", ".dot")
RENDER_TIMEOUT = 600.0  # seconds: dot on a graph of tens of thousands of nodes is slow, not stuck

MATCHED = ("#f8d7d5", "#c0392b")  # fill, border
REFUSED = ("#fde9cf", "#d68910")
CREATED = ("#d5f2df", "#1e8449")
STANDS_IN = ("#d6e6f7", "#2471a3")
PLAIN = ("#ffffff", "#7f8c8d")

__all__ = ["DrawError", "Drawing", "SUFFIXES", "draw", "find_dot", "marks", "to_dot"]


class DrawError(FxrulesError):
    """The picture could not be made: an unknown suffix, or ``dot`` failed."""


@dataclass(frozen=True)
class Drawing:
    """What :func:`draw` wrote."""

    path: Path  # the file written: the requested one, or the .dot file when dot is missing
    rendered: bool  # True when Graphviz drew the picture (always False for .dot)
    dot_path: Optional[Path] = None  # the DOT text written next to the request when dot is missing
    hint: Optional[str] = None  # one line for the user (dot not found)

    def to_json(self) -> dict:
        return {"file": str(self.path), "rendered": self.rendered,
                "dot_file": None if self.dot_path is None else str(self.dot_path), "hint": self.hint}


# ---------------------------------------------------------------------------
# DOT text
# ---------------------------------------------------------------------------


def to_dot(before: Any, after: Any, report: Any, *, title: Optional[str] = None) -> str:
    """DOT text: ``before`` and ``after`` (GraphModules) as two clusters, marked from ``report``.

    ``report`` is a :class:`fxrules.engine.report.Report` (or anything with ``applied`` and
    ``rejected`` sequences of items with ``rule``, ``matched``, ``created``, ``replaced_by``).
    """
    found = marks(before, after, report)
    matched, refused, created, stands_in = (found[k] for k in ("matched", "refused", "created", "stands_in"))
    lines = [
        "digraph fxrules {",
        f"  graph [label={_quote(title or 'fxrules rewrite')}, labelloc=t, fontname=\"Helvetica\", "
        f"fontsize=14, newrank=true, rankdir=TB];",
        "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10, "
        f"fillcolor=\"{PLAIN[0]}\", color=\"{PLAIN[1]}\"];",
        "  edge [color=\"#7f8c8d\", arrowsize=0.6];",
    ]
    changed_before = len(matched) + len(refused)
    changed_after = len(created) + len(stands_in)
    lines += _cluster("before", f"before: {len(before.graph.nodes)} nodes, {changed_before} marked", before,
                      {"matched": matched, "refused": refused})
    lines += _cluster("after", f"after: {len(after.graph.nodes)} nodes, {changed_after} marked", after,
                      {"created": created, "stands_in": stands_in})
    lines += _legend()
    lines.append("}")
    return "\n".join(lines) + "\n"


def _add(table: dict[str, list[str]], name: str, text: str) -> None:
    entries = table.setdefault(name, [])
    if text not in entries:
        entries.append(text)


def _cluster(key: str, label: str, module: Any, marks: dict[str, dict[str, list[str]]]) -> list[str]:
    prefix = "b" if key == "before" else "a"
    out = [f"  subgraph cluster_{key} {{",
           f"    label={_quote(label)}; style=\"rounded\"; color=\"#bdc3c7\"; fontsize=12;"]
    for node in module.graph.nodes:
        text = [f"%{node.name}", _describe(node, module)]
        fill, border = PLAIN
        extra = ""
        if node.name in marks.get("matched", {}):
            fill, border = MATCHED
            text += [f"matched: {r}" for r in marks["matched"][node.name]]
            extra = ", penwidth=2"
        elif node.name in marks.get("refused", {}):
            fill, border = REFUSED
            text += [f"refused: {r}" for r in marks["refused"][node.name]]
            extra = ", penwidth=2, style=\"rounded,filled,dashed\""
        elif node.name in marks.get("created", {}):
            fill, border = CREATED
            text += [f"new: {r}" for r in marks["created"][node.name]]
            extra = ", penwidth=2"
        if node.name in marks.get("stands_in", {}):
            if (fill, border) == PLAIN:
                fill, border = STANDS_IN
                extra = ", penwidth=2"
            text += marks["stands_in"][node.name]
        shape = {"placeholder": "ellipse", "output": "ellipse", "get_attr": "note"}.get(node.op)
        if shape:
            extra += f", shape={shape}" + (", style=\"filled\"" if "style=" not in extra else "")
        attrs = f"label={_quote(chr(10).join(text))}"
        if (fill, border) != PLAIN:
            attrs += f", fillcolor=\"{fill}\", color=\"{border}\""
        out.append(f"    {_quote(prefix + ':' + node.name)} [{attrs}{extra}];")
    for node in module.graph.nodes:
        for source in node.all_input_nodes:
            out.append(f"    {_quote(prefix + ':' + source.name)} -> {_quote(prefix + ':' + node.name)};")
    out.append("  }")
    return out


def _legend() -> list[str]:
    entries = [("matched", "matched by a rule", MATCHED, ""), ("refused", "match refused", REFUSED,
                                                               ", style=\"rounded,filled,dashed\""),
               ("created", "created by a rewrite", CREATED, ""), ("stands_in", "stands in for a replaced node",
                                                                   STANDS_IN, "")]
    out = ["  subgraph cluster_legend {", "    label=\"legend\"; style=\"rounded\"; color=\"#bdc3c7\"; fontsize=10;"]
    for key, text, (fill, border), extra in entries:
        out.append(f"    \"legend:{key}\" [label={_quote(text)}, fillcolor=\"{fill}\", color=\"{border}\", "
                   f"penwidth=2{extra}];")
    keys = [e[0] for e in entries]
    for a, b in zip(keys, keys[1:]):
        out.append(f"    \"legend:{a}\" -> \"legend:{b}\" [style=invis];")
    out.append("  }")
    return out


def _describe(node: Any, module: Any) -> str:
    op, target = node.op, node.target
    if op == "placeholder":
        return "input"
    if op == "output":
        return "output"
    if op == "get_attr":
        return f"get_attr {target}"
    if op == "call_module":
        try:
            kind = type(module.get_submodule(target)).__name__
        except AttributeError:
            kind = "?"
        return _clip(f"{target}: {kind}")
    if op == "call_method":
        return _clip(f".{target}()")
    return _clip(_callable_name(target))


def _callable_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    overload = type(target).__name__
    if overload in ("OpOverload", "OpOverloadPacket", "HigherOrderOperator"):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    short = getattr(target, "__name__", None)
    if module and isinstance(short, str) and short != name:  # torch.relu: qualname _VariableFunctionsClass.relu
        import sys

        if getattr(sys.modules.get(module), short, None) is target:
            name = short
    module = {"_operator": "operator", "torch._C._nn": "torch.nn.functional",
              "torch._C._VariableFunctions": "torch"}.get(module, module)
    return f"{module}.{name}" if module and module != "builtins" else name


def _clip(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _quote(text: str) -> str:
    """A DOT double-quoted string; newlines become centred line breaks."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


# ---------------------------------------------------------------------------
# Writing and rendering
# ---------------------------------------------------------------------------


def find_dot() -> Optional[str]:
    """The Graphviz ``dot`` binary on PATH, or None."""
    return shutil.which("dot")


def draw(path: Union[str, "os.PathLike[str]"], before: Any, after: Any, report: Any, *,
         title: Optional[str] = None) -> Drawing:
    """Draw ``before``/``after`` to ``path`` (.svg, .png, .html or .dot); see the module docstring.

    Raises :class:`DrawError` for an unknown suffix or when ``dot`` fails (the DOT text is
    then written next to ``path``), and ``OSError`` when a file cannot be written.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise DrawError(f"--graph takes a file ending in {', '.join(SUFFIXES)}, got {os.fspath(path)!r}")
    text = to_dot(before, after, report, title=title)
    if suffix == ".dot":
        path.write_text(text, encoding="utf-8")
        return Drawing(path, rendered=False)
    dot = find_dot()
    if dot is None:
        if suffix == ".html":
            hint = f"dot not found; wrote {path} with the DOT text (install graphviz to render)"
            path.write_text(_html(title, report, None, text), encoding="utf-8")
            return Drawing(path, rendered=False, hint=hint)
        dot_path = path.with_suffix(".dot")
        dot_path.write_text(text, encoding="utf-8")
        return Drawing(dot_path, rendered=False, dot_path=dot_path,
                       hint=f"dot not found; wrote {dot_path} (install graphviz to render)")
    if suffix == ".html":
        svg = _render(dot, text, "svg", path)
        path.write_text(_html(title, report, svg.decode("utf-8", "replace"), text), encoding="utf-8")
    else:
        path.write_bytes(_render(dot, text, suffix[1:], path))
    return Drawing(path, rendered=True)


def _render(dot: str, text: str, fmt: str, path: Path) -> bytes:
    try:
        done = subprocess.run([dot, f"-T{fmt}"], input=text.encode("utf-8"), capture_output=True,
                              timeout=RENDER_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        failure = f"{type(exc).__name__}: {exc}"
    else:
        if done.returncode == 0 and done.stdout:
            return done.stdout
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()
        failure = f"exit {done.returncode}" + (f": {message[0]}" if message else "")
    dot_path = path.with_suffix(".dot")
    dot_path.write_text(text, encoding="utf-8")
    raise DrawError(f"dot failed ({failure}); wrote {dot_path}")


def _html(title: Optional[str], report: Any, svg: Optional[str], dot_text: str) -> str:
    heading = html.escape(title or "fxrules rewrite")
    parts = ["<!doctype html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
             f"<title>{heading}</title>",
             "<style>body{font-family:Helvetica,Arial,sans-serif;margin:1.5em}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.2em .6em;"
             "text-align:left;font-size:.9em}pre{background:#f6f8fa;padding:1em;overflow:auto}"
             ".hint{color:#a04000}svg{max-width:100%;height:auto}</style>",
             "</head><body>", f"<h1>{heading}</h1>"]
    applied = list(getattr(report, "applied", ()))
    rejected = list(getattr(report, "rejected", ()))
    nodes = ""
    if hasattr(report, "nodes_before"):
        nodes = f"; nodes {report.nodes_before} &rarr; {report.nodes_after}"
    parts.append(f"<p>{len(applied)} rewrite{'s' * (len(applied) != 1)}, {len(rejected)} refused "
                 f"match{'es' * (len(rejected) != 1)}{nodes}</p>")
    if svg is not None:
        start = svg.find("<svg")
        parts.append(svg[start:] if start >= 0 else svg)
    else:
        parts.append("<p class=\"hint\">dot not found: install graphviz to render the picture. "
                     "The DOT text is below (paste it into any Graphviz viewer).</p>")
        parts.append(f"<pre id=\"dot\">{html.escape(dot_text)}</pre>")
    if applied:
        parts.append("<table><tr><th>rule</th><th>source</th><th>matched</th><th>replaced by</th>"
                     "<th>new nodes</th></tr>")
        for a in applied:
            cells = [a.rule, a.source, ", ".join(a.matched), ", ".join(a.replaced_by), ", ".join(a.created) or "-"]
            parts.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
    if rejected:
        parts.append("<table><tr><th>refused rule</th><th>at</th><th>reason</th></tr>")
        for r in rejected:
            cells = [r.rule, ", ".join(r.matched), r.reason]
            parts.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def marks(before: Any, after: Any, report: Any) -> dict[str, dict[str, list[str]]]:
    """What :func:`to_dot` marks: {"matched"|"refused"|"created"|"stands_in": {node name: labels}}.

    Names in ``report`` are the engine's: a before-graph node keeps its name in the rewritten
    graph and a new node never takes the name of an old one, so a name found in a graph is
    that graph's node. Nodes created and then rewritten again appear in neither graph.
    """
    before_names = {n.name for n in before.graph.nodes}
    after_names = {n.name for n in after.graph.nodes}
    found: dict[str, dict[str, list[str]]] = {"matched": {}, "refused": {}, "created": {}, "stands_in": {}}
    for item in getattr(report, "applied", ()):
        for name in item.matched:
            if name in before_names:
                _add(found["matched"], name, item.rule)
        for name in item.created:
            if name in after_names:
                _add(found["created"], name, item.rule)
        # matched lists the roots first, in the order of replaced_by (one entry per root)
        for root, name in zip(item.matched, item.replaced_by):
            if name in after_names and name not in item.created:
                _add(found["stands_in"], name, f"replaces %{root}: {item.rule}")
    for item in getattr(report, "rejected", ()):
        for name in item.matched:
            if name in before_names and name not in found["matched"]:
                _add(found["refused"], name, item.rule)
    return found
