"""Who may use the gateway, how much, and with what input (issue 7).

The application wires it in with :func:`install_security`; see SECURITY.md
for every way in and the test that covers it.
"""

from gateway.security.keys import KeyRing, Principal, missing_secrets
from gateway.security.limits import check_inference_limits, server_limit_kwargs
from gateway.security.middleware import (
    ADMIN_KEY,
    PRINCIPAL_KEY,
    SECURITY,
    charge_tokens,
    check_auth_exposure,
    install_security,
    log_auth_status,
    reload_security,
    require_admin,
)
from gateway.security.redaction import install_log_redaction, redact
from gateway.security.settings import (
    ApiKeyConfig,
    AuthConfig,
    LimitsConfig,
    RateLimitConfig,
    SecurityConfig,
    parse_auth,
    parse_limits,
    parse_ratelimit,
    parse_security,
)
from gateway.security.usage import StreamUsage, total_tokens

__all__ = [
    "ADMIN_KEY",
    "PRINCIPAL_KEY",
    "SECURITY",
    "ApiKeyConfig",
    "AuthConfig",
    "KeyRing",
    "LimitsConfig",
    "Principal",
    "RateLimitConfig",
    "SecurityConfig",
    "StreamUsage",
    "charge_tokens",
    "check_auth_exposure",
    "check_inference_limits",
    "install_log_redaction",
    "install_security",
    "log_auth_status",
    "missing_secrets",
    "parse_auth",
    "parse_limits",
    "parse_ratelimit",
    "parse_security",
    "redact",
    "reload_security",
    "require_admin",
    "server_limit_kwargs",
    "total_tokens",
]
