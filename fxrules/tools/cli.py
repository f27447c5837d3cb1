"""The ``fxrules`` command. Thin: parse arguments, call the API, render, exit.

One function per command (``_check``, ``_fmt``, ``_apply``, ``_explain``, ``_verify``), one
per option or output they render (``_diff_part``, ``_out_part``, ``_graph_part``, the text
and json renderers). The work is the Python API's: ``fxrules.apply_and_compare`` captures,
rewrites and compares, ``fxrules.capture`` and ``fxrules.explain`` explain, ``fxrules.verify``
verifies; this module imports only the public root, the front end (``check``) and the other
tools.

What stays here, because it is command-line syntax rather than something a Python caller
needs: naming a model as ``PKG.MODULE:FACTORY`` (a Python caller has the model), ``--input
2x3x16x16`` shapes and the seeded random tensors made from them (a Python caller passes its
own inputs), rule family names (``cleanup``), ``[tool.fxrules]`` in pyproject.toml, and
rewording the API's advice (``example_inputs=``) into options (``--input``).

Exit codes: 0 success, 1 the input has problems (errors in rule files), 2 usage
or internal error. No traceback ever reaches the user.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

from fxrules import __version__
from fxrules.lang.diagnostics import ERROR, Diagnostic
from fxrules.lang.load import analyze, read_sources
from fxrules.lang.names import Resolver
from fxrules.lang.runtime import entered

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


class _UsageError(Exception):
    """A problem with how fxrules was called; printed as one line, exit 2."""


class _Failure(Exception):
    """A problem found while running a command: its text (it may span lines) and exit code."""

    def __init__(self, text: str, code: int):
        super().__init__(text)
        self.text, self.code = text, code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors exit 2 with one line, as argparse does
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


# ---------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fxrules", description="Declarative, checked rewrite rules for torch.fx graphs.")
    parser.add_argument("--version", action="version", version=f"fxrules {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _check_parser(commands)
    _apply_parser(commands)
    _explain_parser(commands)
    _fmt_parser(commands)
    _verify_parser(commands)
    _analyze_parser(commands)
    return parser


def _check_parser(commands) -> None:
    check = commands.add_parser("check", help="validate rule files (syntax, names, bindings, contracts)",
                                description="Validate rule files. Exit 0 when clean, 1 when errors were found, "
                                            "2 on usage errors.")
    check.add_argument("paths", nargs="*", default=["."], metavar="PATH",
                       help="rule files or directories (every *.fxr under them); default: .")
    check.add_argument("--format", choices=("text", "json", "github"), default="text",
                       help="text for people, json for machines, github for workflow annotations")
    _allow_import_argument(check)
    check.set_defaults(run=_check)


def _apply_parser(commands) -> None:
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


def _explain_parser(commands) -> None:
    explain = commands.add_parser("explain", help="show where rules almost matched a model, and why not",
                                  description="Trace a model and list its near misses: nodes where a rule's "
                                              "root matched but the rule did not apply, with the rule file:line:col "
                                              "of the part that failed and where the node came from in the "
                                              "model. Exit 0 (near misses are not errors), 2 on usage errors.")
    _model_arguments(explain)
    explain.add_argument("--rule", metavar="NAME", help="explain only the rule NAME")
    _format_argument(explain)
    explain.set_defaults(run=_explain)


def _fmt_parser(commands) -> None:
    fmt = commands.add_parser("fmt", help="format rule files canonically (keeps every comment)",
                              description="Rewrite rule files in the canonical layout, keeping every comment. "
                                          "Exit 0 when done, 1 when a file would change (--check/--diff) or has "
                                          "syntax errors (it is left untouched), 2 on usage or I/O errors.")
    fmt.add_argument("paths", nargs="*", default=["."], metavar="PATH",
                     help="rule files or directories (every *.fxr under them); - for standard input; default: .")
    fmt.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file would change")
    fmt.add_argument("--diff", action="store_true", help="write nothing; print a unified diff of the changes")
    fmt.set_defaults(run=_fmt)


def _verify_parser(commands) -> None:
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


# ---------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> int:
    try:
        allowed = _allowed(args)
    except _UsageError as exc:
        return _usage(exc)
    sources, diagnostics = read_sources(args.paths)
    with entered():  # an entry point: the command runs the front end's stages itself
        rule_set, found = analyze(sources, Resolver(allowed))
    diagnostics = sorted(diagnostics + found, key=lambda d: (d.path, d.line, d.column, d.code))
    unreadable = {d.path for d in diagnostics if d.code in ("io-error", "binary-input", "invalid-encoding")}
    files = sorted({s.path for s in sources} | unreadable)
    texts = {s.path: s.text for s in sources}
    _CHECK_RENDERERS[args.format](diagnostics, texts, files, len(rule_set))
    errors = [d for d in diagnostics if d.severity == ERROR]
    if any(d.code == "io-error" for d in errors):
        return EXIT_USAGE  # a path that does not exist or cannot be read is a usage error
    return EXIT_PROBLEMS if errors else EXIT_OK


def _check_json(diagnostics: list[Diagnostic], texts: dict[str, str], files: list[str], rules: int) -> None:
    errors = sum(d.severity == ERROR for d in diagnostics)
    _print_json({"version": 1, "files": files, "rules": rules, "errors": errors,
                 "warnings": len(diagnostics) - errors, "diagnostics": [d.to_json() for d in diagnostics]})


def _check_github(diagnostics: list[Diagnostic], texts: dict[str, str], files: list[str], rules: int) -> None:
    for d in diagnostics:
        kind = "error" if d.severity == ERROR else "warning"
        message = d.message + "".join(f" ({n})" for n in d.notes)
        print(f"::{kind} file={_property(d.path)},line={d.line},col={d.column},title={_property(d.code)}"
              f"::{_data(message)}")


def _check_text(diagnostics: list[Diagnostic], texts: dict[str, str], files: list[str], rules: int) -> None:
    for d in diagnostics:
        print(d.render(texts.get(d.path)))
    sys.stdout.flush()
    errors = sum(d.severity == ERROR for d in diagnostics)
    warnings = len(diagnostics) - errors
    summary = f"{_count(len(files), 'file')}, {_count(rules, 'rule')} checked"
    if diagnostics:
        summary += f": {_count(errors, 'error')}, {_count(warnings, 'warning')}"
    else:
        summary += ": no problems"
    print(summary, file=sys.stderr if diagnostics else sys.stdout)


_CHECK_RENDERERS = {"text": _check_text, "json": _check_json, "github": _check_github}


def _data(text: str) -> str:
    """Escape a GitHub workflow command's message."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    """Escape a GitHub workflow command's property value."""
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


# ---------------------------------------------------------------------------
# fmt and verify
# ---------------------------------------------------------------------------


def _fmt(args: argparse.Namespace) -> int:
    from fxrules.tools.fmt import run

    return run(list(args.paths), check=args.check, diff=args.diff)


def _verify(args: argparse.Namespace) -> int:
    import fxrules
    from fxrules.tools.progress import progress, should_show

    try:
        if args.max_examples < 1:
            raise _UsageError("--max-examples must be at least 1")
        paths, rule_set = _load_rule_set(args)
        if args.reproduce is not None and len(args.rule or ()) != 1:
            raise _UsageError("--reproduce replays one rule's counterexample: give exactly one --rule")
        unknown = [name for name in args.rule or () if name not in rule_set]
        if unknown:
            raise _UsageError(f"no rule named {unknown[0]!r} in {', '.join(args.paths)}")
        started: list[bool] = []  # verify checks its arguments before the first progress call

        def on_progress(done: int, total: int, name: Optional[str]) -> None:
            started.append(True)
            bar.update(done, note=name or "")

        with progress(len(args.rule or rule_set.names), "verify", should_show(args.format)) as bar:
            try:
                report = fxrules.verify(rule_set, max_examples=args.max_examples, seed=args.seed, grad=args.grad,
                                        database=None if args.no_database else args.database, names=args.rule,
                                        reproduce=args.reproduce, progress=on_progress)
            except ValueError as exc:  # a malformed --reproduce line, found before any work
                if started:
                    raise
                raise _UsageError(str(exc)) from None
    except _UsageError as exc:
        return _usage(exc)
    except _Failure as exc:
        return _fail(exc)
    if args.format == "json":
        _print_json(report.to_json())
    else:
        print(report)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


# ---------------------------------------------------------------------------
# analyze
# ---------------------------------------------------------------------------

_STATIC_CHECKS = ("shadowed", "unsatisfiable")
_ALL_CHECKS = ("shadowed", "loop", "overlap", "unsatisfiable", "dead")


def _analyze_parser(commands) -> None:
    analyze = commands.add_parser(
        "analyze", help="find shadowed, looping, overlapping, unsatisfiable and dead rules in a rule set",
        description="Analyse rule files as one rule set (docs/analyze.md). Exit 0 with no findings, 1 with "
                    "findings, 2 on usage errors (bad rule files included). --static runs only the checks that "
                    "need no torch (shadowed, unsatisfiable), as the fxrules-analyze pre-commit hook does.")
    analyze.add_argument("paths", nargs="+", metavar="PATH",
                         help="rule files or directories, or the name of a bundled rule family (such as cleanup)")
    analyze.add_argument("--against", action="append", default=[], metavar="PKG.MODULE:FACTORY",
                         help="a model to look for dead rules in (may be repeated; each gets the --input shapes)")
    analyze.add_argument("--input", action="append", default=[], metavar="SHAPE",
                         help="an example input shape for the --against models, such as 2x3x32x32 (repeat for "
                              "several inputs)")
    analyze.add_argument("--only", action="append", default=None, choices=_ALL_CHECKS, metavar="CHECK",
                         help=f"look only for these findings (may be repeated): {', '.join(_ALL_CHECKS)}")
    analyze.add_argument("--static", action="store_true",
                         help="only the checks that need no torch: shadowed and unsatisfiable")
    analyze.add_argument("--max-examples", type=int, default=50, metavar="N",
                         help="host graphs drawn per loop or overlap search (default 50)")
    analyze.add_argument("--seed", type=int, default=0, metavar="N", help="hypothesis' seed (default 0)")
    analyze.add_argument("--rule", action="append", default=None, metavar="NAME",
                         help="with --reproduce: the rules of the witness (as its replay command names them)")
    analyze.add_argument("--reproduce", metavar="LINE",
                         help="replay one witness: the @reproduce_failure(...) line a finding printed (with "
                              "--only loop or --only overlap and its --rule names)")
    analyze.add_argument("--format", choices=("text", "json", "github"), default="text",
                         help="text for people, json for machines (schema: docs/analyze.md), github for workflow "
                              "annotations")
    _allow_import_argument(analyze)
    analyze.set_defaults(run=_analyze)


def _analyze(args: argparse.Namespace) -> int:
    try:
        checks = tuple(dict.fromkeys(args.only or (_STATIC_CHECKS if args.static else _ALL_CHECKS)))
        if args.static and set(checks) - set(_STATIC_CHECKS):
            raise _UsageError(f"--static runs only {', '.join(_STATIC_CHECKS)}; drop --static for the others")
        if args.max_examples < 1:
            raise _UsageError("--max-examples must be at least 1")
        if args.input and not args.against:
            raise _UsageError("--input gives the shapes of the --against models: give --against too")
        if args.reproduce is not None and (len(checks) != 1 or checks[0] not in ("loop", "overlap") or not args.rule):
            raise _UsageError("--reproduce replays one witness: give --only loop or --only overlap and its --rule "
                              "names (its replay command has them)")
        paths, rule_set = _load_rule_set(args)
        unknown = [name for name in args.rule or () if name not in rule_set]
        if unknown:
            raise _UsageError(f"no rule named {unknown[0]!r} in {', '.join(args.paths)}")
        if args.static or set(checks) <= set(_STATIC_CHECKS):
            report = _analyze_static(rule_set, checks)  # never imports torch (the pre-commit hook)
        else:
            report = _analyze_full(args, paths, rule_set, checks)
    except _UsageError as exc:
        return _usage(exc)
    except _Failure as exc:
        return _fail(exc)
    _ANALYZE_RENDERERS[args.format](report, dict(rule_set.sources))
    if report.reproduced is False:
        return EXIT_PROBLEMS
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _analyze_static(rule_set, checks: tuple):
    import time

    from fxrules.lang.analysis import AnalysisReport, static_findings

    start = time.perf_counter()
    with entered():
        findings = tuple(f for f in static_findings(rule_set) if str(f.code) in checks)
    return AnalysisReport(findings, len(rule_set), seconds=time.perf_counter() - start)


def _analyze_full(args: argparse.Namespace, paths: list[str], rule_set, checks: tuple):
    import fxrules
    from fxrules.tools.progress import progress, should_show

    shapes = [_shape(s) for s in args.input]
    against = [_against_model(spec, shapes) for spec in args.against]
    with progress(1, "analyze", should_show(args.format)) as bar:
        bar.note("analysing")
        try:
            with _api_errors():
                report = fxrules.analyze(rule_set, against=against, checks=checks, max_examples=args.max_examples,
                                         seed=args.seed, names=args.rule, reproduce=args.reproduce,
                                         paths=args.paths)
        except ValueError as exc:  # a malformed --reproduce line
            raise _UsageError(str(exc)) from None
    return report


def _against_model(spec: str, shapes: list):
    import fxrules

    return fxrules.Against(_load_model(spec), _example_inputs(shapes), spec)


def _analyze_text(report, sources: dict) -> None:
    for finding in report.findings:
        print(finding.render(sources.get(finding.rule.path)))
        print()
    if report.reproduced is not None:
        print("the witness reproduced the finding" if report.reproduced else
              "the witness did not reproduce (the rules, their samplers or hypothesis changed)")
    quiet = [s for s in report.searches if s.hosts_tried == 0 and s.note]
    for search in quiet:
        print(f"note: {search.code} between {', '.join(search.rules)} not tried: {search.note}", file=sys.stderr)
    sys.stdout.flush()
    print(report.summary(), file=sys.stderr if report.findings else sys.stdout)


def _analyze_json(report, sources: dict) -> None:
    _print_json(report.to_json())


def _analyze_github(report, sources: dict) -> None:
    for finding in report.findings:
        d = finding.to_diagnostic()
        message = d.message + "".join(f" ({n})" for n in d.notes)
        print(f"::warning file={_property(d.path)},line={d.line},col={d.column},title={_property(d.code)}"
              f"::{_data(message)}")


_ANALYZE_RENDERERS = {"text": _analyze_text, "json": _analyze_json, "github": _analyze_github}


# ---------------------------------------------------------------------------
# apply
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Part:
    """What one option adds to apply's output: its json value, its lines of text, lines for stderr."""

    json: Any = None
    text: tuple[str, ...] = ()
    messages: tuple[str, ...] = ()


