"""Shared test settings: hypothesis without deadlines (noisy 2-core CI), derandomized under CI."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", deadline=None, max_examples=30,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", parent=settings.get_profile("dev"), derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
