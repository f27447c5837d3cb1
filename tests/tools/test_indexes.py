"""The shipped indexes (fxrules/tools/indexes.py): current, true of the installed torch, and what lets a
cold ``fxrules check`` run without building Lark's parser or importing torch."""

import subprocess
import sys
from pathlib import Path

import pytest

import fxrules
from fxrules.lang import packaged, parser, torch_index
from fxrules.lang.load import analyze, read_sources
from fxrules.lang.names import Resolver
from fxrules.lang.source import Source
from fxrules.lang.torch_index import Facts, Kind, describe
from fxrules.tools import indexes

ROOT = Path(__file__).resolve().parents[2]
CORPUS = sorted((ROOT / "tests" / "corpus").rglob("*.fxr"))


def test_the_shipped_parse_tables_are_current():
    assert indexes.PARSE_TABLES.read_text(encoding="utf-8") == indexes.parse_tables_text(), \
        "run python -m fxrules.tools.indexes"


def test_the_shipped_torch_index_is_current():
    pytest.importorskip("torch")
    assert indexes.TORCH_INDEX.read_text(encoding="utf-8") == indexes.torch_index_text(), \
        "run python -m fxrules.tools.indexes (the installed torch differs from the one the index was made from)"


def test_every_index_entry_is_what_resolving_says():
    """Each answer of the index, against the object the Resolver finds in the installed torch."""
    pytest.importorskip("torch")
    assert torch_index.answers()
    resolver = Resolver()
    data = torch_index._data()
    paths = set(data.modules) | set(data.classes) | set(data.callables) | set(data.values) | set(data.module_classes)
    paths |= {f"torch.ops.{op}.{overload}" for op, overloads in data.operators.items() for overload in overloads}
    assert len(paths) > 5000
    wrong = []
    for path in sorted(paths):
        resolution = resolver.resolve(path)
        facts = torch_index.look_up(path)
        if not resolution.ok or facts != describe(resolution.value):
            wrong.append((path, resolution.status, facts))
    assert not wrong, wrong[:10]
    import torch

    assert all(hasattr(torch.Tensor, name) for name in data.tensor_attributes)


def test_the_index_answers_only_for_its_torch_release(monkeypatch):
    pytest.importorskip("torch")
    assert torch_index.look_up("torch.relu") == Facts(Kind.CALLABLE, True)
    assert torch_index.look_up("torch.nn.Conv2d").constructor.required[:3] == ("in_channels", "out_channels",
                                                                              "kernel_size")
    assert torch_index.look_up("torch.relux") is None  # a miss: resolved, and reported, as before
    assert torch_index.look_up("operator.add") is None  # not torch's: resolving it imports nothing
    monkeypatch.setattr(torch_index, "torch_version", lambda: torch_index.release(torch_index._data().torch_version)
                        + "+cu999")
    assert torch_index.look_up("torch.relu") is not None  # another build of the same release
    monkeypatch.setattr(torch_index, "torch_version", lambda: "1.0.0")
    assert torch_index.look_up("torch.relu") is None
    assert not torch_index.tensor_has("add")
    monkeypatch.setattr(torch_index, "torch_version", lambda: None)
    assert torch_index.look_up("torch.relu") is None


def test_the_installed_version_is_read_without_importing_torch():
    pytest.importorskip("torch")
    import torch

    assert torch_index._installed_version() == torch.__version__


@pytest.mark.slow
def test_checking_the_corpus_says_the_same_with_and_without_the_index(monkeypatch):
    """Every diagnostic of every corpus file (good and bad), the same whether the index answers or not."""
    pytest.importorskip("torch")
    with_index = _check_corpus()
    monkeypatch.setattr(torch_index, "answers", lambda: False)
    assert _check_corpus() == with_index
    assert with_index[1] and with_index[0] > 10


def _check_corpus() -> tuple:
    sources, _ = read_sources([str(p) for p in CORPUS])
    rule_set, found = analyze(sources, Resolver())
    return len(rule_set), [(d.path, d.line, d.column, d.code, d.message, tuple(d.notes)) for d in found]


def test_the_direct_loop_on_the_shipped_tables_makes_lark_loops_ast():
    assert parser.tables().by_rule == {}  # the shipped tables: Lark's parser was not needed
    for path in sorted(fxrules.LIBRARY.rglob("*.fxr")) + CORPUS[:40]:
        source = Source(str(path), path.read_text(encoding="utf-8"))
        try:
            direct = parser.parse_direct(source)
        except parser.NotDirect:
            continue
        assert direct == parser.parse_lark(source), path


def test_tables_made_from_another_grammar_are_not_used():
    data = packaged.read_json(parser.PARSE_TABLES_FILE)
    assert parser.shipped_tables(data) is not None
    assert parser.shipped_tables({**data, "grammar": data["grammar"] + "\n// changed\n"}) is None
    assert parser.lark_tables().by_rule  # what tables() falls back to


def test_a_clean_check_neither_imports_torch_nor_builds_lark_parser():
    code = ("import sys; from fxrules.tools.cli import main; rc = main(['check', '-q', sys.argv[1]]); "
            "import fxrules.lang.parser as p; print(rc, 'torch' in sys.modules, p._parser is None)")
    out = subprocess.run([sys.executable, "-c", code, str(fxrules.LIBRARY)], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.stdout.split() == ["0", "False", "True"], out.stderr


@pytest.mark.slow
def test_a_miss_imports_torch_and_reports_as_before(tmp_path):
    pytest.importorskip("torch")
    rule = tmp_path / "typo.fxr"
    rule.write_text("rule r:\n    call_function torch.relux($x) -> $x\n", encoding="utf-8")
    code = ("import sys; from fxrules.tools.cli import main; rc = main(['check', sys.argv[1]]); "
            "print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(rule)], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.stdout.split()[-2:] == ["1", "True"], out.stdout + out.stderr
    assert "did you mean `torch.relu`?" in out.stdout + out.stderr
