"""Protocol errors: one exception for every request the server refuses, rendered in each API's envelope.

Handlers raise `ApiError(status, message, kind, param)`; the app's error middleware renders it as OpenAI's
``{"error": {"message", "type", "param", "code"}}`` or Anthropic's ``{"type": "error", "error": {"type",
"message"}}`` depending on the route. `kind` is protocol-neutral; each envelope names it its own way.
Engine failures (`RequestError`) map to statuses here too. Nothing in this module mutates shared state.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec
from aiohttp import web

from hybridcache.core.api import RequestError

ErrorKind = Literal[
    "invalid_request", "authentication", "not_found", "too_large", "timeout", "unavailable", "internal",
    "rate_limited",
]
Protocol = Literal["openai", "anthropic"]

_OPENAI_TYPES: dict[str, str] = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "not_found": "invalid_request_error",
    "too_large": "invalid_request_error",
    "timeout": "timeout_error",
    "unavailable": "service_unavailable_error",
    "internal": "server_error",
    "rate_limited": "rate_limit_error",
}
_ANTHROPIC_TYPES: dict[str, str] = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "not_found": "not_found_error",
    "too_large": "request_too_large",
    "timeout": "timeout_error",
    "unavailable": "overloaded_error",
    "internal": "api_error",
    "rate_limited": "rate_limit_error",
}
_ENGINE_ERRORS: dict[str, tuple[int, ErrorKind]] = {
    "unavailable": (503, "unavailable"),
    "timeout": (408, "timeout"),
    "too_long": (400, "invalid_request"),
    "internal": (500, "internal"),
}
_VALIDATION_PATH = re.compile(r" - at `\$\.?([^`]*)`$")


class ApiError(Exception):
    """A refused request: HTTP `status`, a client-facing `message`, the neutral `kind`, the field at fault,
    and any `headers` the response carries (Retry-After on a 429)."""

    def __init__(self, status: int, message: str, kind: ErrorKind = "invalid_request",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = dict(headers or {})
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 invalid-request error naming `param`. Pure."""
    return ApiError(400, message, "invalid_request", param, code)


def from_engine_error(error: RequestError) -> ApiError:
    """The protocol error for an engine `RequestError` (unavailable 503, timeout 408, too_long 400,
    internal 500). Pure."""
    status, kind = _ENGINE_ERRORS.get(error.kind, (500, "internal"))
    return ApiError(status, error.message, kind, code=error.kind)


def from_validation_error(error: msgspec.ValidationError | msgspec.DecodeError) -> ApiError:
    """A 400 for a body msgspec could not decode (malformed JSON) or validate (wrong type, missing field).

    The field path msgspec reports (``$.messages[0].role``) becomes `param` (``messages[0].role``). Pure.
    """
    text = str(error)
    if isinstance(error, msgspec.ValidationError):
        found = _VALIDATION_PATH.search(text)
        param = found.group(1) if found else None
        return bad_request(f"Invalid request body: {text}", param)
    return bad_request(f"Malformed JSON body: {text}", code="invalid_json")


def error_body(error: ApiError, protocol: Protocol) -> dict[str, object]:
    """The JSON envelope of `error` in `protocol`'s own shape. Pure."""
    if protocol == "anthropic":
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES[error.kind], "message": error.message}}
    return {"error": {"message": error.message, "type": _OPENAI_TYPES[error.kind], "param": error.param,
                      "code": error.code}}


def error_response(error: ApiError, protocol: Protocol) -> web.Response:
    """An HTTP response carrying `error` in `protocol`'s envelope. Pure construction."""
    return web.Response(body=msgspec.json.encode(error_body(error, protocol)), status=error.status,
                        content_type="application/json", headers=error.headers)


def protocol_of_path(path: str) -> Protocol:
    """Which envelope a route answers errors in: Anthropic for /v1/messages, OpenAI elsewhere. Pure."""
    return "anthropic" if path.startswith("/v1/messages") else "openai"


def kind_of_status(status: int) -> ErrorKind:
    """The neutral kind for an HTTP status aiohttp raised itself (404 route, 405 method, 413 body). Pure."""
    if status == 401:
        return "authentication"
    if status in (404, 405):
        return "not_found"
    if status == 413:
        return "too_large"
    if status >= 500:
        return "internal"
    return "invalid_request"
