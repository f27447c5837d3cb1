"""``fxrules apply`` and ``fxrules explain`` through the real CLI.

Every option, the json schemas (docs/cli.md), the saved module (``--out``) reloaded in a
fresh interpreter and compared with the in-memory rewrite, pictures (``--graph``) with a
fake ``dot`` and with none, bundled rule families, and each bad input: one line on
stderr, exit 2, never a traceback.

Every command line runs in process: ``fxrules.tools.cli.main(argv)`` (what ``python -m
fxrules`` calls) with pytest's ``capfd``, which captures file descriptors 1 and 2, so a
test sees exactly what a subprocess would print, torch's own logging included. Several
tests read one run, so each command line runs once per module (``runs``). Subprocesses
only where a fresh interpreter is the point: the saved modules reloaded where nothing of
the run is imported, and ``python -m fxrules`` itself (full runs on a terminal are in
test_progress.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fxrules
from fxrules.tools.cli import main

HERE = Path(__file__).resolve().parents[1]  # tests/
ROOT = HERE.parent
from tests.tools.test_drawing import make_fake_dot  # noqa: E402  (the fake Graphviz: records what it is given)

LIBRARY = getattr(fxrules, "LIBRARY", None)
REDUNDANT = ["--model", "fxrules.zoo:redundant"]
IMAGE = ["--input", "2x3x16x16"]

# Rules with no conditions on shapes: they apply without --input (no metadata, a cheap run).
SIMPLE = """\
rule remove_dropout [exact]:
    call_module Dropout($x) as d where not d.training -> $x

rule relu_idempotent [exact]:
    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)

rule double_transpose [exact]:
    call_method transpose(call_method transpose($x, $a, $b), $a, $b) -> $x
"""

# For explain: the condition fails on a model in training mode; its position is line 3, column 11.
FOLD = """\
rule fold_conv2d_bn [approx]:
    call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn
    where not bn.training
    -> call_module fxrules.builders.fold_conv_bn(conv, bn)($x)

rule double_relu [exact]:
    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)
"""

ATEN = """\
rule aten_relu_idempotent [exact]:
    call_function aten.relu.default(call_function aten.relu.default($x)) -> call_function aten.relu.default($x)
"""

NEEDS_SHAPES = """\
rule flatten_2d_noop [exact]:
    call_function torch.flatten($x, 1) where $x.ndim == 2 -> $x
"""

BROKEN = "rule broken [exact]:\n    call_module Dropout($x) -> $y\n"

# A rule that applies cleanly and breaks the model: the rewritten module raises on the inputs.
BREAKS = "rule breaks [changes]:\n    call_function torch.relu($x) -> call_method view($x, 7, 7)\n"

# A model module with no torch import: its failures must not need torch either.
LIGHT = """\
def raises():
    raise RuntimeError("boom\\nsecond line of the message")

def not_module():
    return 42
"""

MODELS = """\
import torch
from torch import nn

from fxrules import zoo


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it, torch.export refuses it
            return x * 2
        return x


def branchy():
    return Branchy()


def train_resnet():
    model = zoo.resnet()
    model.train()
    return model


INSTANCE = zoo.redundant()  # an nn.Module itself, not a factory


class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout()

    def forward(self, x, y):
        return {"a": self.drop(x), "b": [y.transpose(0, 1).transpose(0, 1), x + y]}


def dict_out():
    return DictOut().eval()
"""

RELOAD = """\
import sys

import torch

import fxrules

outputs = {}
for directory in sys.argv[2:]:
    module = fxrules.load_saved(directory)
    assert isinstance(module, torch.fx.GraphModule), type(module)
    generator = torch.Generator().manual_seed(0)  # the inputs fxrules apply made from --input 2x3x16x16
    x = torch.randn(2, 3, 16, 16, generator=generator)
    with torch.no_grad():
        outputs[directory] = module(x)