def _apply(args: argparse.Namespace) -> int:
    import fxrules
    from fxrules.tools.progress import progress, should_show

    try:
        with progress(4 + bool(args.input) + bool(args.out) + bool(args.graph), "fxrules apply",
                      should_show(args.format)) as bar:
            bar.note("loading rules")
            _check_outputs(args)
            shapes = [_shape(s) for s in args.input]
            paths, rules = _load_rule_set(args)
            bar.advance(note="loading the model")
            model = _load_model(args.model)
            with _api_errors():
                found = fxrules.apply_and_compare(model, rules, example_inputs=_example_inputs(shapes),
                                                  export=args.export, keep_before=bool(args.diff or args.graph),
                                                  on_phase=lambda note: bar.advance(note=note))
            bar.advance()
            diff = _diff_part(args, found)
            out = _out_part(args, found, paths, shapes, bar)
            graph = _graph_part(args, found, model, bar)
    except _UsageError as exc:
        return _usage(exc)
    except _Failure as exc:
        return _fail(exc)
    for message in graph.messages:
        print(message, file=sys.stderr)
    if args.format == "json":
        _print_json(_apply_json(args, found, paths, shapes, diff, out, graph))
    else:
        print("\n".join(_apply_text(found) + [*diff.text, *out.text, *graph.text]))
    return EXIT_OK


