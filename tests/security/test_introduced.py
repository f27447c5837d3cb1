"""What a replacement may introduce: random numbers (only under [changes], or when its pattern draws them
too) and devices (only those its pattern names). Checked when the file is checked, without running
anything; the flags the first check reads (``RANDOM_*`` in the allow-list) are reviewed against torch.
"""

from __future__ import annotations

import pytest
import torch

import fxrules
from fxrules.lang import allowlist
from fxrules.lang.check.introduced import MAX_LITERAL_ELEMENTS, RANDOM_UNLESS


def codes(text: str) -> list[str]:
    try:
        fxrules.parse_rules(text)
    except fxrules.RuleFileError as exc:
        return [d.code for d in exc.diagnostics]
    return []


RANDOM_REPLACEMENTS = [
    "call_function torch.add($x, call_function torch.rand(2))",
    "call_function torch.add($x, call_function torch.randn_like($x))",
    "call_function torch.add($x, call_function torch.randint(0, 5, [2]))",
    "call_function torch.add($x, call_method sum(call_function torch.randperm(5)))",
    "call_function torch.bernoulli($x)",
    "call_function torch.normal($x, 1.0)",
    "call_function torch.poisson($x)",
    "call_function torch.multinomial($x, 1)",
    "call_method uniform_($x)",
    "call_method normal_($x)",
    "call_method random_($x)",
    "call_method bernoulli_($x)",
    "call_method exponential_($x)",
    "call_method cauchy_($x)",
    "call_function F.dropout($x, 0.5)",
    "call_function F.dropout($x, 0.5, True)",
    "call_function F.dropout($x, 0.5, training=$x)",
    "call_function F.dropout2d($x)",
    "call_function F.alpha_dropout($x, 0.5, True)",
    "call_function F.rrelu($x, training=True)",
    "call_function F.gumbel_softmax($x)",
    "call_function aten.dropout.default($x, 0.5, True)",
    "call_function aten.bernoulli.p($x, 0.5)",
    "call_function aten.native_dropout.default($x, 0.5, True)",
    "call_function torch.Tensor.uniform_($x)",
    "call_module Dropout{p=0.5}($x)",
    "call_module RReLU{}($x)",
    "call_function F.scaled_dot_product_attention($x, $x, $x, None, 0.1)",
]


@pytest.mark.parametrize("replacement", RANDOM_REPLACEMENTS)
@pytest.mark.parametrize("contract", ["exact", "approx"])
def test_an_exact_or_approx_replacement_may_not_draw_random_numbers(replacement, contract):
    assert "random-state" in codes(f"rule r [{contract}]: call_function torch.relu($x) -> {replacement}\n")


@pytest.mark.parametrize("replacement", RANDOM_REPLACEMENTS)
def test_a_changes_replacement_may(replacement):
    assert "random-state" not in codes(f"rule r [changes]: call_function torch.relu($x) -> {replacement}\n")


@pytest.mark.parametrize("rule", [
    # the pattern draws them too
    "call_function F.dropout($x, $p, True) -> call_function F.dropout(call_function torch.relu($x), $p, True)",
    "call_method uniform_($x) -> call_method uniform_(call_function torch.relu($x))",
    "call_module Dropout($x) as d -> call_module d(call_function torch.relu($x))",
    "call_module Dropout($x) -> call_module Dropout{p=0.5}(call_function torch.relu($x))",
    # no random numbers: training is the literal False, attention without dropout
    "call_function torch.relu($x) -> call_function F.dropout($x, 0.5, False)",
    "call_function torch.relu($x) -> call_function F.dropout($x, 0.5, training=False)",
    "call_function torch.relu($x) -> call_function aten.dropout.default($x, 0.5, False)",
    "call_function torch.relu($x) -> call_function F.rrelu($x)",
    "call_function torch.relu($x) -> call_function F.scaled_dot_product_attention($x, $x, $x)",
    "call_function torch.relu($x) -> call_function F.scaled_dot_product_attention($x, $x, $x, dropout_p=0.0)",
    # patterns and examples may name them
    "call_function F.dropout($x, 0.5, True) -> call_function F.dropout($x, 0.5, True, False)",
])
def test_what_is_not_introduced_or_not_random_is_allowed(rule):
    assert "random-state" not in codes(f"{rule}\n")


def test_examples_may_draw_random_numbers():
    assert codes("rule r [exact]: call_function torch.relu($x) -> call_method relu($x)\n"
                 "    example: call_function torch.relu(call_function F.dropout($x, 0.5, True)) given $x: [2]\n"
                 "    example 0: call_function torch.rand_like($x) given $x: [2]\n") == []


