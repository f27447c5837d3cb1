"""``fxrules fmt``: canonical formatting of rule files, keeping every comment.

The AST (and so :mod:`fxrules.lang.printer`) knows nothing of comments, so a file is
not formatted as a whole. It is cut into *items* (a ``use``, a ``default``, a
rule with its ``where`` and ``example`` lines) and the *gaps* between them, using
each item's span:

* an item runs from the line its span starts on to the last line holding code
  before the next item starts (so lines that belong to a rule are never cut off
  even if its span stops early);
* a gap is what lies between two items: only blank lines and comment lines.

Items are printed by the printer, one at a time. Gaps are copied: every comment
line as written (trailing whitespace removed), runs of blank lines folded to
one, no blank lines at the start or end of the file, and a blank line added
where the printer separates two items (around a multi-line rule) when the source
had none (after the comment lines indented under the item above, so a comment
stays with the item it was written against).

An item with comments *inside* it (a trailing comment on one of its lines, or a
comment line between its lines) is handled one of two ways:

* when the printed item has the same lines as the source, up to whitespace (the
  usual case: a one-line rule or a ``use`` with a trailing comment, a rule that
  is already laid out canonically), each comment goes back on its own line: a
  trailing comment after the same code, at the column it was written at (or two
  spaces after the code when the code grew past it), a comment line before the
  same next line, indented like it;
* otherwise the item is left exactly as written (trailing whitespace aside).
  The printer's layout is a function of the AST alone: it joins a pattern
  written over several lines into one and splits ``pattern -> replacement``
  over two, so a comment next to one part of a rule has no line that is
  certainly "the same line" in the output. Moving it would silently change what
  it documents; keeping the item as written never loses or misplaces a comment.
  Moving the comment above the rule lets fmt format the rule.

Nothing is ever lost: a file with syntax errors is refused (a located
diagnostic; formatting needs a parse, and nothing else: a file whose rules name
unknown targets is formatted, ``fxrules check`` reports those), and the result is
checked before it is returned: it must parse to the same AST and hold the same
comments in the same order, or :class:`FormatError` is raised and the file is
left alone. Formatting is idempotent: ``format_text(format_text(x)) ==
format_text(x)``. The output uses ``\\n`` line endings, no byte-order mark, and
ends with one newline (an empty file stays empty).
"""

from __future__ import annotations

import difflib
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from typing import Optional

import fxrules.lang.ast as A
from fxrules.lang.diagnostics import FxrulesError, RuleFileError
from fxrules.lang.load import parse_source
from fxrules.lang.printer import print_file, print_item
from fxrules.lang.source import Source

__all__ = ["FormatError", "FormatResult", "comments", "format_source", "format_text", "unified_diff",
           "write_atomically"]

_TRAILING = " \t\f\r"  # what the grammar calls whitespace (plus a CR before LF); never part of a token
_STRING = re.compile(r'"([^"\\\n]|\\.)*"|\'([^\'\\\n]|\\.)*\'')


class FormatError(FxrulesError):
    """Formatting would have changed the rules or dropped a comment (a bug): nothing was written."""


@dataclass(frozen=True, slots=True)
class FormatResult:
    """One file formatted: its path, its text before and after."""

    path: str
    original: str
    formatted: str

    @property
    def changed(self) -> bool:
        return self.original != self.formatted


@dataclass(frozen=True, slots=True)
class _Line:
    """A line of a rule file split into its code and its comment."""

    code: str  # the text before the comment, trailing whitespace removed
    comment: Optional[str]  # from `#` to the end of the line, trailing whitespace removed
    column: int  # where the comment starts (0-based), when there is one

    @property
    def is_blank(self) -> bool:
        return not self.code.strip(_TRAILING) and self.comment is None

    @property
    def has_code(self) -> bool:
        """A token on the line (a line holding only a line continuation `\\` has none)."""
        code = self.code.strip(_TRAILING)
        return bool(code) and code != "\\"


def _split_line(line: str) -> _Line:
    """Code and comment of one line of a file that parses: a `#` outside a string starts a comment.

    Strings never span lines, and quotes appear only in strings and comments, so a scan of
    one line from the left is exact.
    """
    i = 0
    n = len(line)
    while i < n:
        ch = line[i]
        if ch == "#":
            return _Line(line[:i].rstrip(_TRAILING), line[i:].rstrip(_TRAILING), i)
        if ch == '"' or ch == "'":
            m = _STRING.match(line, i)
            i = m.end() if m else n  # no match cannot happen in a file that parses
            continue
        i += 1
    return _Line(line.rstrip(_TRAILING), None, 0)


