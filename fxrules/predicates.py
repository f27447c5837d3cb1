"""The predicates ``where`` conditions may call by bare name (``is_zero(bias)``), as Python functions.

Re-exported from :mod:`fxrules.engine.predicates`, where the engine calls them. Importing this
module does not import torch; each predicate imports it when called.
"""

from fxrules.engine.predicates import PREDICATES, is_constant, is_floating, is_one, is_scalar, is_zero

__all__ = ["PREDICATES", "is_constant", "is_floating", "is_one", "is_scalar", "is_zero"]