def test_the_random_flags_are_torchs_own():
    """Every aten op with an overload tagged nondeterministic_seeded is flagged, and every function or
    method on the table with the name of one; the flags name only what the table allows."""
    for name in allowlist.OPERATORS["aten"]:
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            continue
        tagged = any(torch.Tag.nondeterministic_seeded in getattr(packet, o).tags for o in packet.overloads())
        assert tagged <= (name in allowlist.RANDOM_OPERATORS["aten"]), name
    seeded = allowlist.RANDOM_OPERATORS["aten"] | allowlist.RANDOM_OPERATORS["prims"]
    for path in allowlist.FUNCTIONS:
        if path.startswith("torch.") and path.rsplit(".", 1)[-1] in seeded:
            assert allowlist.random_function(path), path
    for name in allowlist.TENSOR_METHODS:
        if name in seeded:
            assert allowlist.random_method(name), name
    assert allowlist.RANDOM_FUNCTIONS <= allowlist.FUNCTIONS
    assert allowlist.RANDOM_METHODS <= allowlist.TENSOR_METHODS
    assert allowlist.RANDOM_MODULE_TYPES <= allowlist.MODULE_TYPES
    # known ones, and known pure ones that a name-based flag would have caught
    for path in ("torch.rand", "torch.randn", "torch.randint", "torch.randperm", "torch.bernoulli", "torch.normal",
                 "torch.nn.functional.dropout", "torch.nn.functional.dropout2d", "torch.nn.functional.gumbel_softmax",
                 "torch.ops.aten.uniform.default", "torch.Tensor.exponential_"):
        assert allowlist.random_function(path), path
    for path in ("torch.nn.functional.normalize", "torch.lgamma", "torch.nn.functional.grid_sample", "torch.relu"):
        assert not allowlist.random_function(path), path
    assert set(RANDOM_UNLESS) <= {p.rsplit(".", 1)[-1] for p in allowlist.RANDOM_FUNCTIONS} | seeded


DEVICE_REPLACEMENTS = [
    'call_method to($x, "cuda")',
    'call_method to($x, "cuda:3")',
    'call_method to($x, "cpu")',
    'call_method to($x, "meta")',
    'call_method to($x, 1)',
    'call_method to($x, device="cuda")',
    'call_method to($x, "cuda", torch.float16)',
    'call_method cpu($x)',
    'call_function torch.Tensor.cpu($x)',
    'call_function torch.add($x, call_function torch.empty(2, device="cuda:3"))',
    'call_function torch.add($x, call_function torch.zeros(2, device=0))',
    'call_function torch.add($x, call_function torch.zeros(2, pin_memory=True))',
    'call_function aten._to_copy.default($x, device="cuda")',
    'call_function aten.to.device($x, "cuda", torch.float32)',
]


@pytest.mark.parametrize("replacement", DEVICE_REPLACEMENTS)
@pytest.mark.parametrize("contract", ["exact", "changes"])
def test_a_replacement_may_not_name_a_device_its_pattern_does_not(replacement, contract):
    assert "device-move" in codes(f"rule r [{contract}]: call_function torch.relu($x) -> {replacement}\n")


@pytest.mark.parametrize("rule", [
    'call_method to($x, "cuda") -> call_method to(call_function torch.relu($x), "cuda")',
    'call_method to($x, $d) -> call_method to(call_function torch.relu($x), $d)',
    'call_method to($x, device=$d) -> call_method to(call_function torch.relu($x), device=$d)',
    'call_method cpu($x) -> call_method cpu(call_function torch.relu($x))',
    'call_function torch.relu($x) -> call_method to($x, torch.float16)',
    'call_function torch.relu($x) -> call_method to($x, dtype=torch.float16)',
    'call_function torch.relu($x) -> call_function torch.add($x, call_function torch.zeros(2, device=None))',
    'call_function torch.relu($x) -> call_function torch.add($x, call_function torch.zeros(2, pin_memory=False))',
    'call_function torch.relu($x) -> call_function torch.add($x, call_function torch.zeros(1))',
])
def test_the_patterns_own_device_and_dtype_moves_are_allowed(rule):
    assert "device-move" not in codes(f"{rule}\n")


def test_an_example_may_name_the_cpu_only():
    head = "rule r: call_function torch.relu($x) -> call_method relu($x)\n"
    assert codes(head + '    example: call_function torch.relu(call_method to($x, "cpu")) given $x: [2]\n') == []
    assert codes(head + '    example: call_function torch.relu(call_method cpu($x)) given $x: [2]\n') == []
    assert codes(head + '    example: call_function torch.relu(call_method to($x, "cuda")) given $x: [2]\n') == [
        "device-move"]


def test_literal_sizes_at_the_limit_pass_and_one_over_does_not():
    rule = "rule r [changes]: call_function torch.relu($x) -> call_function torch.add($x, call_method sum(" \
           "call_function torch.zeros({}, {})))\n"
    assert codes(rule.format(4096, 4096)) == [] and 4096 * 4096 == MAX_LITERAL_ELEMENTS
    assert codes(rule.format(4096, 4097)) == ["allocation-budget"]
    assert codes("rule r [changes]: call_function torch.relu($x) -> call_function torch.add($x, call_method sum("
                 "call_function torch.randint(0, 100, [1000, 1000])))\n") == []  # the bounds are not sizes
    assert codes("rule r [changes]: call_function torch.relu($x) -> call_function torch.add($x, call_method sum("
                 "call_function torch.randint(0, 100, [10000, 10000])))\n") == ["allocation-budget"]
    huge = "9" * 4000  # a product of thousand-digit literals is never computed in full
    assert codes(rule.format(huge, huge)) == ["allocation-budget"]


def test_the_bundled_library_checks_clean():
    fxrules.load_rules(fxrules.LIBRARY)
