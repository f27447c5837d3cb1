"""The rule language: reading, parsing, checking and printing ``.fxr`` files.

Torch-free: nothing under ``fxrules.lang`` imports torch (a test imports it with torch
blocked), so ``fxrules check`` and the pre-commit hook run without it. Stages, in order:
``source`` (bounded reading) -> ``parser`` + ``reductions`` (text to AST) -> ``names``
(what a dotted name may resolve to) -> ``check`` (diagnostics) -> ``ruleset`` (the
checked, frozen result) -> ``load`` (the driver). ``printer`` turns an AST back into text.
``runtime`` holds the process-wide state (the collector, the recursion limit) that the API's
entry points enter; no stage changes it.
"""