def _lines(text: str) -> list[_Line]:
    return [_split_line(line) for line in text.split("\n")]


def comments(text: str) -> list[str]:
    """Every comment of a file that parses, in order, without trailing whitespace."""
    return [line.comment for line in _lines(text) if line.comment is not None]


def _squeeze(text: str) -> str:
    return "".join(text.split())


def _indent(text: str) -> str:
    return text[: len(text) - len(text.lstrip(" \t\f"))]


def _format_item(item: A.Item, region: list[_Line], raw: list[str]) -> list[str]:
    """The output lines of one item (see the module docstring)."""
    printed = print_item(item).split("\n")
    if all(line.comment is None for line in region):
        return printed
    code = [line for line in region if line.has_code]
    if len(code) == len(printed) and all(_squeeze(c.code) == _squeeze(p) for c, p in zip(code, printed)):
        out: list[str] = []
        pending: list[str] = []  # comment lines waiting for the line they sit above
        index = 0
        for line in region:
            if line.has_code:
                text = printed[index]
                index += 1
                out.extend(_indent(text) + comment for comment in pending)
                pending = []
                if line.comment is not None:
                    text += " " * max(2, line.column - len(text)) + line.comment
                out.append(text)
            elif line.comment is not None:
                pending.append(line.comment)
        return out
    out = [r.rstrip(_TRAILING) for r in raw]
    # A line continuation ending the item joined it to the blank or comment line after it,
    # which the gap may drop or move: the item ends here, so the continuation goes.
    while out and out[-1].endswith("\\") and region[len(out) - 1].comment is None:
        out[-1] = out[-1][:-1].rstrip(_TRAILING)
        if not out[-1].strip(_TRAILING):
            out.pop()
    return out


def _needs_blank(first: A.Item, second: A.Item, path: str) -> bool:
    """Whether the printer separates these two items with a blank line."""
    return "\n\n" in print_file(A.RuleFile(path, (first, second)))


def _gap(lines: list[_Line], raw: list[str], *, blank_needed: bool, at_start: bool, at_end: bool) -> list[str]:
    """The comment and blank lines between two items (or before the first, after the last)."""
    out: list[str] = []
    for line, text in zip(lines, raw):
        if line.comment is not None:  # a gap has only comment lines and blank lines
            out.append(text.rstrip(_TRAILING))
        elif line.is_blank and out and out[-1] != "":
            out.append("")
        elif line.is_blank and not out and not at_start:
            out.append("")
        # anything else is a line continuation on its own line: no token, nothing to keep
    if at_end:
        while out and out[-1] == "":
            out.pop()
    if blank_needed and "" not in out:
        at = 0
        while at < len(out) and _indent(out[at]):
            at += 1  # comment lines indented under the item above stay with it
        out.insert(at, "")
    return out


def format_source(source: Source) -> str:
    """The canonical text of ``source``. Raises RuleFileError (syntax) or FormatError (a bug, nothing lost)."""
    rule_file = parse_source(source)
    text = source.text
    raw = text.split("\n")
    lines = _lines(text)
    items = rule_file.items
    starts = [item.span.line - 1 for item in items]
    if any(s < 0 or s >= len(raw) for s in starts) or any(a >= b for a, b in zip(starts, starts[1:])):
        raise FormatError(f"{source.path}: cannot locate the items of the file (spans {starts}); left as written")
    out: list[str] = []
    out.extend(_gap(lines[: starts[0] if items else len(raw)], raw[: starts[0] if items else len(raw)],
                    blank_needed=False, at_start=True, at_end=not items))
    for k, item in enumerate(items):
        start = starts[k]
        limit = starts[k + 1] if k + 1 < len(items) else len(raw)
        end = max(start, min(item.span.end_line - 1, limit - 1))
        for i in range(end + 1, limit):
            if lines[i].has_code:
                end = i
        out.extend(_format_item(item, lines[start : end + 1], raw[start : end + 1]))
        last = k + 1 == len(items)
        blank = not last and _needs_blank(item, items[k + 1], rule_file.path)
        out.extend(_gap(lines[end + 1 : limit], raw[end + 1 : limit], blank_needed=blank, at_start=False,
                        at_end=last))
    formatted = "\n".join(out) + "\n" if out else ""
    _verify(source, rule_file, formatted)
    return formatted


