"""Process-wide state (fxrules.lang.runtime) and the engine's memo of compiled rules.

The API's entry points hold ``runtime.entered()``: the garbage collector paused and the
recursion limit raised while they work, both as they were afterwards, whether the call
returned or raised, and nested entries restore nothing early. The engine remembers what it
compiled per RuleSet object, weakly: a second apply reuses it, and it keeps no RuleSet alive.
"""

from __future__ import annotations

import gc
import sys
import threading
import weakref

import pytest
import torch
from torch import nn

import fxrules
import fxrules.engine.program as program
from fxrules.lang import runtime
from fxrules.lang.load import CHECKED

RULE = "rule r:\n    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)\n"


class Twice(nn.Module):
    def forward(self, x):
        return torch.relu(torch.relu(x))


@pytest.fixture
def low_limit():
    """A recursion limit below the runtime's (the test suite may run with any), restored after."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(3000)
    yield 3000
    sys.setrecursionlimit(before)


def _state() -> tuple[int, bool]:
    return sys.getrecursionlimit(), gc.isenabled()


def test_entered_sets_and_restores(low_limit):
    assert _state() == (low_limit, True)
    with runtime.entered():
        assert _state() == (runtime.RECURSION_LIMIT, False)
        with runtime.entered():
            assert _state() == (runtime.RECURSION_LIMIT, False)
        assert _state() == (runtime.RECURSION_LIMIT, False)  # the inner exit restores nothing
    assert _state() == (low_limit, True)


def test_entered_restores_after_an_exception(low_limit):
    with pytest.raises(KeyError):
        with runtime.entered():
            with runtime.entered():
                raise KeyError("x")
    assert _state() == (low_limit, True)


def test_a_callers_settings_stay():
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(runtime.RECURSION_LIMIT * 2)
    gc.disable()
    try:
        with runtime.entered():
            assert _state() == (runtime.RECURSION_LIMIT * 2, False)
        assert _state() == (runtime.RECURSION_LIMIT * 2, False)
    finally:
        gc.enable()
        sys.setrecursionlimit(before)


def test_entries_from_two_threads_are_counted(low_limit):
    inside, leave = threading.Event(), threading.Event()

    def other():
        with runtime.entered():
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    with runtime.entered():
        thread.start()
        assert inside.wait(10)
    assert _state() == (runtime.RECURSION_LIMIT, False)  # the other thread is still inside
    leave.set()
    thread.join(10)
    assert _state() == (low_limit, True)


def test_the_api_entry_points_restore_the_process_state(low_limit, tmp_path):
    path = tmp_path / "r.fxr"
    path.write_text(RULE)
    seen = []

    def during(*args, **kwargs):
        seen.append(_state())
        return real(*args, **kwargs)

    real = program.compile_rules
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("fxrules.engine.driver.compile_rules", during)
        rules = fxrules.load_rules(path)
        assert _state() == (low_limit, True)
        result = fxrules.apply_rules(Twice(), rules)
        assert result.report.counts == {"r": 1}
        fxrules.find_matches(Twice(), rules)
        fxrules.explain(Twice(), rules)
    assert seen == [(runtime.RECURSION_LIMIT, False)] * 3
    assert _state() == (low_limit, True)
    with pytest.raises(fxrules.RuleFileError):
        fxrules.parse_rules("rule r:\n    call_function torch.relu(\n")
    with pytest.raises(fxrules.RuleFileError):
        fxrules.load_rules(tmp_path / "missing.fxr")
    with pytest.raises(fxrules.ModelError):
        fxrules.apply_rules(object(), rules)
    assert _state() == (low_limit, True)


def test_deep_nesting_is_checked_under_a_low_limit(low_limit):
    """The stages rely on the entry's limit, not on one they set themselves."""
    import fxrules.lang.parser as parser

    depth = parser.MAX_DEPTH - 2
    pattern = "$x"
    for _ in range(depth):
        pattern = f"call_function torch.relu({pattern})"
    sys.setrecursionlimit(1000)
    rules = fxrules.parse_rules(f"rule deep:\n    {pattern} -> $x\n")
    assert rules.names == ["deep"]
    assert sys.getrecursionlimit() == 1000


def test_a_second_apply_reuses_the_compiled_rules(monkeypatch):
    rules = fxrules.parse_rules(RULE)
    compiled = []
    real = program.RuleCompiler.program

    def counting(self):
        compiled.append(self)
        return real(self)

    monkeypatch.setattr(program.RuleCompiler, "program", counting)
    fxrules.apply_rules(Twice(), rules)
    fxrules.apply_rules(Twice(), rules)
    assert len(compiled) == 1
    assert program.compile_rules(rules) is program.compile_rules(rules)
    assert fxrules.parse_rules(RULE) is rules  # the same text: the rule set checked then (load.CHECKED)
    CHECKED.clear()
    again = fxrules.parse_rules(RULE)  # checked again: equal rules, another object, compiled for itself
    assert again is not rules
    assert program.compile_rules(again) is not program.compile_rules(rules)
    assert len(compiled) == 2
    assert not hasattr(rules, "cache") and not hasattr(rules, "__dict__")  # nothing written into it


@pytest.mark.slow
def test_the_memo_keeps_no_rule_set_alive():
    rules = fxrules.parse_rules(RULE)
    fxrules.apply_rules(Twice(), rules)
    assert rules in program._compiled
    before = len(program._compiled)
    ref = weakref.ref(rules)
    CHECKED.clear()  # (which keeps the last rule sets checked, for parse_rules of the same text)
    del rules
    gc.collect()
    assert ref() is None
    assert len(program._compiled) == before - 1


def test_torchs_log_of_an_op_failing_on_fake_tensors_is_silenced_only_while_entered(caplog):
    """fxrules runs ops on fake tensors to learn shapes; one that fails there is handled, so torch's
    ERROR-level traceback for it is not the user's log. Other records of that logger still pass."""
    import logging

    from fxrules.lang import runtime

    log = logging.getLogger("torch._subclasses.fake_tensor")
    with caplog.at_level(logging.ERROR, logger=log.name):
        with runtime.entered():
            log.error("failed while attempting to run meta for %s", "aten.add.Tensor")
            log.error("something else")
        assert [r.getMessage() for r in caplog.records] == ["something else"]
        log.error("failed while attempting to run meta for %s", "aten.mul.Tensor")
    assert [r.getMessage() for r in caplog.records][-1] == "failed while attempting to run meta for aten.mul.Tensor"
    assert runtime._QUIET_FAKE_KERNELS not in log.filters
