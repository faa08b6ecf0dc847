"""The HTTP side of the LLM agents: a deadline per call, bounded bodies, capped retries.

Each call (one request of the conversation) has a deadline, ``agent.call_timeout_s``, never later
than the propose step's (``agent.step_timeout_s``). It holds against
- a silent server or slow headers: every socket read is bounded by ``min(agent.timeout_s, time
  left)`` (httpx timeouts set per request by a request hook), and each attempt runs in a worker
  thread that the caller stops waiting for at the deadline;
- a body that drips (headers, then a byte every few seconds): a response hook wraps the body, which
  fails once the deadline passes or the body (decompressed) exceeds ``agent.max_response_bytes``;
- ``retry-after``: the SDK's own retries are off; ``SDKProvider.send`` retries 408/409/429/5xx/529,
  timeouts, connection errors and unusable 200 replies up to ``agent.max_retries`` times, waiting
  what the server asks (``retry-after-ms`` / ``retry-after``) but at most ``agent.max_retry_wait_s``,
  and never past the deadline.
A call that still fails raises CallFailed with its outcome and failure label; nothing else escapes.
"""

from __future__ import annotations

import email.utils
import importlib
import json
import random
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

from evotrainer import secrets

API_ERROR = "agent_api_error"
TIMEOUT = "agent_timeout"
MALFORMED = "agent_malformed_reply"
INITIAL_BACKOFF_S, MAX_BACKOFF_S = 0.5, 8.0  # the SDKs' own values
THREAD_GRACE_S = 0.5  # past the deadline, the caller stops waiting for the worker thread


class Deadline:
    def __init__(self, seconds: float, parent: Deadline | None = None):
        end = time.monotonic() + max(0.0, float(seconds))
        self.end = min(end, parent.end) if parent is not None else end

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def expired(self) -> bool:
        return self.remaining() <= 0.0


class DeadlineExceeded(Exception):
    """The call's deadline passed while a reply was awaited or read."""


class ResponseTooLarge(Exception):
    """The body of a reply exceeded agent.max_response_bytes."""


class MalformedReply(Exception):
    """The endpoint answered 200 with a body the agent cannot use (not UTF-8, not JSON, wrong shape)."""


class CallFailed(Exception):
    """A call failed for good (retries spent, not retryable, or out of time)."""

    def __init__(self, message: str, label: str, outcome: str, status: int | None, error_type: str,
                 attempts: int, charged: int):
        super().__init__(message)
        self.label, self.outcome, self.status, self.error_type = label, outcome, status, error_type
        self.attempts, self.charged = attempts, charged


