"""Fixtures shared by the end-to-end tests."""

from tests.e2e.local_deploy import local_deployment  # noqa: F401  (session fixture)
