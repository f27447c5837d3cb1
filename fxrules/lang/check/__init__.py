"""The checker: names resolved, bindings checked, all semantic errors of a file collected.

Input: a :class:`fxrules.lang.ast.RuleFile`. Output: the file's
:class:`fxrules.lang.ruleset.CheckedRule` list and every diagnostic found (the caller
decides whether errors are fatal). The checker never stops at the first error.

One module per thing checked, all reporting into one :class:`~fxrules.lang.check.reporter.Reporter`:

* ``driver``: the file's items in order (``use`` lines, ``default [...]``, contract words, rules),
  each rule through the checkers below; the rule as a whole (as many replacement roots as pattern
  roots, a replacement that differs from its pattern, via ``identity``); duplicate rule names
  across a rule set;
* ``patterns``: captures and ``as`` names (no duplicates, none used inside its own definition),
  references to ``as`` names, alternations whose options bind the same names, where ``...`` may
  stand; the result is what the pattern binds (``scope.Bindings``);
* ``conditions`` and ``replacements``: they use only what the pattern binds, call only what is
  allowed, and build only what can be built;
* ``examples``: declared inputs, a rewrite count of at most MAX_EXAMPLE_COUNT, input shapes and
  fills within bounds (their tensors are made only when verifying);
* ``targets``: call_function targets and constants resolve (with torch when it is importable),
  call_method names exist on ``torch.Tensor``, module types are ``nn.Module`` subclasses,
  attribute constraints and constructor arguments are parameters of the module's constructor,
  builders are callables; all under the import policy of :mod:`fxrules.lang.names`;
* ``named``: named patterns (``pattern NAME($a) = ...``): their bodies, the files ``use "FILE"``
  reads them from, and their expansion into the patterns of the rules that use them;
* ``calls``: argument lists and attribute blocks (no keyword given twice, by name; ``...`` last).
"""

from fxrules.lang.check.driver import check_duplicates, check_file

__all__ = ["check_duplicates", "check_file"]