def _apply_json(args: argparse.Namespace, found, paths: list[str], shapes: list, diff: _Part, out: _Part,
                graph: _Part) -> dict:
    return {"version": 1, "command": "apply", "model": args.model, "rules": paths, "exported": bool(args.export),
            "inputs": [list(s) for s in shapes], **found.report.to_json(),
            "max_abs_difference": _finite(found.max_abs_difference), "diff": diff.json, "saved": out.json,
            "graph": graph.json}


def _apply_text(found) -> list[str]:
    text = [found.report.table()]
    if found.max_abs_difference is not None:
        text.append(f"outputs before and after on the example inputs: max |difference| = "
                    f"{found.max_abs_difference:.3g}")
    return text


def _diff_part(args: argparse.Namespace, found) -> _Part:
    """--diff: a unified diff of the generated code before and after."""
    if not args.diff:
        return _Part()
    from fxrules.tools.codediff import unified_diff  # difflib's is quadratic on the code of large graphs

    lines = list(unified_diff(found.code_before.splitlines(keepends=True),
                              found.code_after.splitlines(keepends=True), "before", "after"))
    text = "".join(lines)
    return _Part(text, ("", text.rstrip("\n") if lines else "the code did not change"))


def _out_part(args: argparse.Namespace, found, paths: list[str], shapes: list, bar) -> _Part:
    """--out DIR: save the rewritten module, load it back, and compare it with the rewrite."""
    if not args.out:
        return _Part()
    bar.note(f"saving to {args.out}")
    from fxrules.api import compare_outputs, max_abs_difference
    from fxrules.tools.saving import FILES, SaveError, load_saved, save_module

    info = {"model": args.model, "rules": paths, "inputs": [list(s) for s in shapes], "exported": bool(args.export)}
    try:
        save_module(found.module, args.out, info=info)
    except SaveError as exc:
        raise _UsageError(f"cannot save the rewritten module: {exc}") from None
    except OSError as exc:
        raise _UsageError(f"cannot write --out {args.out}: {exc.strerror or exc}") from None
    try:  # the promise is that it loads back and runs: check it here, once
        loaded = load_saved(args.out)
        difference = None
        if found.example_inputs is not None:
            difference = max_abs_difference(compare_outputs(found.outputs_after, _run(loaded, found.example_inputs)))
    except Exception as exc:
        raise _UsageError(f"saved {args.out}, but it does not load back: {type(exc).__name__}: "
                          f"{_first_line(exc)}") from None
    line = f"saved the rewritten module to {args.out} ({', '.join(FILES)}); load it with " \
           f"fxrules.load_saved({args.out!r})"
    if difference is not None:
        line += f"; reloaded: max |difference| = {difference:.3g}"
    bar.advance()
    return _Part({"dir": args.out, "files": list(FILES), "reload_max_abs_difference": _finite(difference)}, (line,))


