"""The LLM agents against a broken or hostile endpoint (issue 14): no crash, no hang, no leaked key,
no broken budget. Over HTTP, with the real anthropic and openai SDKs, against the scripted endpoint
of tests/llm_server.py; the propose stage runs for real where the canary key is hunted.

Each behaviour's measured outcome is asserted here (the endpoint-behaviour matrix): an unusable 200
reply is a failed call labelled agent_malformed_reply; unbelievable usage is agent_usage_invalid and
counted conservatively; a slow, dripping or silent endpoint and a long retry-after end at the call's
deadline (agent_timeout / agent_api_error); error storms are retried a bounded number of times;
oversized text, tool arguments and diffs are cut or refused before they are stored or sent again.
"""

from __future__ import annotations

import functools
import gzip
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from evotrainer import secrets
from evotrainer.agents import make_agent
from evotrainer.agents.base import FailedProposal, FallbackProposal
from evotrainer.agents.heuristic import set_recipe_values, unified_diff
from evotrainer.config import compose, to_yaml
from evotrainer.contracts import agent_calls as calls
from evotrainer.contracts.harness import DEFAULT_HARNESS
from tests.llm_server import Drip, HttpError, Raw, ScriptedLLM, Silent, Turn, tool

CANARY = "sk-ant-CANARY-4f1e9c2a7b-never-store-me"
RECIPE = (DEFAULT_HARNESS / "recipe.yaml").read_text()
REWARD = (DEFAULT_HARNESS / "reward.py").read_text()
LOWER_LR = unified_diff("recipe.yaml", RECIPE, set_recipe_values(RECIPE, {"lr": 1e-4}))
NAMES = ["claude", "openai"]


def submit(diff: str, name: str = "lower_lr", hypothesis: str = "If lr is lower then val accuracy rises.") -> Turn:
    return tool("submit_candidate", intervention=name, hypothesis=hypothesis, targeted_findings=["dead_group_ratio"],
                success_criterion="val accuracy above control", diff=diff)


