"""Which rule files a list of paths names: the walk behind ``fxrules check DIR`` and ``load_rules(DIR)``.

- A file named explicitly is always read, whatever excludes or ``.gitignore`` say.
- A directory is walked for ``*.fxr`` files, skipping what its project's ``exclude`` and
  ``extend-exclude`` patterns name (:mod:`fxrules.lang.config`; by default ``.git``, virtual
  environments, ``build``, ``dist``, caches, ``node_modules``), any directory holding
  ``pyvenv.cfg``, and what ``.gitignore`` files ignore: those in the directories walked and
  those above them up to the repository root (the nearest directory with ``.git``), plus
  ``.git/info/exclude``. The directory named itself is never excluded: naming it is asking.
- A path that does not exist but holds ``*``, ``?`` or ``[`` is a glob (``**`` spans
  directories); its matches count as named explicitly.
- A path that does not exist (or a glob that matches nothing) is an ``io-error`` about the
  path as a whole: line and column 0, not a made-up ``:1:1``.

Patterns use gitignore's syntax (:class:`IgnoreRules`): ``#`` comments, ``!`` negation, a
trailing ``/`` for directories only, a ``/`` elsewhere anchoring the pattern to its file's
directory, ``*``, ``?``, ``[...]`` and ``**``. As in git, nothing below an ignored directory
can be re-included.

Filesystem order is not trusted: the files come back sorted per path named.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

from fxrules.lang.config import Config
from fxrules.lang.diagnostics import Diagnostic

SUFFIX = ".fxr"
_GLOB_CHARS = re.compile(r"[*?\[]")


@dataclass(frozen=True, slots=True)
class Pattern:
    """One gitignore line, compiled: ``regex`` matches a path relative to ``base`` (``/``-separated)."""

    regex: re.Pattern
    negated: bool
    directory_only: bool


@dataclass(frozen=True, slots=True)
class IgnoreRules:
    """The patterns of one ignore file (or one list of patterns) and the directory they are relative to."""

    base: str
    patterns: tuple[Pattern, ...]

    @classmethod
    def parse(cls, base: str, lines: Iterable[str]) -> "IgnoreRules":
        return cls(base, tuple(p for p in (compile_pattern(line) for line in lines) if p is not None))

    def decide(self, path: str, is_dir: bool) -> Optional[bool]:
        """True: ignored, False: re-included by a ``!`` pattern, None: no pattern here speaks of it."""
        relative = os.path.relpath(path, self.base).replace(os.sep, "/")
        if relative.startswith("../") or relative == "..":
            return None
        verdict = None
        for pattern in self.patterns:
            if pattern.directory_only and not is_dir:
                continue
            if pattern.regex.match(relative):
                verdict = not pattern.negated
        return verdict


def compile_pattern(line: str) -> Optional[Pattern]:
    """One gitignore line as a Pattern; None for blank lines and comments."""
    line = line.rstrip("\n").rstrip("\r")
    line = re.sub(r"(?<!\\) +$", "", line)  # trailing spaces, unless escaped
    if not line or line.startswith("#"):
        return None
    negated = line.startswith("!")
    if negated:
        line = line[1:]
    elif line.startswith("\\!") or line.startswith("\\#"):
        line = line[1:]
    directory_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    body = _translate(line)
    prefix = "" if anchored else "(?:.*/)?"
    return Pattern(re.compile(f"^{prefix}{body}$", re.DOTALL), negated, directory_only)


def _translate(pattern: str) -> str:
    """gitignore glob to a regex body (no anchors)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**", i) and (i == 0 or pattern[i - 1] == "/"):
            after = i + 2
            if after == n:  # trailing /**: everything inside
                out.append(".*")
                i = after
                continue
            if pattern[after] == "/":  # **/ : zero or more directories
                out.append("(?:.*/)?")
                i = after + 1
                continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1:i + 2] in ("!", "^", "]") else i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                inside = pattern[i + 1:end]
                if inside[:1] in ("!", "^"):
                    inside = "^" + inside[1:]
                out.append("[" + inside.replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def repository_root(directory: str) -> Optional[str]:
    """The nearest directory at or above ``directory`` that holds ``.git`` (a folder or a worktree's file)."""
    current = os.path.abspath(directory)
    while True:
        if os.path.exists(os.path.join(current, ".git")):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _read_ignore(directory: str, name: str = ".gitignore") -> Optional[IgnoreRules]:
    try:
        with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as handle:
            return IgnoreRules.parse(directory, handle.read().splitlines())
    except OSError:
        return None


def _inherited_ignores(directory: str) -> list[IgnoreRules]:
    """The ignore files that apply above ``directory``: from the repository root down to its parent."""
    root = repository_root(directory)
    if root is None:
        return []
    found = []
    info = _read_ignore(os.path.join(root, ".git", "info"), "exclude")
    if info is not None:
        found.append(IgnoreRules(root, info.patterns))
    chain = []
    current = os.path.dirname(os.path.abspath(directory))
    while len(current) >= len(root):
        chain.append(current)
        if current == root:
            break
        current = os.path.dirname(current)
    for folder in reversed(chain):
        rules = _read_ignore(folder)
        if rules is not None:
            found.append(rules)
    return found


def _ignored(path: str, is_dir: bool, layers: Sequence[IgnoreRules]) -> bool:
    verdict = False
    for layer in layers:  # outermost first: a deeper file's verdict wins
        decided = layer.decide(path, is_dir)
        if decided is not None:
            verdict = decided
    return verdict


def walk(directory: str, config: Config, extra: Optional[IgnoreRules] = None) -> list[str]:
    """Every ``*.fxr`` below ``directory`` that neither the excludes nor ``.gitignore`` skip, sorted.

    ``extra``: more exclude patterns with their own base (``--exclude``, relative to the working directory).
    """
    top = os.path.abspath(directory)
    base = config.root if config.root and _within(top, config.root) else top
    excludes = [IgnoreRules.parse(base, config.excludes), *([extra] if extra is not None else [])]
    layers: dict[str, list[IgnoreRules]] = {top: _inherited_ignores(top)}
    found: list[str] = []
    for current, dirs, files in os.walk(top):
        here = layers.pop(current, [])
        own = _read_ignore(current)
        if own is not None:
            here = [*here, own]
        kept = []
        for name in sorted(dirs):
            path = os.path.join(current, name)
            if (_ignored(path, True, excludes) or _ignored(path, True, here)
                    or os.path.isfile(os.path.join(path, "pyvenv.cfg"))):
                continue
            kept.append(name)
            layers[path] = here
        dirs[:] = kept
        for name in files:
            if not name.endswith(SUFFIX):
                continue
            path = os.path.join(current, name)
            if os.path.isfile(path) and not _ignored(path, False, excludes) and not _ignored(path, False, here):
                found.append(path)
    shown = Path(directory)  # as pathlib shows it: "." + "a.fxr" is "a.fxr", as before
    return sorted(os.fspath(shown / os.path.relpath(p, top)) for p in found)


def excluded(path: str, config: Config, extra: Optional[IgnoreRules] = None) -> bool:
    """Whether the project's excludes (or ``extra``) name ``path`` or a folder above it (below the
    configuration's folder): for ``--force-exclude``, where tools such as pre-commit name every file."""
    full = os.path.abspath(path)
    base = config.root if config.root and _within(full, config.root) else os.path.dirname(full)
    layers = [IgnoreRules.parse(base, config.excludes), *([extra] if extra is not None else [])]
    current, is_dir = full, False
    while _within(current, base) and current != os.path.abspath(base):
        if _ignored(current, is_dir, layers):
            return True
        current, is_dir = os.path.dirname(current), True
    return False


def _within(path: str, folder: str) -> bool:
    return os.path.commonpath([path, os.path.abspath(folder)]) == os.path.abspath(folder)


def collect(paths: Iterable[str], configs: Mapping[str, Config], extra: Optional[IgnoreRules] = None
            ) -> tuple[list[str], list[Diagnostic]]:
    """The rule files ``paths`` name (see the module docstring) and an io-error per path naming nothing.

    ``configs`` maps each path to its project's settings (:func:`fxrules.lang.config.configs_for`);
    ``extra`` holds more exclude patterns for every directory walked.
    """
    found: list[str] = []
    missing: list[Diagnostic] = []
    for path in paths:
        shown = os.fspath(path)
        config = configs.get(shown) or Config()
        if os.path.isdir(shown):
            found.extend(walk(shown, config, extra))
        elif os.path.exists(shown):
            found.append(shown)
        elif _GLOB_CHARS.search(shown):
            matches = sorted(glob.glob(shown, recursive=True))
            files = [m for m in matches if os.path.isfile(m) and m.endswith(SUFFIX)]
            for m in matches:
                if os.path.isdir(m):
                    files.extend(walk(m, config, extra))
            if files:
                found.extend(files)
            else:
                missing.append(Diagnostic(shown, 0, 0, "io-error", "no rule files match this pattern"))
        else:
            missing.append(Diagnostic(shown, 0, 0, "io-error", "no such file or directory"))
    return found, missing
