"""The checker's parts, each on its own (fxrules.lang.check): the reporter, aliases and bindings,
argument lists, patterns, conditions, replacements, identity, examples, names and the driver.

tests/lang/test_checker.py and tests/lang/test_corpus.py pin what a whole file gets through the public API;
these pin each piece's contract, so a piece can be changed (or given a new check) knowing what it
must keep doing. Conditions and replacements are checked here against hand-made Bindings, with
no pattern at all.
"""

from __future__ import annotations

import dataclasses

import pytest

import fxrules.lang.ast as A
from fxrules.lang.allowlist import Position
from fxrules.lang.check import check_duplicates, check_file
from fxrules.lang.check.calls import attribute_values, check_argument_list, check_duplicate_keywords
from fxrules.lang.check.conditions import CAPTURE_ATTRIBUTES, check_called_path, check_conditions
from fxrules.lang.check.driver import check_rule, contract_word
from fxrules.lang.check.examples import MAX_EXAMPLE_COUNT, check_example, check_inputs
from fxrules.lang.check.identity import is_identity, is_identity_as_written
from fxrules.lang.check.patterns import check_patterns
from fxrules.lang.check.replacements import check_forwarded_ellipses, check_replacements
from fxrules.lang.check.reporter import Reporter, closest, did_you_mean
from fxrules.lang.check.scope import Aliases, Bindings
from fxrules.lang.check.targets import NEVER_CREATED, Targets, report_resolution
from fxrules.lang.load import parse_source
from fxrules.lang.names import Resolution, Resolver, torch_available
from fxrules.lang.source import Source

NO_ALIASES = Aliases({})


def span(column: int, width: int = 1, line: int = 1) -> A.Span:
    return A.Span("t.fxr", line, column, line, column + width)


def rule_of(text: str) -> A.Rule:
    (rule,) = parse_source(Source("t.fxr", text)).rules
    return rule


def targets(reporter: Reporter, aliases: Aliases = NO_ALIASES, resolver: Resolver | None = None) -> Targets:
    return Targets(reporter, resolver or Resolver(), aliases, torch_available())


def found(reporter: Reporter) -> list[tuple[str, str]]:
    return [(d.code, d.message) for d in reporter.diagnostics]


# ---------------------------------------------------------------------------
# The reporter
# ---------------------------------------------------------------------------


def test_the_reporter_keeps_order_and_counts_errors_only():
    reporter = Reporter()
    reporter.error(span(5), "bad-pattern", "first", notes=["a note"])
    reporter.warning(span(1), "bad-example", "second")
    reporter.error(span(9, 2), "unbound-name", "third")
    assert [d.message for d in reporter.diagnostics] == ["first", "second", "third"]  # as reported, not sorted
    assert [d.severity for d in reporter.diagnostics] == ["error", "warning", "error"]
    assert reporter.errors == 2
    first = reporter.diagnostics[0]
    assert (first.line, first.column, first.end_column, first.notes) == (1, 5, 6, ("a note",))


def test_suggestions_name_the_closest_candidate_or_nothing():
    assert closest("aprox", ["exact", "approx", "changes"]) == "approx"
    assert closest("zzz", ["exact", "approx"]) is None
    assert did_you_mean("x1", ["x", "y"], sigil="$") == ["did you mean `$x`?"]
    assert did_you_mean("qqqq", ["x", "y"]) == []
    assert did_you_mean("relu", iter(["rule", "relu6"])) == ["did you mean `relu6`?"]  # any iterable


# ---------------------------------------------------------------------------
# Aliases and bindings: frozen values
# ---------------------------------------------------------------------------


