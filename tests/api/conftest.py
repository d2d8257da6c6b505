"""Fixtures the API tests share."""

import pytest

from tests.helpers import make_consumer_with_token


@pytest.fixture
def worker(channel):
    """The pull consumer "worker" of the shared "orders" channel, with the tokens of tokens()."""
    return make_consumer_with_token(channel)
