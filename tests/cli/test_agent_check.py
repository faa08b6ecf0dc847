"""`evotrainer agent check`: the configured agent, model, endpoint and key, and one real 1-token call through
the SDK the agent uses. Over HTTP, with the real anthropic and openai SDKs, against the scripted endpoint of
tests/llm_server.py: success, a refused key (401), an unknown model (404), a refused connection, a silent
server, no key, --offline, --json; the key is never printed."""

from __future__ import annotations

import json
import socket

import pytest

from evotrainer.cli.agent_check import LABELS
from evotrainer.cli.main import AGENT_CHECK, main
from tests.llm_server import HttpError, ScriptedLLM, Silent, Turn

KEY = "sk-ant-CHECK-7d3f-never-print-me"
NAMES = ["claude", "openai"]
JSON_KEYS = {"agent", "needs_endpoint", "sdk", "sdk_version", "model", "endpoint", "api_key_env", "key_set",
             "key_required", "timeout_s", "call", "ok", "server_model", "latency_s", "error", "http_status", "message"}


@pytest.fixture(autouse=True)
def api_keys(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the package's conf/, whatever folder the tests run from
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def overrides(name: str, url: str) -> list[str]:
    if name == "claude":
        return ["agent=claude", f"agent.base_url={url}"]
    return ["agent=openai", f"agent.base_url={url}/v1", "agent.model=scripted-model", "agent.api_key_env=TEST_OPENAI_KEY"]


def check(capsys, *argv: str) -> tuple[int, dict, str]:
    """Exit status, the --json result, and the same check's text output (stdout and stderr)."""
    status = main(["agent", "check", *argv, "--json"])
    out = capsys.readouterr()
    assert KEY not in out.out + out.err
    return status, json.loads(out.out), out.err


def text(capsys, *argv: str) -> tuple[int, str]:
    status = main(["agent", "check", *argv])
    out = capsys.readouterr()
    assert KEY not in out.out + out.err
    return status, out.out + out.err


def free_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# claude in the fast tier, openai in tier 2 (each ~3 s on 2 cores)
@pytest.mark.parametrize("name", [pytest.param("claude", marks=pytest.mark.fast), "openai"])
def test_a_working_endpoint_answers_one_minimal_call(name, capsys):
    with ScriptedLLM([Turn(text="ok")]) as server:
        status, result, _ = check(capsys, *overrides(name, server.url))
        [request] = server.requests
    assert status == 0 and set(result) == JSON_KEYS and all(key in AGENT_CHECK for key in JSON_KEYS)
    assert result["ok"] is True and result["call"] == "ok" and result["error"] is None
    assert result["server_model"] == result["model"] and result["latency_s"] >= 0
    assert result["key_set"] is True and result["sdk"] == ("anthropic" if name == "claude" else "openai")
    assert result["endpoint"] == (server.url if name == "claude" else f"{server.url}/v1")
    assert result["timeout_s"] == 20.0
    body = request["body"]  # one token, no tools: the least a call can cost
    assert body.get("max_tokens", body.get("max_completion_tokens")) == 1 and "tools" not in body
    assert request["kind"] == ("anthropic" if name == "claude" else "openai")

    with ScriptedLLM([Turn(text="ok")]) as server:
        status, out = text(capsys, *overrides(name, server.url))
    assert status == 0 and f"agent: {name}" in out and "call: ok in" in out
    assert f"endpoint: {server.url}" in out and "is set" in out


AUTH_FAILED = (HttpError(401, "authentication_error", "invalid x-api-key"), "auth_failed")
MODEL_NOT_FOUND = (HttpError(404, "not_found_error", "model: no-such-model"), "model_not_found")


# each label and each SDK once in the fast tier, the other two cases in tier 2 (each ~3 s on 2 cores)
@pytest.mark.parametrize(("name", "error", "label"), [
    pytest.param("claude", *AUTH_FAILED, id="401-claude", marks=pytest.mark.fast),
    pytest.param("claude", *MODEL_NOT_FOUND, id="404-claude"),
    pytest.param("openai", *AUTH_FAILED, id="401-openai"),
    pytest.param("openai", *MODEL_NOT_FOUND, id="404-openai", marks=pytest.mark.fast),
])
def test_a_refused_key_or_an_unknown_model_is_a_labelled_error(name, error, label, capsys):
    with ScriptedLLM([error]) as server:
        status, result, _ = check(capsys, *overrides(name, server.url))
        assert len(server.requests) == 1  # no retries
    assert status == 1 and result["ok"] is False and result["call"] == "failed"
    assert result["error"] == label and label in LABELS and result["http_status"] == error.status
    assert error.message in result["message"]  # the server's own words

    with ScriptedLLM([error]) as server:
        status, out = text(capsys, *overrides(name, server.url))
    assert status == 1 and f"agent check failed [{label}]: HTTP {error.status}" in out


@pytest.mark.fast
@pytest.mark.parametrize("name", NAMES)
def test_a_refused_connection_is_a_labelled_error(name, capsys):
    status, result, _ = check(capsys, *overrides(name, f"http://127.0.0.1:{free_port()}"))
    assert status == 1 and result["error"] == "connection_error" and result["call"] == "failed"
    assert "cannot reach http://127.0.0.1:" in result["message"]


@pytest.mark.fast
def test_a_silent_server_times_out_at_the_timeout_asked(capsys):
    with ScriptedLLM([Silent(30)]) as server:
        status, result, _ = check(capsys, *overrides("claude", server.url), "--timeout", "1")
    assert status == 1 and result["error"] == "timeout" and result["timeout_s"] == 1.0


@pytest.mark.fast
def test_the_configs_timeouts_cap_the_checks(capsys):
    status, result, _ = check(capsys, "agent=claude", "agent.timeout_s=3", "--offline")
    assert status == 0 and result["timeout_s"] == 3.0
    status, result, _ = check(capsys, "agent=claude", "agent.call_timeout_s=2", "--timeout", "60", "--offline")
    assert result["timeout_s"] == 2.0


@pytest.mark.fast
@pytest.mark.parametrize("name", NAMES)
def test_offline_reports_the_agent_and_makes_no_call(name, capsys):
    with ScriptedLLM([]) as server:
        status, result, _ = check(capsys, *overrides(name, server.url), "--offline")
        assert server.requests == []
    assert status == 0 and result["ok"] is True and result["call"] == "skipped" and result["key_set"] is True
    assert result["model"] == ("claude-sonnet-5-5" if name == "claude" else "scripted-model")


@pytest.mark.fast
def test_the_default_endpoint_is_the_sdks(capsys):
    status, out = text(capsys, "agent=claude", "--offline")
    assert status == 0 and "endpoint: https://api.anthropic.com" in out and "call: skipped (--offline)" in out


@pytest.mark.fast
def test_a_missing_key_fails_before_any_call(monkeypatch, capsys):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with ScriptedLLM([Turn(text="ok")]) as server:
        status, result, err = check(capsys, *overrides("claude", server.url))
        assert server.requests == []
    assert status == 1 and result["error"] == "no_key" and result["call"] == "not_made"
    assert result["key_set"] is False and result["key_required"] is True
    assert "ANTHROPIC_API_KEY" in result["message"]
    assert text(capsys, "agent=claude", "--offline")[0] == 1  # --offline reports it too


@pytest.mark.fast
def test_a_local_openai_server_needs_no_key(monkeypatch, capsys):
    monkeypatch.delenv("TEST_OPENAI_KEY")
    with ScriptedLLM([Turn(text="ok")]) as server:
        status, result, _ = check(capsys, *overrides("openai", server.url))
        headers = {k.lower(): v for k, v in server.requests[0]["headers"].items()}
        assert headers["authorization"] == "Bearer no-key"  # the placeholder agent=openai sends
    assert status == 0 and result["key_set"] is False and result["key_required"] is False


@pytest.mark.fast
@pytest.mark.parametrize("name", ["heuristic", "tpe"])
def test_offline_agents_need_no_endpoint(name, capsys):
    status, out = text(capsys, f"agent={name}")
    assert status == 0 and out.strip() == f"agent: {name} (offline: no endpoint needed)"
    status, result, _ = check(capsys, f"agent={name}")
    assert result["needs_endpoint"] is False and result["call"] == "not_needed" and result["ok"] is True


@pytest.mark.fast
def test_a_config_error_or_an_unknown_action_exits_2(capsys):
    assert main(["agent", "check", "agent=openai"]) == 2  # agent.model is required
    assert "agent.model" in capsys.readouterr().err
    assert main(["agent", "ping"]) == 2
    assert "unknown action 'ping'" in capsys.readouterr().err