def test_aliases_expand_names_and_remember_reported_use_lines():
    aliases = Aliases({"G": "torch.nn.functional", "bad": "nowhere"}, frozenset({"bad"}))
    assert aliases.full_path(A.Dotted(("G", "relu"))) == "torch.nn.functional.relu"
    assert aliases.full_path(A.Dotted(("F", "gelu"))) == "torch.nn.functional.gelu"  # a built-in alias
    assert aliases.full_path(A.Dotted(("mypkg", "f"))) == "mypkg.f"  # no alias: as written
    assert aliases.is_reported(A.Dotted(("bad", "f"))) and not aliases.is_reported(A.Dotted(("G", "f")))
    assert aliases.is_module_head("G") and aliases.is_module_head("torch") and not aliases.is_module_head("conv")
    with pytest.raises(dataclasses.FrozenInstanceError):
        aliases.reported = frozenset()  # type: ignore[misc]


def test_the_file_driver_gives_each_rule_the_aliases_above_it():
    text = ("use torch.nn.functional as G\n"
            "call_function G.relu -> call_function torch.relu\n"
            "use operator as ops\n"
            "call_function ops.add -> call_function operator.mul\n")
    rules, diagnostics = check_file(parse_source(Source("t.fxr", text)), Resolver())
    assert diagnostics == []
    assert [dict(r.aliases) for r in rules] == [{"G": "torch.nn.functional"},
                                                {"G": "torch.nn.functional", "ops": "operator"}]
    assert [r.index for r in rules] == [0, 1]


# ---------------------------------------------------------------------------
# Argument lists and attributes (shared by patterns, replacements and examples)
# ---------------------------------------------------------------------------


def _call(*args: A.Expr, kwargs: tuple[A.Keyword, ...] = ()) -> A.Call:
    return A.Call("call_function", A.Dotted(("torch", "add")), args, kwargs)


def test_an_argument_list_returns_its_ellipsis_and_reports_misplaced_ones():
    reporter = Reporter()
    assert check_argument_list(reporter, _call(A.Capture("x"), A.Ellipsis_(span(9, 3))), "bad-pattern") == span(9, 3)
    assert check_argument_list(reporter, _call(A.Capture("x")), "bad-pattern") is None
    assert reporter.diagnostics == []

    misplaced = _call(A.Ellipsis_(span(3, 3)), A.Capture("x"), A.Ellipsis_(span(9, 3)))
    assert check_argument_list(reporter, misplaced, "bad-pattern") == span(3, 3)  # the first, even when misplaced
    assert found(reporter) == [("ellipsis-misuse", "`...` may appear only once in an argument list")]
    assert reporter.diagnostics[0].column == 9

    reporter = Reporter()
    check_argument_list(reporter, _call(A.Ellipsis_(span(3, 3)), A.Capture("x")), "bad-pattern")
    assert found(reporter) == [("ellipsis-misuse", "`...` must be the last positional argument")]


@pytest.mark.parametrize("code", ["bad-pattern", "bad-replacement", "bad-example"])
def test_a_keyword_given_twice_gets_the_code_of_where_it_is(code):
    reporter = Reporter()
    keywords = (A.Keyword("dim", A.Literal(1), span(1)), A.Keyword("dim", A.Literal(1), span(8)),
                A.Keyword("out", A.Literal(2), span(15)), A.Keyword("dim", A.Literal(0), span(22)))
    check_duplicate_keywords(reporter, keywords, code, "keyword argument")
    assert found(reporter) == [(code, "keyword argument `dim` is given twice")] * 2
    assert [d.column for d in reporter.diagnostics] == [8, 22]
    assert [d.notes for d in reporter.diagnostics] == [("first given at t.fxr:1:1",)] * 2


def test_attribute_values_come_in_order_with_the_bad_ones_reported_in_place():
    reporter = Reporter()
    value = A.ListExpr((A.Literal(1), A.Call("call_function", A.Dotted(("f",)), span=span(4)),
                        A.TupleExpr((A.Capture("n"), A.Alt((A.Capture("m"),), span(9)))), A.Literal(3)))
    seen = []
    for leaf in attribute_values(reporter, value, "bad-replacement"):
        seen.append((leaf, len(reporter.diagnostics)))  # how many were reported when this value came
    assert seen == [(A.Literal(1), 0), (A.Capture("n"), 1), (A.Literal(3), 2)]
    assert [(d.code, d.column) for d in reporter.diagnostics] == [("bad-replacement", 4), ("bad-replacement", 9)]