def _graph_part(args: argparse.Namespace, found, model, bar) -> _Part:
    """--graph FILE: draw the graph before and after, what the rules did marked."""
    if not args.graph:
        return _Part()
    bar.note(f"drawing {args.graph}")
    from fxrules.tools.drawing import DrawError, draw

    report = found.report
    title = f"{type(model).__name__} ({args.model}): {len(report.applied)} rewrites, nodes " \
            f"{report.nodes_before} -> {report.nodes_after}"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.graph)), exist_ok=True)
        drawing = draw(args.graph, found.before, found.module, report, title=title)
    except DrawError as exc:
        raise _UsageError(str(exc)) from None
    except OSError as exc:
        raise _UsageError(f"cannot write --graph {args.graph}: {exc.strerror or exc}") from None
    bar.advance()
    shown = drawing.rendered or os.path.splitext(args.graph)[1].lower() == ".dot"
    return _Part(drawing.to_json(), (f"drew the graph before and after to {drawing.path}",) if shown else (),
                 (drawing.hint,) if drawing.hint else ())


def _run(module, inputs: tuple):
    import torch

    with torch.no_grad():
        return module(*inputs)


def _finite(value: Optional[float]):
    """JSON has no inf/nan: such differences are written as the strings "inf" and "nan"."""
    import math

    return value if value is None or math.isfinite(value) else str(value)


