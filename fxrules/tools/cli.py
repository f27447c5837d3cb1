"""The ``fxrules`` command. Thin: parse arguments, call the API, print, exit.

Exit codes: 0 success, 1 the input has problems (errors in rule files), 2 usage
or internal error. No traceback ever reaches the user.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from typing import Optional, Sequence

from fxrules import __version__
from fxrules.lang.diagnostics import ERROR, Diagnostic
from fxrules.lang.load import analyze, read_sources
from fxrules.lang.names import Resolver
from fxrules.lang.runtime import entered

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
    _allow_import_argument(check)
    check.set_defaults(run=_check)

    apply = commands.add_parser("apply", help="apply rules to a model and print what they did",
                                description="Trace a model, apply the rules to a fixpoint and print the report. "
                                            "Exit 0 on success, 1 when a rule fails on the model, 2 on usage "
                                            "errors (bad rule files, a model that cannot be loaded or traced).")
    _model_arguments(apply)
    apply.add_argument("--diff", action="store_true",
                       help="show a unified diff of the generated Python code before and after")
    apply.add_argument("--out", metavar="DIR",
                       help="save the rewritten module to DIR (module.py, modules.pt, manifest.json); load it "
                            "back with fxrules.load_saved(DIR)")
    apply.add_argument("--graph", metavar="FILE",
                       help="draw the graph before and after to FILE (.svg, .png, .html or .dot), rewritten "
                            "nodes marked with their rule; needs Graphviz's dot for .svg/.png (else writes .dot)")
    _format_argument(apply)
    apply.set_defaults(run=_apply)

    explain = commands.add_parser("explain", help="show where rules almost matched a model, and why not",
                                  description="Trace a model and list its near misses: nodes where a rule's "
                                              "root matched but the rule did not apply, with the rule file:line:col "
                                              "of the part that failed and where the node came from in the "
                                              "model. Exit 0 (near misses are not errors), 2 on usage errors.")
    _model_arguments(explain)
    explain.add_argument("--rule", metavar="NAME", help="explain only the rule NAME")
    _format_argument(explain)
    explain.set_defaults(run=_explain)

    fmt = commands.add_parser("fmt", help="format rule files canonically (keeps every comment)",
                              description="Rewrite rule files in the canonical layout, keeping every comment. "
                                          "Exit 0 when done, 1 when a file would change (--check/--diff) or has "
                                          "syntax errors (it is left untouched), 2 on usage or I/O errors.")
    fmt.add_argument("paths", nargs="*", default=["."], metavar="PATH",
                     help="rule files or directories (every *.fxr under them); - for standard input; default: .")
    fmt.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file would change")
    fmt.add_argument("--diff", action="store_true", help="write nothing; print a unified diff of the changes")
    fmt.set_defaults(run=_fmt)

    verify = commands.add_parser("verify", help="check that every rule keeps its contract (property tests)",
                                 description="For each rule: draw host models that contain its pattern and run its "
                                             "examples; apply the rule; compare outputs by its contract. Exit 0 when "
                                             "every rule is validated, 1 when one is wrong, noisy, missing or "
                                             "unverified, 2 on usage errors (bad rule files included).")
    _rules_argument(verify)
    verify.add_argument("--rule", action="append", default=None, metavar="NAME",
                        help="verify only the rule NAME (may be repeated)")
    verify.add_argument("--max-examples", type=int, default=50, metavar="N",
                        help="host models drawn per rule (default 50)")
    verify.add_argument("--seed", type=int, default=None, metavar="N",
                        help="fix the random seed, for a reproducible run (default: random)")
    verify.add_argument("--grad", action="store_true",
                        help="also compare gradients of a scalar loss w.r.t. the inputs (rules for training graphs)")
    verify.add_argument("--database", default="default", metavar="DIR",
                        help="hypothesis' example database: counterexamples found are kept there and tried first "
                             "next time (default: .hypothesis/ in the working directory)")
    verify.add_argument("--no-database", action="store_true", help="keep no counterexamples")
    verify.add_argument("--reproduce", metavar="LINE",
                        help="replay one counterexample: the @reproduce_failure(...) line a failure printed "
                             "(with exactly one --rule)")
    _format_argument(verify)
    _allow_import_argument(verify)
    verify.set_defaults(run=_verify)
    return parser


def _verify(args: argparse.Namespace) -> int:
    try:
        return _run_verify(args)
    except _UsageError as exc:
        print(f"fxrules: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _run_verify(args: argparse.Namespace) -> int:
    from fxrules.api import load_rules
    from fxrules.lang.diagnostics import RuleFileError
    from fxrules.tools.progress import progress, should_show

    if args.max_examples < 1:
        raise _UsageError("--max-examples must be at least 1")
    paths = _rule_paths(args.paths)
    try:
        rule_set = load_rules(*paths, allow_imports=_allowed(args))
    except RuleFileError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_USAGE
    if args.reproduce is not None:
        from fxrules.verifier.driver import parse_reproduce

        if len(args.rule or ()) != 1:
            raise _UsageError("--reproduce replays one rule's counterexample: give exactly one --rule")
        try:
            parse_reproduce(args.reproduce)
        except ValueError as exc:
            raise _UsageError(str(exc)) from None
    unknown = [name for name in args.rule or () if name not in rule_set]
    if unknown:
        raise _UsageError(f"no rule named {unknown[0]!r} in {', '.join(args.paths)}")
    from fxrules.verifier.driver import verify

    database = None if args.no_database else args.database
    with progress(len(args.rule or rule_set.names), "verify", should_show(args.format)) as bar:
        report = verify(rule_set, max_examples=args.max_examples, seed=args.seed, grad=args.grad, database=database,
                        names=args.rule, reproduce=args.reproduce,
                        progress=lambda done, total, name: bar.update(done, note=name or ""))
    if args.format == "json":
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(report)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _fmt(args: argparse.Namespace) -> int:
    from fxrules.tools.fmt import run

    return run(list(args.paths), check=args.check, diff=args.diff)


def _model_arguments(command: argparse.ArgumentParser) -> None:
    """The arguments apply and explain share: rules, the model, its inputs, how to capture it."""
    _rules_argument(command)
    command.add_argument("--model", required=True, metavar="MODULE:FACTORY",
                         help="a model factory (called with no arguments) or nn.Module, e.g. fxrules.zoo:resnet")
    command.add_argument("--input", action="append", default=[], metavar="SHAPE",
                         help="an example input shape such as 2x3x32x32 (repeat for several inputs); used for "
                              "shape metadata and to compare outputs before and after")
    command.add_argument("--export", action="store_true",
                         help="torch.export the model (needs --input) instead of symbolic tracing")
    _allow_import_argument(command)


def _rules_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument("paths", nargs="+", metavar="RULES",
                         help="rule files or directories, or the name of a bundled rule family (such as cleanup)")


def _format_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument("--format", choices=("text", "json"), default="text",
                         help="text for people, json for machines (schema: docs/cli.md)")


def _allow_import_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument("--allow-import", action="append", default=[], metavar="PKG",
                         help="allow rule files to name modules of PKG (may be repeated; also read from "
                              "allow-imports in the [tool.fxrules] table of the nearest pyproject.toml)")


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
    with entered():  # an entry point: the command runs the front end's stages itself
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
        raise _UsageError(f"cannot import {module_name}: {type(exc).__name__}: {_first_line(exc)}") from None
    target = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise _UsageError(f"{module_name} has no attribute {attr!r}")
        target = getattr(target, part)

    def is_module(value) -> bool:  # without importing torch: no nn.Module exists before torch is imported
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(value, torch.nn.Module)

    if is_module(target):
        return target
    if callable(target):
        try:
            model = target()
        except Exception as exc:
            raise _UsageError(f"{spec}() raised {type(exc).__name__}: {_first_line(exc)}") from None
        if is_module(model):
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


class _Failure(Exception):
    """A problem found while running a command: its text (it may span lines) and exit code."""

    def __init__(self, text: str, code: int):
        super().__init__(text)
        self.text, self.code = text, code


def _cli_hint(message: str) -> str:
    """Engine messages speak of the Python API; say what to pass on the command line instead."""
    message = message.replace("pass example_inputs= to apply_rules, or a graph with meta['val'] (torch.export)",
                              "pass --input SHAPE (and --export for a torch.export graph)")
    message = message.replace("; pass a torch.fx.GraphModule or a torch.export.ExportedProgram, or concrete_args",
                              "; try --export with --input")
    return message.replace("pass example_inputs= to apply_rules", "pass --input SHAPE")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _rule_paths(paths: Sequence[str]) -> list[str]:
    """Each path as given, or the bundled rule family of that name when no such path exists."""
    import importlib
    import os

    library = getattr(importlib.import_module("fxrules"), "LIBRARY", None)
    resolved = []
    for path in paths:
        if os.path.exists(path) or library is None or not os.path.isdir(library):
            resolved.append(path)  # a missing path is reported by load_rules, with the other problems
            continue
        parts = path.replace("\\", "/").strip("/").split("/")
        candidate = os.path.join(os.fspath(library), *parts)
        if not os.path.isabs(path) and ".." not in parts and os.path.exists(candidate):
            resolved.append(candidate)
            continue
        families = sorted(e.name for e in os.scandir(library) if e.is_dir() and not e.name.startswith(("_", ".")))
        raise _UsageError(f"no such file or directory: {path!r} (nor a bundled rule family: "
                          f"{', '.join(families) or 'none'})")
    return resolved


def _load_rule_set(args: argparse.Namespace):
    from fxrules.api import load_rules
    from fxrules.lang.diagnostics import RuleFileError

    paths = _rule_paths(args.paths)
    try:
        return paths, load_rules(*paths, allow_imports=_allowed(args))
    except RuleFileError as exc:
        raise _Failure(exc.render(), EXIT_USAGE) from None


def _writable_directory(path: str, what: str) -> None:
    """Fail early (before any work) when ``path`` cannot become a writable directory."""
    import os

    if os.path.exists(path):
        if not os.path.isdir(path):
            raise _UsageError(f"{what} {path}: exists and is not a directory")
        if not os.access(path, os.W_OK):
            raise _UsageError(f"{what} {path}: directory is not writable")
        return
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise _UsageError(f"{what} {path}: cannot be created ({parent} is not a directory)")
    if not os.access(parent, os.W_OK):
        raise _UsageError(f"{what} {path}: cannot be created ({parent} is not writable)")


def _check_outputs(args: argparse.Namespace) -> None:
    import os

    from fxrules.tools.drawing import SUFFIXES

    if args.export and not args.input:
        raise _UsageError("--export needs example inputs (--input SHAPE)")
    if getattr(args, "out", None):
        _writable_directory(args.out, "--out")
    if getattr(args, "graph", None):
        if os.path.splitext(args.graph)[1].lower() not in SUFFIXES:
            raise _UsageError(f"--graph takes a file ending in {', '.join(SUFFIXES)}, got {args.graph!r}")
        if os.path.isdir(args.graph):
            raise _UsageError(f"--graph {args.graph}: is a directory")
        _writable_directory(os.path.dirname(os.path.abspath(args.graph)), "--graph")


def _capture(model, shapes: list, export: bool, *, stack_traces: bool = False, before: bool = True):
    """What to rewrite, the graph before any rewrite (a GraphModule) and the example inputs (or None).

    What to rewrite is the ExportedProgram with --export (the engine unlifts its own copy, with
    the same node names), else the traced GraphModule itself (the engine copies its graph). When
    the graph before is not wanted (``before=False``, symbolic tracing), the model itself is
    returned, with None: the engine traces it, and no GraphModule is built for nothing (on a
    20,000-node graph that saves seconds).
    """
    import torch
    from torch import fx

    generator = torch.Generator().manual_seed(0)
    inputs = tuple(torch.randn(*shape, generator=generator) for shape in shapes) or None
    if export:
        with _captured_output() as replay:
            try:
                program = torch.export.export(model, inputs)
                module = program.module()
            except Exception as exc:  # what torch logged on the way (pages of graph dumps) is dropped
                raise _UsageError(f"torch.export failed: {type(exc).__name__}: {_first_line(exc)}") from None
            replay.append(True)  # it worked: pass on whatever torch printed
        return program, module, inputs
    if not before:
        return model, None, inputs
    tracer = fx.Tracer()
    tracer.record_stack_traces = stack_traces  # explain shows them; they slow tracing about 2x
    try:
        graph = tracer.trace(model)
    except Exception as exc:
        raise _UsageError(f"{type(model).__name__} does not trace with torch.fx ({type(exc).__name__}: "
                          f"{_first_line(exc)}); try --export with --input") from None
    module = fx.GraphModule(tracer.root, graph, class_name=type(model).__name__)
    return module, module, inputs


@contextlib.contextmanager
def _captured_output():
    """Hold back what is written to file descriptors 1 and 2 (torch's logging, C++ warnings included).

    Yields a list: append to it to have the output written out at the end; otherwise it is dropped.
    """
    import os
    import tempfile

    replay: list = []
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [(fd, os.dup(fd)) for fd in (1, 2)]
    except (OSError, ValueError, AttributeError):
        yield replay
        return
    files = {fd: tempfile.TemporaryFile() for fd, _ in saved}
    try:
        for fd, _ in saved:
            os.dup2(files[fd].fileno(), fd)
        yield replay
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
        for fd, handle in files.items():
            if replay:
                handle.seek(0)
                data = handle.read()
                if data:
                    os.write(fd, data)
            handle.close()


def _finite(value):
    """JSON has no inf/nan: such differences are written as the strings "inf" and "nan"."""
    import math

    return value if value is None or math.isfinite(value) else str(value)


def _code(module) -> str:
    """The module's generated code without the blank and whitespace-only lines around it."""
    return "\n".join(line.rstrip() for line in module.code.strip().splitlines()) + "\n"


def _apply(args: argparse.Namespace) -> int:
    from fxrules.tools.progress import progress, should_show

    messages: list[str] = []
    try:
        with progress(4 + bool(args.out) + bool(args.graph), "fxrules apply", should_show(args.format)) as bar:
            payload, text = _run_apply(args, bar, messages)
    except _UsageError as exc:
        print(f"fxrules: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except _Failure as exc:
        print(exc.text, file=sys.stderr)
        return exc.code
    for message in messages:
        print(message, file=sys.stderr)
    if args.format == "json":
        json.dump(payload, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print("\n".join(text))
    return EXIT_OK


def _run_apply(args: argparse.Namespace, bar, messages: list[str]) -> tuple[dict, list[str]]:
    import os

    bar.note("loading rules")
    _check_outputs(args)
    shapes = [_shape(s) for s in args.input]
    paths, rules = _load_rule_set(args)
    bar.advance(note="loading the model")
    model = _load_model(args.model)
    bar.advance(note="exporting" if args.export else "tracing")
    subject, before, inputs = _capture(model, shapes, args.export, before=bool(args.diff or args.graph))
    import torch

    from fxrules.api import apply_rules
    from fxrules.lang.diagnostics import FxrulesError
    from fxrules.engine.errors import ModelError

    bar.advance(note="rewriting" if before is None else f"rewriting {len(before.graph.nodes)} nodes")
    try:
        result = apply_rules(subject, rules, example_inputs=None if args.export else inputs)
    except ModelError as exc:
        raise _UsageError(_cli_hint(_first_line(exc))) from None
    except FxrulesError as exc:
        raise _Failure(f"fxrules: {_cli_hint(str(exc))}", EXIT_PROBLEMS) from None
    difference = None
    outputs = None
    if inputs is not None:
        bar.note("comparing outputs")
        with torch.no_grad():
            try:
                reference = before(*inputs) if args.export else model(*inputs)
            except Exception as exc:
                raise _UsageError(f"the model does not run on the example inputs: {type(exc).__name__}: "
                                  f"{_first_line(exc)}") from None
            try:
                outputs = result.module(*inputs)
            except Exception as exc:  # the rules broke the model: a problem with the rules, exit 1
                raise _Failure(f"fxrules: the rewritten module does not run on the example inputs (the original "
                               f"does): {type(exc).__name__}: {_first_line(exc)}", EXIT_PROBLEMS) from None
        difference = _max_difference(reference, outputs)
    bar.advance()
    report = result.report
    text = [report.table()]
    if difference is not None:
        text.append(f"outputs before and after on the example inputs: max |difference| = {difference:.3g}")
    payload = {"version": 1, "command": "apply", "model": args.model, "rules": paths, "exported": bool(args.export),
               "inputs": [list(s) for s in shapes], **report.to_json(), "max_abs_difference": _finite(difference),
               "diff": None, "saved": None, "graph": None}
    if args.diff:
        from fxrules.tools.codediff import unified_diff  # difflib's is quadratic on the code of large graphs

        lines = list(unified_diff(_code(before).splitlines(keepends=True),
                                  _code(result.module).splitlines(keepends=True), "before", "after"))
        payload["diff"] = "".join(lines)
        text.append("")
        text.append("".join(lines).rstrip("\n") if lines else "the code did not change")
    if args.out:
        bar.note(f"saving to {args.out}")
        payload["saved"] = _save(args, result.module, shapes, paths, inputs, outputs)
        bar.advance()
        saved = payload["saved"]
        line = f"saved the rewritten module to {args.out} ({', '.join(saved['files'])}); load it with " \
               f"fxrules.load_saved({args.out!r})"
        if saved["reload_max_abs_difference"] is not None:
            line += f"; reloaded: max |difference| = {float(saved['reload_max_abs_difference']):.3g}"
        text.append(line)
    if args.graph:
        bar.note(f"drawing {args.graph}")
        from fxrules.tools.drawing import DrawError, draw

        title = f"{type(model).__name__} ({args.model}): {len(report.applied)} rewrites, nodes " \
                f"{report.nodes_before} -> {report.nodes_after}"
        try:
            os.makedirs(os.path.dirname(os.path.abspath(args.graph)), exist_ok=True)
            drawing = draw(args.graph, before, result.module, report, title=title)
        except DrawError as exc:
            raise _UsageError(str(exc)) from None
        except OSError as exc:
            raise _UsageError(f"cannot write --graph {args.graph}: {exc.strerror or exc}") from None
        bar.advance()
        payload["graph"] = drawing.to_json()
        if drawing.hint:
            messages.append(drawing.hint)
        if drawing.rendered or os.path.splitext(args.graph)[1].lower() == ".dot":
            text.append(f"drew the graph before and after to {drawing.path}")
    return payload, text


def _save(args: argparse.Namespace, module, shapes: list, paths: list[str], inputs, outputs) -> dict:
    import torch

    from fxrules.tools.saving import FILES, SaveError, load_saved, save_module

    info = {"model": args.model, "rules": paths, "inputs": [list(s) for s in shapes], "exported": bool(args.export)}
    try:
        save_module(module, args.out, info=info)
    except SaveError as exc:
        raise _UsageError(f"cannot save the rewritten module: {exc}") from None
    except OSError as exc:
        raise _UsageError(f"cannot write --out {args.out}: {exc.strerror or exc}") from None
    try:  # the promise is that it loads back and runs: check it here, once
        loaded = load_saved(args.out)
        difference = None
        if inputs is not None:
            with torch.no_grad():
                difference = _max_difference(outputs, loaded(*inputs))
    except Exception as exc:
        raise _UsageError(f"saved {args.out}, but it does not load back: {type(exc).__name__}: "
                          f"{_first_line(exc)}") from None
    return {"dir": args.out, "files": list(FILES), "reload_max_abs_difference": _finite(difference)}


def _explain(args: argparse.Namespace) -> int:
    from fxrules.tools.progress import progress, should_show

    try:
        with progress(3, "fxrules explain", should_show(args.format)) as bar:
            payload, text = _run_explain(args, bar)
    except _UsageError as exc:
        print(f"fxrules: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except _Failure as exc:
        print(exc.text, file=sys.stderr)
        return exc.code
    if args.format == "json":
        json.dump(payload, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print("\n".join(text))
    return EXIT_OK


def _run_explain(args: argparse.Namespace, bar) -> tuple[dict, list[str]]:
    bar.note("loading rules")
    _check_outputs(args)
    shapes = [_shape(s) for s in args.input]
    paths, rules = _load_rule_set(args)
    if args.rule is not None and args.rule not in rules.names:
        raise _UsageError(f"no rule named {args.rule!r} in {', '.join(args.paths)}; the rules are: "
                          f"{', '.join(rules.names) or 'none'}")
    bar.advance(note="loading the model")
    model = _load_model(args.model)
    bar.advance(note="exporting" if args.export else "tracing")
    subject, before, inputs = _capture(model, shapes, args.export, stack_traces=True)
    from fxrules.api import explain
    from fxrules.lang.diagnostics import FxrulesError
    from fxrules.engine.errors import ModelError

    bar.advance(note="matching")
    try:
        misses = explain(subject, rules, rule=args.rule, example_inputs=None if args.export else inputs)
    except ModelError as exc:
        raise _UsageError(_cli_hint(_first_line(exc))) from None
    except FxrulesError as exc:
        raise _Failure(f"fxrules: {_cli_hint(str(exc))}", EXIT_PROBLEMS) from None
    entries = [_near_miss(m) for m in misses]
    considered = len(rules) if args.rule is None else 1
    summary = (f"fxrules explain: {len(misses)} near miss{'es' * (len(misses) != 1)} of "
               f"{considered} rule{'s' * (considered != 1)} in {len(before.graph.nodes)} nodes")
    text = []
    for miss, entry in zip(misses, entries):
        text.append(f"{miss.location}: rule `{miss.rule}` did not match at %{miss.node}: {miss.reason}")
        if entry["frames"]:
            text.append(f"  %{miss.node} comes from (innermost last):")
        for frame in entry["frames"]:
            text.append(f"    {frame['file']}:{frame['line']} in {frame['function']}")
            if frame["code"]:
                text.append(f"      {frame['code']}")
        text.append("")
    text.append(summary)
    payload = {"version": 1, "command": "explain", "model": args.model, "rules": paths, "rule": args.rule,
               "exported": bool(args.export), "inputs": [list(s) for s in shapes], "nodes": len(before.graph.nodes),
               "near_misses": entries}
    return payload, text


def _near_miss(miss) -> dict:
    """One near miss as JSON: the rule's location split into file/line/column, the node's own frames."""
    file, line, column = miss.location, None, None
    head, sep, col = miss.location.rpartition(":")
    if sep and col.isdigit():
        head2, sep2, ln = head.rpartition(":")
        if sep2 and ln.isdigit():
            file, line, column = head2, int(ln), int(col)
        else:
            file, line = head, int(col)
    stage = "refused" if miss.depth >= 1 << 21 else "condition" if miss.depth >= 1 << 20 else "pattern"
    return {"rule": miss.rule, "location": miss.location, "file": file, "line": line, "column": column,
            "node": miss.node, "reason": miss.reason, "code": str(miss.code), "stage": stage,
            "depth": miss.depth if stage == "pattern" else None,
            "stack_trace": miss.stack_trace, "frames": _user_frames(miss.stack_trace)}


def _user_frames(stack_trace) -> list[dict]:
    """The frames of a node's stack trace in the model's own code (torch's internals left out)."""
    import os

    if not stack_trace:
        return []
    frames: list[dict] = []
    for line in stack_trace.splitlines():
        found = re.match(r'^\s*File "(?P<file>.*)", line (?P<line>\d+), in (?P<function>.*)$', line)
        if found:
            frames.append({"file": found["file"], "line": int(found["line"]), "function": found["function"].strip(),
                           "code": ""})
        elif frames and line.strip() and not frames[-1]["code"]:
            frames[-1]["code"] = line.strip()
    import torch

    internal = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    own = [f for f in frames if not os.path.abspath(f["file"]).startswith(internal)]
    return own or frames


def _max_difference(a, b) -> float:
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            return float("inf")
        return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return max((_max_difference(x, y) for x, y in zip(a, b)), default=0.0)
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return max((_max_difference(a[k], b[k]) for k in a), default=0.0)
    try:
        return 0.0 if bool(a == b) else float("inf")
    except Exception:  # values that do not compare to a bool (a tensor against a list, ...)
        return float("inf")


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