torch.save(outputs, sys.argv[1])
"""


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def _start(args: list[str], env: dict, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("cli_apply")
    files = {"simple.fxr": SIMPLE, "fold.fxr": FOLD, "aten_relu.fxr": ATEN, "needs_shapes.fxr": NEEDS_SHAPES,
             "broken.fxr": BROKEN, "breaks.fxr": BREAKS, "cli_light.py": LIGHT, "cli_models.py": MODELS, "reload.py": RELOAD,
             # a bundled-library stand-in, and a local directory with the name of one of its families
             "lib/myfam/drop.fxr": SIMPLE.split("\n\n")[0] + "\n",
             "lib/shadowed/never.fxr": "rule never_used [exact]:\n    call_module Identity($x) -> $x\n",
             "shadowed/transpose.fxr": SIMPLE.split("\n\n")[2]}
    for name, text in files.items():
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    make_fake_dot(work / "fakebin")
    (work / "emptybin").mkdir()
    (work / "a_file").write_text("not a directory\n")
    (work / "late" / "module.py").mkdir(parents=True)  # --out passes the early check, then cannot be written
    return work


def _command_lines(w: Path) -> dict:
    """Every command line the tests read: key -> (argv, the bundled library to use or None, environment)."""
    empty = {"PATH": str(w / "emptybin")}
    fake = {"PATH": str(w / "fakebin"), "FAKE_DOT_LOG": str(w / "dot_json.log")}
    simple = str(w / "simple.fxr")
    cleanup = "cleanup" if LIBRARY is not None else str(ROOT / "rules")
    return {
        "json": (["apply", cleanup, *REDUNDANT, *IMAGE, "--diff", "--out", str(w / "out_json"), "--graph",
                  str(w / "g_json.svg"), "--format", "json"], None, fake),
        "text": (["apply", simple, *REDUNDANT, "--diff", "--out", str(w / "out_text"), "--graph",
                  str(w / "g_text.png")], None, empty),
        "export": (["apply", str(w / "aten_relu.fxr"), *REDUNDANT, *IMAGE, "--export", "--out",
                    str(w / "out_export"), "--graph", str(w / "g_export.html"), "--format", "json"], None, empty),
        "instance": (["apply", simple, "--model", "cli_models:INSTANCE", "--graph", str(w / "g_instance.dot")],
                     None, empty),
        "dict_out": (["apply", simple, "--model", "cli_models:dict_out", "--input", "2x3", "--input", "2x3",
                      "--out", str(w / "out_dict"), "--format", "json"], None, empty),
        "bad_inputs": (["apply", simple, *REDUNDANT, "--input", "2x5"], None, empty),
        "explain": (["explain", str(w / "fold.fxr"), "--model", "cli_models:train_resnet", *IMAGE], None, empty),
        "explain_json": (["explain", str(w / "aten_relu.fxr"), "--model", "cli_models:train_resnet", *IMAGE,
                          "--export", "--format", "json", "--rule", "aten_relu_idempotent"], None, empty),
        "explain_no_rule": (["explain", str(w / "fold.fxr"), *REDUNDANT, "--rule", "nope"], None, empty),
        "no_module": (["apply", simple, "--model", "no_such_pkg_xyz.models:make"], None, empty),
        "no_attribute": (["apply", simple, "--model", "cli_light:nope"], None, empty),
        "bad_spec": (["apply", simple, "--model", "cli_light"], None, empty),
        "factory_raises": (["apply", simple, "--model", "cli_light:raises"], None, empty),
        "not_module": (["apply", simple, "--model", "cli_light:not_module"], None, empty),
        "no_trace": (["apply", simple, "--model", "cli_models:branchy"], None, empty),
        "out_late": (["apply", simple, *REDUNDANT, "--out", str(w / "late")], None, empty),
        "rule_file": (["apply", str(w / "broken.fxr"), *REDUNDANT], None, empty),
        "needs_shapes": (["apply", str(w / "needs_shapes.fxr"), *REDUNDANT], None, empty),
        "breaks": (["apply", str(w / "breaks.fxr"), *REDUNDANT, *IMAGE], None, empty),
        "families": (["apply", "myfam", "shadowed", *REDUNDANT, "--format", "json"], str(w / "lib"), empty),
        "no_family": (["apply", "nosuch", *REDUNDANT], str(w / "lib"), empty),
        "export_no_input": (["apply", simple, *REDUNDANT, "--export"], None, empty),
        "bad_shape": (["apply", simple, *REDUNDANT, "--input", "2xq"], None, empty),
        "out_under_file": (["apply", simple, *REDUNDANT, "--out", str(w / "a_file" / "x")], None, empty),
        "out_is_file": (["apply", simple, *REDUNDANT, "--out", str(w / "a_file")], None, empty),
        "graph_suffix": (["apply", simple, *REDUNDANT, "--graph", str(w / "g.jpg")], None, empty),
        "no_model": (["apply", simple], None, empty),
    }


class Runs:
    """Each command line's (exit code, stdout, stderr), run in process the first time a test asks for it.

    A run happens inside the test that first asks, with that test's ``capfd`` and ``monkeypatch``:
    the working directory is the module's work directory (where the model modules are importable),
    the environment and ``fxrules.LIBRARY`` are the command line's, all restored after the test.
    """

    def __init__(self, work: Path, processes: dict[str, subprocess.Popen]):
        self.work = work
        self.lines = _command_lines(work)
        self.processes = processes  # SUBPROCESSES, started: finished when a test first asks
        self.results: dict[str, tuple[int, str, str]] = {}
        self.capfd = self.monkeypatch = None

    def __getitem__(self, key: str) -> tuple[int, str, str]:
        if key not in self.results:
            found = self.processes.get(key)
            self.results[key] = _finish(found) if found is not None else self._run(*self.lines[key])
        return self.results[key]

    def _run(self, argv: list[str], library: str | None, env: dict) -> tuple[int, str, str]:
        monkeypatch, capfd = self.monkeypatch, self.capfd
        with monkeypatch.context() as patch:
            patch.chdir(self.work)
            patch.syspath_prepend(str(self.work))
            patch.delenv("FAKE_DOT_FAIL", raising=False)
            for name, value in env.items():
                patch.setenv(name, value)
            if library is not None:
                patch.setattr(fxrules, "LIBRARY", Path(library))
            capfd.readouterr()
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse
                code = exc.code
            out, err = capfd.readouterr()
        return code, out, err


# Where a real process is the point: torch logs an export's failure through a handler made when torch was
# imported, holding the sys.stderr of that moment; in a process of its own that writes to file descriptor 2,
# which the command holds back. Under pytest it is pytest's capture object instead, which no command can hold.
SUBPROCESSES = {
    "no_export": ["-m", "fxrules", "apply", "simple.fxr", "--model", "cli_models:branchy", "--export", "--input", "3"],
}


@pytest.fixture(scope="module")
def all_runs(work) -> Runs:
    env = _env()
    env["PYTHONPATH"] += os.pathsep + str(work)
    started = {key: _start(argv, env, work) for key, argv in SUBPROCESSES.items()}  # they run meanwhile
    runs = Runs(work, started)
    yield runs
    for proc in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.fixture
def runs(all_runs, capfd, monkeypatch) -> Runs:
    all_runs.capfd, all_runs.monkeypatch = capfd, monkeypatch
    return all_runs


def _ok(result: tuple[int, str, str]) -> tuple[str, str]:
    code, out, err = result
    assert code == 0, err
    assert "Traceback" not in err and "\r" not in err
    return out, err


def _one_line_error(result: tuple[int, str, str], code: int = 2) -> str:
    returned, out, err = result
    assert returned == code, (returned, out, err)
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------------------
# apply: json, diff, out, graph
# ---------------------------------------------------------------------------


def test_apply_json_schema(runs, work):
    out, err = _ok(runs["json"])
    assert err == ""
    payload = json.loads(out)
    assert list(payload) == ["version", "command", "model", "rules", "exported", "inputs", "nodes_before",
                             "nodes_after", "seconds", "counts", "applied", "rejected", "notes",
                             "max_abs_difference", "diff", "saved", "graph", "module_diff", "startup_seconds"]
    assert payload["version"] == 1 and payload["command"] == "apply"
    assert payload["module_diff"].startswith("--- modules before\n") and payload["startup_seconds"] > 0
    assert payload["model"] == "fxrules.zoo:redundant" and payload["exported"] is False
    assert payload["inputs"] == [[2, 3, 16, 16]]
    if LIBRARY is not None:  # the family name resolved to the bundled directory
        assert payload["rules"] == [str(LIBRARY / "cleanup")]
    assert payload["nodes_before"] == 19 and payload["nodes_after"] < 19
    assert payload["counts"]["remove_dropout"] == 1 and payload["counts"]["double_transpose"] == 1
    assert sum(payload["counts"].values()) == len(payload["applied"])
    drop = next(a for a in payload["applied"] if a["rule"] == "remove_dropout")
    assert drop["matched"] == ["drop"] and drop["replaced_by"] == ["flatten"] and drop["created"] == []
    assert re.fullmatch(r".*\.fxr:\d+", drop["source"])
    assert 0 <= payload["max_abs_difference"] < 1e-5
    assert isinstance(payload["seconds"], float)


def test_apply_diff_is_a_unified_diff_of_the_code(runs):
    payload = json.loads(_ok(runs["json"])[0])
    diff = payload["diff"]
    assert diff.startswith("--- before\n+++ after\n@@ ")
    removed = [line for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    assert "-    drop = self.drop(flatten);  flatten = None" in removed
    assert any(line.startswith("-    transpose_1 = transpose.transpose(0, 1)") for line in removed)
    assert not any(line.rstrip() != line for line in diff.splitlines() if line not in ("-", "+", " "))


def test_apply_out_is_reported_and_checked(runs, work):
    payload = json.loads(_ok(runs["json"])[0])
    assert payload["saved"] == {"dir": str(work / "out_json"), "files": ["module.py", "modules.pt", "manifest.json"],
                                "reload_max_abs_difference": 0.0}
    manifest = json.loads((work / "out_json" / "manifest.json").read_text())
    assert manifest["format"] == "fxrules-saved-module" and manifest["version"] == 1
    assert manifest["class_name"] == "Redundant" and manifest["training"] is False and manifest["dropped"] == []
    assert manifest["info"] == {"model": "fxrules.zoo:redundant", "rules": payload["rules"],
                                "inputs": [[2, 3, 16, 16]], "exported": False}
    code = (work / "out_json" / "module.py").read_text()
    assert "def forward(self, x" in code and "self.drop(" not in code and "transpose" not in code
    compile(code, "module.py", "exec")


def test_apply_graph_svg_is_rendered_by_dot(runs, work):
    payload = json.loads(_ok(runs["json"])[0])
    assert payload["graph"] == {"file": str(work / "g_json.svg"), "rendered": True, "dot_file": None, "hint": None}
    assert (work / "g_json.svg").read_text().startswith("<?xml")
    arguments, _, dot = (work / "dot_json.log").read_text().partition("\n")
    assert arguments == "-Tsvg"
    assert re.search(r'"b:drop" \[label="%drop\\ndrop: Dropout\\nmatched: remove_dropout"', dot)
    assert re.search(r'"a:flatten" \[label="[^"]*replaces %drop: remove_dropout', dot)
    assert 'label="Redundant (fxrules.zoo:redundant):' in dot


def test_apply_text_report_diff_out_and_graph_without_dot(runs, work):
    out, err = _ok(runs["text"])
    assert out.startswith("fxrules: 3 rewrites, 0 rejected matches; nodes 19 -> 15; ")
    assert re.search(r"^remove_dropout +\S+simple\.fxr:1 +1$", out, re.M)
    assert "outputs before and after" not in out  # no --input: nothing to compare
    assert "\n--- before\n+++ after\n" in out and "\n-    drop = self.drop(flatten);  flatten = None\n" in out
    assert f"saved the rewritten module to {work / 'out_text'} (module.py, modules.pt, manifest.json); " \
           f"load it with fxrules.load_saved({str(work / 'out_text')!r})\n" in out
    # no dot on PATH: the DOT text next to the requested file, and one line saying so
    assert err == f"dot not found; wrote {work / 'g_text.dot'} (install graphviz to render)\n"
    assert (work / "g_text.dot").read_text().startswith("digraph fxrules {")
    assert not (work / "g_text.png").exists()
    assert "drew the graph" not in out


def test_apply_module_attribute_and_dot_file(runs, work):
    out, err = _ok(runs["instance"])
    assert err == ""
    assert out.startswith("fxrules: 3 rewrites") and out.rstrip().endswith(f"drew the graph before and after to "
                                                                          f"{work / 'g_instance.dot'}")
    assert "matched: double_transpose" in (work / "g_instance.dot").read_text()


def test_apply_two_inputs_and_nested_outputs(runs, work):
    payload = json.loads(_ok(runs["dict_out"])[0])
    assert payload["inputs"] == [[2, 3], [2, 3]]
    assert payload["counts"] == {"remove_dropout": 1, "double_transpose": 1}
    assert payload["max_abs_difference"] == 0.0 and payload["saved"]["reload_max_abs_difference"] == 0.0


def test_inputs_the_model_does_not_run_on(runs):
    line = _one_line_error(runs["bad_inputs"])
    assert line.startswith("fxrules: error: the model does not run on the example inputs: RuntimeError: ")


# ---------------------------------------------------------------------------
# --export, and the saved modules reloaded in a fresh interpreter
# ---------------------------------------------------------------------------


def test_apply_export(runs, work):
    out, err = _ok(runs["export"])
    payload = json.loads(out)
    assert payload["exported"] is True and payload["counts"] == {"aten_relu_idempotent": 1}
    assert payload["max_abs_difference"] == 0.0
    assert payload["saved"]["reload_max_abs_difference"] == 0.0
    manifest = json.loads((work / "out_export" / "manifest.json").read_text())
    assert manifest["dropped"] == ["_guards_fn (torch.export input guard)"]
    assert manifest["info"]["exported"] is True
    code = (work / "out_export" / "module.py").read_text()
    assert "torch.ops.aten.conv2d.default" in code and "_guards_fn" not in code
    # .html without dot: the page holds the DOT text, and one line says so
    assert payload["graph"]["rendered"] is False and payload["graph"]["file"] == str(work / "g_export.html")
    assert err == payload["graph"]["hint"] + "\n" and err.startswith("dot not found; wrote ")
    page = (work / "g_export.html").read_text()
    assert '<pre id="dot">digraph fxrules {' in page and "matched: aten_relu_idempotent" in page
    assert "<td>aten_relu_idempotent</td>" in page


@pytest.fixture
def reloaded(runs, work):
    """Load the saved modules in a fresh interpreter (nothing of the run imported) and run them on the
    CLI's example inputs; once per module."""
    import torch

    target = work / "reloaded.pt"
    if not target.exists():
        _ok(runs["json"])
        _ok(runs["export"])
        proc = _start([str(work / "reload.py"), str(target), str(work / "out_json"), str(work / "out_export")],
                      _env(), work)
        code, out, err = _finish(proc)
        assert code == 0, err
    return torch.load(target)


