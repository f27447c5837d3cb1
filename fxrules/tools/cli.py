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
import time
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

from fxrules import __version__
from fxrules.lang.config import Config, ConfigError, discover
from fxrules.lang.diagnostics import CODES, ERROR, Diagnostic
from fxrules.lang.discover import IgnoreRules
from fxrules.lang.load import ConfigWarning, analyze, load_paths, project, read_sources
from fxrules.lang.names import Resolver
from fxrules.lang.runtime import entered
from fxrules.lang.source import Source, decode

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

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """An unknown option is reported with the usage of the subcommand it was given to, not fxrules'."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._commands.choices.get(getattr(parsed, "command", None)) if self._commands else None
            (command or self).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    _commands = None


# ---------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fxrules", description="Declarative, checked rewrite rules for torch.fx graphs.")
    parser.add_argument("--version", action="version", version=f"fxrules {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parser._commands = commands
    _check_parser(commands)
    _apply_parser(commands)
    _explain_parser(commands)
    _fmt_parser(commands)
    _verify_parser(commands)
    _test_parser(commands)
    _new_parser(commands)
    _lsp_parser(commands)
    _analyze_parser(commands)
    return parser


def _lsp_parser(commands) -> None:
    lsp = commands.add_parser("lsp", help="run the language server (LSP over stdio; for editors)",
                              description="Speak the Language Server Protocol on standard input and output: "
                                          "diagnostics as you type, hover, go to definition, formatting, "
                                          "completion. Needs the lsp extra: pip install \"fxrules[lsp]\".")
    lsp.set_defaults(run=_lsp)


def _lsp(args: argparse.Namespace) -> int:
    try:
        import pygls  # noqa: F401
    except ImportError:
        return _usage(_UsageError('the language server needs pygls: pip install "fxrules[lsp]"'))
    from fxrules.tools.lsp import serve

    serve()
    return EXIT_OK


def _test_parser(commands) -> None:
    test = commands.add_parser("test", help="run the rules' own examples only (fast; no random models)",
                               description="Run every rule's `example:` lines: build each example model, apply "
                                           "the rule, check the rewrite count and the contract. Exit 0 when every "
                                           "example passes, 1 when one fails, 2 on usage errors.")
    _rules_argument(test)
    test.add_argument("--rule", action="append", default=None, metavar="NAME",
                      help="test only the rule NAME (may be repeated)")
    _format_argument(test)
    _project_arguments(test)
    _output_arguments(test)
    test.set_defaults(run=_test)


def _new_parser(commands) -> None:
    new = commands.add_parser("new", help="scaffold a rule file with a doc string, a contract and examples",
                              description="Write NAME.fxr (under rules/FAMILY/ when rules/ exists, else ./FAMILY/): "
                                          "a rule that checks clean and passes `fxrules test`, to edit. Never "
                                          "overwrites a file. Exit 0 when written, 2 otherwise.")
    new.add_argument("name", metavar="NAME", help="the rule's name (letters, digits, _)")
    new.add_argument("--family", default="", metavar="F",
                     help="the family folder (cleanup, canonicalize, fold, swap, aten or your own); fold rules "
                          "get [approx], swap rules [changes], others [exact]")
    new.add_argument("--dir", default="", metavar="DIR", help="where families live (default: rules/ if it exists)")
    new.set_defaults(run=_new)


def _check_parser(commands) -> None:
    check = commands.add_parser("check", help="validate rule files (syntax, names, bindings, contracts)",
                                description="Validate rule files. Exit 0 when clean, 1 when errors were found, "
                                            "2 on usage errors.")
    check.add_argument("paths", nargs="*", default=["."], metavar="PATH",
                       help="rule files, directories (every *.fxr under them, skipping excluded and gitignored "
                            "ones) or globs; - for standard input; default: .")
    check.add_argument("--format", choices=("text", "json", "github", "sarif"), default="text",
                       help="text for people, json for machines, github for workflow annotations, sarif for "
                            "code scanning (SARIF 2.1.0)")
    check.add_argument("--force-exclude", action="store_true",
                       help="apply the excludes to files named explicitly too (for pre-commit, which names "
                            "every changed file)")
    check.add_argument("--stdin-filename", metavar="PATH",
                       help="with -: the name diagnostics use for standard input (and where its project "
                            "configuration is found)")
    _project_arguments(check)
    _output_arguments(check)
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
    _output_arguments(apply)
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
    _output_arguments(explain)
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
    verify.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                        help="verify rules in N worker processes (0: one per CPU core; default 1); the same "
                             "verdicts in the same order as one process, for a fixed --seed")
    verify.add_argument("--grad", action=argparse.BooleanOptionalAction, default=True,
                        help="compare gradients of a scalar loss w.r.t. the inputs and trainable parameters too, for "
                             "[exact] and [approx] rules (the default); --no-grad compares forward outputs only")
    verify.add_argument("--coverage", action="store_true",
                        help="verify nothing: list the ops the rules' patterns name that have no sampler (exit 1 "
                             "if any)")
    verify.add_argument("--database", default="default", metavar="DIR",
                        help="hypothesis' example database: counterexamples found are kept there and tried first "
                             "next time (default: .hypothesis/ in the working directory)")
    verify.add_argument("--no-database", action="store_true", help="keep no counterexamples")
    verify.add_argument("--reproduce", metavar="LINE",
                        help="replay one counterexample: the @reproduce_failure(...) line a failure printed "
                             "(with exactly one --rule)")
    _format_argument(verify, "sarif")
    _project_arguments(verify)
    _output_arguments(verify)
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
    _project_arguments(command)


def _rules_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument("paths", nargs="+", metavar="RULES",
                         help="rule files or directories, or the name of a bundled rule family (such as cleanup)")


def _format_argument(command: argparse.ArgumentParser, *more: str) -> None:
    command.add_argument("--format", choices=("text", "json", *more), default="text",
                         help="text for people, json for machines (schema: docs/cli.md)"
                              + "".join(f", {m}" for m in more))


def _project_arguments(command: argparse.ArgumentParser) -> None:
    """The options every command that reads rule files shares: imports, configuration, excludes."""
    command.add_argument("--allow-import", action="append", default=[], metavar="PKG",
                         help="allow rule files to name modules of PKG (may be repeated; adds to allow-imports "
                              "of the project configuration)")
    command.add_argument("--config", metavar="FILE",
                         help="use this pyproject.toml or fxrules.toml for every path, instead of each rule "
                              "file's nearest one ([tool.fxrules], found from the file's folder upward)")
    command.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                         help="skip paths matching PATTERN (gitignore syntax, relative to the working "
                              "directory) when walking directories; adds to exclude/extend-exclude")


def _output_arguments(command: argparse.ArgumentParser) -> None:
    """--quiet and --verbose: how much goes to stderr besides results and errors."""
    group = command.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1, default=0,
                       help="print results and errors only: no summary, hints or warnings")
    group.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1,
                       help="also say which configuration applies to each path and which files are read")


@dataclass(frozen=True, slots=True)
class _Project:
    """What the rule paths of a command run under: each path's configuration, the resolver, the excludes."""

    configs: dict
    resolver: Resolver
    exclude: Optional[IgnoreRules]


