"""Rule sets checked once per text: ``load_rules``/``apply_rules`` given paths reuse the RuleSet (and
so the engine's compiled matcher) while the files read the same, and never otherwise.

What is kept is keyed by each file's path and text and the import policy (fxrules/lang/load.py,
``CheckedRuleSets``). These tests edit files between loads the ways an editor or a build does (the
same size, the same modification time, a file added to a directory), load under other policies,
and break a file, and check that every load answers what a fresh check would.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import fxrules
from fxrules.engine import program
from fxrules.lang import load
from fxrules.lang.load import CHECKED

RELU = "rule relu_twice [exact]:\n    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)\n"
GELU = "rule gelu_twice [exact]:\n    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)\n"


@pytest.fixture(autouse=True)
def _forget():
    CHECKED.clear()
    yield
    CHECKED.clear()


class Twice(nn.Module):
    def forward(self, x):
        return torch.relu(torch.relu(x))


def test_the_same_text_gives_the_same_rule_set_and_compiled_matcher(tmp_path, monkeypatch):
    path = tmp_path / "r.fxr"
    path.write_text(RELU)
    analyzed = []
    real = load.analyze
    monkeypatch.setattr(load, "analyze", lambda *a: analyzed.append(1) or real(*a))
    first = fxrules.load_rules(path)
    assert fxrules.load_rules(str(path)) is first  # a Path and its string: one file name
    assert len(analyzed) == 1
    relative = os.path.relpath(path)
    assert fxrules.load_rules(relative) is not first  # another name: diagnostics would say another path
    assert len(analyzed) == 2
    x = torch.randn(3, 4)
    for _ in range(3):
        result = fxrules.apply_rules(Twice(), path)
        assert result.report.counts == {"relu_twice": 1}
        assert torch.equal(result.module(x), torch.relu(x))
    assert len(analyzed) == 2
    assert program.compile_rules(first) is program.compile_rules(fxrules.load_rules(path))


def test_an_edit_is_seen_even_with_the_same_size_and_modification_time(tmp_path):
    path = tmp_path / "r.fxr"
    path.write_text(RELU)
    stat = os.stat(path)
    first = fxrules.load_rules(path)
    assert first.names == ["relu_twice"]
    assert len(GELU) == len(RELU)
    path.write_text(GELU)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(path).st_size == stat.st_size and os.stat(path).st_mtime_ns == stat.st_mtime_ns
    second = fxrules.load_rules(path)
    assert second is not first and second.names == ["gelu_twice"]
    assert fxrules.apply_rules(Twice(), path).report.counts == {"gelu_twice": 1}
    path.write_text(RELU)
    assert fxrules.load_rules(path) is first  # the old text again: the rule set checked from it


def test_a_file_added_to_a_directory_is_loaded(tmp_path):
    (tmp_path / "a.fxr").write_text(RELU)
    first = fxrules.load_rules(tmp_path)
    assert first.names == ["relu_twice"]
    (tmp_path / "b.fxr").write_text(GELU.replace("gelu_twice", "other"))
    second = fxrules.load_rules(tmp_path)
    assert second.names == ["relu_twice", "other"]
    (tmp_path / "b.fxr").unlink()
    assert fxrules.load_rules(tmp_path) is first


def test_a_broken_file_fails_every_time_and_is_never_kept(tmp_path):
    path = tmp_path / "r.fxr"
    path.write_text(RELU)
    good = fxrules.load_rules(path)
    path.write_text(RELU.replace("torch.relu($x)) ->", "torch.nosuchthing($x)) ->"))
    for _ in range(2):
        with pytest.raises(fxrules.RuleFileError) as raised:
            fxrules.load_rules(path)
        assert "nosuchthing" in str(raised.value)
        assert f"{path}:2:" in str(raised.value)
    assert len(CHECKED) == 1
    path.write_text(RELU)
    assert fxrules.load_rules(path) is good


def test_another_policy_is_another_check(tmp_path):
    path = tmp_path / "r.fxr"
    path.write_text(RELU)
    plain = fxrules.load_rules(path)
    with_torch = fxrules.load_rules(path, allow_imports=["torch"])
    assert with_torch is not plain
    assert fxrules.load_rules(path, allow_imports=["torch"]) is with_torch
    assert fxrules.load_rules(path) is plain


def test_rule_sets_allowing_user_packages_are_not_kept(tmp_path):
    """A user's module can be reloaded under the same name (importlib.reload); a kept rule set would
    go on calling the old builder or predicate."""
    path = tmp_path / "r.fxr"
    path.write_text(RELU)
    first = fxrules.load_rules(path, allow_imports=["tests.fixtures"])
    second = fxrules.load_rules(path, allow_imports=["tests.fixtures"])
    assert first is not second
    assert len(CHECKED) == 0


def test_parse_rules_reuses_by_text_and_name():
    first = fxrules.parse_rules(RELU, "a.fxr")
    assert fxrules.parse_rules(RELU, "a.fxr") is first
    other_name = fxrules.parse_rules(RELU, "b.fxr")
    assert other_name is not first and other_name.rules[0].source == "b.fxr:1"


def test_at_most_size_rule_sets_are_kept_the_least_recent_dropped():
    texts = [RELU.replace("relu_twice", f"r{i}") for i in range(CHECKED.SIZE + 5)]
    first = fxrules.parse_rules(texts[0], "x.fxr")
    for text in texts[1:]:
        fxrules.parse_rules(text, "x.fxr")
        fxrules.parse_rules(texts[0], "x.fxr")  # used again each time: the most recent
    assert len(CHECKED) == CHECKED.SIZE
    assert fxrules.parse_rules(texts[0], "x.fxr") is first
    assert fxrules.parse_rules(texts[1], "x.fxr").names == ["r1"]  # dropped, checked again


def test_rule_sets_of_more_text_than_the_limit_are_not_kept(monkeypatch):
    monkeypatch.setattr(type(CHECKED), "MAX_TEXT", len(RELU) + 10)
    small = fxrules.parse_rules(RELU, "s.fxr")
    assert fxrules.parse_rules(RELU, "s.fxr") is small
    padded = RELU + "# " + "x" * 20 + "\n"
    large = fxrules.parse_rules(padded, "l.fxr")
    assert fxrules.parse_rules(padded, "l.fxr") is not large
    assert large.names == ["relu_twice"] and len(CHECKED) == 1
