"""Test suite for rollout-queue; a package so that `from tests.helpers import ...` works."""