# ---------------------------------------------------------------------------
# explain
# ---------------------------------------------------------------------------


def _explain(args: argparse.Namespace) -> int:
    import fxrules
    from fxrules.tools.progress import progress, should_show

    try:
        with progress(3, "fxrules explain", should_show(args.format)) as bar:
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
            with _api_errors():
                captured = fxrules.capture(model, example_inputs=_example_inputs(shapes), export=args.export,
                                           stack_traces=True)
                bar.advance(note="matching")
                misses = fxrules.explain(captured.subject, rules, rule=args.rule,
                                         example_inputs=captured.engine_inputs)
    except _UsageError as exc:
        return _usage(exc)
    except _Failure as exc:
        return _fail(exc)
    entries = [_near_miss(m) for m in misses]
    if args.format == "json":
        _print_json({"version": 1, "command": "explain", "model": args.model, "rules": paths, "rule": args.rule,
                     "exported": bool(args.export), "inputs": [list(s) for s in shapes], "nodes": captured.nodes,
                     "near_misses": entries})
    else:
        considered = len(rules) if args.rule is None else 1
        print("\n".join(_explain_text(misses, entries) + [
            f"fxrules explain: {len(misses)} near miss{'es' * (len(misses) != 1)} of "
            f"{_count(considered, 'rule')} in {captured.nodes} nodes"]))
    return EXIT_OK