FINISH = tool("finish")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run directory as the workflow leaves it before propose, made by hand (no policy, no training):
    synthetic rollouts with many dead groups, a diagnosis that flags them, the parent harness."""
    from evotrainer.atomic import write_json, write_parquet
    from evotrainer.contracts import evidence

    run = tmp_path_factory.mktemp("results") / "r"
    gen = run / "gen0"
    shutil.copytree(DEFAULT_HARNESS, gen / "harness")
    rng = np.random.default_rng(0)
    rows = []
    for p in range(16):
        dead = p < 10
        for s in range(4):
            correct = (not dead) and bool(rng.random() < 0.5)
            rows.append({"run": "r", "generation": 0, "split": "probe", "step": 0, "prompt_id": f"p{p}",
                         "group_id": f"p{p}", "sample_idx": s, "data_source": "arithmetic", "prompt": f"{p}+{s}=",
                         "response": str(p + s if correct else p - s), "ground_truth": str(p + s),
                         "reward": float(correct), "correct": correct, "response_tokens": 3, "truncated": False,
                         "finish_reason": "eos", "mean_logprob": -1.0, "policy_id": "p", "harness_id": "h", "seed": 0,
                         "wall_time": 0.0, "difficulty": 1})
    evidence.write(pd.DataFrame(rows), gen / "rollouts.parquet")
    findings = [{"name": "dead_group_ratio", "layer": "signal", "value": 0.62, "threshold": 0.5, "direction": "above",
                 "severity": "critical", "affected_rows": 40, "message": "most groups carry no signal"},
                {"name": "truncation_rate", "layer": "behaviour", "value": 0.0, "threshold": 0.2, "direction": "above",
                 "severity": "ok", "affected_rows": 0, "message": "no truncation"}]
    write_parquet(gen / "diagnostics.parquet", pd.DataFrame(findings))
    write_json(gen / "diagnosis.json", {"generation": 0, "findings": findings})
    return run


@pytest.fixture(autouse=True)
def canary_keys(monkeypatch):
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "TEST_OPENAI_KEY"):
        monkeypatch.setenv(name, CANARY)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def overrides(name: str, url: str, *extra: str) -> list[str]:
    base = ["agent=claude", f"agent.base_url={url}"] if name == "claude" else [
        "agent=openai", f"agent.base_url={url}/v1", "agent.model=scripted-model", "agent.api_key_env=TEST_OPENAI_KEY"]
    fast = ["agent.timeout_s=5", "agent.max_retries=1", "agent.max_retry_wait_s=0.05", "agent.call_timeout_s=10",
            "agent.max_candidates=2", "agent.max_invalid_replies=1", "agent.fallback=none"]
    return [*base, *fast, *extra]


@functools.cache
def _composed(name: str):
    return compose(overrides(name, "http://127.0.0.1:9")).agent


def agent_conf(name: str, url: str, *extra: str):
    """overrides() applied to a config composed once per SDK (Hydra's compose costs ~1 s here)."""
    dots = [o.removeprefix("agent.") for o in overrides(name, url, *extra) if o.startswith("agent.")]
    return OmegaConf.merge(_composed(name), OmegaConf.from_dotlist(dots))


def context_for(run: Path):
    from evotrainer.agents import ProposalContext
    from evotrainer.atomic import read_json
    from evotrainer.contracts import lineage
    from evotrainer.contracts.harness import harness_id

    gen = run / "gen0"
    context = ProposalContext(generation=0, harness_dir=gen / "harness", harness_id=harness_id(gen / "harness"),
                              findings=read_json(gen / "diagnosis.json")["findings"],
                              lineage=lineage.read(run / "lineage.parquet"))
    context.extra.update(run="r", run_dir=run, rollouts=gen / "rollouts.parquet", diagnostics=gen / "diagnostics.parquet")
    return context


def run_agent(name, run, script, *extra, k=2, url=None):
    with ScriptedLLM(script) as server:
        agent = make_agent(agent_conf(name, url or server.url, *extra))
        context = context_for(run)
        started = time.perf_counter()
        narrative = agent.narrate(context)
        proposals = agent.propose(context, k)
        elapsed = time.perf_counter() - started
    return agent, narrative, proposals, server, elapsed


def no_canary_in(server: ScriptedLLM) -> None:
    for request in server.requests:
        assert CANARY.encode() not in request["raw"], "the canary went back to the endpoint in a request body"


# -- unusable 200 replies: a labelled failed call, retried, recorded ------------------------------------

def _wrong_shape(reply: dict) -> dict:
    return {**reply, "content": "plain text"} if "content" in reply else {**reply, "choices": {"0": reply["choices"][0]}}


def _no_tool_id(reply: dict) -> dict:
    if "content" in reply:
        reply["content"][0].pop("id")
    else:
        reply["choices"][0]["message"]["tool_calls"][0]["function"].pop("name")
    return reply


def _content_not_list(reply: dict) -> dict:
    if "content" in reply:
        reply["content"] = [["nested"], 3]
    else:
        reply["choices"][0]["message"]["content"] = {"text": 1}
    return reply


UNUSABLE = {
    "not_json": Raw(b"<html><body>502 Bad Gateway</body></html>", headers={"content-type": "text/html"}),
    "json_labelled_but_not_json": Raw(b"{'content': [oops"),
    "not_utf8": Raw(b'{"content": [{"type": "text", "text": "\xff\xfe\xfa"}]}'),
    "empty_object": Turn(text="x", transform=lambda reply: {}),
    "json_array": Raw(b"[1, 2, 3]"),
    "wrong_shape": Turn(text="x", transform=_wrong_shape),
    "missing_tool_fields": Turn(tool_calls=[("finish", {})], transform=_no_tool_id),
    "wrong_content_types": Turn(text="x", transform=_content_not_list),
    "body_over_max_response_bytes": Raw(b'{"pad": "' + b"x" * 300_000 + b'"}'),
    "unsupported_content_encoding": Raw(b"\x00\x01", headers={"content-type": "application/json",
                                                                "content-encoding": "br"}),
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("behaviour", list(UNUSABLE))
def test_an_unusable_reply_is_a_labelled_failed_call_and_the_step_goes_on(run_dir, name, behaviour):
    bad = UNUSABLE[behaviour]
    agent, narrative, proposals, server, _ = run_agent(name, run_dir, [bad, bad], "agent.max_response_bytes=100000")
    assert len(server.requests) == 2  # one attempt and one retry (agent.max_retries=1), then it stops
    (failed,) = proposals
    assert isinstance(failed, FailedProposal) and failed.failure_label == "agent_malformed_reply"
    (call,) = agent.calls
    assert (call.outcome, call.label, call.status_code, call.attempts) == ("malformed_reply", "agent_malformed_reply", 200, 2)
    # the lost replies may have been billed: counted at the conservative estimate, twice
    max_tokens = 8192 if name == "claude" else 4096
    assert call.usage_estimated and call.usage.output_tokens == 2 * max_tokens
    assert call.usage.input_tokens == 2 * call.request_chars
    assert "stopped: malformed_reply" in narrative


@pytest.mark.parametrize("name", NAMES)
def test_an_unusable_reply_then_a_good_one_succeeds(run_dir, name):
    agent, narrative, _, server, _ = run_agent(name, run_dir, [Raw(b"not json"), tool("read_findings"), FINISH])
    assert server.remaining == 0 and "stopped: finished" in narrative
    assert agent.calls[0].attempts == 2 and agent.calls[0].outcome == "ok" and agent.calls[0].usage_estimated


# -- usage: only non-negative integers are believed ----------------------------------------------------

BAD_USAGE = {
    "missing": None,
    "negative": {"input_tokens": -1_000_000, "output_tokens": -5, "prompt_tokens": -1_000_000, "completion_tokens": -5},
    "non_numeric": {"input_tokens": "lots", "output_tokens": "x", "prompt_tokens": "lots", "completion_tokens": "x"},
    "float": {"input_tokens": 10.5, "output_tokens": 3.2, "prompt_tokens": 10.5, "completion_tokens": 3.2},
    "absurd": {"input_tokens": 10**18, "output_tokens": 1, "prompt_tokens": 10**18, "completion_tokens": 1},
    "under_reported": {"input_tokens": 0, "output_tokens": 0, "prompt_tokens": 0, "completion_tokens": 0},
    "not_an_object": [1, 2],
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("behaviour", list(BAD_USAGE))
def test_usage_that_cannot_be_believed_is_labelled_and_counted_conservatively(run_dir, name, behaviour, tmp_path):
    turn = Turn(tool_calls=[("read_findings", {})], usage=BAD_USAGE[behaviour])
    agent, _, _, server, _ = run_agent(name, run_dir, [turn, FINISH])
    first = agent.calls[0]
    assert (first.outcome, first.label, first.usage_estimated) == ("ok", "agent_usage_invalid", True)
    max_tokens = 8192 if name == "claude" else 4096
    assert first.usage.input_tokens == first.request_chars and first.usage.output_tokens == max_tokens
    calls.write(tmp_path / calls.FILE_NAME, agent.calls)
    table = pd.read_parquet(tmp_path / calls.FILE_NAME)
    assert (table[list(calls.TOKEN_COLUMNS)] >= 0).all().all() and table["label"].iloc[0] == "agent_usage_invalid"


@pytest.mark.fast
@pytest.mark.parametrize("name", NAMES)
def test_the_budget_holds_when_usage_is_missing_or_negative(run_dir, name):
    negative = {"input_tokens": -10**6, "output_tokens": -10**6, "prompt_tokens": -10**6, "completion_tokens": -10**6}
    script = [Turn(tool_calls=[("read_findings", {})], usage=negative), Turn(tool_calls=[("read_findings", {})], usage=None),
              submit(LOWER_LR)]
    # the conservative estimate of the first call (its request's characters + max_tokens) spends a 5k-token
    # budget at once (negative counts would have driven the counter below zero): no second call is made
    agent, narrative, proposals, server, _ = run_agent(name, run_dir, script, "agent.budget.max_tokens=5000")
    assert len(server.requests) == 1 and proposals == [] and "stopped: budget" in narrative
    assert agent.calls[0].usage.total >= 5000


# -- slow, dripping and silent endpoints, retry-after: the deadlines hold --------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_a_body_that_drips_one_byte_at_a_time_ends_at_the_call_deadline(run_dir, name):
    # each byte arrives well within the read timeout (5 s): only the call's deadline can stop it
    agent, narrative, proposals, _, elapsed = run_agent(name, run_dir, [Drip(FINISH, every_s=0.3)] * 2,
                                                        "agent.call_timeout_s=1.5", "agent.max_retries=0")
    assert elapsed < 4, elapsed
    (failed,) = proposals
    assert failed.failure_label == "agent_timeout" and agent.calls[0].outcome == "timeout"
    assert "stopped: timeout" in narrative


@pytest.mark.parametrize("name", NAMES)
def test_a_silent_server_times_out_per_read_and_is_retried_a_bounded_number_of_times(run_dir, name):
    agent, _, proposals, server, elapsed = run_agent(name, run_dir, [Silent(30)] * 3, "agent.timeout_s=0.4")
    assert elapsed < 4 and len(server.requests) == 2
    assert proposals[0].failure_label == "agent_timeout"
    assert (agent.calls[0].outcome, agent.calls[0].attempts) == ("timeout", 2)


@pytest.mark.parametrize("name", NAMES)
def test_a_silent_server_with_a_long_read_timeout_still_ends_at_the_call_deadline(run_dir, name):
    agent, _, proposals, _, elapsed = run_agent(name, run_dir, [Silent(30)] * 3, "agent.timeout_s=120",
                                                "agent.call_timeout_s=1", "agent.max_retries=3")
    assert elapsed < 3, elapsed
    assert proposals[0].failure_label == "agent_timeout" and agent.calls[0].outcome == "timeout"


@pytest.mark.parametrize("name", NAMES)
def test_a_huge_retry_after_is_capped(run_dir, name):
    limited = HttpError(429, "rate_limit_error", "slow down", {"retry-after": "99999"})
    agent, _, _, server, _ = run_agent(name, run_dir, [limited, tool("read_findings"), FINISH],
                                       "agent.max_retry_wait_s=0.2")
    assert len(server.requests) == 3 and server.remaining == 0
    assert agent.calls[0].attempts == 2 and agent.calls[0].outcome == "ok" and agent.calls[0].latency_s < 2


@pytest.mark.parametrize("name", NAMES)
def test_a_retry_after_beyond_the_deadline_fails_at_once_with_its_label(run_dir, name):
    limited = HttpError(429, "rate_limit_error", "slow down", {"retry-after": "99999"})
    agent, _, proposals, server, elapsed = run_agent(name, run_dir, [limited] * 3, "agent.max_retry_wait_s=30",
                                                     "agent.call_timeout_s=2", "agent.max_retries=4")
    assert elapsed < 2 and len(server.requests) == 1
    assert proposals[0].failure_label == "agent_api_error"
    call = agent.calls[0]
    assert (call.outcome, call.status_code, call.label) == ("rate_limited", 429, "agent_api_error")
    assert "retry-after 99999 s" in call.error and "no time left" in call.error


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("status, error_type, outcome", [(429, "rate_limit_error", "rate_limited"),
                                                        (500, "api_error", "server_error"),
                                                        (529, "overloaded_error", "overloaded")])
def test_an_error_storm_is_retried_a_bounded_number_of_times(run_dir, name, status, error_type, outcome):
    storm = [HttpError(status, error_type, "storm", {"retry-after-ms": "10"})] * 10
    agent, _, proposals, server, _ = run_agent(name, run_dir, storm, "agent.max_retries=2")
    assert len(server.requests) == 3 and server.remaining == 7
    (failed,) = proposals
    assert failed.failure_label == "agent_api_error"
    call = agent.calls[0]
    assert (call.outcome, call.status_code, call.attempts, call.label) == (outcome, status, 3, "agent_api_error")
    assert call.usage.total == 0 and not call.usage_estimated  # an error status is not billed


@pytest.mark.fast
@pytest.mark.parametrize("name", NAMES)
def test_an_endpoint_that_is_down_fails_as_a_connection_error(run_dir, name):
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agent, _, proposals, server, elapsed = run_agent(name, run_dir, [], url=f"http://127.0.0.1:{port}")
    assert elapsed < 5 and server.requests == []
    assert proposals[0].failure_label == "agent_api_error"
    assert (agent.calls[0].outcome, agent.calls[0].attempts) == ("connection_error", 2)


@pytest.mark.parametrize("name", NAMES)
def test_the_step_deadline_bounds_the_whole_conversation(run_dir, name):
    slow = Turn(tool_calls=[("read_findings", {})], delay_s=0.5)
    agent, narrative, _, _, elapsed = run_agent(name, run_dir, [slow] * 10, "agent.step_timeout_s=1.2",
                                                "agent.timeout_s=30", "agent.max_turns=50")
    assert elapsed < 3, elapsed
    assert "stopped: timeout" in narrative or "stopped: deadline" in narrative
    assert len(agent.calls) <= 3


# -- caps: text, tool arguments, diffs, tool calls --------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_a_huge_reply_text_is_cut_before_it_is_stored_or_sent_back(run_dir, name):
    huge = Turn(text="A" * 5_000_000, tool_calls=[("read_findings", {})])
    agent, narrative, _, server, _ = run_agent(name, run_dir, [huge, FINISH], "agent.max_reply_chars=2000")
    assert len(server.requests) == 2 and agent.calls[0].outcome == "ok"
    assert len(narrative) < 4000 and "characters cut" in narrative
    assert server.requests[1]["raw_chars"] < server.requests[0]["raw_chars"] + 12_000  # not 5 MB more


@pytest.mark.parametrize("name", NAMES)
def test_oversized_tool_arguments_are_refused_and_not_sent_back(run_dir, name):
    big_diff = LOWER_LR + "+# " + "x" * 100_000 + "\n"
    agent, _, proposals, server, _ = run_agent(name, run_dir, [submit(big_diff), FINISH],
                                               "agent.max_tool_args_chars=20000")
    (failed,) = proposals
    assert failed.failure_label == "agent_diff_too_large" and failed.diff == ""
    assert server.requests[1]["raw_chars"] < 40_000 and "max_tool_args_chars" in server.requests[1]["raw"].decode()


@pytest.mark.fast
@pytest.mark.parametrize("name", NAMES)
def test_an_oversized_diff_is_refused_and_stored_cut(run_dir, name):
    big_diff = LOWER_LR + "+# " + "y" * 30_000 + "\n"
    _, _, proposals, _, _ = run_agent(name, run_dir, [submit(big_diff), FINISH], "agent.max_diff_bytes=16000")
    (failed,) = proposals
    assert failed.failure_label == "agent_diff_too_large" and len(failed.diff) < 16_100


@pytest.mark.parametrize("name", NAMES)
def test_a_reply_with_a_flood_of_tool_calls_runs_only_the_first_few(run_dir, name):
    flood = Turn(tool_calls=[("read_findings", {})] * 200)
    _, _, _, server, _ = run_agent(name, run_dir, [flood, FINISH])
    messages = server.requests[1]["body"]["messages"]
    results = (messages[-1]["content"] if name == "claude" else [m for m in messages if m["role"] == "tool"])
    assert len(results) == 8  # eight read_findings results, not 200


@pytest.mark.fast
@pytest.mark.parametrize("name", NAMES)
def test_path_traversal_through_the_tools_is_refused(run_dir, name):
    (run_dir / "secret.txt").write_text("TOP-SECRET-CONTENT")
    script = [tool("read_harness_file", file="../../secret.txt"), tool("read_harness_file", file="/etc/passwd"),
              tool("query_evidence", aggregation="overview", where={"split": "test"}),
              submit(LOWER_LR.replace("a/recipe.yaml", "a/../../secret.txt").replace("b/recipe.yaml", "b/../../secret.txt")),
              FINISH]
    _, _, proposals, server, _ = run_agent(name, run_dir, script)
    sent = b"".join(r["raw"] for r in server.requests).decode()
    assert "TOP-SECRET-CONTENT" not in sent and "root:x:0" not in sent
    assert sent.count("is not a harness file") >= 2
    assert proposals[0].failure_label == "agent_wrong_file"


@pytest.mark.parametrize("name", NAMES)
def test_a_gzip_encoded_reply_is_decoded_within_the_byte_cap(run_dir, name):
    with ScriptedLLM([]) as probe_server:  # render the reply the provider would send, then gzip it
        reply = probe_server._reply("anthropic" if name == "claude" else "openai", {"model": "m", "messages": []},
                                    Turn(tool_calls=[("finish", {})]))
    body = gzip.compress(json.dumps(reply).encode())
    ok = Raw(body, headers={"content-type": "application/json", "content-encoding": "gzip"})
    bomb = Raw(gzip.compress(b'{"pad": "' + b"0" * 5_000_000 + b'"}'),
               headers={"content-type": "application/json", "content-encoding": "gzip"})
    agent, _, _, _, _ = run_agent(name, run_dir, [ok], "agent.max_response_bytes=100000")
    assert agent.calls[0].outcome == "ok" and agent.calls[0].tool_calls == ["finish"]
    agent, _, _, _, _ = run_agent(name, run_dir, [bomb, bomb], "agent.max_response_bytes=100000")
    assert agent.calls[0].outcome == "malformed_reply"


# -- the fallback --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_when_the_endpoint_fails_the_heuristic_fills_the_free_slots(run_dir, name):
    storm = [HttpError(500, "api_error", "down", {"retry-after-ms": "1"})] * 2
    _, narrative, proposals, _, _ = run_agent(name, run_dir, storm, "agent.fallback=heuristic")
    failed, *stand_ins = proposals
    assert failed.failure_label == "agent_api_error" and len(stand_ins) == 2
    assert all(isinstance(p, FallbackProposal) and p.fallback and p.proposed_by == "heuristic-fallback" for p in stand_ins)
    assert all(p.hypothesis.startswith("[heuristic fallback: the endpoint failed (api_error)]") for p in stand_ins)
    assert "Heuristic fallback" in narrative


@pytest.mark.fast
def test_when_the_budget_is_spent_the_heuristic_proposes_and_none_keeps_control_only(run_dir, tmp_path):
    run = tmp_path / "r"
    shutil.copytree(run_dir, run)
    spent = calls.CallRecord(run="r", generation=0, agent="claude", model="m", call_index=0, outcome="ok", attempts=1,
                             started_at=0.0, latency_s=1.0, request_chars=10, usage=calls.Usage(100, 100))
    calls.write(run / "gen0" / "candidates" / calls.FILE_NAME, [spent])
    context = context_for(run)
    context.generation = 1
    for fallback, expected in (("heuristic", 2), ("none", 0)):
        with ScriptedLLM([FINISH]) as server:
            agent = make_agent(agent_conf("claude", server.url, "agent.budget.max_tokens=150",
                                                 f"agent.fallback={fallback}"))
            proposals = agent.propose(context, 2)
        assert server.requests == [] and len(proposals) == expected
        assert all(isinstance(p, FallbackProposal) and "the agent budget is spent" in p.hypothesis for p in proposals)


@pytest.mark.fast
def test_an_unknown_fallback_is_a_config_error():
    from evotrainer.config import ConfigError, compose

    with pytest.raises(ConfigError, match="'agent.fallback' = 'maybe' is not allowed; choose one of"):
        compose(["agent=claude", "agent.fallback=maybe"])
    with pytest.raises(ConfigError, match="'agent.call_timeout_s' = 0.0 is outside"):
        compose(["agent=claude", "agent.call_timeout_s=0"])


# -- the key: never stored, never sent back, never given to candidate code --------------------------------

def exfiltrating_reward(conditional: bool, echo: str | None = None) -> str:
    """A reward.py that tries to read the key (its environment, its own and its parent's /proc environ) and to get it out through the import
    check's error message (sent back to the model, written to proposal.json); ``echo``: a key the endpoint
    saw in the request headers, written into the code as well."""
    steal = (f"# echo {echo}\n" if echo else "") + ('import os as _os\n'
             '_LOOT = " ".join(v for k, v in _os.environ.items() if "KEY" in k or "TOKEN" in k)\n'
             'for _pid in ("self", str(_os.getppid())):\n'
             '    try:\n'
             '        _LOOT += open(f"/proc/{_pid}/environ", "rb").read().decode("utf-8", "replace")\n'
             '    except OSError:\n'
             '        pass\n')
    steal += ('if "sk-" in _LOOT:\n    raise ImportError("exfil: " + _LOOT)\n' if conditional
              else 'raise ImportError("exfil: " + (_LOOT or "nothing"))\n')
    return unified_diff("reward.py", REWARD, REWARD + "\n" + steal)


def hostile_script() -> list:
    echo = Turn(text=f"Diagnosis. By the way, your key is {CANARY}.",
                tool_calls=[("read_harness_file", {"file": "reward.py"})])
    return [echo, submit(exfiltrating_reward(conditional=False), "exfil_always", hypothesis=f"leak {CANARY}"),
            submit(exfiltrating_reward(conditional=True, echo=CANARY), "exfil_if_key"), FINISH]


def test_the_canary_key_never_reaches_the_agent_outputs_or_requests_openai(run_dir, tmp_path):
    agent, narrative, proposals, server, _ = run_agent("openai", run_dir, hostile_script())
    no_canary_in(server)
    accepted, failed = proposals
    assert failed.failure_label in ("import_error", "sandbox_violation") and "exfil" in failed.error
    assert accepted.intervention == "exfil_if_key" and f"# echo {secrets.REDACTED}" in accepted.diff
    calls.write(tmp_path / calls.FILE_NAME, agent.calls)
    outputs = [narrative, *(json.dumps(p.__dict__) for p in proposals), (tmp_path / calls.FILE_NAME).read_bytes().decode("latin-1")]
    assert not any(CANARY in text for text in outputs) and secrets.REDACTED in narrative


def test_the_canary_key_never_reaches_results_request_bodies_or_candidate_code(run_dir, tmp_path):
    """The real propose stage (agent=claude): the whole results tree and every request body are searched."""
    from evotrainer.atomic import read_json
    from evotrainer.stages import propose

    name = "claude"
    run = tmp_path / "r"
    shutil.copytree(run_dir, run)
    with ScriptedLLM(hostile_script()) as server:
        conf = run / "config.yaml"
        conf.write_text(to_yaml(compose(["experiment=quick", "run=r", *overrides(name, server.url)])))
        gen = run / "gen0"
        propose.run(str(conf), str(gen / "diagnosis.json"), str(gen / "harness"), str(run / "lineage.parquet"),
                    str(gen / "candidates"), 0)
    headers = {k.lower(): v for k, v in server.requests[0]["headers"].items()}
    assert CANARY in headers.get("authorization", "") + headers.get("x-api-key", "")  # sent where it must go ...
    no_canary_in(server)  # ... and nowhere else
    leaks = [str(p) for p in run.rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()]
    assert leaks == []
    written = {read_json(p)["intervention"]: p.parent for p in (gen / "candidates").glob("*/proposal.json")}
    always = read_json(written["exfil_always"] / "proposal.json")
    assert always["validation"]["failure_label"] in ("import_error", "sandbox_violation")
    assert "exfil" in always["validation"]["error"] and always["hypothesis"] == f"leak {secrets.REDACTED}"
    # the import check ran without the key in its environment: the conditional thief found nothing to steal
    assert read_json(written["exfil_if_key"] / "proposal.json")["validation"]["ok"]
    echoed = (written["exfil_if_key"] / "harness.diff").read_text()  # the key the model wrote in is redacted
    assert f"# echo {secrets.REDACTED}" in echoed
    assert secrets.REDACTED in (gen / "candidates" / "narrative.md").read_text()


# -- the call log, its summary, and redaction itself ----------------------------------------------------------

@pytest.mark.fast
def test_summarize_reads_every_generation_call_log(tmp_path):
    def record(g, i, outcome="ok", label=None, tokens=(100, 10)):
        return calls.CallRecord(run="r", generation=g, agent="claude", model="m", call_index=i, outcome=outcome,
                                attempts=1, started_at=0.0, latency_s=0.1, request_chars=400,
                                usage=calls.Usage(*tokens), cost_usd=0.5, label=label)

    calls.write(tmp_path / "gen0" / "candidates" / calls.FILE_NAME,
                [record(0, 0), record(0, 1, "timeout", "agent_timeout", (400, 8192))])
    calls.write(tmp_path / "gen1" / "candidates" / calls.FILE_NAME,
                [record(1, 0, "malformed_reply", "agent_malformed_reply"), record(1, 1, label="agent_usage_invalid")])
    summary = calls.summarize(tmp_path)
    assert (summary["calls"], summary["failed_calls"]) == (4, 2)
    assert summary["failed_by_label"] == {"agent_timeout": 1, "agent_malformed_reply": 1}
    assert summary["usage_not_believed"] == 1
    assert (summary["input_tokens"], summary["output_tokens"], summary["cost_usd"]) == (700, 8222, 2.0)
    assert [g["generation"] for g in summary["per_generation"]] == [0, 1]
    table = calls.summary_table(summary)
    assert list(table["generation"]) == [0, 1, "total"] and table["calls"].iloc[-1] == 4
    assert calls.summarize(tmp_path / "nothing")["calls"] == 0


def test_redact_and_scrubbed_env(monkeypatch):
    monkeypatch.setenv("MY_PROVIDER_KEY", "provider-secret-value")
    monkeypatch.setenv("SHORT_KEY", "abc")
    secrets.register("MY_PROVIDER_KEY")
    text = f"a {CANARY} b provider-secret-value c abc"
    assert secrets.redact(text) == f"a {secrets.REDACTED} b {secrets.REDACTED} c abc"
    assert secrets.redact_obj({"k": [CANARY, ("x", CANARY)], CANARY: 1}) == {
        "k": [secrets.REDACTED, ("x", secrets.REDACTED)], secrets.REDACTED: 1}
    env = secrets.scrubbed_env({"PATH": "/bin", "HF_TOKEN": "t", "db_password": "p", "AWS_SECRET_ACCESS_KEY": "s",
                                "COPIED": f"x{CANARY}", "MY_PROVIDER_KEY": "v", "HOME": "/h"})
    assert env == {"PATH": "/bin", "HOME": "/h"}


@pytest.mark.fast
def test_every_atomic_write_is_redacted(tmp_path):
    import pyarrow.parquet as pq

    from evotrainer.atomic import write_json, write_parquet, write_text

    write_text(tmp_path / "a.txt", f"key={CANARY}")
    write_json(tmp_path / "a.json", {"nested": [{"k": CANARY}]})
    frame = pd.DataFrame({"s": [CANARY, "ok"], "l": [[CANARY], []], "n": [1, 2], f"col_{CANARY}": [0.1, 0.2],
                          "c": pd.Categorical([CANARY, "q"])})
    write_parquet(tmp_path / "a.parquet", frame)
    for path in tmp_path.iterdir():
        assert CANARY.encode() not in path.read_bytes(), path
    back = pq.read_table(tmp_path / "a.parquet").to_pandas()
    assert list(back["s"]) == [secrets.REDACTED, "ok"] and list(back["n"]) == [1, 2]
