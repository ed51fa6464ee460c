"""The servers the tests use by default, and the README's word on them (issue 30: db 0 of whatever Redis
listens on 6379, and variables only conftest mentioned)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from tests.conftest import DEFAULT_POSTGRES_URL, DEFAULT_REDIS_URL

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_tests_default_to_a_redis_database_other_than_the_usual_one() -> None:
    assert urlsplit(DEFAULT_REDIS_URL).path not in {"", "/", "/0"}


def test_the_readme_names_the_test_server_variables_and_their_defaults() -> None:
    text = " ".join(README.read_text().split())
    for variable, default in (
        ("LATEBANDIT_TEST_REDIS_URL", DEFAULT_REDIS_URL),
        ("LATEBANDIT_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL),
    ):
        assert f"`{variable}` (default `{default}`" in text
