"""What both real providers share: SDK failures as ``LlmFailureError``, Retry-After, clean text.

The SDKs (``openai``, ``anthropic``) have the same exception shapes: ``APIStatusError`` with the
HTTP response and its parsed body, ``APITimeoutError`` and ``APIConnectionError`` (a refused,
reset or dropped connection, also mid-stream). :func:`failure_from_sdk` maps them onto the
agent loop's failure vocabulary, so the loop decides about retries and compaction the same way
whichever provider answered.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from email.utils import parsedate_to_datetime
from types import ModuleType
from typing import Any, Final

from dsh._errors import LlmFailureError
from dsh._messages import StreamChunk

_LONE: Final = re.compile("[\ud800-\udfff]")

# How each provider says "the request did not fit the context window" (OpenAI, DeepSeek,
# vLLM, OpenRouter, Anthropic wordings; OpenAI also sets code context_length_exceeded).
_OVERFLOW: Final = re.compile(
    r"maximum context length|context[ _]length[ _]exceeded|context window|prompt is too long"
    r"|too many tokens|input is too long|exceeds the context|reduce the length of the messages",
    re.IGNORECASE)


def replace_lone_surrogates(value: Any) -> Any:
    """Return ``value`` with every lone surrogate in its strings replaced by U+FFFD.

    Applies to what is sent only (the log keeps its strings as they are); containers are copied
    into plain ``dict``/``list`` values, everything else is returned unchanged.
    """
    if isinstance(value, str):
        return _LONE.sub("\ufffd", value) if _LONE.search(value) else value
    if isinstance(value, Mapping):
        return {str(k): replace_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [replace_lone_surrogates(v) for v in value]
    return value


def retry_after_ms(headers: Mapping[str, str] | None) -> int | None:
    """Return the server's retry hint in ms from ``retry-after-ms`` or ``retry-after``, or None.

    ``retry-after`` may be seconds (``"2"``, ``"0.5"``) or an HTTP date; a date in the past
    gives 0. Unparseable or negative values give None.
    """
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            value = float(raw_ms)
        except ValueError:
            value = -1.0
        if value >= 0:
            return round(value)
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = parsedate_to_datetime(raw).timestamp()
        except (TypeError, ValueError):
            return None
        seconds = max(0.0, when - time.time())
    return round(seconds * 1000) if seconds >= 0 else None


def _error_fields(body: object) -> tuple[str, str, str]:
    """(message, type, code) of a provider error body, either SDK's shape, '' when absent."""
    err = body.get("error", body) if isinstance(body, Mapping) else None
    if not isinstance(err, Mapping):
        return (str(body) if isinstance(body, str) else "", "", "")
    return (str(err.get("message") or ""), str(err.get("type") or ""), str(err.get("code") or ""))


def _transport_failure(exc: BaseException) -> str | None:
    """``TIMEOUT``/``NETWORK`` for an HTTP-layer error the SDK let through unwrapped.

    Errors while reading a stream can arrive as the HTTP client's own (``ReadTimeout``,
    ``RemoteProtocolError``); they are recognised by class name in the client's hierarchy, so
    this works whichever module name the SDK's HTTP client has.
    """
    for cls in type(exc).__mro__:
        if cls.__module__.split(".")[0] in ("httpx", "httpx2"):
            if cls.__name__ == "TimeoutException":
                return "TIMEOUT"
            if cls.__name__ == "TransportError":
                return "NETWORK"
    return None


