"""benchmarks/cold.py's plumbing (the measurements themselves are run by hand: fresh processes, seconds each)."""

from __future__ import annotations

from pathlib import Path

import pytest

cold = pytest.importorskip("benchmarks.cold")


def test_each_measurement_runs_the_measured_checkout_with_its_bytecode_written(tmp_path):
    env = cold._environment(Path("/some/checkout"), str(tmp_path))
    assert env["PYTHONPATH"].split(":")[0] == "/some/checkout"
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path) and "PYTHONDONTWRITEBYTECODE" not in env


def test_without_bytecode_none_is_written_and_a_checkout_holding_some_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "elsewhere"))
    (tmp_path / "fxrules" / "lang").mkdir(parents=True)
    env = cold._environment(tmp_path, None)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and "PYTHONPYCACHEPREFIX" not in env
    (tmp_path / "fxrules" / "lang" / "__pycache__").mkdir()
    with pytest.raises(SystemExit, match="holds cached bytecode"):
        cold._environment(tmp_path, None)


def test_the_table_is_markdown():
    text = cold.render([cold.Row("fxrules check LIBRARY", 0.1834, 5, "torch imported: no")])
    assert text.splitlines() == ["| what | seconds (median) | runs | note |", "|---|---|---|---|",
                                 "| fxrules check LIBRARY | 0.183 | 5 | torch imported: no |"]


@pytest.mark.slow
def test_the_check_probe_reports_whether_torch_was_imported(tmp_path):
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", cold._CHECK], env=cold._environment(root, str(tmp_path)),
                         cwd=root, capture_output=True, text=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"code": 0, "torch": False}, out.stderr


@pytest.mark.slow
def test_a_meta_kernel_imports_dynamo_so_metadata_propagation_stays_on_fake_tensors(tmp_path):
    """The measured reason issue 17's first-apply goal (0.2 s beyond `import torch` with example
    inputs) was not met by propagating on meta tensors instead of fake ones: in torch 2.13 the meta
    kernels of everyday ops (relu, add, mul, cat, gelu, layer_norm, batch_norm's decomposition) are
    Python functions wrapped in `torch._disable_dynamo`, whose first call imports `torch._dynamo`:
    the same import `FakeTensorMode()` makes. Should a torch release stop doing so, this fails, and a
    meta-tensor metadata path (benchmarks/README.md, "Cold start") is worth revisiting."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", cold._META_OP], env=cold._environment(root, str(tmp_path)),
                         cwd=root, capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["dynamo"] is True, out.stderr
    assert report["seconds"] > 0
