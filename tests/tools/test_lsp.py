"""The language server, driven over its protocol: ``python -m fxrules lsp`` in a subprocess, JSON-RPC
with Content-Length framing on its stdin/stdout, as an editor speaks to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pygls")
pytest.importorskip("torch")

from fxrules.tools import lsp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RULES = ("rule fold_it \"conv + bn\" [approx]:\n"
         "    call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn\n"
         "    where not bn.training\n"
         "    -> call_module fxrules.builders.fold_conv_bn(conv, bn)($x)\n")


class Client:
    """A minimal LSP client: requests with ids, notifications, and the messages the server sends."""

    def __init__(self, cwd: Path):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.process = subprocess.Popen([sys.executable, "-m", "fxrules", "lsp"], cwd=cwd, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.next_id = 0
        self.notifications: list[dict] = []

    def send(self, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.process.stdin.write(f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        self.process.stdin.flush()

    def read(self) -> dict:
        length = None
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise EOFError(self.process.stderr.read().decode()[-3000:])
            line = line.strip()
            if not line:
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return json.loads(self.process.stdout.read(length))

    def request(self, method: str, params: dict) -> dict:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            message = self.read()
            if message.get("id") == self.next_id and "method" not in message:
                assert "error" not in message, message
                return message.get("result")
            if "method" in message:
                self.notifications.append(message)

    def notify(self, method: str, params: dict) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def wait_for(self, method: str, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, message in enumerate(self.notifications):
                if message.get("method") == method:
                    return self.notifications.pop(i)
            self.notifications.append(self.read())
        raise TimeoutError(method)


@pytest.fixture
def client(tmp_path):
    c = Client(tmp_path)
    result = c.request("initialize", {"processId": None, "rootUri": lsp.uri_of(str(tmp_path)), "capabilities": {}})
    capabilities = result["capabilities"]
    assert capabilities["hoverProvider"] and capabilities["definitionProvider"]
    assert capabilities["documentFormattingProvider"] and "completionProvider" in capabilities
    c.notify("initialized", {})
    yield c
    c.request("shutdown", None)
    c.notify("exit", None)
    c.process.wait(timeout=30)


def _pos(line: int, character: int) -> dict:
    return {"line": line, "character": character}


@pytest.mark.slow
def test_diagnostics_as_you_type_hover_definition_formatting_completion(client, tmp_path):
    path = tmp_path / "mine.fxr"
    uri = lsp.uri_of(str(path))
    broken = "rule r:\n    call_module Dropuot($x) -> $y\n"
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "fxrules", "version": 1,
                                                            "text": broken}})
    published = client.wait_for("textDocument/publishDiagnostics")["params"]
    assert published["uri"] == uri
    codes = {d["code"]: d for d in published["diagnostics"]}
    assert set(codes) == {"unknown-module-type", "unbound-capture"}
    assert codes["unbound-capture"]["range"] == {"start": _pos(1, 31), "end": _pos(1, 33)}
    assert "did you mean `torch.nn.Dropout`?" in codes["unknown-module-type"]["message"]

    client.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 2},
                                             "contentChanges": [{"text": RULES}]})
    assert client.wait_for("textDocument/publishDiagnostics")["params"]["diagnostics"] == []

    on_name = client.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": _pos(0, 7)})
    assert "rule `fold_it`" in on_name["contents"]["value"] and "conv + bn" in on_name["contents"]["value"]
    on_type = client.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": _pos(1, 20)})
    assert "torch.nn.modules.batchnorm.BatchNorm2d" in on_type["contents"]["value"]

    builder = client.request("textDocument/definition", {"textDocument": {"uri": uri}, "position": _pos(3, 40)})
    assert builder["uri"].endswith("/fxrules/builders.py") and builder["range"]["start"]["line"] > 0
    bound = client.request("textDocument/definition", {"textDocument": {"uri": uri}, "position": _pos(2, 15)})
    name_at = RULES.splitlines()[1].rindex("as bn") + 3
    assert bound["uri"] == uri and bound["range"]["start"] == _pos(1, name_at)  # `... as bn` in the pattern

    client.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 3},
                                             "contentChanges": [{"text": "rule r:   call_module Dropout($x)->$x\n"}]})
    client.wait_for("textDocument/publishDiagnostics")
    (edit,) = client.request("textDocument/formatting", {"textDocument": {"uri": uri},
                                                         "options": {"tabSize": 4, "insertSpaces": True}})
    assert edit["newText"] == "rule r:\n    call_module Dropout($x)\n    -> $x\n"

    client.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 4},
                                             "contentChanges": [{"text": "rule r: call_module Dro"}]})
    items = client.request("textDocument/completion", {"textDocument": {"uri": uri}, "position": _pos(0, 23)})
    assert {"Dropout", "Dropout2d"} <= {i["label"] for i in items["items"]}
    client.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 5},
                                             "contentChanges": [{"text": "rule r: call_function F.rel"}]})
    items = client.request("textDocument/completion", {"textDocument": {"uri": uri}, "position": _pos(0, 27)})
    assert "F.relu" in {i["label"] for i in items["items"]}


def test_diagnostics_use_the_files_project_configuration(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.fxrules]\nallow-imports = ["json"]\n')
    text = "rule r: call_function json.dumps($x) -> $x\n"
    assert lsp.diagnostics_for(str(tmp_path / "r.fxr"), text) == []
    assert [d.code for d in lsp.diagnostics_for("/elsewhere/r.fxr", text)] == ["import-not-allowed"]