def _cli_inputs():
    import torch

    return (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)),)


@pytest.mark.slow
def test_saved_module_reloads_and_matches_the_rewrite(reloaded, work):
    import torch

    from fxrules import zoo

    rules = fxrules.load_rules(LIBRARY / "cleanup" if LIBRARY is not None else ROOT / "rules")
    inputs = _cli_inputs()
    result = fxrules.apply_rules(zoo.redundant(), rules, example_inputs=inputs)
    with torch.no_grad():
        expected = result.module(*inputs)
        original = zoo.redundant()(*inputs)
    got = reloaded[str(work / "out_json")]
    assert torch.equal(got, expected)
    assert torch.allclose(got, original, atol=1e-5)
    # the saved code is the code of the in-memory rewrite
    saved = (work / "out_json" / "module.py").read_text()
    for line in result.module.code.strip().splitlines():
        assert line.rstrip() in saved


def test_saved_export_module_reloads_and_matches_the_rewrite(reloaded, work):
    import torch

    from fxrules import zoo

    inputs = _cli_inputs()
    program = torch.export.export(zoo.redundant(), inputs)
    result = fxrules.apply_rules(program, fxrules.parse_rules(ATEN))
    with torch.no_grad():
        expected = result.module(*inputs)
    assert torch.equal(reloaded[str(work / "out_export")], expected)


