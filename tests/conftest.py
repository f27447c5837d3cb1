"""Shared pytest configuration: the Hypothesis profiles.

``ci`` (the default) is derandomized, so a run is reproducible and a failure
prints a blob to replay it; ``thorough`` runs many more examples, for a local
hunt: ``HYPOTHESIS_PROFILE=thorough pytest tests/lang/test_parser_fuzz.py``.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
)
settings.register_profile("thorough", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
