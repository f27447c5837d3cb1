"""The bundled rule library (fxrules/library, linked from the checkout's rules/).

Per-rule behaviour (each rule's examples, and host graphs drawn for it) is checked by
``fxrules verify``; these tests check the library as a whole:

* it loads and checks clean, from ``fxrules.LIBRARY`` and through the ``rules`` link;
* every rule has a description, an explicit contract, a positive and a negative example;
* its README index is current (``python -m fxrules.tools.library_index --check``);
* applied to the zoo models (traced, and exported for the aten family) it rewrites them and
  keeps their outputs (bit for bit where only ``[exact]`` rules fired);
* the ``[changes]`` swaps change what they should and keep the models running;
* a built wheel contains it, and an installed fxrules loads it without a checkout (slow).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import fxrules
from fxrules import zoo
import fxrules.tools.library_index as library_index
from fxrules.tools.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = {"aten", "canonicalize", "cleanup", "fold", "fuse", "swap"}
LIBRARY = fxrules.load_rules(fxrules.LIBRARY)
SAFE = LIBRARY.select(contracts=["exact", "approx"])
ATEN = fxrules.load_rules(fxrules.LIBRARY / "aten")


def rule_file(rule: fxrules.CheckedRule) -> Path:
    return Path(rule.source.rsplit(":", 1)[0])


FX_SAFE = SAFE.select(names=[r.name for r in SAFE if rule_file(r).parent.name != "aten"])  # traced-graph rules


# ---------------------------------------------------------------- the files


def test_library_is_inside_the_package():
    assert fxrules.LIBRARY == Path(fxrules.__file__).resolve().parent / "library"
    assert {p.name for p in fxrules.LIBRARY.iterdir() if p.is_dir()} == FAMILIES
    for family in FAMILIES:
        assert any((fxrules.LIBRARY / family).glob("*.fxr")), family


def test_rules_link_is_the_library():
    """In a checkout, rules/ is a link to fxrules/library, so both paths name the same files."""
    link = ROOT / "rules"
    assert link.is_symlink()
    assert link.resolve() == fxrules.LIBRARY
    assert fxrules.load_rules(link).names == LIBRARY.names


def test_library_loads_and_checks_clean(capsys):
    assert len(LIBRARY) >= 30
    assert not LIBRARY.warnings, [d.render() if hasattr(d, "render") else str(d) for d in LIBRARY.warnings]
    assert cli_main(["check", str(fxrules.LIBRARY)]) == 0
    out = capsys.readouterr().out
    assert f"{len(LIBRARY)} rules checked: no problems" in out


def test_families_load_on_their_own():
    total = 0
    for family in sorted(FAMILIES):
        rules = fxrules.load_rules(fxrules.LIBRARY / family)
        assert len(rules), family
        assert all(f"/{family}/" in rule.source.replace("\\", "/") for rule in rules)
        total += len(rules)
    assert total == len(LIBRARY)


@pytest.mark.parametrize("rule", list(LIBRARY), ids=LIBRARY.names)
def test_every_rule_is_documented_and_has_examples(rule):
    assert rule.ast.name == rule.name, "one-line rules have no name to document"
    assert rule.description and len(rule.description) >= 10, "a doc string says what the rule does"
    assert rule.ast.contract is not None, "the contract is written on the rule, not inherited"
    examples = rule.ast.examples
    assert any(e.count != 0 for e in examples), "no positive example"
    assert any(e.count == 0 for e in examples), "no negative example"


def test_contracts_by_family():
    """[changes] rules live in swap/, and every swap is one."""
    for rule in LIBRARY:
        family = rule_file(rule).parent.name
        assert (rule.contract == "changes") == (family == "swap"), rule


def test_readme_is_current():
    assert library_index.is_current(), "run `python -m fxrules.tools.library_index` to regenerate fxrules/library/README.md"
    text = library_index.readme_path().read_text(encoding="utf-8")
    for rule in LIBRARY:
        assert f"| `{rule.name}` |" in text


@pytest.mark.slow
def test_library_index_check_and_write(tmp_path, capsys):
    copy = tmp_path / "library"
    shutil.copytree(fxrules.LIBRARY, copy)
    assert library_index.main(["--check", "--library", str(copy)]) == 0
    extra = copy / "cleanup" / "zz_extra.fxr"
    extra.write_text('rule zz_extra "an extra rule for the test" [exact]:\n'
                     '    call_module Identity($x) -> $x\n'
                     '    example: call_module Identity{}($x) given $x: [2]\n'
                     '    example 0: call_function torch.relu($x) given $x: [2]\n')
    capsys.readouterr()
    assert library_index.main(["--check", "--library", str(copy)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert library_index.main(["--library", str(copy)]) == 0
    assert library_index.main(["--check", "--library", str(copy)]) == 0
    text = (copy / "README.md").read_text(encoding="utf-8")
    assert "| `zz_extra` | [cleanup/zz_extra.fxr](cleanup/zz_extra.fxr#L1) | `[exact]` | 1/1 | an extra rule for the test |" \
        in text


# ------------------------------------------------------------ the zoo models


# What the library must rewrite in each zoo model (at least these rules, at least once).
ZOO_EXPECTED = {
    "mlp": {"canonical_relu", "remove_dropout"},
    "resnet": {"fold_conv2d_bn", "remove_identity", "canonical_relu"},
    "transformer": {"remove_dropout", "canonical_gelu"},  # its contiguous() follows a transpose: kept
    "methods": {"double_transpose", "relu_idempotent", "canonical_relu", "mul_one", "view_chain"},
    "redundant": {"fold_conv2d_bn", "relu_idempotent", "remove_dropout", "flatten_2d_noop", "double_transpose",
                  "mul_one", "add_zero", "add_zero_bias", "add_self"},
}


def _outputs_kept(result, reference, inputs, exact: bool) -> None:
    with torch.no_grad():
        out = result.module(*inputs)
    if exact:
        assert_close(out, reference, rtol=0, atol=0)
    else:
        assert_close(out, reference)


@pytest.mark.parametrize("name", sorted(ZOO_EXPECTED))
@pytest.mark.slow
def test_library_rewrites_zoo_models_and_keeps_outputs(name):
    model = zoo.ZOO[name]()
    inputs = zoo.example_inputs(name)
    with torch.no_grad():
        reference = model(*inputs)
    result = fxrules.apply_rules(model, FX_SAFE, example_inputs=inputs)
    fired = set(result.counts)
    assert ZOO_EXPECTED[name] <= fired, f"expected {sorted(ZOO_EXPECTED[name] - fired)} to fire; fired {result.counts}"
    assert not any(rule.startswith("aten_") for rule in fired)
    only_exact = all(SAFE[rule].contract == "exact" for rule in fired)
    _outputs_kept(result, reference, inputs, only_exact)
    assert len(result.module.graph.nodes) < len(torch.fx.symbolic_trace(model).graph.nodes)
    again = fxrules.apply_rules(result.module, FX_SAFE, example_inputs=inputs)
    assert not again.counts, f"not a fixpoint: a second run fired {again.counts}"


# What the aten family must rewrite in each exported zoo model.
ATEN_EXPECTED = {
    "mlp": {"aten_dropout_eval"},
    "resnet": {"aten_fold_conv2d_bn"},
    "transformer": {"aten_dropout_eval"},
    "methods": {"aten_double_transpose", "aten_relu_idempotent", "aten_mul_one", "aten_view_chain"},
    "redundant": {"aten_dropout_eval", "aten_relu_idempotent", "aten_double_transpose", "aten_mul_one",
                  "aten_add_zero", "aten_flatten_noop", "aten_fold_conv2d_bn"},
}


@pytest.mark.parametrize("name", sorted(ATEN_EXPECTED))
@pytest.mark.slow
def test_aten_family_rewrites_exported_zoo_models(name):
    model = zoo.ZOO[name]()
    inputs = zoo.example_inputs(name)
    program = torch.export.export(model, inputs)
    with torch.no_grad():
        reference = program.module()(*inputs)
    result = fxrules.apply_rules(program, ATEN)
    fired = set(result.counts)
    assert ATEN_EXPECTED[name] <= fired, f"expected {sorted(ATEN_EXPECTED[name] - fired)}; fired {result.counts}"
    only_exact = all(ATEN[rule].contract == "exact" for rule in fired)
    _outputs_kept(result, reference, inputs, only_exact)
    assert len(result.module.graph.nodes) < len(program.module().graph.nodes)


def test_fx_rules_do_not_fire_on_export_graphs_and_aten_rules_not_on_traced_ones():
    inputs = zoo.example_inputs("redundant")
    program = torch.export.export(zoo.redundant(), inputs)
    fx_only = fxrules.apply_rules(program, FX_SAFE.select(names=["relu_idempotent", "remove_dropout",
                                                                 "double_transpose"]))
    assert not fx_only.counts
    aten_only = fxrules.apply_rules(zoo.redundant(), ATEN, example_inputs=inputs)
    assert not aten_only.counts


def test_swaps_change_values_and_keep_shapes():
    swaps = fxrules.load_rules(fxrules.LIBRARY / "swap")
    for name, expected in {"mlp": {"relu_to_leaky_relu"}, "transformer": {"gelu_exact_to_tanh"}}.items():
        model = zoo.ZOO[name]()
        inputs = zoo.example_inputs(name)
        with torch.no_grad():
            reference = model(*inputs)
            result = fxrules.apply_rules(model, swaps, example_inputs=inputs)
            out = result.module(*inputs)
        assert expected <= set(result.counts), result.counts
        assert out.shape == reference.shape and out.dtype == reference.dtype
        assert not torch.equal(out, reference), f"{name}: a [changes] swap fired but nothing changed"


def test_prune_linear_skips_square_layers_only():
    model = zoo.mlp()  # Linear 16->32, 32->32, 32->32, 32->10
    inputs = zoo.example_inputs("mlp")
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    square = sum(1 for m in linears if m.in_features == m.out_features)
    assert 0 < square < len(linears)
    rules = fxrules.load_rules(fxrules.LIBRARY / "swap").select(names=["prune_linear"])
    result = fxrules.apply_rules(model, rules, example_inputs=inputs)
    assert result.counts == {"prune_linear": square}
    with torch.no_grad():
        assert result.module(*inputs).shape == model(*inputs).shape


# ------------------------------------------------------------------ the wheel


def _copy_source(destination: Path) -> None:
    """What building needs, with links resolved (fxrules/lang/fxr.lark links to grammar/)."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, destination / name)
    shutil.copytree(ROOT / "fxrules", destination / "fxrules", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


@pytest.mark.slow
def test_wheel_contains_the_library_and_installed_fxrules_loads_it(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    _copy_source(source)
    wheels = tmp_path / "wheels"
    offline = ["--no-build-isolation"] if _has_setuptools() else []  # build with the setuptools at hand
    command = [sys.executable, "-m", "pip", "wheel", str(source), "-w", str(wheels), "--no-deps", "-q", *offline]
    build = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("fxrules-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {"fxrules/library/" + p.relative_to(fxrules.LIBRARY).as_posix()
                for p in fxrules.LIBRARY.rglob("*") if p.suffix in (".fxr", ".md")}
    assert len(expected) == len(list(fxrules.LIBRARY.rglob("*.fxr"))) + 1
    assert expected <= names, sorted(expected - names)
    assert "fxrules/lang/fxr.lark" in names

    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                              str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"  # no checkout here: the library must come from the installed package
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    script = ("import sys, fxrules\n"
              "assert fxrules.__file__.startswith(sys.argv[1]), fxrules.__file__\n"
              "library = fxrules.LIBRARY\n"
              "torch_loaded = 'torch' in sys.modules\n"
              "rules = fxrules.load_rules(library)\n"
              "cleanup = fxrules.load_rules(library / 'cleanup')\n"
              "print(len(rules), len(cleanup), torch_loaded)\n")
    run = subprocess.run([sys.executable, "-c", script, str(target)], cwd=elsewhere, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    count, cleanup_count, torch_loaded = run.stdout.split()
    assert int(count) == len(LIBRARY)
    assert int(cleanup_count) == len(fxrules.load_rules(fxrules.LIBRARY / "cleanup"))
    assert torch_loaded == "False", "fxrules.LIBRARY must not import torch"


def _has_setuptools() -> bool:
    """Whether the setuptools at hand can build the wheel (pyproject asks for >= 68; before 70.1
    it also needs the wheel package). If not, pip builds in isolation, fetching setuptools."""
    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(p) for p in setuptools.__version__.split(".")[:2] if p.isdigit())
    if version >= (70, 1):
        return True
    if version < (68, 0):
        return False
    try:
        import wheel  # noqa: F401
    except ImportError:
        return False
    return True