# ---------------------------------------------------------------------------
# Rule families of the bundled library
# ---------------------------------------------------------------------------


def test_family_names_resolve_in_the_library_unless_a_path_exists(runs, work):
    payload = json.loads(_ok(runs["families"])[0])
    # myfam: only in the library; shadowed: a local directory of that name wins over the family
    assert payload["rules"] == [str(work / "lib" / "myfam"), "shadowed"]
    assert payload["counts"] == {"remove_dropout": 1, "double_transpose": 1}


def test_unknown_family_lists_the_families(runs):
    line = _one_line_error(runs["no_family"])
    assert line == "fxrules: error: no such file or directory: 'nosuch' (nor a bundled rule family: myfam, shadowed)"


# ---------------------------------------------------------------------------
# explain
# ---------------------------------------------------------------------------


def test_explain_text_names_the_rule_position_and_the_model_line(runs, work):
    out, err = _ok(runs["explain"])
    fold = str(work / "fold.fxr")
    # the condition `not bn.training` is false: its own line and column
    heads = re.findall(rf"^{re.escape(fold)}:3:11: rule `fold_conv2d_bn` did not match at %(\w+): "
                       r"the pattern matched, but the condition `not bn\.training` is false$", out, re.M)
    assert heads == ["bn", "layers_0_bn1", "layers_0_bn2", "layers_1_bn1", "layers_1_bn2", "layers_1_downsample_1"]
    assert FOLD.splitlines()[2][10:].startswith("not bn.training")
    # each near miss shows where its node came from in the model's code (torch internals left out)
    block = out.split(f"{fold}:3:11: rule `fold_conv2d_bn` did not match at %bn:")[1].split("\n\n")[0]
    frames = re.findall(r"^    (.+):(\d+) in forward$", block, re.M)
    assert frames and not any("site-packages" in f[0] for f in frames)
    zoo_file, line = frames[-1]
    assert zoo_file.endswith("zoo.py")
    assert "self.bn(" in Path(zoo_file).read_text().splitlines()[int(line) - 1]
    assert "site-packages/torch" not in out
    assert out.rstrip().splitlines()[-1] == "fxrules explain: 6 near misses of 2 rules in 25 nodes"