def _project(args: argparse.Namespace, paths: Sequence[str]) -> _Project:
    """Each path's project configuration (``--config``, else discovered), its warnings said on stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        try:
            configs, resolver = project(paths, args.allow_import, args.config)
        except ConfigError as exc:
            raise _UsageError(str(exc)) from None
    for warning in caught:
        if issubclass(warning.category, ConfigWarning) and _verbosity(args) >= 0:
            print(f"fxrules: warning: {warning.message}", file=sys.stderr)
    if _verbosity(args) > 0:
        for path, config in configs.items():
            print(f"fxrules: {path}: configuration {config.path or '(none: defaults)'}", file=sys.stderr)
    exclude = IgnoreRules.parse(os.getcwd(), args.exclude) if args.exclude else None
    return _Project(configs, resolver, exclude)


def _verbosity(args: argparse.Namespace) -> int:
    return getattr(args, "verbosity", 0)


# ---------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> int:
    try:
        sources, diagnostics, resolver = _check_inputs(args)
    except _UsageError as exc:
        return _usage(exc)
    if _verbosity(args) > 0:
        for source in sources:
            print(f"fxrules: reading {source.path}", file=sys.stderr)
    with entered():  # an entry point: the command runs the front end's stages itself
        rule_set, found = analyze(sources, resolver)
    diagnostics = sorted(diagnostics + found, key=lambda d: (d.path, d.line, d.column, d.code))
    unreadable = {d.path for d in diagnostics if d.code in ("io-error", "binary-input", "invalid-encoding")}
    files = sorted({s.path for s in sources} | unreadable)
    texts = {s.path: s.text for s in sources}
    if args.format == "text":
        _check_text(diagnostics, texts, files, len(rule_set), _verbosity(args))
    else:
        _CHECK_RENDERERS[args.format](diagnostics, texts, files, len(rule_set))
    errors = [d for d in diagnostics if d.severity == ERROR]
    if any(d.code == "io-error" for d in errors):
        return EXIT_USAGE  # a path that does not exist or cannot be read is a usage error
    return EXIT_PROBLEMS if errors else EXIT_OK


def _check_inputs(args: argparse.Namespace) -> tuple[list[Source], list[Diagnostic], Resolver]:
    """The sources to check (files, directories walked, globs, or standard input for ``-``), the
    diagnostics of paths that could not be read, and the resolver of their projects."""
    if "-" in args.paths:
        if len(args.paths) != 1:
            raise _UsageError("- (standard input) cannot be combined with other paths")
        name = args.stdin_filename or "<stdin>"
        where = args.stdin_filename or os.getcwd()
        found = _project(args, [where])
        try:
            return [decode(sys.stdin.buffer.read(), name)], [], found.resolver
        except Exception as exc:  # RuleFileError: not UTF-8, or binary
            diagnostics = getattr(exc, "diagnostics", None)
            if diagnostics is None:
                raise
            return [], list(diagnostics), found.resolver
    if args.stdin_filename:
        raise _UsageError("--stdin-filename needs - (standard input) as the path")
    found = _project(args, args.paths)
    paths = args.paths
    if args.force_exclude:
        from fxrules.lang.discover import excluded

        paths = [p for p in paths if not (os.path.isfile(p) and excluded(p, found.configs[p], found.exclude))]
    sources, diagnostics = read_sources(paths, found.configs, found.exclude)
    return sources, diagnostics, found.resolver


def _check_sarif(diagnostics: list[Diagnostic], texts: dict[str, str], files: list[str], rules: int) -> None:
    from fxrules.tools.sarif import render_sarif

    _print_json(render_sarif(diagnostics, CODES, version=__version__))


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


def _check_text(diagnostics: list[Diagnostic], texts: dict[str, str], files: list[str], rules: int,
                verbosity: int = 0) -> None:
    from fxrules.tools.style import Style

    style = Style.for_stream(sys.stdout)
    for d in diagnostics:
        print(style.diagnostic(d.render(texts.get(d.path))))
    sys.stdout.flush()
    if verbosity < 0:
        return
    errors = sum(d.severity == ERROR for d in diagnostics)
    warnings = len(diagnostics) - errors
    summary = f"{_count(len(files), 'file')}, {_count(rules, 'rule')} checked"
    if diagnostics:
        summary += f": {_count(errors, 'error')}, {_count(warnings, 'warning')}"
    else:
        summary += ": no problems"
    print(summary, file=sys.stderr if diagnostics else sys.stdout)


_CHECK_RENDERERS = {"text": _check_text, "json": _check_json, "github": _check_github, "sarif": _check_sarif}


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
        if args.jobs < 0:
            raise _UsageError("--jobs must be 0 (one per CPU core) or more")
        jobs = args.jobs or os.cpu_count() or 1
        paths, rule_set = _load_rule_set(args)
        if args.coverage:
            return _coverage(rule_set, args.format)
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
                                        reproduce=args.reproduce, progress=on_progress, jobs=jobs)
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
    elif args.format == "sarif":
        from fxrules.tools.sarif import render_sarif

        _print_json(render_sarif(_verify_diagnostics(report), VERIFY_GRADES, version=__version__))
    else:
        print(report)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _coverage(rule_set, output_format: str) -> int:
    """``verify --coverage``: the ops without a sampler, one a line with the rules naming them."""
    from fxrules.verifier.driver import coverage

    gaps = coverage(rule_set)
    if output_format == "json":
        _print_json({"version": 1, "complete": not gaps,
                     "uncovered": [{"op": gap.op, "rules": list(gap.rules)} for gap in gaps]})
    else:
        for gap in gaps:
            print(f"no sampler: {gap.op} (named by {', '.join(gap.rules)})")
        print(f"fxrules verify --coverage: {len(rule_set.names)} rules, "
              + ("every op they name has a sampler" if not gaps else f"{len(gaps)} op{'s' * (len(gaps) != 1)} "
                                                                      f"without a sampler"))
    return EXIT_PROBLEMS if gaps else EXIT_OK


VERIFY_GRADES = {
    "wrong": "the rule breaks its contract on a model (a counterexample is given)",
    "noisy": "the rule's outputs differ beyond its contract's tolerance only sometimes",
    "weak": "nothing broke, but fewer distinct host graphs than the minimum checked the rule",
    "missing": "no model exercised the rule: its pattern was never drawn or rewritten",
    "unverified": "the rule could not be checked (no sampler for one of its ops, or nothing rewritten)",
    "error": "verifying the rule failed with an error",
}
"""The verify grades that are findings (``validated`` is not), as SARIF rules."""


def _verify_diagnostics(report) -> list[Diagnostic]:
    """Each rule that is not validated as a Diagnostic at the rule's file:line."""
    found = []
    for entry in report.to_json()["rules"]:
        grade = entry["grade"]
        if grade == "validated":
            continue
        path, line = _split_source(entry.get("source") or "")
        counterexample = entry.get("counterexample") or {}
        problem = counterexample.get("problem") or entry.get("hosts_note") or grade
        notes = tuple(n for n in (counterexample.get("command"),) if n)
        found.append(Diagnostic(path, line, 1 if line else 0, grade, f"rule `{entry['rule']}` is {grade}: {problem}",
                                notes=notes))
    return found


