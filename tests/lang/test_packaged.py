"""The shipped tables as JSON (fxrules.lang.packaged): what the generators write and what the loaders read.
(That they are current and true of the installed torch: tests/tools/test_indexes.py; in the wheel:
tests/tools/test_release.py.)"""

import json
from pathlib import Path

import pytest

from fxrules.lang import allowlist, packaged, parser, torch_index

ROOT = Path(__file__).resolve().parents[2]
TABLES = ("parse_tables.json", "torch_index.json", "allowlist.json")


def test_json_text_is_deterministic_one_item_a_line_and_reads_back():
    fields = {"version": "2.13.0", "names": frozenset({"b", "a", "c"}), "pairs": [("x", 1), ("y", None)],
              "table": {"k": ("v", ["w"]), "j": None}, "empty": [], "nothing": {}}
    text = packaged.json_text("made by a test", fields)
    assert text == packaged.json_text("made by a test", dict(fields))
    lines = text.splitlines()
    assert lines[:3] == ["{", '"about": "made by a test",', '"version": "2.13.0",']
    assert '"names": [' in lines and lines[lines.index('"names": [') + 1:][:3] == ['"a",', '"b",', '"c"']
    assert '["x", 1],' in lines and '["y", null]' in lines
    assert '"k": ["v", ["w"]],' in lines and '"j": null' in lines
    assert '"empty": [],' in lines and '"nothing": {}' in lines
    assert text.endswith("}\n")
    assert json.loads(text) == {"about": "made by a test", "version": "2.13.0", "names": ["a", "b", "c"],
                                "pairs": [["x", 1], ["y", None]], "table": {"k": ["v", ["w"]], "j": None},
                                "empty": [], "nothing": {}}


def test_json_text_refuses_keys_json_would_turn_into_strings():
    with pytest.raises(TypeError, match="keys must be strings"):
        packaged.json_text("x", {"table": {1: "one"}})


def test_a_damaged_table_is_named():
    with pytest.raises(FileNotFoundError, match=r"fxrules/lang/no_such_table\.json"):
        packaged.read_json("no_such_table.json")


def test_read_json_refuses_a_file_that_is_not_an_object(monkeypatch, tmp_path):
    (tmp_path / "list.json").write_text("[1, 2]", encoding="utf-8")
    monkeypatch.setattr(packaged, "HERE", str(tmp_path))
    with pytest.raises(ValueError, match=r"fxrules/lang/list\.json: expected a JSON object, found list"):
        packaged.read_json("list.json")


@pytest.mark.parametrize("name", TABLES)
def test_each_shipped_table_is_an_object_with_its_about(name):
    data = packaged.read_json(name)
    assert isinstance(data, dict) and data["about"].startswith(("The LALR", "What ")), data.get("about")
    assert (ROOT / "fxrules" / "lang" / name).read_text(encoding="utf-8").endswith("}\n")


def test_the_loaders_give_frozen_tables():
    assert isinstance(allowlist.FUNCTIONS, frozenset) and "torch.relu" in allowlist.FUNCTIONS
    assert isinstance(allowlist.OPERATORS["aten"], frozenset) and "add" in allowlist.OPERATORS["aten"]
    assert "torch.nn.Dropout" in allowlist.RANDOM_MODULE_TYPES
    assert not hasattr(allowlist, "_data")  # the raw lists are not kept beside the frozensets
    data = torch_index._data()
    assert isinstance(data.callables, frozenset) and "torch.relu" in data.callables
    name, parameters, required = data.module_classes["torch.nn.Conv2d"]
    assert name == "Conv2d" and isinstance(parameters, tuple) and required[:2] == ("in_channels", "out_channels")
    assert isinstance(data.operators["aten.add"], tuple) and "Tensor" in data.operators["aten.add"]
    with pytest.raises(AttributeError):
        data.callables = frozenset()  # frozen


def test_the_parse_tables_read_from_json_parse_as_lark_does():
    tables = parser.shipped_tables(packaged.read_json(parser.PARSE_TABLES_FILE))
    assert tables is not None and tables.by_rule == {}
    text = "rule r [exact]:\n    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)\n"
    from fxrules.lang.source import Source

    source = Source("r.fxr", text)
    assert parser.parse_direct(source) == parser.parse_lark(source)