# ---------------------------------------------------------------------------
# Patterns: what they bind
# ---------------------------------------------------------------------------


def test_a_pattern_returns_what_it_binds():
    rule = rule_of("call_module BatchNorm2d(call_module Conv2d($x, ...) as conv) as bn -> $x\n")
    reporter = Reporter()
    bindings = check_patterns(reporter, targets(reporter), rule.patterns)
    assert reporter.diagnostics == []
    assert set(bindings.captures) == {"x"} and set(bindings.names) == {"conv", "bn"}
    assert isinstance(bindings.names["conv"], A.Call) and bindings.names["conv"].target.text == "Conv2d"
    assert len(bindings.ellipses) == 1 and bindings.ellipses[0].line == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        bindings.names = {}  # type: ignore[misc]


def test_an_alternation_binds_the_union_and_reports_options_that_differ():
    rule = rule_of("(call_function torch.relu($x) | call_method relu($y)) -> $x\n")
    reporter = Reporter()
    bindings = check_patterns(reporter, targets(reporter), rule.patterns)
    assert set(bindings.captures) == {"x", "y"}
    assert [d.code for d in reporter.diagnostics] == ["alternation-binding"]
    assert reporter.diagnostics[0].notes == ("bound by some options but not others: $x, $y",)


def test_a_pattern_reports_references_after_the_walk():
    rule = rule_of("call_function torch.add(call_function torch.relu(a) as a, b) -> $x\n")
    reporter = Reporter()
    check_patterns(reporter, targets(reporter), rule.patterns)
    assert [(d.code, d.message) for d in reporter.diagnostics] == [
        ("bad-pattern", "`a` is used inside the pattern it names"),
        ("unbound-name", "`b` is not a node the pattern names with `as`"),
    ]


# ---------------------------------------------------------------------------
# Conditions, against hand-made bindings
# ---------------------------------------------------------------------------

BOUND = Bindings(captures={"x": span(1)}, names={"bn": A.Call("call_module", A.Dotted(("BatchNorm2d",)), ())},
                 ellipses=())


def condition_diagnostics(*conditions: A.Cond, resolver: Resolver | None = None) -> list[tuple[str, str]]:
    reporter = Reporter()
    check_conditions(reporter, targets(reporter, resolver=resolver), BOUND, conditions)
    return found(reporter)


def test_conditions_read_what_the_pattern_binds():
    assert condition_diagnostics(
        A.CBinary("==", A.CAttr(A.CCapture("x"), "ndim"), A.CLiteral(2)),
        A.CUnary("not", A.CAttr(A.CName("bn"), "training")),
        A.CCall(A.CName("is_zero"), (A.CCapture("x"),)),
        A.CCall(A.CName("len"), (A.CAttr(A.CCapture("x"), "shape"),)),
        A.CCall(A.CAttr(A.CCapture("x"), "is_contiguous"), ()),
    ) == []
    assert "shape" in CAPTURE_ATTRIBUTES


