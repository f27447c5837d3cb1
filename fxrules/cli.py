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


class _UsageError(Exception):
    """A problem with how fxrules was called; printed as one line, exit 2."""


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
                       help="allow rule files to name modules of PKG (may be repeated; also read from "
                            "allow-imports in the [tool.fxrules] table of the nearest pyproject.toml)")
    check.set_defaults(run=_check)

    apply = commands.add_parser("apply", help="apply rules to a model and print what they did",
                                description="Trace a model, apply the rules to a fixpoint and print the report. "
                                            "Exit 0 on success, 1 when a rule fails on the model, 2 on usage "
                                            "errors (bad rule files, a model that cannot be loaded or traced).")
    apply.add_argument("paths", nargs="+", metavar="RULES", help="rule files or directories")
    apply.add_argument("--model", required=True, metavar="MODULE:FACTORY",
                       help="a model factory (called with no arguments) or nn.Module, e.g. fxrules.zoo:resnet")
    apply.add_argument("--input", action="append", default=[], metavar="SHAPE",
                       help="an example input shape such as 2x3x32x32 (repeat for several inputs); used for "
                            "shape metadata and to compare outputs before and after")
    apply.add_argument("--export", action="store_true",
                       help="torch.export the model (needs --input) instead of symbolic tracing")
    apply.add_argument("--format", choices=("text", "json"), default="text")
    apply.add_argument("--allow-import", action="append", default=[], metavar="PKG",
                       help="allow rule files to name modules of PKG (may be repeated)")
    apply.set_defaults(run=_apply)

    fmt = commands.add_parser("fmt", help="format rule files canonically (keeps every comment)",
                              description="Rewrite rule files in the canonical layout, keeping every comment. "
                                          "Exit 0 when done, 1 when a file would change (--check/--diff) or has "
                                          "syntax errors (it is left untouched), 2 on usage or I/O errors.")
    fmt.add_argument("paths", nargs="*", default=["."], metavar="PATH",
                     help="rule files or directories (every *.fxr under them); - for standard input; default: .")
    fmt.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file would change")
    fmt.add_argument("--diff", action="store_true", help="write nothing; print a unified diff of the changes")
    fmt.set_defaults(run=_fmt)
    return parser


def _fmt(args: argparse.Namespace) -> int:
    from .fmt import run

    return run(list(args.paths), check=args.check, diff=args.diff)