def _split_source(source: str) -> tuple[str, int]:
    """``file:line`` -> (file, line); (source, 0) when it has no line."""
    head, sep, tail = source.rpartition(":")
    return (head, int(tail)) if sep and tail.isdigit() else (source, 0)


# ---------------------------------------------------------------------------
# test and new
# ---------------------------------------------------------------------------


def _test(args: argparse.Namespace) -> int:
    from fxrules.verifier.driver import verify_examples

    try:
        paths, rule_set = _load_rule_set(args)
        unknown = [name for name in args.rule or () if name not in rule_set]
        if unknown:
            raise _UsageError(f"no rule named {unknown[0]!r} in {', '.join(args.paths)}")
    except _UsageError as exc:
        return _usage(exc)
    except _Failure as exc:
        return _fail(exc)
    names = list(args.rule or rule_set.names)
    results = {name: verify_examples(rule_set, name) for name in names}
    failed = {name: [o for o in outcomes if str(o.grade) != "validated"] for name, outcomes in results.items()}
    bad = sum(len(v) for v in failed.values())
    total = sum(len(v) for v in results.values())
    untested = [name for name, outcomes in results.items() if not outcomes]
    if args.format == "json":
        _print_json({"version": 1, "command": "test", "ok": bad == 0, "examples": total, "failed": bad,
                     "rules": [{"rule": name, "source": rule_set[name].source,
                                "examples": [o.to_json() for o in outcomes]} for name, outcomes in results.items()]})
        return EXIT_PROBLEMS if bad else EXIT_OK
    for name, outcomes in results.items():
        for outcome in failed[name]:
            print(f"{outcome.location}: FAIL rule `{name}`: expected it to {outcome.expected}: {outcome.problem}")
        if outcomes and not failed[name] and _verbosity(args) > 0:
            print(f"{rule_set[name].source}: ok rule `{name}` ({_count(len(outcomes), 'example')})")
    if _verbosity(args) >= 0:
        summary = f"fxrules test: {_count(total, 'example')} of {_count(len(names), 'rule')}: "
        summary += f"{bad} failed" if bad else "all passed"
        if untested:
            summary += f"; {_count(len(untested), 'rule')} without examples ({', '.join(untested[:5])}" \
                       f"{', ...' if len(untested) > 5 else ''})"
        print(summary, file=sys.stderr if bad else sys.stdout)
    return EXIT_PROBLEMS if bad else EXIT_OK


