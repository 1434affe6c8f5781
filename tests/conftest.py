"""Shared pytest configuration: fixtures live in tests/support/ plugin modules."""

pytest_plugins = [
    "tests.support.s3server",
    "tests.support.llmserver",
]
