"""API keys and cache salts.

When keys are configured, every ``/v1/`` route needs one, as ``Authorization: Bearer KEY`` (OpenAI) or
``x-api-key: KEY`` (Anthropic). Each key gets its own cache salt, derived from the key by a one-way hash,
so tenants never share or probe each other's cached prefixes; a request's own ``cache_salt`` is appended
to its key's salt (it can narrow sharing within a tenant, never widen it across tenants).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from aiohttp import web

from hybridcache.http.errors import ApiError, bad_request

KEY_SALT_FIELD = web.RequestKey("hybridcache_key_salt", str)
_SALT_DOMAIN = b"hybridcache cache salt v1\x00"


def key_salt(api_key: str) -> str:
    """The cache salt of `api_key`: a hex digest that does not reveal the key. Pure."""
    return "key-" + hashlib.sha256(_SALT_DOMAIN + api_key.encode()).hexdigest()[:32]


def presented_key(request: web.Request) -> str | None:
    """The key a request carries, from ``Authorization: Bearer`` or ``x-api-key``; None if neither."""
    authorization = request.headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("x-api-key") or None


def authenticate(request: web.Request, api_keys: Sequence[str]) -> str | None:
    """The key salt for `request` (None when no keys are configured).

    Records it on the request (mutates `request`). Raises ApiError 401 for a missing or unknown key.
    """
    if not api_keys:
        return None
    key = presented_key(request)
    if key is None:
        raise ApiError(401, "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'.",
                       "authentication", code="invalid_api_key")
    if not any(hmac.compare_digest(key.encode(), known.encode()) for known in api_keys):
        raise ApiError(401, "Incorrect API key provided.", "authentication", code="invalid_api_key")
    salt = key_salt(key)
    request[KEY_SALT_FIELD] = salt
    return salt


def request_cache_salt(request: web.Request, requested: str | None) -> str | None:
    """The salt a request's prompt is hashed under: its key's salt, its own `cache_salt`, or both.

    Raises ApiError 400 for an empty `cache_salt`. Pure apart from reading `request`.
    """
    if requested is not None and not requested:
        raise bad_request("cache_salt: must be a non-empty string", "cache_salt")
    tenant = request.get(KEY_SALT_FIELD)
    if tenant is None:
        return requested
    return tenant if requested is None else f"{tenant}/{requested}"