def test_conditions_report_what_is_not_bound_or_not_metadata():
    assert condition_diagnostics(A.CCapture("y", span(4, 2))) == [
        ("unbound-capture", "the condition uses `$y`, which the pattern does not bind")]
    assert condition_diagnostics(A.CName("conv")) == [
        ("unknown-name", "the condition uses `conv`, which is not bound or known")]
    assert condition_diagnostics(A.CName("is_zero")) == [
        ("unknown-name", "`is_zero` is a function; call it, as in `is_zero($x)`")]
    assert condition_diagnostics(A.CAttr(A.CCapture("x"), "data")) == [
        ("unknown-attribute", "a capture has no attribute `data`")]
    assert condition_diagnostics(A.CAttr(A.CName("bn"), "__class__")) == [
        ("forbidden-target", "a condition may not read the dunder attribute `__class__`")]
    assert condition_diagnostics(A.CCall(A.CName("is_zeros"), ())) == [
        ("unknown-predicate", "`is_zeros` is not a built-in predicate")]
    assert condition_diagnostics(A.CCall(A.CAttr(A.CName("bn"), "forward"), ())) == [
        ("unknown-predicate", "only predicates and dotted function paths can be called")]


@pytest.mark.parametrize("path", ["builtins.eval", "builtins.len", "operator.attrgetter", "math._private",
                                  "torch._C.foo"])
def test_a_condition_may_not_call_builtins_private_or_never_created_paths(path):
    reporter = Reporter()
    check_called_path(reporter, targets(reporter), span(1), path)
    assert found(reporter) == [("forbidden-target", f"a condition may not call `{path}`")]


def test_a_condition_calls_dotted_paths_that_resolve_to_callables_under_the_policy():
    def called(path: str) -> list[tuple[str, str]]:
        reporter = Reporter()
        check_called_path(reporter, targets(reporter), span(1), path)
        return found(reporter)

    # only predicates and the bare-name builtins are callable (the allow-list, SECURITY.md); a dotted
    # path that resolves is refused by the allow-list unless its package is allowed explicitly
    assert [code for code, _ in called("math.isfinite")] == ["not-allowed"]
    assert called("math.pi") == [("not-allowed", called("math.pi")[0][1])]
    assert called("math.isfinit")[0][0] == "unknown-predicate"
    assert called("json.dumps")[0][0] == "import-not-allowed"  # the policy's own code
    assert called("nosuchpackage_zz.f")[0][0] == "unknown-alias"
    assert "operator.itemgetter" in NEVER_CREATED


def test_a_dotted_constant_in_a_condition_may_not_be_a_module():
    chain = A.CAttr(A.CName("torch"), "nn", span(1, 8))
    # a module is not on the allow-list of constants, so the allow-list refuses it first
    assert condition_diagnostics(chain) == [
        ("not-allowed", "`torch.nn` is not on fxrules' allow-list of constants (dtypes, layouts, memory formats, "
                        "numbers) or functions")]
    assert condition_diagnostics(A.CAttr(A.CName("math"), "pi")) == []
    assert condition_diagnostics(A.CAttr(A.CName("torch"), "float32")) == []


# ---------------------------------------------------------------------------
# Replacements, against hand-made bindings
# ---------------------------------------------------------------------------


def replacement_diagnostics(text: str, bindings: Bindings = BOUND) -> list[tuple[str, str]]:
    rule = rule_of(f"call_function torch.relu($x) -> {text}\n")
    reporter = Reporter()
    check_replacements(reporter, targets(reporter), bindings, rule.replacements)
    return found(reporter)


def test_replacements_use_only_what_is_bound():
    assert replacement_diagnostics("call_function torch.add($x, 1)") == []
    assert replacement_diagnostics("call_function torch.add($x, $z)") == [
        ("unbound-capture", "the replacement uses `$z`, which the pattern does not bind")]
    assert replacement_diagnostics("call_module bn($x)") == []  # a matched module, called as it is
    assert replacement_diagnostics("conv") == [("unbound-name", "`conv` is not a node the pattern names with `as`")]
    assert replacement_diagnostics("_") == [("bad-replacement", "`_` matches anything, so it cannot be built")]


def test_a_replacement_never_creates_forbidden_calls():
    # the allow-list for replacements leaves out what reaches arbitrary attributes or callables
    (code, message), = replacement_diagnostics("call_function operator.attrgetter($x)")
    assert code == "not-allowed" and "operator.attrgetter" in message
    assert replacement_diagnostics("call_method __setattr__($x)")[-1][0] == "not-allowed"
    assert replacement_diagnostics("call_method __setattr__($x)")[-1][1].count("__setattr__") >= 1


