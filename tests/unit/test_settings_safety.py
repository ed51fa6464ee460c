"""What the service refuses to start with (issue 19): a placeholder or short HMAC secret, and no API keys on a
non-loopback address, wherever the app is built; and secrets that never show in a repr. Issue 30: a placeholder
or short API key too."""

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


KEY = "3f9a0c7e1b5d2468ace0f1e2d3c4b5a6"  # `openssl rand -hex 16`
WEAK_KEYS = [
    "REPLACE-ME",
    "REPLACE-ME-decide-key",  # deploy/kubernetes/secret.yaml shipped it
    "changeme",
    "secret",
    "password",
    "the-password-of-the-api",
    "x" * 32,
    "0123456789abcde",  # 15 bytes
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


@pytest.mark.parametrize("weak", WEAK_KEYS)
def test_a_placeholder_or_short_api_key_is_refused_naming_its_place_not_its_value(weak: str) -> None:
    expected = (
        r"^API key 2 of LATEBANDIT_API_KEYS \(decide@summer-\*\) is .*: generate each key with `openssl rand -hex 16`"
    )
    with pytest.raises(UnsafeSettings, match=expected) as refused:
        settings(api_keys=f"admin:{KEY},decide@summer-*:{weak}").check()
    assert weak not in str(refused.value)


def test_a_weak_key_in_the_keys_file_or_an_entry_without_a_key_is_refused(tmp_path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"admin:{KEY}\nmetrics:REPLACE-ME\n")
    with pytest.raises(
        UnsafeSettings, match=r"^API key 2 of LATEBANDIT_API_KEYS and LATEBANDIT_API_KEYS_FILE \(metrics\)"
    ):
        settings(api_keys_file=keys).check()
    for entry in (KEY, f"{KEY}:decide"):  # a key without its scope, or before it: never printed
        with pytest.raises(UnsafeSettings, match=r"^entry 1 of LATEBANDIT_API_KEYS is not scope:key") as refused:
            settings(api_keys=entry).check()
        assert KEY not in str(refused.value)
    with pytest.raises(UnsafeSettings, match="API key 1"):
        create_app(settings(api_keys="decide:REPLACE-ME"))  # the factory refuses it too
    assert settings(api_keys=f"admin:{KEY},decide@summer-*:{KEY[::-1]}").check() == []


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
        "api_keys": "admin:admin-key-c4a1e9,decide:decide-key-7b3f52",
        "redis_url": "redis://:redis-password-91f2@127.0.0.1:6379/0",
        "database_url": f"sqlite:///{tmp_path}/pg-password-5d1c.db",
    }
    built = settings(**hidden)
    assert built.sqlalchemy_url.endswith("pg-password-5d1c.db")  # read where needed (and cached)...
    assert built.api_key_pairs().startswith("admin:admin-key-c4a1e9")
    shown = f"{built!r} {built} {built.model_dump()} {built.model_dump_json()}"
    for value in ("redis-password-91f2", "pg-password-5d1c", "admin-key-c4a1e9", "decide-key-7b3f52", STRONG):
        assert value not in shown  # ...never shown
