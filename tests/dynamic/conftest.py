"""The dynamic-shapes tests start and end with no sizes remembered (automatic dynamic)."""
import pytest

import ember


@pytest.fixture(autouse=True)
def _fresh_sizes():
    ember.reset()
    yield
    ember.reset()
