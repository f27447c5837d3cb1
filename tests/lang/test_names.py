"""Name resolution under the import policy (fxrules/lang/names.py) and replacement-only refusals."""

import pytest

import fxrules
from fxrules.lang.names import Resolver


@pytest.mark.parametrize("path, status", [
    ("torch.relu", "ok"), ("operator.add", "ok"), ("torch.nn.Linear", "ok"), ("math.pi", "ok"),
    ("torch.ops.aten.relu.default", "ok"), ("fxrules.builders.fold_conv_bn", "ok"),
    ("os.system", "forbidden-target"), ("subprocess.run", "forbidden-target"),
    ("builtins.eval", "forbidden-target"), ("torch.load", "forbidden-target"),
    ("torch.hub.load", "forbidden-target"), ("torch.relu.__globals__", "forbidden-target"),
    ("json.dumps", "import-not-allowed"), ("no_such_package_xyz.f", "unknown-alias"),
    ("torch.no_such_function", "unknown-target"),
])
def test_resolution_statuses(path, status):
    assert Resolver().resolve(path).status == status


@pytest.mark.parametrize("path", ["torch.os", "torch.fx.graph.os.system", "torch._utils.sys"])
def test_a_re_exported_module_outside_the_policy_is_refused(path):
    """A name under an allowed root that reaches os or sys through a re-export is refused by origin."""
    resolution = Resolver().resolve(path)
    assert resolution.status == "forbidden-target", resolution


def test_allow_imports_opens_a_package():
    assert Resolver(["json"]).resolve("json.dumps").status == "ok"


@pytest.mark.parametrize("replacement", [
    "call_function builtins.getattr($x, \"__class__\")",
    "call_function getattr($x, \"shape\")",
    "call_function operator.attrgetter(\"shape\")",
    "call_method __reduce__($x)",
])
def test_replacements_may_not_create_attribute_reaching_calls(replacement):
    with pytest.raises(fxrules.RuleFileError) as info:
        fxrules.parse_rules(f"rule r: call_function torch.relu($x) -> {replacement}\n")
    assert [d.code for d in info.value.diagnostics] == ["not-allowed"]


def test_patterns_may_match_getattr_calls():
    rules = fxrules.parse_rules('rule r: call_function getattr($x, "shape") -> call_method size($x)\n')
    assert rules.names == ["r"]