def failure_from_sdk(exc: Exception, sdk: ModuleType, *, provider: str,
                     model: str) -> LlmFailureError:
    """Map an ``openai``/``anthropic`` SDK exception to the loop's :class:`LlmFailureError`.

    Args:
        exc: The exception the SDK raised (creating the stream or while reading it), or its
            HTTP client's transport error.
        sdk: The SDK module it came from (for its exception classes).
        provider: Provider id for the message, e.g. ``"deepseek"``.
        model: Model id for the message.

    Returns:
        The failure (the caller raises it ``from exc``). Codes: ``TIMEOUT`` and ``NETWORK``
        (retryable), ``RATE_LIMITED`` (429, retryable unless the quota is exhausted:
        ``QUOTA_EXHAUSTED``), ``OVERLOADED`` (529 or an ``overloaded_error`` body),
        ``UNAVAILABLE`` (503), ``SERVER_ERROR`` (other 5xx, 408), all retryable;
        ``CONTEXT_OVERFLOW`` (a 400/413 whose body says the prompt is too long,
        ``context_overflow``); ``AUTHENTICATION`` (401), ``PERMISSION_DENIED`` (403),
        ``NOT_FOUND`` (404), ``BAD_REQUEST`` (other 4xx). ``retry_after_ms`` comes from the
        response's Retry-After headers.

    Raises:
        Exception: ``exc`` itself when it is neither an SDK API error nor an HTTP transport
            error (a bug is not a model failure).
    """
    where = f"{provider} model {model}"
    transport = _transport_failure(exc)
    if isinstance(exc, sdk.APITimeoutError) or transport == "TIMEOUT":
        return LlmFailureError(f"{where}: the request timed out (no data within the read "
                               f"timeout); it will be retried", code="TIMEOUT", retryable=True)
    if isinstance(exc, sdk.APIConnectionError) or transport == "NETWORK":
        cause = exc if transport else exc.__cause__ or exc.__context__
        detail = f" ({type(cause).__name__}: {cause})" if cause else ""
        return LlmFailureError(f"{where}: the connection failed or was closed before the reply "
                               f"ended{detail}", code="NETWORK", retryable=True)
    if not isinstance(exc, sdk.APIStatusError):
        raise exc
    status = int(exc.status_code)
    headers = exc.response.headers if exc.response is not None else None
    message, type_, code = _error_fields(exc.body)
    message = message or str(exc)
    request_id = (getattr(exc, "request_id", None)
                  or (headers.get("x-request-id") or headers.get("request-id") if headers else None)
                  or (exc.body.get("request_id") if isinstance(exc.body, Mapping) else None))
    hint = retry_after_ms(headers)

    def fail(dsh_code: str, what: str, *, retryable: bool = False,
             overflow: bool = False) -> LlmFailureError:
        return LlmFailureError(f"{where}: HTTP {status} {what}: {message}", code=dsh_code,
                               retryable=retryable, context_overflow=overflow, status=status,
                               retry_after_ms=hint if retryable else None,
                               request_id=str(request_id) if request_id else None)

    if status in (400, 413) and (code == "context_length_exceeded" or _OVERFLOW.search(message)
                                 or type_ == "request_too_large"):
        return fail("CONTEXT_OVERFLOW", "the request is larger than the model's context window",
                    overflow=True)
    if status == 429 or type_ == "rate_limit_error":
        if code == "insufficient_quota" or type_ == "insufficient_quota":
            return fail("QUOTA_EXHAUSTED", "the account's quota is used up (add credit)")
        return fail("RATE_LIMITED", "rate limited", retryable=True)
    if status == 529 or type_ == "overloaded_error":
        return fail("OVERLOADED", "the provider is overloaded", retryable=True)
    if status == 503:
        return fail("UNAVAILABLE", "the provider is unavailable", retryable=True)
    # An error event inside a 200 stream carries only its type (Anthropic's api_error).
    if status >= 500 or status == 408 or type_ in ("api_error", "server_error"):
        return fail("SERVER_ERROR", "server error", retryable=True)
    if status == 401:
        return fail("AUTHENTICATION", "the API key was refused (check the key variable)")
    if status == 403:
        return fail("PERMISSION_DENIED", "permission denied")
    if status == 404:
        return fail("NOT_FOUND", "not found (check --model and --base-url)")
    return fail("BAD_REQUEST", "the request was refused")


async def stream_sdk(sdk: ModuleType, create: Awaitable[Any],
                     take: Callable[[Any], list[StreamChunk]], *, provider: str,
                     model: str) -> AsyncIterator[StreamChunk]:
    """Open an SDK stream with ``create``, yield ``take(event)``'s chunks for each event.

    SDK and HTTP errors (while opening or reading) are raised as :class:`LlmFailureError`
    (:func:`failure_from_sdk`); the SDK stream is closed in every case, also when the loop
    cancels the iteration.
    """
    try:
        sdk_stream = await create
    except Exception as exc:  # SDK and HTTP errors; anything else is re-raised as is
        raise failure_from_sdk(exc, sdk, provider=provider, model=model) from exc
    try:
        async for event in sdk_stream:
            for chunk in take(event):
                yield chunk
    except Exception as exc:  # SDK and HTTP errors; anything else is re-raised as is
        raise failure_from_sdk(exc, sdk, provider=provider, model=model) from exc
    finally:
        await sdk_stream.close()
