"""Configuration: the default file is valid, and every error names the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parent.parent
MINIMAL = '[[backends]]\nname = "a"\nurl = "http://127.0.0.1:9"\nmodels = ["m"]\n'


def test_default_config_file_loads():
    config = load_config(str(ROOT / "config.toml"))
    assert config.timeouts.connect == 3.0
    assert config.timeouts.read == 15.0
    assert config.timeouts.total == 20.0
    assert config.timeouts.stream_max == 0.0
    assert config.models == ("sim-model",)


def test_defaults_apply_and_backend_timeouts_override():
    config = parse_config(MINIMAL + "[backends.timeouts]\nread = 2.5\n" +
                          "[timeouts]\nconnect = 1.0\n")
    backend = config.backends[0]
    assert backend.timeouts.read == 2.5
    assert backend.timeouts.connect == 1.0  # inherited from [timeouts]
    assert backend.timeouts.total == 20.0
    assert config.server.max_body_bytes == 4 * 1024 * 1024


@pytest.mark.parametrize("text,message", [
    ('[timeouts]\nread = "fast"\n' + MINIMAL,
     'config.toml: timeouts.read: expected seconds > 0, got "fast"'),
    ("[timeouts]\nconnect = 0\n" + MINIMAL, "timeouts.connect: expected seconds > 0, got 0"),
    ("[timeouts]\nstream_max = -1\n" + MINIMAL, "timeouts.stream_max: expected seconds >= 0"),
    ("[server]\nport = 70000\n" + MINIMAL, "server.port: expected an integer >= 0 and <= 65535"),
    ("[server]\nmax_body_bytes = true\n" + MINIMAL, "server.max_body_bytes: expected an integer"),
    ("[server]\nprot = 1\n" + MINIMAL, "server.prot: unknown key"),
    ("[surver]\n" + MINIMAL, "surver: unknown key"),
    ("", "backends: expected at least one [[backends]] table"),
    (MINIMAL.replace('models = ["m"]', "models = []"),
     "backends[0].models: expected a non-empty list of strings"),
    (MINIMAL.replace("http://127.0.0.1:9", "ftp://x"), "backends[0].url: expected an http://"),
    (MINIMAL.replace("http://127.0.0.1:9", "http://h:1/v1"), "without the /v1 suffix"),
    (MINIMAL + 'kind = "grpc"\n', 'backends[0].kind: expected one of "openai", got "grpc"'),
    (MINIMAL + 'api_key_env = "sk-123 secret"\n',
     "backends[0].api_key_env: expected the name of an environment variable"),
    (MINIMAL + "weight = 0\n", "backends[0].weight: expected a weight > 0"),
    (MINIMAL + "[backends.timeouts]\nread = -1\n", "backends[0].timeouts.read: expected seconds"),
    (MINIMAL + MINIMAL, 'backends[1].name: expected a name no other backend uses, got "a"'),
    ("[server\n", "config.toml: not valid TOML"),
])
def test_errors_name_the_file_and_key(text, message):
    with pytest.raises(ConfigError) as error:
        parse_config(text)
    assert message in str(error.value)


def test_gateway_config_env_selects_the_file(tmp_path, monkeypatch):
    path = tmp_path / "other.toml"
    path.write_text(MINIMAL.replace('"m"', '"from-env"'))
    monkeypatch.setenv("GATEWAY_CONFIG", str(path))
    assert load_config().models == ("from-env",)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config(str(tmp_path / "absent.toml"))


def test_secrets_come_from_the_environment(monkeypatch):
    config = parse_config(MINIMAL + 'api_key_env = "GW_TEST_KEY"\n')
    monkeypatch.delenv("GW_TEST_KEY", raising=False)
    assert config.missing_secrets() == [
        "backends.a.api_key_env: environment variable GW_TEST_KEY is not set"]
    monkeypatch.setenv("GW_TEST_KEY", "s3cret")
    assert config.backends[0].api_key() == "s3cret"
    assert config.missing_secrets() == []
