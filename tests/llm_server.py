"""A scripted LLM endpoint on 127.0.0.1 for offline tests of the real anthropic and openai SDKs.

It speaks the Anthropic Messages API (POST /v1/messages) and the OpenAI chat-completions API
(POST /v1/chat/completions, also under /v1/ of any base path) and answers each request with the next
step of a script: a model turn (text and/or tool calls), an HTTP error with the provider's error body
(429, 500, 529 overloaded_error ...), or a turn delivered after a delay (to outrun the client's
timeout). A step may be a function of the request body, so a scripted model can react to what the
agent sent. Every request is recorded (path, headers, body) for the test to inspect.

A broken or hostile service is scripted too: ``Raw`` sends any bytes as the body (not JSON, not
UTF-8, gzip), ``Drip`` sends the headers and then the body one byte every few seconds, ``Silent``
reads the request and never answers, and a Turn can carry made-up ``usage`` or a ``transform`` of
the whole reply (``{}``, the wrong shape).

Usage is reported the way the real services report it, from the size of what was sent (about 4
characters per token). Anthropic: the prefix up to the last ``cache_control`` breakpoint is written to
the cache (cache_creation_input_tokens) unless already there, and the longest prefix written by an
earlier request is read from it (cache_read_input_tokens). OpenAI: the system prompt and tools are an
automatically cached prefix from the second request on (prompt_tokens_details.cached_tokens).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHARS_PER_TOKEN = 4.0
KEEP = object()  # Turn.usage: report the usage the real service would


@dataclass
class Turn:
    """One model reply: optional text, then tool calls as (name, arguments)."""

    text: str | None = None
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)
    raw_arguments: str | None = None  # OpenAI only: send this exact string as the first call's arguments
    delay_s: float = 0.0
    usage: Any = field(default_factory=lambda: KEEP)  # replaces the reply's usage (None: no usage at all)
    transform: Callable[[dict], Any] | None = None  # the whole reply, rewritten (e.g. lambda r: {})


@dataclass
class HttpError:
    status: int
    error_type: str
    message: str = "scripted error"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Raw:
    """Any bytes as the body, with any status and headers."""

    body: bytes
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "application/json"})


@dataclass
class Drip:
    """Headers at once (with the full content-length), then the body one byte every ``every_s``."""

    turn: Turn
    every_s: float = 1.0


@dataclass
class Silent:
    """Read the request and answer nothing for ``seconds`` (then close)."""

    seconds: float = 30.0


Step = Turn | HttpError | Raw | Drip | Silent | Callable[[dict], "Turn | HttpError | Raw | Drip | Silent"]


def tool(name: str, **arguments) -> Turn:
    return Turn(tool_calls=[(name, arguments)])


def tokens(chars: int) -> int:
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


class ScriptedLLM:
    def __init__(self, script: list[Step], fallback: Step | None = None):
        self.script = list(script)
        self.fallback = fallback
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._cached_prefixes: set[str] = set()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._closing = threading.Event()  # ends Silent and Drip steps when the test is over

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ScriptedLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()

    @property
    def remaining(self) -> int:
        return len(self.script)

    def _next_step(self, body: dict) -> Turn | HttpError | Raw | Drip | Silent:
        with self._lock:
            step = self.script.pop(0) if self.script else self.fallback
        if step is None:
            return HttpError(500, "api_error", "the script is exhausted")
        return step(body) if callable(step) else step

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                raw = self.rfile.read(length)
                body = json.loads(raw.decode("utf-8"))
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    self._answer(raw, body)

            def _answer(self, raw: bytes, body: dict) -> None:
                kind = "anthropic" if self.path.rstrip("/").endswith("/messages") else (
                    "openai" if self.path.rstrip("/").endswith("/chat/completions") else None)
                with server._lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body,
                                            "kind": kind, "raw_chars": len(raw), "raw": raw})
                if kind is None:
                    return self._send(404, {"error": {"type": "not_found_error", "message": self.path}})
                step = server._next_step(body)
                if isinstance(step, HttpError):
                    payload = ({"type": "error", "error": {"type": step.error_type, "message": step.message}}
                               if kind == "anthropic" else
                               {"error": {"type": step.error_type, "message": step.message, "code": None}})
                    return self._send(step.status, payload, step.headers)
                if isinstance(step, Raw):
                    return self._send_bytes(step.status, step.body, step.headers)
                if isinstance(step, Silent):
                    server._closing.wait(step.seconds)
                    return None
                turn = step.turn if isinstance(step, Drip) else step
                if turn.delay_s:
                    time.sleep(turn.delay_s)
                reply = server._reply(kind, body, turn)
                if isinstance(step, Drip):
                    return self._drip(json.dumps(reply).encode("utf-8"), step.every_s)
                self._send(200, reply)

            def _send(self, status: int, payload: Any, headers: dict | None = None) -> None:
                self._send_bytes(status, json.dumps(payload).encode("utf-8"),
                                 {"content-type": "application/json", **(headers or {})})

            def _send_bytes(self, status: int, data: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("content-length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def _drip(self, data: bytes, every_s: float) -> None:
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.flush()
                for index in range(len(data)):
                    if server._closing.wait(every_s):
                        return
                    self.wfile.write(data[index:index + 1])
                    self.wfile.flush()

        return Handler

    def _reply(self, kind: str, body: dict, turn: Turn) -> Any:
        reply = self._anthropic(body, turn) if kind == "anthropic" else self._openai(body, turn)
        if turn.usage is not KEEP:
            if turn.usage is None:
                reply.pop("usage")
            else:
                reply["usage"] = turn.usage
        return turn.transform(reply) if turn.transform else reply

    # -- usage: what the real services would report for this request ----------------------------------

    def _usage(self, prefix: str, rest: str, output: str) -> tuple[int, int, int, int]:
        """(uncached input, output, cache read, cache write) tokens."""
        prefix_tokens, rest_tokens = tokens(len(prefix)), tokens(len(rest))
        with self._lock:
            hit = prefix in self._cached_prefixes
            self._cached_prefixes.add(prefix)
        read, write = (prefix_tokens, 0) if hit else (0, prefix_tokens)
        return rest_tokens, tokens(len(output)), read, write

    def _anthropic_cache(self, body: dict) -> tuple[int, int, int]:
        """(uncached input, cache read, cache write) tokens under Anthropic's breakpoint rules."""
        def marked(value) -> bool:
            return isinstance(value, list) and any(isinstance(b, dict) and "cache_control" in b for b in value)

        def plain(value):
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items() if k != "cache_control"}
            return [plain(v) for v in value] if isinstance(value, list) else value

        parts = [json.dumps(plain(body.get("tools"))), json.dumps(plain(body.get("system")))]
        parts += [json.dumps(plain(m)) for m in body.get("messages", [])]
        ends = [1] if marked(body.get("tools")) else []  # a breakpoint covers everything before it
        ends += [2] if marked(body.get("system")) else []
        ends += [3 + i for i, m in enumerate(body.get("messages", [])) if marked(m.get("content"))]
        full = "".join(parts)
        with self._lock:
            hits = [p for p in self._cached_prefixes if full.startswith(p)]
            read = max(hits, key=len, default="")
            write = "".join(parts[: max(ends)]) if ends else ""
            if write:
                self._cached_prefixes.add(write)
        read_t = tokens(len(read)) if read else 0
        write_t = max(0, tokens(len(write)) - read_t) if write and len(write) > len(read) else 0
        return max(0, tokens(len(full)) - read_t - write_t), read_t, write_t

    def _anthropic(self, body: dict, turn: Turn) -> dict:
        content: list[dict] = []
        if turn.text:
            content.append({"type": "text", "text": turn.text})
        for name, arguments in turn.tool_calls:
            content.append({"type": "tool_use", "id": f"toolu_{next(self._ids):04d}", "name": name, "input": arguments})
        uncached, read, write = self._anthropic_cache(body)
        out = tokens(len(json.dumps(content)))
        return {
            "id": f"msg_{next(self._ids):04d}", "type": "message", "role": "assistant", "model": body["model"],
            "content": content, "stop_reason": "tool_use" if turn.tool_calls else "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": uncached, "output_tokens": out, "cache_read_input_tokens": read,
                      "cache_creation_input_tokens": write},
        }

    def _openai(self, body: dict, turn: Turn) -> dict:
        calls = []
        for index, (name, arguments) in enumerate(turn.tool_calls):
            raw = turn.raw_arguments if (index == 0 and turn.raw_arguments is not None) else json.dumps(arguments)
            calls.append({"id": f"call_{next(self._ids):04d}", "type": "function",
                          "function": {"name": name, "arguments": raw}})
        message: dict = {"role": "assistant", "content": turn.text}
        if calls:
            message["tool_calls"] = calls
        messages = body.get("messages", [])
        prefix = json.dumps([messages[:1], body.get("tools")])
        uncached, out, read, _ = self._usage(prefix, json.dumps(messages[1:]), json.dumps(message))
        return {
            "id": f"chatcmpl-{next(self._ids):04d}", "object": "chat.completion", "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": uncached + read, "completion_tokens": out, "total_tokens": uncached + read + out,
                      "prompt_tokens_details": {"cached_tokens": read}},
        }
