"""The ``fxrules`` command. Thin: parse arguments, call the API, print, exit.

Exit codes: 0 success, 1 the input has problems (errors in rule files), 2 usage
or internal error. No traceback ever reaches the user.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from . import __version__
from .errors import ERROR, Diagnostic
from .frontend import analyze, read_sources
from .names import Resolver

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors exit 2 with one line, as argparse does
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fxrules", description="Declarative, checked rewrite rules for torch.fx graphs.")
    parser.add_argument("--version", action="version", version=f"fxrules {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    check = commands.add_parser("check", help="validate rule files (syntax, names, bindings, contracts)",
                                description="Validate rule files. Exit 0 when clean, 1 when errors were found, "
                                            "2 on usage errors.")
    check.add_argument("paths", nargs="*", default=["."], metavar="PATH",
                       help="rule files or directories (every *.fxr under them); default: .")
    check.add_argument("--format", choices=("text", "json", "github"), default="text",
                       help="text for people, json for machines, github for workflow annotations")
    check.add_argument("--allow-import", action="append", default=[], metavar="PKG",
                       help="allow rule files to name modules of PKG (may be repeated)")
    check.set_defaults(run=_check)
    return parser


def _check(args: argparse.Namespace) -> int:
    sources, diagnostics = read_sources(args.paths)
    rule_set, found = analyze(sources, Resolver(args.allow_import))
    diagnostics = diagnostics + found
    texts = {s.path: s.text for s in sources}
    errors = [d for d in diagnostics if d.severity == ERROR]
    _emit(args.format, diagnostics, texts, files=[s.path for s in sources], rules=len(rule_set))
    if any(d.code == "io-error" for d in errors):
        return EXIT_USAGE  # a path that does not exist or cannot be read is a usage error
    return EXIT_PROBLEMS if errors else EXIT_OK


def _emit(fmt: str, diagnostics: list[Diagnostic], texts: dict[str, str], *, files: list[str], rules: int) -> None:
    diagnostics = sorted(diagnostics, key=lambda d: (d.path, d.line, d.column, d.code))
    errors = sum(d.severity == ERROR for d in diagnostics)
    warnings = len(diagnostics) - errors
    if fmt == "json":
        json.dump({"version": 1, "files": files, "rules": rules, "errors": errors, "warnings": warnings,
                   "diagnostics": [d.to_json() for d in diagnostics]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if fmt == "github":
        for d in diagnostics:
            kind = "error" if d.severity == ERROR else "warning"
            message = d.message + "".join(f" ({n})" for n in d.notes)
            message = message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
            print(f"::{kind} file={d.path},line={d.line},col={d.column},title={d.code}::{message}")
        return
    for d in diagnostics:
        print(d.render(texts.get(d.path)))
    summary = f"{len(files)} file{'s' * (len(files) != 1)}, {rules} rule{'s' * (rules != 1)} checked"
    if errors or warnings:
        summary += f": {errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"
    else:
        summary += ": no problems"
    print(summary, file=sys.stderr if diagnostics else sys.stdout)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        if getattr(args, "run", None) is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        return args.run(args)
    except KeyboardInterrupt:
        print("fxrules: interrupted", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # the promise: one line, never a traceback
        print(f"fxrules: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
