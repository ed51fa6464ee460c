"""What the service refuses to start with (issue 19): a placeholder or short HMAC secret, and no API keys on a
non-loopback address, wherever the app is built; and secrets that never show in a repr."""

from __future__ import annotations

import pytest

from latebandit.api.app import create_app
from latebandit.config import Settings, UnsafeSettings

STRONG = "c0ffee15-strong-enough-secret-4f2a9b7e1d"
PLACEHOLDERS = [
    "change-me-in-production",  # docker-compose.yml used to ship it
    "REPLACE-ME-with-openssl-rand-hex-32",  # deploy/kubernetes/secret.yaml ships it
    "secret",
    "changeme",
    "Change_Me_Please_this_is_long_enough_32",
    "your-secret-here-your-secret-here-0123",
    "x" * 64,
    "abab" * 10,
    "0123456789abcdef0123456789abcde",  # 31 bytes
]


def settings(**values: object) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[arg-type]


@pytest.mark.parametrize("weak", PLACEHOLDERS)
def test_a_placeholder_or_short_secret_is_refused_naming_the_setting_not_the_value(weak: str) -> None:
    with pytest.raises(UnsafeSettings, match=r"^LATEBANDIT_SECRET is") as refused:
        settings(secret=weak).check()
    assert weak not in str(refused.value)
    with pytest.raises(UnsafeSettings, match=r"^LATEBANDIT_PREVIOUS_SECRETS \(secret 2\) is"):
        settings(secret=STRONG, previous_secrets=f"{STRONG[::-1]},{weak}").check()


def test_strong_secrets_pass_and_the_embedded_default_needs_none() -> None:
    assert settings(secret=STRONG, previous_secrets=STRONG[::-1]).check() == []
    assert settings().check() == []  # `latebandit serve` with no settings: a generated secret
    assert settings(secret="b" * 16 + "0123456789abcdef").check() == []  # 32 bytes, 17 distinct characters


def test_the_factory_refuses_unsafe_settings_before_serving() -> None:
    """`uvicorn latebandit.api.app:create_app --factory` passes here too, not only `latebandit serve`."""
    with pytest.raises(UnsafeSettings, match="LATEBANDIT_SECRET"):
        create_app(settings(secret="change-me-in-production"))
    with pytest.raises(UnsafeSettings, match=r"refusing to listen on 0\.0\.0\.0 without API keys"):
        create_app(settings(host="0.0.0.0"))
    create_app(settings(host="0.0.0.0", api_keys="admin:" + STRONG))
    create_app(settings(host="0.0.0.0", insecure=True))
    create_app(settings(host="::1"))


def test_no_secret_with_redis_is_refused_saying_what_to_set() -> None:
    """Hosts sharing a Redis would each generate their own secret and reject each other's decision ids."""
    with pytest.raises(UnsafeSettings, match=r"^LATEBANDIT_SECRET is not set: every host .* same value on each"):
        settings(redis_url="redis://127.0.0.1:6379/0").check()
    with pytest.raises(UnsafeSettings, match="LATEBANDIT_SECRET is not set"):
        create_app(settings(redis_url="redis://127.0.0.1:6379/0"))  # uvicorn run directly, in each worker
    assert settings(redis_url="redis://127.0.0.1:6379/0", secret=STRONG).check() == []


def test_secrets_keys_and_urls_never_show_in_a_repr(tmp_path) -> None:
    hidden = {
        "secret": STRONG,
        "previous_secrets": "previous-" + STRONG,
        "api_keys": "admin:admin-key-c4a1e9,decide:decide-key-7b3f",
        "redis_url": "redis://:redis-password-91f2@127.0.0.1:6379/0",
        "database_url": f"sqlite:///{tmp_path}/pg-password-5d1c.db",
    }
    built = settings(**hidden)
    assert built.sqlalchemy_url.endswith("pg-password-5d1c.db")  # read where needed (and cached)...
    assert built.api_key_pairs().startswith("admin:admin-key-c4a1e9")
    shown = f"{built!r} {built} {built.model_dump()} {built.model_dump_json()}"
    for value in ("redis-password-91f2", "pg-password-5d1c", "admin-key-c4a1e9", "decide-key-7b3f", STRONG):
        assert value not in shown  # ...never shown
