"""``[auth]``, ``[ratelimit]``, ``[limits]``: parsing, errors that name the key, key resolution."""

from __future__ import annotations

import pytest

from gateway.configreader import ConfigError
from gateway.security import KeyRing, missing_secrets
from gateway.security.settings import IDENTIFIER, LimitsConfig, RateLimitConfig
from gateway.sessions.keys import TENANT_PATTERN
from tests.test_security_support import ALPHA_KEY, auth_toml, security_from_text, sha256_hex


def test_defaults_leave_auth_off_and_limits_sane() -> None:
    config = security_from_text("")
    assert not config.auth.enabled and config.auth.keys == ()
    assert config.ratelimit == RateLimitConfig() and config.ratelimit.redis_url == ""
    assert config.limits == LimitsConfig()


def test_keys_by_hash_and_env_with_limits() -> None:
    config = security_from_text(
        '[auth]\nadmin_key_env = "ADMIN"\n'
        '[[auth.keys]]\nname = "a"\ntenant = "t1"\n'
        f'sha256 = "{sha256_hex(ALPHA_KEY).upper()}"\nrequests_per_minute = 60\n'
        '[[auth.keys]]\nname = "b"\ntenant = "t2"\nkey_env = "KEY_B"\n'
        "tokens_per_minute = 1000\n")
    auth = config.auth
    assert auth.enabled, "listing keys turns auth on unless the file says otherwise"
    a, b = auth.keys
    assert (a.sha256, a.requests_per_minute, a.tokens_per_minute) == (
        sha256_hex(ALPHA_KEY), 60, None)
    assert (b.key_env, b.sha256, b.tokens_per_minute) == ("KEY_B", None, 1000)
    assert auth.admin_key_env == "ADMIN" and auth.admin_configured


@pytest.mark.parametrize("text,message", [
    ("[auth]\nenabled = true\n", "test.toml: auth.keys: expected at least one"),
    ('[auth]\nenabled = "yes"\n', "auth.enabled: expected true or false"),
    ('[[auth.keys]]\nname = "a"\ntenant = "t"\n', "auth.keys[0].sha256: expected exactly one"),
    ('[[auth.keys]]\nname = "a"\ntenant = "t"\nsha256 = "abc"\n',
     "auth.keys[0].sha256: expected 64 hexadecimal digits"),
    (f'[[auth.keys]]\nname = "a"\ntenant = "t"\nsha256 = "{"0" * 64}"\nkey_env = "K"\n',
     "auth.keys[0].sha256: expected exactly one of sha256 or key_env"),
    ('[[auth.keys]]\nname = "a"\ntenant = "a:b"\nkey_env = "K"\n',
     'auth.keys[0].tenant: expected 1-64 characters of [A-Za-z0-9._-], got "a:b"'),
    ('[[auth.keys]]\nname = "a{x}"\ntenant = "t"\nkey_env = "K"\n', "auth.keys[0].name"),
    ('[[auth.keys]]\nname = "a"\ntenant = "t"\nkey_env = "1BAD"\n',
     "auth.keys[0].key_env: expected the name of an environment variable"),
    ('[[auth.keys]]\nname = "a"\ntenant = "t"\nkey_env = "K"\nrequests_per_minute = 0\n',
     "auth.keys[0].requests_per_minute: expected an integer >= 1"),
    ('[[auth.keys]]\nname = "a"\ntenant = "t"\nkey_env = "K"\nkey = "sk-plain"\n',
     "auth.keys[0].key: unknown key"),
    ('[[auth.keys]]\nname = "a"\ntenant = "t"\nkey_env = "K"\n'
     '[[auth.keys]]\nname = "a"\ntenant = "u"\nkey_env = "L"\n',
     "auth.keys[1].name: expected a name no other key uses"),
    (f'[[auth.keys]]\nname = "a"\ntenant = "t"\nsha256 = "{"1" * 64}"\n'
     f'[[auth.keys]]\nname = "b"\ntenant = "u"\nsha256 = "{"1" * 64}"\n',
     "auth.keys[1].sha256: expected a key no other entry uses"),
    (f'[auth]\nadmin_key_env = "A"\nadmin_key_sha256 = "{"2" * 64}"\n',
     "auth.admin_key_env: expected either admin_key_sha256 or admin_key_env"),
    ('[ratelimit]\nredis_url = "http://x"\n', "ratelimit.redis_url: expected a redis://"),
    ('[ratelimit]\nredis_url = "redis://h:99999"\n', "ratelimit.redis_url: expected a redis://"),
    ('[ratelimit]\nredis_url = "redis://h:1/x"\n', "ratelimit.redis_url: expected a redis://"),
    ("[ratelimit]\nop_timeout_ms = 0\n", "ratelimit.op_timeout_ms: expected an integer >= 1"),
    ('[ratelimit]\nprefix = "rl:{x}:"\n', "ratelimit.prefix: expected a prefix without braces"),
    ("[limits]\nmax_json_depth = 1\n", "limits.max_json_depth: expected an integer >= 2"),
    ("[limits]\nmax_headers = 3\n", "limits.max_headers: expected an integer >= 8"),
    ("[limits]\nmax_body = 3\n", "limits.max_body: unknown key"),
])
def test_errors_name_the_file_and_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        security_from_text(text)
    assert message in str(error.value)
    assert str(error.value).startswith("test.toml: ")


def test_tenant_rule_is_the_session_keys_rule() -> None:
    """A tenant goes into session keys: the two rules must never drift apart."""
    assert IDENTIFIER.pattern == TENANT_PATTERN.pattern


def test_env_keys_are_read_at_start_and_checked() -> None:
    with pytest.raises(ConfigError, match="at least one"):
        security_from_text(auth_toml([]))
    text = '[[auth.keys]]\nname = "a"\ntenant = "t"\nkey_env = "GW_KEY_A"\n' \
           '[auth]\nadmin_key_env = "GW_ADMIN"\n'
    auth = security_from_text(text).auth
    assert missing_secrets(auth, {}) == [
        "auth.keys.a.key_env: environment variable GW_KEY_A is not set",
        "auth.admin_key_env: environment variable GW_ADMIN is not set"]
    with pytest.raises(ConfigError, match=r"auth\.keys\.a\.key_env: environment variable GW_KEY_A"):
        KeyRing.from_config(auth, "test.toml", {})
    with pytest.raises(ConfigError, match="shorter than 16 characters"):
        KeyRing.from_config(auth, "test.toml", {"GW_KEY_A": "short", "GW_ADMIN": "x" * 20})
    with pytest.raises(ConfigError, match="admin key is also a client key"):
        KeyRing.from_config(auth, "test.toml", {"GW_KEY_A": ALPHA_KEY, "GW_ADMIN": ALPHA_KEY})
    ring = KeyRing.from_config(auth, "test.toml", {"GW_KEY_A": f" {ALPHA_KEY}\n",
                                                   "GW_ADMIN": "y" * 20})
    assert ring.authenticate({"api-key": ALPHA_KEY}).tenant == "t"
    assert missing_secrets(auth, {"GW_KEY_A": ALPHA_KEY, "GW_ADMIN": "y" * 20}) == []
