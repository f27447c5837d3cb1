"""Hostile rule files, one per class of attack, each run in a subprocess with memory and time limits.

Each case runs in a process of its own, forked from a server that imported torch and fxrules
once (tests/security/forkserver.py: the cost of a new interpreter, twice per case, was most of
this file's time); a few cases that need a fresh interpreter still start one. Each child sets
RLIMIT_AS (address space) after its imports, so an attack that allocated
without bound would die of MemoryError instead of taking the machine, and runs under a
timeout, so a blocking read fails the test instead of hanging it. A marker file shows that
no shell command or file write ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.security.forkserver import ForkServer

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = textwrap.dedent("""
    import resource, sys
    import torch, fxrules

    def limit(extra_bytes):
        # the address space now (torch maps a lot) plus what the attack may use at most
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + extra_bytes, vm + extra_bytes))
""")


def _run(body: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -c PRELUDE+body`` in a process of its own (forked from the server)."""
    return ForkServer.ask({"kind": "code", "code": PRELUDE + textwrap.dedent(body)}, timeout)


def _check(path: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """``fxrules check PATH`` in a process of its own (forked from the server)."""
    return ForkServer.ask({"kind": "check", "args": [str(path)]}, timeout)


def _codes(output: str) -> set[str]:
    import re

    return set(re.findall(r"error\[([a-z-]+)\]", output))


SHELL_CONDITIONS = [
    'torch.utils.collect_env.run("touch {marker}") == 0',
    'torch.utils.collect_env.run_and_read_all(torch.utils.collect_env.run, "touch {marker}") == 0',
    'torch._dynamo.utils.subprocess.run("touch {marker}") == 0',
    'c.run("touch {marker}") == 0',
]


@pytest.mark.parametrize("condition", SHELL_CONDITIONS)
@pytest.mark.slow
def test_a_condition_cannot_run_a_shell_command(tmp_path, condition):
    marker = tmp_path / "marker"
    rules = tmp_path / "shell.fxr"
    rules.write_text("use torch.utils.collect_env as c\n"
                     f"rule r: call_function torch.relu($x) where {condition.format(marker=marker)} "
                     f"-> call_function torch.sigmoid($x)\n", encoding="utf-8")
    result = _check(rules)
    assert result.returncode == 1 and _codes(result.stdout + result.stderr) & {"not-allowed", "forbidden-target"}
    run = _run(f"""
        limit(1 << 30)
        m = torch.fx.symbolic_trace(torch.nn.ReLU())
        try:
            fxrules.apply_rules(m, {str(rules)!r}, example_inputs=(torch.randn(2),))
        except fxrules.RuleFileError as exc:
            print("refused", [d.code for d in exc.diagnostics])
    """)
    assert "refused" in run.stdout, run.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_an_example_cannot_execute_code(tmp_path):
    marker = tmp_path / "marker"
    rules = tmp_path / "exec.fxr"
    rules.write_text(
        "rule r [exact]: call_function torch.relu($x) -> call_function torch.relu($x, inplace=False)\n"
        f"    example: call_function torch.jit.CompilationUnit(\"import os; os.system('touch {marker}')\") "
        "given $x: [2]\n"
        f"    example: call_function builtins.exec(\"open('{marker}', 'w')\", $x) given $x: [2]\n"
        f"    example: call_function torch.fx.graph_module.exec_with_source(\"open('{marker}', 'w')\", $x) "
        "given $x: [2]\n", encoding="utf-8")
    result = _check(rules)
    assert result.returncode == 1
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    verify = subprocess.run([sys.executable, "-m", "fxrules", "verify", str(rules)], capture_output=True, text=True,
                            timeout=120, env=env, cwd=ROOT)
    assert verify.returncode != 0
    assert not marker.exists()


@pytest.mark.parametrize("replacement", [
    'call_function torch.save($x, "{marker}")',
    'call_function torch.from_file("{marker}")',
    'call_function torch.ops.aten.from_file("{marker}")',
    'call_function torch.hub.download_url_to_file("x", "{marker}")',
    'call_function torch.utils.cpp_extension.load_inline("{marker}", "")',
    'call_function torch.ops.load_library("{marker}")',
    'call_function torch.set_default_dtype(torch.float64)',
    'call_function torch.manual_seed(0)',
    'call_function torch.export.save($x, "{marker}")',
    'call_method numpy($x)',
    'call_method apply_($x, torch.relu)',
    'call_function builtins.min($x, key=torch.manual_seed)',
    'call_module torch.nn.DataParallel{{module=None}}($x)',
    'call_module fxrules.tools.cli.main(m)($x)',
    # cost grows with the value: hours of CPU in apply_rules' shape propagation and in verify
    'call_function torch.add($x, call_function math.factorial(1000000000))',
    'call_function torch.add($x, call_function builtins.pow(10, 100000000))',
    'call_function torch.add($x, call_function operator.lshift(1, 100000000000))',
    'call_function torch.add($x, call_function math.comb(1000000000, 500000000))',
    # Python values from literals only: hours (sum, max, fsum) or gigabytes (list, *) in shape propagation
    'call_function torch.add($x, call_function builtins.sum(call_function builtins.range(1000000000000)))',
    'call_function torch.add($x, call_function builtins.max(call_function builtins.range(10000000000)))',
    'call_function torch.add($x, call_function math.fsum(call_function builtins.range(10000000000)))',
    'call_function torch.add($x, call_function builtins.len(call_function operator.mul([0], 10000000000)))',
    'call_function torch.add($x, call_function len(call_function list(call_function range(10000000000))))',
])
@pytest.mark.slow
def test_a_replacement_cannot_touch_files_or_global_state(tmp_path, replacement):
    marker = tmp_path / "marker"
    rules = tmp_path / "files.fxr"
    rules.write_text(f"rule r: call_function torch.relu($x) as m -> {replacement.format(marker=marker)}\n",
                     encoding="utf-8")
    result = _check(rules)
    assert result.returncode == 1, result.stdout
    assert _codes(result.stdout) & {"not-allowed", "forbidden-target", "unknown-module-type", "bad-replacement"}
    assert not marker.exists()


@pytest.mark.parametrize("condition", [
    "len([0] * 1000000000) > 0",
    "len(\"a\" * 1000000000) > 0",
    "len([0, 1, 2, 3] * 100000 + [0] * 100000) > 0",
    "99999999999999999999 * 99999999999999999999 * 99999999999999999999 * 99999999999999999999 > 0 and "
    + " * ".join(["9" * 3000] * 6) + " > 0",
    "round(1, -1000000000) == 0",
    "len(\"%999999999d\" % 1) > 0",
    # nested sharing: cheap to build, 3.6e9 items to walk (time) or to concatenate (memory)
    "[[0] * 60000] * 60000 == [[0] * 60000] * 60000",
    "[[[0] * 60000] * 60000] * 60000 != []",
    "sum([[0] * 60000] * 60000, []) != []",
    "sum([[0]] * 30000, []) != []",
    "[\"a\" * 60000] * 60000 == [\"a\" * 60000] * 60000",
])
@pytest.mark.slow
def test_a_condition_cannot_exhaust_memory(tmp_path, condition):
    rules = tmp_path / "memory.fxr"
    rules.write_text(f"rule r: call_module ReLU($x) where {condition} -> call_function torch.sigmoid($x)\n",
                     encoding="utf-8")
    run = _run(f"""
        m = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
        rules = fxrules.load_rules({str(rules)!r})
        limit(1 << 30)
        try:
            fxrules.apply_rules(m, rules, example_inputs=(torch.randn(2, 2),))
            print("applied")
        except fxrules.RewriteError as exc:
            print("refused:", exc)
    """, timeout=60)
    assert "refused:" in run.stdout, run.stdout + run.stderr
    assert "rule `r`" in run.stdout and "ConditionRefused" in run.stdout


def test_a_fifo_is_refused_quickly(tmp_path):
    fifo = tmp_path / "rules.fxr"
    os.mkfifo(fifo)
    result = _check(fifo, timeout=30)
    assert result.returncode == 2 and "io-error" in result.stdout and "FIFO" in result.stdout


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_is_refused_quickly(device):
    if not os.path.exists(device):
        pytest.skip(f"{device} does not exist here")
    result = _check(Path(device), timeout=30)
    assert result.returncode == 2 and "io-error" in result.stdout


def test_a_symlink_to_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "rules.fxr"
    link.symlink_to(fifo)
    result = _check(link, timeout=30)
    assert result.returncode == 2 and "FIFO" in result.stdout


def test_reading_stops_at_the_cap_whatever_the_reported_size(tmp_path, monkeypatch):
    from fxrules.lang import source
    from fxrules.lang.diagnostics import RuleFileError

    path = tmp_path / "big.fxr"
    path.write_bytes(b"# " + b"x" * 200 + b"\n")
    monkeypatch.setattr(source, "MAX_FILE_BYTES", 100)
    with pytest.raises(RuleFileError) as info:
        source.read(path)
    assert info.value.diagnostics[0].code == "io-error"


def test_a_long_string_literal_loads_within_50_times_its_size(tmp_path):
    size = 20 * 1024 * 1024
    rules = tmp_path / "literal.fxr"
    rules.write_text('rule r: call_function torch.add($x, "' + "a" * size + '") -> $x\n', encoding="utf-8")
    run = _run(f"""
        fxrules.parse_rules("rule warm: call_function torch.add($x, \\"a\\", 1.5) -> $x\\n")  # imports done
        limit(50 * {size})
        rules = fxrules.load_rules({str(rules)!r})
        print("loaded", len(rules))
    """, timeout=120)
    assert "loaded 1" in run.stdout, run.stderr[-2000:]


def test_a_string_literal_full_of_escapes_loads_within_50_times_its_size(tmp_path):
    size = 8 * 1024 * 1024
    rules = tmp_path / "escapes.fxr"
    rules.write_text('rule r: call_function torch.add($x, "' + "\\t" * (size // 2) + '") -> $x\n', encoding="utf-8")
    run = _run(f"""
        fxrules.parse_rules("rule warm: call_function torch.add($x, \\"a\\", 1.5) -> $x\\n")
        limit(50 * {size})
        rules = fxrules.load_rules({str(rules)!r})
        print("loaded", len(rules))
    """, timeout=120)
    assert "loaded 1" in run.stdout, run.stderr[-2000:]


@pytest.mark.slow
def test_a_condition_cannot_index_a_tensor_into_a_larger_one(tmp_path):
    # w[[[0] * 255] * 255] gathers 65,025 copies of a row: 1 GB from a 1 MB weight, per candidate
    rules = tmp_path / "index.fxr"
    rules.write_text("rule r: call_module Linear($x) as m where m.weight[[[0] * 255] * 255] != 0 "
                     "-> call_function torch.sigmoid($x)\n", encoding="utf-8")
    run = _run(f"""
        m = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4096, 64)))
        rules = fxrules.load_rules({str(rules)!r})
        limit(1 << 30)
        try:
            fxrules.apply_rules(m, rules, example_inputs=(torch.randn(2, 4096),))
            print("applied")
        except fxrules.RewriteError as exc:
            print("refused:", exc)
    """, timeout=60)
    assert "refused:" in run.stdout and "ConditionRefused" in run.stdout, run.stdout + run.stderr


@pytest.mark.parametrize("rule", [
    'rule r: call_function torch.relu($x) -> call_function torch.save($x, "{marker}")',
    'rule r: call_function torch.relu($x) -> call_function builtins.min($x, key=torch.manual_seed)',
    'rule r: call_function torch.relu($x) -> call_method numpy($x)',
    'rule r: call_function torch.relu($x) -> call_module torch.nn.DataParallel{{module=None}}($x)',
    'rule r: call_function torch.relu($x) -> call_module fxrules.tools.cli.main(m)($x)',
    'rule r: call_function torch.relu($x) -> call_function torch.add($x, torch.manual_seed)',
])
def test_a_rule_set_made_without_the_checker_is_refused_by_the_engine(tmp_path, rule):
    # RuleSet and CheckedRule are public dataclasses: one can be made from a parsed AST, skipping the
    # checker. The engine decides every name by the allow-list again when it compiles the rule.
    marker = tmp_path / "marker"
    run = _run(f"""
        from fxrules.lang.parser import parse
        from fxrules.lang.source import Source
        from fxrules.lang.ruleset import CheckedRule, RuleSet
        ast = parse(Source("hand.fxr", {rule.format(marker=marker)!r} + "\\n")).items[0]
        rules = RuleSet((CheckedRule(ast.name, "changes", ast, {{}}),))
        m = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
        m.graph.call_function(torch.relu, (next(iter(m.graph.nodes)),))
        m = torch.fx.GraphModule(m, m.graph)
        limit(1 << 30)
        try:
            out = fxrules.apply_rules(m, rules)
            out.module(torch.randn(2))
            print("applied")
        except fxrules.RuleFileError as exc:
            print("refused", [d.code for d in exc.diagnostics])
    """)
    assert "refused ['not-allowed']" in run.stdout, run.stdout + run.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_an_example_cannot_construct_a_huge_module(tmp_path):
    # the constructor arguments are literals and check clean; the module would hold 6.4e9 elements (25.6 GB)
    rules = tmp_path / "module.fxr"
    rules.write_text(
        "rule r [exact]: call_module Embedding($x) -> call_module Embedding{num_embeddings=3, embedding_dim=4}($x)\n"
        "    example 0: call_module Embedding{num_embeddings=100000000, embedding_dim=64}($i) given $i: int64[2]\n",
        encoding="utf-8")
    run = _run(f"""
        from fxrules.tools.cli import main
        limit(1 << 30)
        main(["verify", {str(rules)!r}])
    """)
    assert "examples construct modules of at most" in run.stdout, run.stdout + run.stderr
