"""``fxrules lsp``: a language server for rule files (on pygls, the LSP library of the Python ecosystem).

What it does, each a pure function of a document's path and text (unit-testable without a client)
and a handler that answers the protocol with it:

- diagnostics as you type: the checker's, under the file's project configuration (as ``fxrules
  check`` finds it), published on open, change and save (:func:`diagnostics_for`);
- hover: on a rule's name, its description and contract; on a target, what it resolves to and the
  first line of its docstring (:func:`hover_text`);
- go to definition: a target or builder (``fxrules.builders.fold_conv_bn``, a project's own builder)
  goes to its Python source; a name bound with ``as`` goes to where the pattern binds it
  (:func:`definition_of`);
- formatting: ``fxrules fmt``'s canonical layout (:func:`formatted`);
- completion: opcodes and aliases; module types after ``call_module``; a dotted name's attributes
  after a ``.`` (:func:`completions`).

pygls is an optional dependency (``pip install "fxrules[lsp]"``); everything but :func:`serve` works
without it. Rule files are untrusted: hover and definition resolve names through the same
:class:`fxrules.lang.names.Resolver` (the allow-list) the checker uses, so nothing outside it is
imported.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import urllib.parse
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import fxrules.lang.ast as A
from fxrules.lang.diagnostics import Diagnostic
from fxrules.lang.load import ConfigWarning, analyze, parse_recovering, project
from fxrules.lang.names import BUILTIN_ALIASES, Resolver, expand
from fxrules.lang.source import Source

OPCODES = A.OPCODES
KEYWORDS = ("rule", "use", "where", "example", "given", "default", "exact", "approx", "changes")


@dataclass(frozen=True, slots=True)
class Location:
    """A place in a file: 1-based line and column, as Diagnostic and Span have them."""

    path: str
    line: int
    column: int = 1


# ---------------------------------------------------------------------------
# The features, as functions of (path, text, position)
# ---------------------------------------------------------------------------


def diagnostics_for(path: str, text: str) -> list[Diagnostic]:
    """What ``fxrules check`` says about ``text`` as the file ``path`` (its project's configuration)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        try:
            _, resolver = project([path])
        except Exception:  # a broken configuration: check with the defaults (fxrules check reports it)
            resolver = Resolver()
    _, found = analyze([Source(path, text)], resolver)
    return [d for d in found if d.path == path]


def _resolver(path: str) -> Resolver:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        try:
            return project([path])[1]
        except Exception:
            return Resolver()


def _nodes(value: Any) -> Iterator[Any]:
    """Every AST node under ``value`` (dataclasses, tuples), parents before children."""
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _nodes(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        yield value
        for field in dataclasses.fields(value):
            yield from _nodes(getattr(value, field.name))


def _inside(span: A.Span, line: int, column: int) -> bool:
    if span.line <= 0:
        return False
    after_start = (line, column) >= (span.line, span.column)
    before_end = (line, column) < (span.end_line, span.end_column) if span.end_line else False
    return after_start and before_end


def _aliases(rule_file: A.RuleFile) -> dict[str, str]:
    aliases = dict(BUILTIN_ALIASES)
    for item in rule_file.items:
        if isinstance(item, A.Use):
            aliases[item.alias] = expand(item.path.parts, aliases) or ".".join(item.path.parts)
    return aliases


def _parsed(path: str, text: str) -> Optional[A.RuleFile]:
    rule_file, _ = parse_recovering(Source(path, text))
    return rule_file


@dataclass(frozen=True, slots=True)
class _Target:
    """A call whose target is under the cursor, and the full dotted path it names."""

    call: A.Call
    path: str  # the full dotted path the target names


def _target_at(rule_file: A.RuleFile, line: int, column: int) -> Optional[_Target]:
    aliases = _aliases(rule_file)
    for node in _nodes(rule_file.items):
        if isinstance(node, A.Call) and _inside(node.target.span, line, column):
            parts = node.target.parts
            full = expand(parts, aliases)
            if full is None and node.op == "call_module" and len(parts) == 1:
                full = f"torch.nn.{parts[0]}"
            if full is None and node.op == "call_method":
                full = f"torch.Tensor.{'.'.join(parts)}"
            return _Target(node, full or ".".join(parts))
    return None


def _rule_at(rule_file: A.RuleFile, line: int, column: int) -> Optional[A.Rule]:
    for item in rule_file.items:
        if isinstance(item, A.Rule) and item.span.line <= line <= max(item.span.end_line, item.span.line):
            return item
    return None


def hover_text(path: str, text: str, line: int, column: int) -> Optional[str]:
    """Markdown for what is at (line, column): a rule's name, or a target and what it resolves to."""
    rule_file = _parsed(path, text)
    if rule_file is None:
        return None
    for item in rule_file.items:
        if isinstance(item, A.Rule) and _inside(item.name_span, line, column):
            contract = item.contract.word if item.contract is not None else "exact (the default)"
            head = f"**rule `{item.name}`** [{contract}]"
            return head + (f"\n\n{item.description}" if item.description else "")
    target = _target_at(rule_file, line, column)
    if target is None:
        return None
    resolution = _resolver(path).resolve(target.path)
    if not resolution.ok:
        return f"`{target.path}`: {resolution.message or resolution.status}"
    value = resolution.value
    kind = "class" if inspect.isclass(value) else type(value).__name__
    shown = f"`{target.path}` ({target.call.op}): {kind} `{_qualified(value)}`"
    doc = (inspect.getdoc(value) or "").strip().splitlines()
    return shown + (f"\n\n{doc[0]}" if doc else "")


def _qualified(value: Any) -> str:
    module = getattr(value, "__module__", None)
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None) or repr(value)
    return f"{module}.{name}" if module else str(name)


def definition_of(path: str, text: str, line: int, column: int) -> Optional[Location]:
    """Where what is at (line, column) is defined: a name bound with ``as`` in the rule, or the Python
    source of a target or builder."""
    rule_file = _parsed(path, text)
    if rule_file is None:
        return None
    rule = _rule_at(rule_file, line, column)
    if rule is not None:
        name = _bound_name_at(rule, line, column)
        if name is not None:
            for node in _nodes(rule.patterns):
                if isinstance(node, A.Bind) and node.name == name:  # the span ends with the name
                    return Location(path, node.span.end_line, node.span.end_column - len(name))
    target = _target_at(rule_file, line, column)
    if target is None:
        return None
    resolution = _resolver(path).resolve(target.path)
    if not resolution.ok:
        return None
    value = inspect.unwrap(resolution.value) if callable(resolution.value) else resolution.value
    try:
        file = inspect.getsourcefile(value)
        _, first = inspect.getsourcelines(value)
    except (TypeError, OSError):
        return None
    return Location(file, max(first, 1)) if file else None


def _bound_name_at(rule: A.Rule, line: int, column: int) -> Optional[str]:
    """The ``as`` name used at (line, column) in a replacement, a condition or a builder's arguments."""
    for node in _nodes((rule.replacements, rule.conditions)):
        if isinstance(node, A.Name) and _inside(node.span, line, column) and len(node.dotted.parts) == 1:
            return node.dotted.parts[0]
        if isinstance(node, A.CName) and _inside(node.span, line, column):
            return node.name
        if isinstance(node, A.Call) and _inside(node.target.span, line, column) and len(node.target.parts) == 1:
            return node.target.parts[0]  # call_module conv(...): a module the pattern named
    return None


def formatted(path: str, text: str) -> Optional[str]:
    """The canonical text (``fxrules fmt``), or None when the text has syntax errors or is canonical."""
    from fxrules.tools.fmt import FormatError, format_text

    try:
        new = format_text(text, path)
    except Exception as exc:  # a syntax error (RuleFileError) or FormatError: leave the text alone
        if isinstance(exc, FormatError) or hasattr(exc, "diagnostics"):
            return None
        raise
    return None if new == text else new


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*$")


def completions(path: str, text: str, line: int, column: int) -> list[str]:
    """Candidates for the word before (line, column): attributes after a ``.``, module types after
    ``call_module``, else opcodes, keywords and aliases."""
    lines = text.split("\n")
    before = lines[line - 1][: column - 1] if 1 <= line <= len(lines) else ""
    found = _WORD.search(before)
    word = found.group(0) if found else ""
    head = before[: len(before) - len(word)]
    if "." in word:
        return _attributes(path, text, word)
    if head.rstrip().endswith("call_module"):
        return [name for name in _module_types() if name.startswith(word)]
    rule_file = _parsed(path, text)
    aliases = sorted(_aliases(rule_file) if rule_file is not None else BUILTIN_ALIASES)
    return [c for c in (*OPCODES, *KEYWORDS, *aliases) if c.startswith(word)]


def _attributes(path: str, text: str, word: str) -> list[str]:
    prefix, _, partial = word.rpartition(".")
    rule_file = _parsed(path, text)
    aliases = _aliases(rule_file) if rule_file is not None else dict(BUILTIN_ALIASES)
    full = expand(tuple(prefix.split(".")), aliases) or prefix
    resolution = _resolver(path).resolve(full)
    if not resolution.ok:
        return []
    names = sorted(n for n in dir(resolution.value) if not n.startswith("_") and n.startswith(partial))
    return [f"{prefix}.{n}" for n in names]


def _module_types() -> list[str]:
    try:
        import torch
    except ImportError:
        return []
    return sorted(n for n, v in vars(torch.nn).items()
                  if inspect.isclass(v) and issubclass(v, torch.nn.Module) and not n.startswith("_"))


# ---------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------


def path_of(uri: str) -> str:
    """A ``file://`` URI's path (other schemes: the URI itself, as diagnostics' name)."""
    parsed = urllib.parse.urlparse(uri)
    return urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else uri


def uri_of(path: str) -> str:
    return "file://" + urllib.parse.quote(os.path.abspath(path))


def build_server():
    """The pygls LanguageServer with every feature registered (import pygls only here)."""
    from lsprotocol import types
    from pygls.lsp.server import LanguageServer

    from fxrules import __version__

    server = LanguageServer("fxrules", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Full)

    def publish(ls, uri: str) -> None:
        document = ls.workspace.get_text_document(uri)
        found = diagnostics_for(path_of(uri), document.source)
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
            uri=uri, version=document.version, diagnostics=[_lsp_diagnostic(types, d) for d in found]))

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls, params):
        publish(ls, params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls, params):
        publish(ls, params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls, params):
        publish(ls, params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    def hover(ls, params):
        uri, position = params.text_document.uri, params.position
        text = hover_text(path_of(uri), ls.workspace.get_text_document(uri).source, position.line + 1,
                          position.character + 1)
        if text is None:
            return None
        return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=text))

    @server.feature(types.TEXT_DOCUMENT_DEFINITION)
    def definition(ls, params):
        uri, position = params.text_document.uri, params.position
        found = definition_of(path_of(uri), ls.workspace.get_text_document(uri).source, position.line + 1,
                              position.character + 1)
        if found is None:
            return None
        where = types.Position(line=found.line - 1, character=found.column - 1)
        target = uri if found.path == path_of(uri) else uri_of(found.path)
        return types.Location(uri=target, range=types.Range(start=where, end=where))

    @server.feature(types.TEXT_DOCUMENT_FORMATTING)
    def formatting(ls, params):
        uri = params.text_document.uri
        text = ls.workspace.get_text_document(uri).source
        new = formatted(path_of(uri), text)
        if new is None:
            return []
        lines = text.split("\n")
        end = types.Position(line=len(lines), character=0)
        return [types.TextEdit(range=types.Range(start=types.Position(line=0, character=0), end=end), new_text=new)]

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=[".", " "]))
    def completion(ls, params):
        uri, position = params.text_document.uri, params.position
        items = completions(path_of(uri), ls.workspace.get_text_document(uri).source, position.line + 1,
                            position.character + 1)
        return types.CompletionList(is_incomplete=False, items=[types.CompletionItem(label=i) for i in items[:500]])

    return server


def _lsp_diagnostic(types, d: Diagnostic):
    line = max(d.line, 1) - 1
    column = max(d.column, 1) - 1
    end_line = max(d.end_line, d.line, 1) - 1
    end_column = max(d.end_column - 1, column + 1) if d.end_line == d.line else max(d.end_column - 1, 0)
    severity = types.DiagnosticSeverity.Error if d.severity == "error" else types.DiagnosticSeverity.Warning
    message = d.message + "".join(f"\n{note}" for note in d.notes)
    return types.Diagnostic(range=types.Range(start=types.Position(line=line, character=column),
                                              end=types.Position(line=end_line, character=end_column)),
                            message=message, severity=severity, code=d.code, source="fxrules")


def serve() -> None:
    """Speak LSP over standard input and output until the client says exit."""
    build_server().start_io()