def test_explain_json_with_export_and_one_rule(runs, work):
    out, err = _ok(runs["explain_json"])
    payload = json.loads(out)
    assert list(payload) == ["version", "command", "model", "rules", "rule", "exported", "inputs", "nodes",
                             "near_misses"]
    assert payload["command"] == "explain" and payload["rule"] == "aten_relu_idempotent" and payload["exported"]
    misses = payload["near_misses"]
    assert misses and {m["rule"] for m in misses} == {"aten_relu_idempotent"}
    first = misses[0]
    assert list(first) == ["rule", "location", "file", "line", "column", "node", "reason", "code", "stage", "depth",
                           "stack_trace", "frames"]
    assert first["file"] == str(work / "aten_relu.fxr") and first["location"] == \
        f"{first['file']}:{first['line']}:{first['column']}"
    assert first["stage"] == "pattern" and isinstance(first["depth"], int)
    assert first["code"] == "target-mismatch" and "expected aten.relu.default" in first["reason"]
    assert first["stack_trace"] and first["frames"][-1]["file"].endswith("zoo.py")
    assert set(first["frames"][-1]) == {"file", "line", "function", "code"}


def test_explain_unknown_rule(runs, work):
    line = _one_line_error(runs["explain_no_rule"])
    assert line == (f"fxrules: error: no rule named 'nope' in {work / 'fold.fxr'}; the rules are: "
                    f"fold_conv2d_bn, double_relu")


