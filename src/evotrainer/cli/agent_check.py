"""`evotrainer agent check [OVERRIDE ...] [--offline] [--json] [--timeout S]`: before a run, whether the
configured agent can be reached. It composes the config as `evotrainer config` does, reports the agent, its
model id, endpoint (base URL) and API key variable (set or not; the key is never printed), and for an LLM
agent makes one minimal real call through the SDK the agent uses (anthropic for agent=claude, openai for
agent=openai): a 1-token message, no retries, at most ``--timeout`` seconds (default 20, never more than
``agent.timeout_s`` or ``agent.call_timeout_s``). The offline agents (heuristic, the tuners, the baseline
arms) need no endpoint. Exit status: 0 ok, 1 the check failed (with a label, see ``LABELS``), 2 a config
error or an unknown action."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

# agent name -> (the SDK module it calls, the client class)
LLM_AGENTS = {"claude": ("anthropic", "Anthropic"), "openai": ("openai", "OpenAI")}
DEFAULT_TIMEOUT_S = 20.0
NO_KEY = "no-key"  # what agent=openai sends to a server that needs no key (evotrainer.agents.openai_agent)
PING = [{"role": "user", "content": "Reply with one word."}]

# the failure labels and what each means
LABELS = {
    "no_key": "the API key's environment variable is not set",
    "sdk_missing": "the agent's SDK is not installed",
    "auth_failed": "the server refused the key (HTTP 401)",
    "permission_denied": "the key may not use this model or endpoint (HTTP 403)",
    "model_not_found": "the server has no such model, or no API at this base URL (HTTP 404)",
    "bad_request": "the server refused the request (HTTP 400/422)",
    "rate_limited": "the server asks to slow down, or the account has no credit (HTTP 429)",
    "server_error": "the server failed (HTTP 5xx, 529 overloaded)",
    "http_error": "another HTTP error",
    "connection_error": "no connection (no network, connection refused, unknown host, TLS)",
    "timeout": "no reply in time",
    "api_error": "the SDK failed on what it received",
}


@dataclass
class Check:
    """What the check found; its fields are the keys of the --json output (cli/main.py AGENT_CHECK)."""

    agent: str
    needs_endpoint: bool
    sdk: str | None = None
    sdk_version: str | None = None
    model: str | None = None
    endpoint: str | None = None
    api_key_env: str | None = None
    key_set: bool | None = None
    key_required: bool | None = None
    timeout_s: float | None = None
    call: str = "not_needed"  # ok | failed | skipped (--offline) | not_needed (offline agent) | not_made
    ok: bool = True
    server_model: str | None = None
    latency_s: float | None = None
    error: str | None = None  # a LABELS key
    http_status: int | None = None
    message: str | None = None

    def fail(self, label: str, message: str, status: int | None = None) -> Check:
        self.ok, self.error, self.message, self.http_status = False, label, message, status
        if self.call != "failed":
            self.call = "not_made"
        return self


def agent(action: str, overrides: list[str] | None = None, offline: bool = False, as_json: bool = False,
          timeout: float | None = None) -> int:
    from evotrainer.cli.inspect import compose_here
    from evotrainer.config import ConfigError

    if action != "check":
        print(f"evotrainer agent: unknown action {action!r}; use `evotrainer agent check [OVERRIDE ...]`",
              file=sys.stderr)
        return 2
    try:
        cfg = compose_here(overrides)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    result = check(cfg.agent, offline=offline, timeout=DEFAULT_TIMEOUT_S if timeout is None else timeout)
    if as_json:
        print(json.dumps(dataclasses.asdict(result), indent=1))
    else:
        _print(result)
    return 0 if result.ok else 1


def check(agent_cfg, offline: bool = False, timeout: float = DEFAULT_TIMEOUT_S) -> Check:
    """The agent of ``agent_cfg`` (the composed config's ``agent`` group) checked; one call unless ``offline``."""
    from evotrainer import secrets
    from evotrainer.preflight import agent_key_problems, agent_key_required

    name = str(agent_cfg.name)
    if name not in LLM_AGENTS:
        return Check(agent=name, needs_endpoint=False)
    module, client_class = LLM_AGENTS[name]
    key_env = agent_cfg.api_key_env or None
    secrets.register(key_env)  # its value is redacted from every message printed below
    key = os.environ.get(key_env) if key_env else None
    limits = [float(v) for v in (timeout, agent_cfg.timeout_s, agent_cfg.call_timeout_s) if v is not None]
    result = Check(agent=name, needs_endpoint=True, sdk=module, model=agent_cfg.model, api_key_env=key_env,
                   key_set=bool(key), key_required=agent_key_required(agent_cfg), timeout_s=min(limits))
    try:
        sdk = importlib.import_module(module)
    except ImportError as err:
        return result.fail("sdk_missing", f"cannot import {module} ({err}); install it: pip install {module}")
    result.sdk_version = getattr(sdk, "__version__", None)
    kwargs = {"base_url": str(agent_cfg.base_url)} if agent_cfg.base_url else {}
    # the key is passed explicitly, as the agent does: the SDK's own environment lookup never decides
    client = getattr(sdk, client_class)(api_key=key or NO_KEY, timeout=result.timeout_s, max_retries=0, **kwargs)
    result.endpoint = str(client.base_url).rstrip("/")
    problems = agent_key_problems(agent_cfg)
    if problems:
        return result.fail("no_key", "; ".join(problems))
    if offline:
        result.call = "skipped"
        return result
    return _call(result, sdk, client)


def _call(result: Check, sdk, client) -> Check:
    from evotrainer import secrets
    from evotrainer.agents.transport import Deadline, DeadlineExceeded, run_bounded

    def ping() -> Any:
        if result.agent == "claude":
            return client.messages.create(model=result.model, max_tokens=1, messages=PING)
        return client.chat.completions.create(model=result.model, max_completion_tokens=1, messages=PING)

    start = time.monotonic()
    result.call = "failed"
    try:
        reply = run_bounded(ping, Deadline(result.timeout_s))  # also against a body that drips past the timeout
    except (DeadlineExceeded, sdk.APITimeoutError):
        return result.fail("timeout", f"no reply from {result.endpoint} within {result.timeout_s:g} s")
    except sdk.APIConnectionError as err:
        cause = err.__cause__ or err.__context__
        return result.fail("connection_error", secrets.redact(
            f"cannot reach {result.endpoint}: {cause or err}"))
    except sdk.APIStatusError as err:
        status = int(err.status_code)
        label = {400: "bad_request", 401: "auth_failed", 403: "permission_denied", 404: "model_not_found",
                 422: "bad_request", 429: "rate_limited"}.get(status, "server_error" if status >= 500 else "http_error")
        detail = {"auth_failed": f"the server refused the key in {result.api_key_env}",
                  "model_not_found": f"no model {result.model!r} at {result.endpoint} (or no API at this base URL)"
                  }.get(label, LABELS[label])
        return result.fail(label, secrets.redact(f"HTTP {status}: {detail}: {_server_message(err)}"), status)
    except Exception as err:  # the SDK failed on what it received (not JSON, wrong shape)
        return result.fail("api_error", secrets.redact(f"{type(err).__name__}: {err}")[:500])
    result.latency_s = round(time.monotonic() - start, 3)
    result.call = "ok"
    result.server_model = getattr(reply, "model", None)
    return result


def _server_message(err) -> str:
    """The error message of the server's JSON body (Anthropic and OpenAI shapes), else the SDK's."""
    body = getattr(err, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    message = inner.get("message") if isinstance(inner, dict) else None
    return str(message or err)[:500]


def _print(result: Check) -> None:
    if not result.needs_endpoint:
        print(f"agent: {result.agent} (offline: no endpoint needed)")
        return
    print(f"agent: {result.agent} ({result.sdk} SDK {result.sdk_version or 'not installed'})")
    print(f"model: {result.model}")
    print(f"endpoint: {result.endpoint or '-'}")
    if result.api_key_env:
        state = "set" if result.key_set else ("NOT SET" if result.key_required else "not set (not needed here)")
        print(f"key: {result.api_key_env} is {state}")
    else:
        print("key: none (agent.api_key_env is null)")
    if result.call == "ok":
        print(f"call: ok in {result.latency_s:.2f} s; the server answered as model {result.server_model}")
    elif result.call == "skipped":
        print("call: skipped (--offline)")
    if not result.ok:
        print(f"agent check failed [{result.error}]: {result.message}", file=sys.stderr)