def _explain_text(misses, entries: list[dict]) -> list[str]:
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
    return text


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
    stage = miss.stage
    return {"rule": miss.rule, "location": miss.location, "file": file, "line": line, "column": column,
            "node": miss.node, "reason": miss.reason, "code": str(miss.code), "stage": stage,
            "depth": miss.depth if stage == "pattern" else None,
            "stack_trace": miss.stack_trace, "frames": _user_frames(miss.stack_trace)}


def _user_frames(stack_trace) -> list[dict]:
    """The frames of a node's stack trace in the model's own code (torch's internals left out)."""
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


# ---------------------------------------------------------------------------
# What apply and explain share: rules, the model, inputs, output paths, errors
# ---------------------------------------------------------------------------


def _rule_paths(paths: Sequence[str]) -> list[str]:
    """Each path as given, or the bundled rule family of that name when no such path exists."""
    import importlib

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
    """(the rule paths, families resolved; the RuleSet). Rule-file errors: compiler style, exit 2."""
    from fxrules.api import load_rules
    from fxrules.errors import RuleFileError

    paths = _rule_paths(args.paths)
    try:
        return paths, load_rules(*paths, allow_imports=_allowed(args))
    except RuleFileError as exc:
        raise _Failure(exc.render(), EXIT_USAGE) from None


def _load_model(spec: str):
    """The model ``PKG.MODULE:ATTR`` names: an nn.Module, or what a factory of that name returns."""
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
    if _is_module(target):
        return target
    if not callable(target):
        raise _UsageError(f"{spec} is neither an nn.Module nor a factory")
    try:
        model = target()
    except Exception as exc:
        raise _UsageError(f"{spec}() raised {type(exc).__name__}: {_first_line(exc)}") from None
    if _is_module(model):
        return model
    raise _UsageError(f"{spec}() returned {type(model).__name__}, not an nn.Module")


def _is_module(value) -> bool:
    """Without importing torch: no nn.Module exists before torch is imported."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.nn.Module)


def _shape(text: str) -> tuple:
    """``2x3x32x32`` (or ``2,3,32,32``) -> (2, 3, 32, 32)."""
    try:
        dims = tuple(int(d) for d in text.lower().replace(",", "x").split("x") if d)
    except ValueError:
        raise _UsageError(f"--input takes a shape like 2x3x32x32, got {text!r}") from None
    if not dims or any(d < 0 for d in dims):
        raise _UsageError(f"--input takes a shape like 2x3x32x32, got {text!r}")
    return dims


def _example_inputs(shapes: list) -> Optional[tuple]:
    """One float32 tensor per shape, drawn from a generator seeded with 0 (the same every run); None for none."""
    if not shapes:
        return None
    import torch

    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(*shape, generator=generator) for shape in shapes)


def _writable_directory(path: str, what: str) -> None:
    """Fail early (before any work) when ``path`` cannot become a writable directory."""
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
    """Arguments are checked before any work: a bad --out does not cost a trace."""
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


@contextlib.contextmanager
def _api_errors() -> Iterator[None]:
    """The API's errors as the command's, in its words: a model that cannot be captured or run is a
    usage error (exit 2); a rule failing on the model, or breaking it, is a problem (exit 1)."""
    from fxrules.errors import FxrulesError, ModelError

    try:
        yield
    except ModelError as exc:
        raise _UsageError(_cli_hint(_first_line(exc))) from None
    except FxrulesError as exc:
        raise _Failure(f"fxrules: {_cli_hint(str(exc))}", EXIT_PROBLEMS) from None


def _cli_hint(message: str) -> str:
    """API messages speak of the Python API; say what to pass on the command line instead."""
    message = message.replace("pass example_inputs= to apply_rules, or a graph with meta['val'] (torch.export)",
                              "pass --input SHAPE (and --export for a torch.export graph)")
    message = message.replace("; pass a torch.fx.GraphModule or a torch.export.ExportedProgram, or concrete_args",
                              "; try --export with --input")
    message = message.replace("; try export=True with example_inputs", "; try --export with --input")
    return message.replace("pass example_inputs= to apply_rules", "pass --input SHAPE")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---------------------------------------------------------------------------
# Output and the entry point
# ---------------------------------------------------------------------------


def _print_json(payload: dict) -> None:
    json.dump(payload, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def _usage(exc: _UsageError) -> int:
    print(f"fxrules: error: {exc}", file=sys.stderr)
    return EXIT_USAGE


def _fail(exc: _Failure) -> int:
    print(exc.text, file=sys.stderr)
    return exc.code


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