def _new(args: argparse.Namespace) -> int:
    from fxrules.tools.scaffold import ScaffoldError, scaffold, write

    try:
        found = scaffold(args.name, args.family, args.dir)
        write(found)
    except ScaffoldError as exc:
        return _usage(_UsageError(str(exc)))
    print(f"wrote {found.path}; next: fxrules check {found.path} && fxrules test {found.path}")
    return EXIT_OK


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
    analyze.add_argument("--format", choices=("text", "json", "github", "sarif"), default="text",
                         help="text for people, json for machines (schema: docs/analyze.md), github for workflow "
                              "annotations, sarif for code scanning (SARIF 2.1.0)")
    _project_arguments(analyze)
    _output_arguments(analyze)
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


def _analyze_sarif(report, sources: dict) -> None:
    from fxrules.lang.analysis import FINDING_CODES
    from fxrules.tools.sarif import render_sarif

    _print_json(render_sarif([f.to_diagnostic() for f in report.findings], FINDING_CODES, version=__version__))


_ANALYZE_RENDERERS = {"text": _analyze_text, "json": _analyze_json, "github": _analyze_github,
                      "sarif": _analyze_sarif}


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
            phases: dict[str, float] = {}

            def on_phase(note: str) -> None:
                phases.setdefault(note.split()[0], time.perf_counter())
                bar.advance(note=note)

            with _api_errors():
                _warm_up(rules)
                found = fxrules.apply_and_compare(model, rules, example_inputs=_example_inputs(shapes),
                                                  export=args.export, keep_before=bool(args.diff or args.graph),
                                                  on_phase=on_phase)
            bar.advance()
            startup = phases.get("rewriting", time.perf_counter()) - getattr(args, "started", time.perf_counter())
            diff = _diff_part(args, found)
            module_diff = _module_diff_part(args, found)
            out = _out_part(args, found, paths, shapes, bar)
            graph = _graph_part(args, found, model, bar)
    except _UsageError as exc:
        return _usage(exc)
    except _Failure as exc:
        return _fail(exc)
    for message in graph.messages:
        print(message, file=sys.stderr)
    if args.format == "json":
        _print_json({**_apply_json(args, found, paths, shapes, diff, out, graph),
                     "module_diff": module_diff.json, "startup_seconds": round(startup, 6)})
    else:
        print("\n".join(_apply_text(found) + [_timing_line(found, startup), *diff.text, *module_diff.text,
                                               *out.text, *graph.text]))
    return EXIT_OK