def test_forwarded_ellipses_need_exactly_one_in_the_pattern():
    rule = rule_of("call_function torch.relu($x) -> call_function torch.add($x, ...)\n")

    def forwarded(ellipses: tuple[A.Span, ...]) -> list[str]:
        reporter = Reporter()
        check_forwarded_ellipses(reporter, rule.replacements, Bindings({"x": span(1)}, {}, ellipses))
        return [d.message for d in reporter.diagnostics]

    assert forwarded((span(20),)) == []
    assert forwarded(()) == ["the replacement forwards `...`, but the pattern has no `...` to take arguments from"]
    assert forwarded((span(20), span(40))) == [
        "the replacement forwards `...`, but the pattern has several; it would be ambiguous"]


# ---------------------------------------------------------------------------
# Identity, examples, names and the driver
# ---------------------------------------------------------------------------


def test_identity_compares_names_expanded_and_keywords_in_any_order():
    def identity(text: str, aliases: Aliases = NO_ALIASES) -> bool:
        rule = rule_of(text)
        return is_identity(rule.patterns, rule.replacements, aliases)

    assert identity("call_function F.relu($x, inplace=False) -> call_function torch.nn.functional.relu($x, inplace=False)")
    assert identity("call_module Linear{bias=True, in_features=2}($x) -> call_module torch.nn.Linear{in_features=2, bias=True}($x)")
    assert identity("call_function G.relu($x) -> call_function torch.nn.functional.relu($x)",
                    Aliases({"G": "torch.nn.functional"}))
    assert not identity("call_function G.relu($x) -> call_function torch.nn.functional.relu($x)")
    assert identity("call_module Dropout($x) -> call_module Dropout")  # a bare call forwards the pattern's arguments
    assert not identity("call_function torch.relu($x) -> call_function torch.relu($y)")


def test_an_identity_through_a_commutative_exchange_is_told_apart():
    def both(text: str) -> tuple:
        rule = rule_of(text)
        return (is_identity(rule.patterns, rule.replacements, NO_ALIASES),
                is_identity_as_written(rule.patterns, rule.replacements, NO_ALIASES))

    assert both("call_function torch.add($x, $y) -> call_function torch.add($y, $x)") == (True, False)
    assert both("call_function operator.mul($x, 2) -> call_function operator.mul(2, $x)") == (True, False)
    assert both("call_function torch.relu(call_function torch.add($x, $y)) -> "
                "call_function torch.relu(call_function torch.add($y, $x))") == (True, False)
    assert both("call_function torch.add($x, $y) -> call_function torch.add($x, $y)") == (True, True)
    assert both("call_function torch.sub($x, $y) -> call_function torch.sub($y, $x)") == (False, False)
    messages = []
    for text in ("call_function torch.add($x, $y) -> call_function torch.add($y, $x)",
                 "call_function torch.add($x, $y) -> call_function torch.add($x, $y)"):
        reporter = Reporter()
        check_rule(reporter, targets(reporter), rule_of(text))
        [error] = reporter.diagnostics
        assert error.code == "identity-rewrite"
        messages.append(error.message)
    assert [("exchanged" in m, "identical" in m) for m in messages] == [(True, False), (False, True)]


def test_example_inputs_are_bounded_and_declared_once():
    reporter = Reporter()
    inputs = (A.InputSpec("x", None, (2, 8), None, span(1)), A.InputSpec("x", None, (2,), None, span(10)),
              A.InputSpec("w", "float33", (4097,), None, span(20)))
    declared = check_inputs(reporter, inputs)
    assert list(declared) == ["x", "w"] and declared["x"].shape == (2, 8)  # the first declaration counts
    assert [(d.code, d.column) for d in reporter.diagnostics] == [("bad-example", 10), ("bad-example", 20),
                                                                  ("bad-example", 20)]
    assert reporter.diagnostics[1].notes[-1] == "did you mean `float32`?"


