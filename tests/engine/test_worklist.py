"""The fixpoint's worklist (fxrules.engine.worklist): the first scan's entries read with a cursor, later ones
on a heap, taken least first as one heap of everything would give them."""

import heapq

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import fxrules
from fxrules.engine.worklist import Worklist

# An operation: ("first", rule, position) while the first scan runs, then ("add", rule, position) or ("pop",).
_first_entries = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40)), max_size=40)
_later_operations = st.lists(st.one_of(st.tuples(st.just("add"), st.integers(0, 3), st.integers(0, 60)),
                                       st.just(("pop",))), max_size=80)


def _entry(serial: int, rule: int, position: int) -> tuple:
    return (rule, (position,), serial, f"node{position}", f"rule{rule}")


@given(_first_entries, _later_operations, st.booleans())
def test_entries_come_out_as_from_one_heap(first, later, graph_order):
    """Whatever the first scan gives (in graph order per rule, as the driver's scan does, or in any order),
    and however adds and pops interleave afterwards, pop() gives what a heap of all of them gives."""
    if graph_order:
        first = sorted(first, key=lambda item: item[1])
    worklist, reference, serial = Worklist(), [], 0
    for rule, position in first:
        entry = _entry(serial, rule, position)
        serial += 1
        worklist.add_first(entry)
        heapq.heappush(reference, entry)
    assert len(worklist) == len(reference)
    for operation in later:
        if operation[0] == "add":
            entry = _entry(serial, operation[1], operation[2])
            serial += 1
            worklist.add(entry)
            heapq.heappush(reference, entry)
        else:
            assert worklist.pop() == (heapq.heappop(reference) if reference else None)
        assert len(worklist) == len(reference)
    while reference:
        assert worklist.pop() == heapq.heappop(reference)
    assert worklist.pop() is None and len(worklist) == 0


def test_an_entry_added_after_reading_began_is_taken_before_a_later_one_of_the_first_scan():
    worklist = Worklist()
    for serial, (rule, position) in enumerate([(1, 1), (1, 5), (1, 9), (0, 3)]):
        worklist.add_first(_entry(serial, rule, position))
    assert worklist.pop()[:2] == (0, (3,))  # the lowest rule first, though the scan found it last
    assert worklist.pop()[:2] == (1, (1,))
    worklist.add(_entry(10, 0, 7))  # a lower rule: before the rest of rule 1
    worklist.add(_entry(11, 1, 2))  # rule 1 again, at a position before the scan's next one
    assert [worklist.pop()[:2] for _ in range(4)] == [(0, (7,)), (1, (2,)), (1, (5,)), (1, (9,))]
    assert worklist.pop() is None
    worklist.add_first(_entry(12, 2, 0))  # a first-scan entry after reading began: still taken
    assert worklist.pop()[:2] == (2, (0,)) and worklist.pop() is None


def test_a_rewrite_by_a_later_rule_lets_an_earlier_rule_go_first():
    """The driver's order through the worklist: rule order first, then graph order, entries a rewrite adds
    included. Each sigmoid becomes a relu (the second rule), and the first rule then turns that relu into
    tanh before the second rule's next sigmoid is taken."""
    rules = fxrules.parse_rules("""
rule relu_to_tanh [changes]: call_function torch.relu($x) -> call_function torch.tanh($x)
rule sigmoid_to_relu [changes]: call_function torch.sigmoid($x) -> call_function torch.relu($x)
""", source="order.fxr")

    class Chain(nn.Module):
        def forward(self, x):
            return torch.sigmoid(torch.sigmoid(torch.sigmoid(x)))

    result = fxrules.apply_rules(Chain(), rules)
    assert [entry.rule for entry in result.report.applied] == ["sigmoid_to_relu", "relu_to_tanh"] * 3
    assert [n.target for n in result.module.graph.nodes if n.op == "call_function"] == [torch.tanh] * 3
    x = torch.randn(4)
    assert torch.equal(result.module(x), torch.tanh(torch.tanh(torch.tanh(x))))