def _warm_up(rules) -> None:
    """Pay the one-time costs (compiling the rules, torch's lazily imported shape propagation) on a
    one-node graph, so the rewrite time reported is the rewrite's, not the process's start-up."""
    import torch

    import fxrules

    fxrules.apply_rules(torch.fx.symbolic_trace(torch.nn.Identity()), rules, example_inputs=(torch.zeros(1),))


def _timing_line(found, startup: float) -> str:
    """Where the time went: the rewrite (the engine's, as the report says) apart from start-up."""
    return (f"time: rewrite {found.result.report.seconds * 1000:.1f} ms; before it {startup:.2f} s of start-up "
            f"(imports, loading the rules and the model, tracing, compiling the rules: once per process)")


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


def _module_diff_part(args: argparse.Namespace, found) -> _Part:
    """--diff, second half: a unified diff of the module tree (types and constructor arguments)."""
    if not args.diff:
        return _Part()
    from fxrules.tools.codediff import unified_diff

    lines = list(unified_diff(_module_tree(found.before), _module_tree(found.module), "modules before",
                              "modules after"))
    text = "".join(lines)
    return _Part(text, ("", text.rstrip("\n") if lines else "the modules did not change"))


def _module_tree(module) -> list[str]:
    """One line per submodule: its path, type and constructor arguments as ``extra_repr`` shows them, so a
    module swapped for another type, or for the same type built differently (GELU() ->
    GELU(approximate='tanh')), shows in the diff where the generated code only shows a call."""
    if module is None:
        return []
    return [f"{name}: {type(sub).__name__}({sub.extra_repr()})\n" for name, sub in module.named_modules() if name]