def run_bounded(fn: Callable[[], Any], deadline: Deadline) -> Any:
    """``fn()`` in a daemon thread; DeadlineExceeded if it has not returned by the deadline (the thread
    is left to end on its own socket timeouts; it holds nothing the caller uses)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # handed to the caller
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True, name="evotrainer-llm-call")
    thread.start()
    thread.join(deadline.remaining() + THREAD_GRACE_S)
    if thread.is_alive():
        raise DeadlineExceeded("no complete reply before the call's deadline")
    if "error" in box:
        raise box["error"]
    return box["value"]


def retry_wait(headers, retry_index: int, cap_s: float) -> tuple[float, float | None]:
    """(seconds to wait, seconds the server asked for or None): ``retry-after-ms`` or ``retry-after``
    (seconds or an HTTP date) when given, else exponential backoff with jitter; at most ``cap_s``."""
    asked = None
    if headers is not None:
        for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
            value = headers.get(name)
            if value is None:
                continue
            try:
                asked = float(value) / scale
            except ValueError:
                parsed = email.utils.parsedate_tz(value) if name == "retry-after" else None
                asked = email.utils.mktime_tz(parsed) - time.time() if parsed else None
            if asked is not None and asked == asked:  # not NaN
                break
            asked = None
    if asked is not None and asked >= 0:
        wait = asked
    else:
        wait = min(INITIAL_BACKOFF_S * 2.0 ** min(retry_index, 30), MAX_BACKOFF_S) * (1 - 0.25 * random.random())
    return min(wait, cap_s), asked


def _httpx_of(sdk):
    """The httpx distribution the SDK is built on (httpx, or httpx2 in newer SDKs)."""
    for cls in sdk.DefaultHttpxClient.__mro__:
        if cls.__name__ == "Client" and cls.__module__.startswith("httpx"):
            return importlib.import_module(cls.__module__.split(".")[0])
    raise RuntimeError(f"{sdk.__name__}: cannot find the httpx client it is built on")


class Hooks:
    """httpx event hooks of one client: count attempts, bound each read by the deadline, wrap bodies."""

    def __init__(self, httpx, max_bytes: int):
        self.count = 0
        self.deadline: Deadline | None = None
        self._max_bytes = max_bytes
        self._stream_base = httpx.SyncByteStream

    def on_request(self, request) -> None:
        self.count += 1
        request.headers["accept-encoding"] = "gzip, deflate, identity"  # only what BoundedBody can decode
        if self.deadline is not None:
            left = max(0.01, self.deadline.remaining())
            timeout = dict(request.extensions.get("timeout") or {})
            timeout = {k: min(timeout.get(k) or left, left) for k in ("connect", "read", "write", "pool")}
            request.extensions = {**request.extensions, "timeout": timeout}

    def on_response(self, response) -> None:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", ""):
            del response.headers["content-encoding"]  # decoded (bounded) here, not by httpx
        response.stream = _bounded_body(self._stream_base, response.stream, self.deadline, self._max_bytes, encoding)


def _bounded_body(base: type, inner, deadline: Deadline | None, max_bytes: int, encoding: str):
    class BoundedBody(base):
        def __iter__(self):
            decoder = None
            if encoding in ("gzip", "x-gzip"):
                decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
            elif encoding == "deflate":
                decoder = zlib.decompressobj()
            elif encoding not in ("identity", ""):
                raise ResponseTooLarge(f"unsupported content-encoding {encoding!r}")
            total = 0
            for chunk in inner:
                if decoder is not None:
                    chunk = decoder.decompress(chunk, max_bytes + 1 - total)
                total += len(chunk)
                if total > max_bytes:
                    raise ResponseTooLarge(f"the reply is larger than agent.max_response_bytes={max_bytes}")
                if deadline is not None and deadline.expired():
                    raise DeadlineExceeded("the reply was still arriving at the call's deadline")
                yield chunk

        def close(self) -> None:
            inner.close()

    return BoundedBody()


def _cause(err: BaseException, kinds: tuple[type, ...]) -> BaseException | None:
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, kinds):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class SDKProvider:
    """What the anthropic and openai providers share: the SDK client (its retries off, the hooks
    above), the retry loop with capped waits, and the mapping of failures to outcomes and labels.
    Subclasses build the request (``request``), post it (``post``, returning the raw httpx response
    of a 200) and turn the decoded JSON into a Reply (``parse``, raising MalformedReply)."""

    name = "sdk"

    def __init__(self, sdk, client_class: str, agent_cfg, key: str) -> None:
        self._sdk = sdk
        self._httpx = _httpx_of(sdk)
        self._client_class = client_class
        self._key = key
        self.cfg = agent_cfg
        self.model = agent_cfg.model
        self._connect()

    def _connect(self) -> None:
        cfg = self.cfg
        self.hooks = Hooks(self._httpx, int(cfg.max_response_bytes))
        kwargs = {"base_url": cfg.base_url} if cfg.base_url else {}
        http_client = self._sdk.DefaultHttpxClient(
            event_hooks={"request": [self.hooks.on_request], "response": [self.hooks.on_response]})
        self.client = getattr(self._sdk, self._client_class)(
            api_key=self._key, timeout=float(cfg.timeout_s), max_retries=0, http_client=http_client, **kwargs)

    # -- provider-specific ----------------------------------------------------------------------------

    def request(self, system: str, messages: list[dict], tools: list[dict]) -> dict:
        raise NotImplementedError

    def post(self, kwargs: dict):
        raise NotImplementedError

    def parse(self, payload: dict):
        raise NotImplementedError

    # -- one call ------------------------------------------------------------------------------------

    def send(self, system: str, messages: list[dict], tools: list[dict], deadline: Deadline):
        """The Reply of one call (its ``attempts`` and ``charged`` set), or CallFailed."""
        kwargs = secrets.redact_obj(self.request(system, messages, tools))
        attempts = charged = 0
        max_retries = int(self.cfg.max_retries)
        last: tuple[str, str, int | None, str, str] | None = None  # label, outcome, status, type, message
        out_of_time = False
        for retry in range(max_retries + 1):
            if deadline.expired():
                out_of_time = True
                break
            attempts += 1
            self.hooks.deadline = deadline
            try:
                raw = run_bounded(lambda: self.post(kwargs), deadline)
                reply = self.parse(_decode(raw.content))
            except Exception as err:  # every failure of an attempt is classified below, none escapes
                label, outcome, status, retryable, billed, headers = self._classify(err)
                charged += billed
                if isinstance(err, DeadlineExceeded):
                    self._connect()  # the worker thread may still hold the old client's connection
                last = (label, outcome, status, type(err).__name__, _message(err))
                if not retryable or retry == max_retries:
                    break
                wait, asked = retry_wait(headers, retry, float(self.cfg.max_retry_wait_s))
                if asked is not None and asked > wait:
                    last = (*last[:4], f"{last[4]} (retry-after {asked:.0f} s; waited {wait:.1f} s at most)")
                if wait >= deadline.remaining():
                    last = (*last[:4], f"{last[4]} (no time left to retry before the call's deadline)")
                    break
                time.sleep(wait)
                continue
            reply.attempts, reply.charged = attempts, charged
            return reply
        if last is None or (out_of_time and last[1] != "timeout"):
            last = (TIMEOUT, "timeout", None, "DeadlineExceeded",
                    f"the call's deadline passed{' after: ' + last[4] if last else ''}")
        label, outcome, status, error_type, message = last
        raise CallFailed(f"{error_type} after {attempts} attempt(s): {message}", label, outcome, status, error_type,
                         attempts, charged)

    def _classify(self, err: Exception) -> tuple[str, str, int | None, bool, int, Any]:
        """(label, outcome, HTTP status, retryable, billed (0/1), response headers) of a failed attempt."""
        sdk = self._sdk
        if isinstance(err, MalformedReply) or _cause(err, (ResponseTooLarge,)):
            return MALFORMED, "malformed_reply", 200, True, 1, None
        if isinstance(err, DeadlineExceeded) or _cause(err, (DeadlineExceeded,)):
            return TIMEOUT, "timeout", None, True, 1, None
        if isinstance(err, sdk.APITimeoutError):
            return TIMEOUT, "timeout", None, True, 1, None
        if isinstance(err, sdk.APIConnectionError):
            return API_ERROR, "connection_error", None, True, 0, None
        if isinstance(err, sdk.APIStatusError):
            status = int(err.status_code)
            headers = getattr(err.response, "headers", None)
            should = (headers.get("x-should-retry") if headers is not None else None)
            retryable = status in (408, 409, 429) or status >= 500
            retryable = {"true": True, "false": False}.get(should, retryable)
            outcome = ("rate_limited" if status == 429 else "overloaded" if status == 529
                       else "server_error" if status >= 500 else "api_error")
            return API_ERROR, outcome, status, retryable, 0, headers
        return API_ERROR, "api_error", None, False, 0, None  # the SDK failed on something it received


def _decode(content: bytes) -> dict:
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as err:
        raise MalformedReply(f"the reply is not UTF-8 (bad byte at offset {err.start})") from None
    try:
        payload = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise MalformedReply(f"the reply is not JSON ({getattr(err, 'msg', 'nested too deep')})") from None
    if not isinstance(payload, dict):
        raise MalformedReply(f"the reply is a JSON {type(payload).__name__}, not an object")
    return secrets.redact_obj(payload)  # what the endpoint echoes of a key goes no further


def _message(err: Exception) -> str:
    text = str(err) or type(err).__name__
    cause = _cause(err, (ResponseTooLarge, DeadlineExceeded))
    if cause is not None and cause is not err:
        text = f"{text}: {cause}"
    return secrets.redact(text)[:2000]