def test_an_example_warns_about_an_unused_input_and_bounds_its_count():
    rule = rule_of(f"call_function torch.relu($x) -> call_function torch.abs($x)\n"
                   f"example {MAX_EXAMPLE_COUNT + 1}: call_function torch.relu($x) given $x: [2], $y: [3]\n")
    reporter = Reporter()
    check_example(reporter, targets(reporter), rule.examples[0])
    assert [(d.severity, d.message) for d in reporter.diagnostics] == [
        ("error", f"an example may ask for at most {MAX_EXAMPLE_COUNT} rewrites"),
        ("warning", "`$y` is declared but the example does not use it"),
    ]
    assert reporter.errors == 1


def test_a_failed_resolution_is_reported_once_under_the_policy_code():
    resolver = Resolver()
    unknown = Resolution("unknown-alias", "bad.f", message="`bad` is neither an alias ...")
    reporter = Reporter()
    report_resolution(reporter, resolver, span(1), unknown, "unknown-target", {"bad"})
    assert reporter.diagnostics == []  # its `use` line was reported already
    report_resolution(reporter, resolver, span(1), unknown, "unknown-target", set())
    assert [d.code for d in reporter.diagnostics] == ["unknown-alias"]
    reporter = Reporter()
    report_resolution(reporter, resolver, span(1), resolver.resolve("math.sqr"), "unknown-target", set())
    assert [(d.code, d.notes) for d in reporter.diagnostics] == [("unknown-target", ("did you mean `math.sqrt`?",))]


def test_names_under_a_reported_alias_are_not_reported_again():
    reporter = Reporter()
    names = targets(reporter, Aliases({"bad": "nowhere_zz"}, frozenset({"bad"})))
    names.constant(A.Dotted(("bad", "x")))
    names.function_target(A.Dotted(("bad", "f")), Position.PATTERN)
    assert names.module_type(A.Dotted(("bad", "M"))) is None
    assert reporter.diagnostics == []
    names.function_target(A.Dotted(("nowhere_zz", "f")), Position.REPLACEMENT)
    assert [d.code for d in reporter.diagnostics] == ["unknown-alias"]


def test_contract_words():
    reporter = Reporter()
    assert contract_word(reporter, None) is None
    assert contract_word(reporter, A.Contract("exact")) == "exact"
    assert contract_word(reporter, A.Contract("exakt")) is None
    assert [(d.code, d.notes[-1]) for d in reporter.diagnostics] == [("bad-contract", "did you mean `exact`?")]


def test_a_rule_is_checked_in_order_patterns_conditions_replacements_rule_examples():
    rule = rule_of("rule r:\n"
                   "    call_function torch.relu($x) where $q.ndim == 2 -> call_function torch.relu($z)\n"
                   "    example: call_function torch.relu($w) given $x: [2]\n")
    reporter = Reporter()
    check_rule(reporter, targets(reporter), rule)
    assert [d.code for d in reporter.diagnostics] == ["unbound-capture", "unbound-capture", "bad-example",
                                                      "bad-example"]
    assert [d.message.split(" uses")[0] for d in reporter.diagnostics[:2]] == ["the condition", "the replacement"]


def test_duplicate_rule_names_are_reported_at_the_later_rule():
    rule_file = parse_source(Source("t.fxr", "rule a:\n    call_module Dropout($x) -> $x\n"
                                             "rule a:\n    call_module Identity($x) -> $x\n"))
    (duplicate,) = check_duplicates(rule_file.rules)
    assert (duplicate.code, duplicate.line, duplicate.notes) == ("duplicate-rule", 3, ("first defined at t.fxr:1",))