def _out_part(args: argparse.Namespace, found, paths: list[str], shapes: list, bar) -> _Part:
    """--out DIR: save the rewritten module, load it back, and compare it with the rewrite."""
    if not args.out:
        return _Part()
    bar.note(f"saving to {args.out}")
    from fxrules.api import compare_outputs, max_abs_difference, run_on_copies
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
            reloaded = run_on_copies(loaded, found.example_inputs)
            difference = max_abs_difference(compare_outputs(found.outputs_after, reloaded))
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
    from fxrules.errors import RuleFileError

    paths = _rule_paths(args.paths)
    found = _project(args, paths)
    try:
        with entered():
            return paths, load_paths(paths, found.resolver, found.configs, found.exclude)
    except RuleFileError as exc:
        raise _Failure(exc.render(), EXIT_USAGE) from None


def _load_model(spec: str):
    """The model ``PKG.MODULE:ATTR`` names: an nn.Module, or what a factory of that name returns."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise _UsageError(f"--model must look like PKG.MODULE:FACTORY, got {spec!r}")
    _model_search_path()
    try:
        module = importlib.import_module(module_name)  # models are trusted code (see SECURITY.md)
    except Exception as exc:
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == module_name.split(".")[0]:
            hint = (" (models are imported from the working directory and the python-path folders of "
                    "[tool.fxrules]; run from the project's root or set python-path)")
        raise _UsageError(f"cannot import {module_name}: {type(exc).__name__}: {_first_line(exc)}{hint}") from None
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


def _model_search_path() -> None:
    """Where ``--model`` modules are found: the working directory first (so the ``fxrules`` script finds
    what ``python -m fxrules`` finds), then the ``python-path`` of the working directory's project."""
    try:
        config = discover(os.getcwd())
    except ConfigError as exc:
        raise _UsageError(str(exc)) from None
    Config(python_path=(os.getcwd(), *config.python_path)).put_on_sys_path()


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
        raise _Failure(f"fxrules: {_cli_hint(_first_line(exc))}{_node_origin(exc)}", EXIT_PROBLEMS) from None


def _node_origin(exc: BaseException) -> str:
    """Where the failing node came from in the model's own code, on the same line: the error stays one
    line (the full stack trace, torch's frames included, is the API's, on ``exc.stack_trace``)."""
    frames = _user_frames(getattr(exc, "stack_trace", None))
    if not frames:
        return ""
    frame = frames[-1]
    return f" (%{getattr(exc, 'node', '?')} comes from {frame['file']}:{frame['line']} in {frame['function']})"


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
    started = time.perf_counter()
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        args.started = started
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