def project_allow_imports(start: Optional[str] = None) -> list[str]:
    """``allow-imports`` from the ``[tool.fxrules]`` table of the nearest pyproject.toml above ``start``."""
    import os
    import tomllib

    directory = os.path.abspath(start or os.getcwd())
    while True:
        candidate = os.path.join(directory, "pyproject.toml")
        if os.path.isfile(candidate):
            try:
                with open(candidate, "rb") as handle:
                    table = tomllib.load(handle).get("tool", {}).get("fxrules", {})
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise _UsageError(f"cannot read {candidate}: {exc}") from None
            value = table.get("allow-imports", [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise _UsageError(f"{candidate}: [tool.fxrules] allow-imports must be a list of package names")
            return value
        parent = os.path.dirname(directory)
        if parent == directory:
            return []
        directory = parent


def _allowed(args: argparse.Namespace) -> list[str]:
    return list(args.allow_import) + project_allow_imports()


def _check(args: argparse.Namespace) -> int:
    try:
        allowed = _allowed(args)
    except _UsageError as exc:
        print(f"fxrules: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    sources, diagnostics = read_sources(args.paths)
    rule_set, found = analyze(sources, Resolver(allowed))
    diagnostics = diagnostics + found
    texts = {s.path: s.text for s in sources}
    errors = [d for d in diagnostics if d.severity == ERROR]
    files = sorted({s.path for s in sources} | {d.path for d in diagnostics if d.code in ("io-error", "binary-input",
                                                                                           "invalid-encoding")})
    _emit(args.format, diagnostics, texts, files=files, rules=len(rule_set))
    if any(d.code == "io-error" for d in errors):
        return EXIT_USAGE  # a path that does not exist or cannot be read is a usage error
    return EXIT_PROBLEMS if errors else EXIT_OK


def _data(text: str) -> str:
    """Escape a GitHub workflow command's message."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    """Escape a GitHub workflow command's property value."""
    return _data(text).replace(":", "%3A").replace(",", "%2C")


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
            print(f"::{kind} file={_property(d.path)},line={d.line},col={d.column},title={_property(d.code)}"
                  f"::{_data(message)}")
        return
    for d in diagnostics:
        print(d.render(texts.get(d.path)))
    sys.stdout.flush()
    summary = f"{len(files)} file{'s' * (len(files) != 1)}, {rules} rule{'s' * (rules != 1)} checked"
    if errors or warnings:
        summary += f": {errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"
    else:
        summary += ": no problems"
    print(summary, file=sys.stderr if diagnostics else sys.stdout)


def _load_model(spec: str):
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise _UsageError(f"--model must look like PKG.MODULE:FACTORY, got {spec!r}")
    try:
        module = importlib.import_module(module_name)  # models are trusted code (see SECURITY.md)
    except Exception as exc:
        raise _UsageError(f"cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    target = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise _UsageError(f"{module_name} has no attribute {attr!r}")
        target = getattr(target, part)
    import torch

    if isinstance(target, torch.nn.Module):
        return target
    if callable(target):
        try:
            model = target()
        except Exception as exc:
            raise _UsageError(f"{spec}() raised {type(exc).__name__}: {exc}") from None
        if isinstance(model, torch.nn.Module):
            return model
        raise _UsageError(f"{spec}() returned {type(model).__name__}, not an nn.Module")
    raise _UsageError(f"{spec} is neither an nn.Module nor a factory")


def _shape(text: str) -> tuple:
    try:
        dims = tuple(int(d) for d in text.lower().replace(",", "x").split("x") if d)
    except ValueError:
        raise _UsageError(f"--input takes a shape like 2x3x32x32, got {text!r}") from None
    if not dims or any(d < 0 for d in dims):
        raise _UsageError(f"--input takes a shape like 2x3x32x32, got {text!r}")
    return dims




def _apply(args: argparse.Namespace) -> int:
    from .api import load_rules
    from .errors import FxrulesError, RuleFileError

    try:
        rules = load_rules(*args.paths, allow_imports=_allowed(args))
    except _UsageError as exc:
        print(f"fxrules: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RuleFileError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_USAGE
    try:
        model = _load_model(args.model)
        shapes = [_shape(s) for s in args.input]
    except _UsageError as exc:
        print(f"fxrules: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    import torch

    from .api import apply_rules
    from .transaction import ModelError

    generator = torch.Generator().manual_seed(0)
    inputs = tuple(torch.randn(*shape, generator=generator) for shape in shapes) or None
    subject = model
    if args.export:
        if inputs is None:
            print("fxrules: error: --export needs example inputs (--input SHAPE)", file=sys.stderr)
            return EXIT_USAGE
        try:
            subject = torch.export.export(model, inputs)
        except Exception as exc:
            print(f"fxrules: error: torch.export failed: {type(exc).__name__}: {str(exc).splitlines()[0]}",
                  file=sys.stderr)
            return EXIT_USAGE
    try:
        result = apply_rules(subject, rules, example_inputs=None if args.export else inputs)
    except ModelError as exc:
        print(f"fxrules: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except FxrulesError as exc:
        print(f"fxrules: {exc}", file=sys.stderr)
        return EXIT_PROBLEMS
    difference = None
    if inputs is not None:
        with torch.no_grad():
            reference = subject.module()(*inputs) if args.export else model(*inputs)
            rewritten = result.module(*inputs)
        difference = _max_difference(reference, rewritten)
    if args.format == "json":
        payload = {"version": 1, "model": args.model, **result.report.to_json(), "max_abs_difference": difference}
        json.dump(payload, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(result.report.table())
        if difference is not None:
            print(f"outputs before and after on the example inputs: max |difference| = {difference:.3g}")
    return EXIT_OK


def _max_difference(a, b) -> float:
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            return float("inf")
        return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return max((_max_difference(x, y) for x, y in zip(a, b)), default=0.0)
    return 0.0 if a == b else float("inf")


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
