"""Project configuration: ``[tool.fxrules]`` in ``pyproject.toml``, or an ``fxrules.toml``.

Found the way ruff finds its own: from each rule file's directory upward, the first
directory holding an ``fxrules.toml`` (its top-level keys are the settings) or a
``pyproject.toml`` with a ``[tool.fxrules]`` table wins (``fxrules.toml`` first when a
directory has both; a ``pyproject.toml`` without the table is passed over). So the
settings that apply to a rule file are its project's, whatever the working directory.

Keys (relative paths are relative to the directory of the file that sets them):

``allow-imports``   packages (beyond torch, operator, math, fxrules) rule files may name
``exclude``         gitignore-style patterns of paths never read when a directory is walked;
                    replaces :data:`DEFAULT_EXCLUDE`
``extend-exclude``  more patterns, added to ``exclude``
``python-path``     folders put on ``sys.path`` (front) before rule files are checked and
                    models are imported: where the project's own builders and models live

Unknown keys are warnings (:attr:`Config.warnings`), not errors: a newer fxrules's key
does not break an older one. A key of the wrong type is a :class:`ConfigError`.

Lives in ``fxrules.lang`` (torch-free) because ``load_rules`` discovers it too.
"""

from __future__ import annotations

import os
import sys
import tomllib
from dataclasses import dataclass
from typing import Iterable, Optional, Union

from fxrules.lang.diagnostics import FxrulesError

PathLike = Union[str, "os.PathLike[str]"]

CONFIG_FILES = ("fxrules.toml", "pyproject.toml")
"""The files looked for in each directory, in this order."""

DEFAULT_EXCLUDE = (
    ".git", ".hg", ".svn", ".bzr", ".venv", "venv", ".direnv", ".tox", ".nox", ".eggs", "*.egg-info",
    "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis", ".ipynb_checkpoints",
    "build", "dist", "_build", "node_modules", "site-packages", "__pypackages__",
)
"""Directory names never walked into (any directory holding ``pyvenv.cfg`` is skipped too:
a virtual environment, whatever its name)."""

KEYS = ("allow-imports", "exclude", "extend-exclude", "python-path")


class ConfigError(FxrulesError):
    """A configuration file that cannot be read or has a key of the wrong type."""


@dataclass(frozen=True, slots=True)
class Config:
    """The settings for rule files of one project. ``path`` is the file they came from (None: defaults);
    ``root`` the directory patterns and relative folders are relative to."""

    path: Optional[str] = None
    root: Optional[str] = None
    allow_imports: tuple[str, ...] = ()
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    extend_exclude: tuple[str, ...] = ()
    python_path: tuple[str, ...] = ()  # absolute folders
    warnings: tuple[str, ...] = ()

    @property
    def excludes(self) -> tuple[str, ...]:
        return self.exclude + self.extend_exclude

    def put_on_sys_path(self) -> None:
        """Put ``python-path`` folders at the front of ``sys.path`` (each once; they stay, as PYTHONPATH's do:
        a builder module imported while checking is imported again by nothing, but its own lazy imports
        must still resolve while rules apply)."""
        for folder in reversed(self.python_path):
            if folder not in sys.path:
                sys.path.insert(0, folder)


def load_config(path: PathLike) -> Config:
    """The settings in ``path`` (an ``fxrules.toml``, or a ``pyproject.toml``'s ``[tool.fxrules]``)."""
    shown = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read {shown}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{shown}: not valid TOML: {exc}") from None
    if os.path.basename(shown) == "pyproject.toml":
        table = document.get("tool", {}).get("fxrules", {})
        where = f"{shown}: [tool.fxrules]"
    else:
        table, where = document, shown
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    return _from_table(table, os.path.dirname(os.path.abspath(shown)), shown, where)


def _from_table(table: dict, root: str, path: str, where: str) -> Config:
    unknown = [key for key in table if key not in KEYS]
    warnings = tuple(f"{where}: unknown key {key!r} (known: {', '.join(KEYS)})" for key in unknown)
    return Config(path=path, root=root,
                  allow_imports=_strings(table, "allow-imports", (), where),
                  exclude=_strings(table, "exclude", DEFAULT_EXCLUDE, where),
                  extend_exclude=_strings(table, "extend-exclude", (), where),
                  python_path=tuple(os.path.normpath(os.path.join(root, p))
                                    for p in _strings(table, "python-path", (), where)),
                  warnings=warnings)


def _strings(table: dict, key: str, default: tuple[str, ...], where: str) -> tuple[str, ...]:
    if key not in table:
        return default
    value = table[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {key} must be a list of strings, got {value!r}")
    return tuple(value)


def config_file(start: PathLike) -> Optional[str]:
    """The configuration file that applies to ``start`` (a file or directory), or None."""
    directory = os.path.abspath(os.fspath(start))
    if not os.path.isdir(directory):
        directory = os.path.dirname(directory)
    while True:
        for name in CONFIG_FILES:
            candidate = os.path.join(directory, name)
            if os.path.isfile(candidate) and (name != "pyproject.toml" or _has_table(candidate)):
                return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def _has_table(pyproject: str) -> bool:
    """Whether a pyproject.toml has a ``[tool.fxrules]`` table (an unreadable one counts: its error is shown)."""
    try:
        with open(pyproject, "rb") as handle:
            return "fxrules" in tomllib.load(handle).get("tool", {})
    except (OSError, tomllib.TOMLDecodeError):
        return True


def discover(start: PathLike) -> Config:
    """The settings for ``start`` (a rule file or directory): its nearest configuration, else the defaults."""
    found = config_file(start)
    return load_config(found) if found is not None else Config()


ConfigLike = Union[Config, PathLike, None]
"""What ``config=`` takes: a Config, the path of a configuration file, or None to discover per path."""


def configs_for(paths: Iterable[PathLike], config: ConfigLike = None) -> dict[str, Config]:
    """Each path's settings: ``config`` for all when given (a Config or a file to load), else discovered."""
    paths = [os.fspath(p) for p in paths]
    if isinstance(config, Config):
        return {p: config for p in paths}
    if config is not None:
        loaded = load_config(config)
        return {p: loaded for p in paths}
    found: dict[Optional[str], Config] = {}
    result = {}
    for p in paths:
        file = config_file(p)
        if file not in found:
            found[file] = load_config(file) if file is not None else Config()
        result[p] = found[file]
    return result


def merged_allow_imports(configs: Iterable[Config], explicit: Iterable[str] = ()) -> tuple[str, ...]:
    """The packages allowed: those given explicitly, then each configuration's, each once, in order."""
    seen: dict[str, None] = dict.fromkeys(explicit)
    for config in configs:
        seen.update(dict.fromkeys(config.allow_imports))
    return tuple(seen)