def _verify(source: Source, rule_file: A.RuleFile, formatted: str) -> None:
    """The formatted text must mean the same rules and keep every comment, in order."""
    try:
        again = parse_source(Source(source.path, formatted))
    except RuleFileError as exc:
        raise FormatError(f"{source.path}: internal error: the formatted text does not parse "
                          f"({exc.diagnostics[0].headline()}); left as written") from None
    if again.items != rule_file.items:
        for before, after in zip(rule_file.items, again.items):
            if before != after:
                where = f"{source.path}:{before.span.line}"
                break
        else:
            where = source.path
        raise FormatError(f"{where}: internal error: formatting would change the rules; left as written")
    if comments(formatted) != comments(source.text):
        raise FormatError(f"{source.path}: internal error: formatting would lose a comment; left as written")


def format_text(text: str, path: str = "<string>") -> str:
    """The canonical text of a rule file given as text (see :func:`format_source`)."""
    return format_source(Source(path, text))


def unified_diff(result: FormatResult) -> str:
    """A unified diff from the file as it is to the file formatted."""
    return "".join(difflib.unified_diff(result.original.splitlines(keepends=True),
                                        result.formatted.splitlines(keepends=True),
                                        fromfile=result.path, tofile=result.path + " (formatted)"))


def write_atomically(path: str, text: str) -> None:
    """Replace the file at ``path`` (the target of a symlink) in one step, keeping its permissions.

    The text goes to a temporary file in the same directory, which is flushed to disk and
    renamed over the original, so a crash leaves either the old file or the new one.
    """
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    mode = stat.S_IMODE(os.stat(target).st_mode)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(target) + ".", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(text.encode("utf-8"))
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------


def run(paths: list[str], *, check: bool = False, diff: bool = False, out=None, err=None) -> int:
    """``fxrules fmt``: format files in place; with ``check`` or ``diff``, only report.

    Exit status: 0 nothing to do (or everything written), 1 a file would change (``--check``/
    ``--diff``) or has syntax errors, 2 a path that cannot be read or written, or an internal
    error. A file with errors is never written; the other files are still processed.
    ``-`` reads standard input and writes the formatted text to standard output.
    """
    import sys

    from fxrules.lang.load import read_sources
    from fxrules.lang.source import decode

    out = out or sys.stdout
    err = err or sys.stderr
    status = 0
    would_change = changed = unchanged = 0
    if paths == ["-"]:
        try:
            source = decode(sys.stdin.buffer.read(), "<stdin>")
            out.write(format_source(source))
            return 0
        except RuleFileError as exc:
            print(exc.render(), file=err)
            return 1
        except FormatError as exc:
            print(f"fxrules fmt: {exc}", file=err)
            return 2
    sources, problems = read_sources(paths)
    for diagnostic in problems:
        print(diagnostic.render(), file=err)
        status = max(status, 2 if diagnostic.code == "io-error" else 1)
    for source in sources:
        try:
            result = FormatResult(source.path, _on_disk(source), format_source(source))
        except RuleFileError as exc:
            print(RuleFileError(exc.diagnostics, {source.path: source.text}).render(), file=err)
            print(f"{source.path}: not formatted: it has errors", file=err)
            status = max(status, 1)
            continue
        except FormatError as exc:
            print(f"fxrules fmt: {exc}", file=err)
            status = 2
            continue
        except RecursionError:
            print(f"{source.path}:1:1: error[too-deep]: the file nests too deeply to format", file=err)
            status = max(status, 1)
            continue
        if not result.changed:
            unchanged += 1
            continue
        if diff:
            out.write(unified_diff(result))
        if check or diff:
            would_change += 1
            print(f"would reformat {source.path}", file=err)
            status = max(status, 1)
            continue
        try:
            write_atomically(source.path, result.formatted)
        except OSError as exc:
            print(f"{source.path}:1:1: error[io-error]: cannot write the file: {exc.strerror or exc}", file=err)
            status = 2
            continue
        changed += 1
        print(f"reformatted {source.path}", file=err)
    parts = []
    if changed:
        parts.append(f"{changed} file{'s' * (changed != 1)} reformatted")
    if would_change:
        parts.append(f"{would_change} file{'s' * (would_change != 1)} would be reformatted")
    parts.append(f"{unchanged} file{'s' * (unchanged != 1)} {'already formatted' if check or diff else 'left unchanged'}")
    print(", ".join(parts), file=err)
    return status


def _on_disk(source: Source) -> str:
    """The file's text as stored: ``read`` drops a byte-order mark, which formatting removes too."""
    try:
        with open(source.path, "rb") as handle:
            bom = handle.read(3) == b"\xef\xbb\xbf"
    except OSError:
        bom = False
    return "\ufeff" + source.text if bom else source.text