# ---------------------------------------------------------------------------
# Bad input: one line, exit 2 (1 when a rule fails on the model)
# ---------------------------------------------------------------------------

ERRORS = {
    "no_module": "fxrules: error: cannot import no_such_pkg_xyz.models: ModuleNotFoundError: No module named "
                 "'no_such_pkg_xyz' (models are imported from the working directory and the python-path folders "
                 "of [tool.fxrules]; run from the project's root or set python-path)",
    "no_attribute": "fxrules: error: cli_light has no attribute 'nope'",
    "bad_spec": "fxrules: error: --model must look like PKG.MODULE:FACTORY, got 'cli_light'",
    "factory_raises": "fxrules: error: cli_light:raises() raised RuntimeError: boom",
    "not_module": "fxrules: error: cli_light:not_module() returned int, not an nn.Module",
    "export_no_input": "fxrules: error: --export needs example inputs (--input SHAPE)",
    "bad_shape": "fxrules: error: --input takes a shape like 2x3x32x32, got '2xq'",
    "graph_suffix": "fxrules: error: --graph takes a file ending in .svg, .png, .html, .dot, got '{w}/g.jpg'",
    "out_under_file": "fxrules: error: --out {w}/a_file/x: cannot be created ({w}/a_file is not a directory)",
    "out_is_file": "fxrules: error: --out {w}/a_file: exists and is not a directory",
    "out_late": "fxrules: error: cannot write --out {w}/late: Is a directory",
}


