// Starts `fxrules lsp` (configurable: fxrules.server.command) for .fxr files and connects it over stdio.
const vscode = require("vscode");
const { LanguageClient, TransportKind } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const [command, ...args] = vscode.workspace.getConfiguration("fxrules").get("server.command");
  const server = { command, args, transport: TransportKind.stdio };
  client = new LanguageClient("fxrules", "fxrules", { run: server, debug: server }, {
    documentSelector: [{ scheme: "file", language: "fxrules" }, { scheme: "untitled", language: "fxrules" }],
  });
  context.subscriptions.push(client);
  client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
