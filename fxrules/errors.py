"""The exceptions fxrules raises, and the diagnostics rule-file errors carry.

Every exception fxrules raises on purpose is a :class:`FxrulesError`. A problem in a rule
file is a :class:`Diagnostic` (stable code, message, span, notes); :class:`RuleFileError`
holds all of a load's diagnostics. This module only re-exports: diagnostics live in
:mod:`fxrules.lang.diagnostics`, the engine's errors in :mod:`fxrules.engine.errors`.
Importing it does not import torch.
"""

from fxrules.engine.errors import BuilderError, ComparisonError, ModelError, RewriteError, RewriteLoopError
from fxrules.lang.diagnostics import CODES, ERROR, WARNING, Diagnostic, FxrulesError, RuleFileError, sort_key

__all__ = [
    "BuilderError", "CODES", "ComparisonError", "Diagnostic", "ERROR", "FxrulesError", "ModelError", "RewriteError", "RewriteLoopError",
    "RuleFileError", "WARNING", "sort_key",
]