@pytest.mark.parametrize("key", sorted(ERRORS))
def test_bad_input_is_one_line_exit_2(runs, work, key):
    assert _one_line_error(runs[key]) == ERRORS[key].format(w=work)


def test_untraceable_model(runs):
    line = _one_line_error(runs["no_trace"])
    assert line.startswith("fxrules: error: Branchy does not trace with torch.fx (TraceError: ")
    assert line.endswith("); try --export with --input")


@pytest.mark.slow
def test_export_failure_hides_torch_logging(runs):
    line = _one_line_error(runs["no_export"])  # torch logs pages of graph dumps on the way; none shown
    assert line.startswith("fxrules: error: torch.export failed: ")


def test_rule_file_errors_exit_2_with_positions(runs, work):
    code, out, err = runs["rule_file"]
    assert code == 2 and out == "" and "Traceback" not in err
    assert f"{work / 'broken.fxr'}:2:" in err and "$y" in err


def test_missing_model_option_is_a_usage_error(runs):
    code, out, err = runs["no_model"]
    assert code == 2 and out == ""
    assert err.splitlines()[-1] == "fxrules apply: error: the following arguments are required: --model"


def test_a_rule_failing_on_the_model_exits_1_and_names_the_cli_fix(runs, work):
    line = _one_line_error(runs["needs_shapes"], code=1)
    assert line.startswith(f"fxrules: {work / 'needs_shapes.fxr'}:1: rule `flatten_2d_noop` failed at node ")
    assert "pass --input SHAPE" in line and "example_inputs=" not in line


def test_a_rule_breaking_the_model_exits_1_in_one_line(runs):
    """torch prints the generated code's traceback when a GraphModule raises: none of it is shown."""
    line = _one_line_error(runs["breaks"], code=1)
    assert line.startswith("fxrules: the rewritten module does not run on the example inputs (the original "
                           "does): RuntimeError: shape '[7, 7]' is invalid")


def test_help_lists_apply_and_explain_options(capsys):
    for command, options in (("apply", ("--diff", "--out DIR", "--graph FILE", "--export", "--format {text,json}",
                                        "--input SHAPE", "--allow-import PKG")),
                             ("explain", ("--rule NAME", "--export", "--format {text,json}", "--input SHAPE"))):
        with pytest.raises(SystemExit) as info:
            main([command, "--help"])
        out, err = capsys.readouterr()
        assert info.value.code == 0 and err == ""
        for option in options:
            assert option in out, (command, option)
        assert "name of a bundled rule family" in " ".join(out.split())
