"""The Claude and OpenAI-compatible agents through the real SDKs, over HTTP, against a scripted
endpoint on 127.0.0.1 (tests/llm_server.py); tools on real evidence of the tiny policy."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from evotrainer.agents import make_agent
from evotrainer.agents.base import FailedProposal
from evotrainer.agents.heuristic import set_recipe_values, unified_diff
from evotrainer.agents.tools import TOOL_SPECS, Toolbox
from evotrainer.config import compose, to_yaml
from evotrainer.contracts import lineage
from evotrainer.contracts.harness import DEFAULT_HARNESS
from tests.llm_server import HttpError, ScriptedLLM, Turn, tool

KEY = "sk-ant-test-7f3c9e1b2d-do-not-log"
RECIPE = (DEFAULT_HARNESS / "recipe.yaml").read_text()


def recipe_diff(**changes) -> str:
    return unified_diff("recipe.yaml", RECIPE, set_recipe_values(RECIPE, changes))


LOWER_LR = recipe_diff(lr=1e-4)
DYNAMIC = recipe_diff(dynamic_sampling=True)


def submit(diff: str, name: str = "lower_lr") -> Turn:
    return tool("submit_candidate", intervention=name, hypothesis=f"If {name} then val accuracy rises because X.",
                targeted_findings=["dead_group_ratio"], success_criterion="val accuracy above control", diff=diff)


@pytest.fixture(scope="module")
def generation(tmp_path_factory, splits):
    """A run directory as the workflow leaves it before propose: real rollouts of a tiny policy (fresh
    weights: no SFT, to keep this file fast) on the probe split, the diagnosis, the parent harness, and
    the test split in data/ (which no tool may read)."""
    from evotrainer.atomic import write_parquet
    from evotrainer.policy.tiny import build_model, build_tokenizer, save_policy
    from evotrainer.stages import diagnose
    from tests.scoring.test_evidence_and_diagnostics import rollouts

    tiny_policy = tmp_path_factory.mktemp("policy") / "policy"
    tokenizer = build_tokenizer()
    save_policy(build_model(tokenizer, seed=0), tokenizer, tiny_policy)
    run = tmp_path_factory.mktemp("results") / "r"
    gen = run / "gen0"
    shutil.copytree(DEFAULT_HARNESS, gen / "harness")
    write_parquet(run / "data" / "test.parquet", splits["test"])
    frame = rollouts(tiny_policy, splits["probe"])
    from evotrainer.contracts import evidence

    evidence.write(frame, gen / "rollouts.parquet")
    conf = run / "config.yaml"
    conf.write_text(to_yaml(compose(["experiment=quick", "run=r"])))
    diagnose.run(str(conf), str(gen / "rollouts.parquet"), str(gen / "harness"), None, str(gen / "diagnostics.parquet"),
                 str(gen / "diagnosis.json"), str(gen / "diagnosis.md"), 0)
    return run


def agent_cfg(name: str, url: str, *overrides: str):
    base = ["agent=claude", f"agent.base_url={url}"] if name == "claude" else [
        "agent=openai", f"agent.base_url={url}/v1", "agent.model=scripted-model", "agent.api_key_env=TEST_OPENAI_KEY"]
    return compose([*base, "agent.timeout_s=5", "agent.max_retries=2", "agent.max_candidates=2", "agent.fallback=none",
                    *overrides]).agent


def context_for(run: Path, feedback: str | None = None):
    from evotrainer.agents import ProposalContext
    from evotrainer.atomic import read_json
    from evotrainer.contracts.harness import harness_id

    gen = run / "gen0"
    diagnosis = read_json(gen / "diagnosis.json")
    context = ProposalContext(generation=0, harness_dir=gen / "harness", harness_id=harness_id(gen / "harness"),
                              findings=diagnosis["findings"], lineage=lineage.read(run / "lineage.parquet"),
                              feedback=feedback)
    context.extra.update(run="r", run_dir=run, rollouts=gen / "rollouts.parquet", diagnostics=gen / "diagnostics.parquet")
    return context


@pytest.fixture(autouse=True)
def api_keys(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def run_agent(name, run, script, *overrides, feedback=None, k=2):
    with ScriptedLLM(script) as server:
        agent = make_agent(agent_cfg(name, server.url, *overrides))
        context = context_for(run, feedback)
        narrative = agent.narrate(context)
        proposals = agent.propose(context, k)
    return agent, narrative, proposals, server


@pytest.mark.parametrize("name", ["claude", "openai"])
def test_a_normal_tool_use_loop_ends_in_submitted_candidates(generation, name):
    script = [
        Turn(text="Dead groups are high: many groups get no signal.", tool_calls=[("read_harness_file", {"file": "recipe.yaml"})]),
        tool("query_evidence", aggregation="group_signal", group_by="difficulty"),
        submit(LOWER_LR),
        submit(DYNAMIC, "dynamic_sampling"),
    ]
    agent, narrative, proposals, server = run_agent(name, generation, script)
    assert [p.intervention for p in proposals] == ["lower_lr", "dynamic_sampling"]
    assert not any(isinstance(p, FailedProposal) for p in proposals)
    assert proposals[0].diff == LOWER_LR
    assert "Dead groups are high" in narrative
    assert len(server.requests) == 4 and server.remaining == 0
    # the tool results the model saw: the real recipe file and real group statistics
    second = json.dumps(server.requests[1]["body"]["messages"])
    assert "prompts_per_step" in second
    third = json.dumps(server.requests[2]["body"]["messages"])
    assert "dead_group_ratio" in third and "all_wrong_ratio" in third
    rows = [c.row() for c in agent.calls]
    assert [r["outcome"] for r in rows] == ["ok"] * 4 and all(r["attempts"] == 1 for r in rows)
    assert all(r["input_tokens"] + r["cache_read_tokens"] + r["cache_creation_tokens"] > 0 and r["output_tokens"] > 0
               for r in rows)
    assert rows[0]["cache_read_tokens"] == 0 and all(r["cache_read_tokens"] > 0 for r in rows[1:])
    if name == "claude":  # the conversation so far is read from the cache: cache reads grow call by call
        assert rows[0]["cache_creation_tokens"] > 0 and rows[0]["cost_usd"] > 0
        reads = [r["cache_read_tokens"] for r in rows]
        assert reads == sorted(reads) and reads[-1] > reads[1] and reads[1] == rows[0]["cache_creation_tokens"]
        marked = [m for m in server.requests[-1]["body"]["messages"] if "cache_control" in json.dumps(m)]
        assert len(marked) == 1 and marked[0] is server.requests[-1]["body"]["messages"][-1]


BAD_CONTEXT = LOWER_LR.replace(" group_size: 8", " group_size: 9")  # a context line that is not in the file
WRONG_FILE = LOWER_LR.replace("a/recipe.yaml", "a/../data/test.parquet").replace("b/recipe.yaml", "b/../data/test.parquet")
NOT_UTF8 = LOWER_LR.replace("+lr: 1.00e-04", "+lr: 1.00e-04  # \ud800")
TOO_LARGE = LOWER_LR.replace("+lr: 1.00e-04", "+lr: 1.00e-04  # " + "x" * 700)
assert len({LOWER_LR, BAD_CONTEXT, WRONG_FILE, NOT_UTF8, TOO_LARGE}) == 5


@pytest.mark.parametrize("name", ["claude", "openai"])
@pytest.mark.parametrize("bad, label", [
    (Turn(text="I would lower the learning rate to 1e-4."), "agent_no_tool_call"),
    (submit(BAD_CONTEXT), "agent_diff_does_not_apply"),
    (submit(WRONG_FILE), "agent_wrong_file"),
    (submit(TOO_LARGE), "agent_diff_too_large"),
    (submit(NOT_UTF8), "agent_non_utf8"),
    (submit(""), "agent_no_diff"),
    (submit("lower the lr please"), "agent_not_a_diff"),
    (submit(recipe_diff(lr=0.5)), "schema_violation"),
])
def test_invalid_replies_are_retried_with_the_error_then_fail_with_a_label(generation, name, bad, label):
    # two invalid replies for the first candidate (the limit), then a valid second candidate
    agent, _, proposals, server = run_agent(name, generation, [bad, bad, submit(LOWER_LR)],
                                            "agent.max_invalid_replies=2", "agent.max_diff_bytes=600")
    accepted, failed = proposals
    assert accepted.intervention == "lower_lr" and not isinstance(accepted, FailedProposal)
    assert isinstance(failed, FailedProposal) and failed.failure_label == label
    assert failed.failure == {"ok": False, "failure_label": label, "error": failed.error, "files": []}
    failed.diff.encode("utf-8")  # what is written to harness.diff is valid UTF-8 even when the model's was not
    # the error went back to the model each time
    seen_second = json.dumps(server.requests[1]["body"]["messages"], ensure_ascii=False)
    assert label in seen_second or "no tool call" in seen_second
    assert "recorded as failed" in json.dumps(server.requests[2]["body"]["messages"])
    assert len(agent.calls) == 3


@pytest.mark.parametrize("name", ["claude", "openai"])
def test_a_fixed_reply_is_accepted_after_the_error_is_shown(generation, name):
    _, _, proposals, server = run_agent(name, generation, [submit(BAD_CONTEXT), submit(LOWER_LR), tool("finish")])
    assert [type(p) for p in proposals] == [type(proposals[0])] and proposals[0].diff == LOWER_LR
    assert "copy the context lines exactly" in json.dumps(server.requests[1]["body"]["messages"])


def test_tool_arguments_that_are_not_json_are_shown_to_the_model(generation):
    bad = Turn(tool_calls=[("submit_candidate", {})], raw_arguments='{"diff": "--- a/recipe.yaml\n')
    _, _, proposals, server = run_agent("openai", generation, [bad, submit(LOWER_LR), tool("finish")])
    assert proposals[0].diff == LOWER_LR
    assert "not valid JSON" in json.dumps(server.requests[1]["body"]["messages"])


@pytest.mark.parametrize("name", ["claude", "openai"])
def test_a_rate_limit_is_retried_by_the_sdk_and_recorded(generation, name):
    limited = HttpError(429, "rate_limit_error", "slow down", {"retry-after-ms": "50"})
    agent, _, proposals, server = run_agent(name, generation, [limited, submit(LOWER_LR), tool("finish")])
    assert proposals[0].diff == LOWER_LR
    first = agent.calls[0]
    assert first.outcome == "ok" and first.attempts == 2
    assert len(server.requests) == 3


def test_overloaded_529_raises_the_sdk_overloaded_error_and_fails_the_candidate(generation):
    import anthropic

    overloaded = HttpError(529, "overloaded_error", "Overloaded")
    agent, narrative, proposals, server = run_agent("claude", generation, [overloaded] * 3, "agent.max_retries=2")
    assert len(server.requests) == 3  # one attempt plus the SDK's two retries
    (failed,) = proposals
    assert isinstance(failed, FailedProposal) and failed.failure_label == "agent_api_error"
    call = agent.calls[0]
    assert (call.outcome, call.status_code, call.error_type, call.attempts) == ("overloaded", 529, "OverloadedError", 3)
    assert issubclass(anthropic.OverloadedError, anthropic.APIStatusError)
    assert "stopped: api_error" in narrative


@pytest.mark.parametrize("name", ["claude", "openai"])
def test_a_slow_reply_past_the_timeout_is_retried_then_fails_as_timeout(generation, name):
    slow = Turn(text="late", tool_calls=[("finish", {})], delay_s=2.0)
    started = time.perf_counter()
    agent, _, proposals, server = run_agent(name, generation, [slow, slow], "agent.timeout_s=0.5", "agent.max_retries=1")
    assert time.perf_counter() - started < 10
    (failed,) = proposals
    assert failed.failure_label == "agent_timeout"
    assert (agent.calls[0].outcome, agent.calls[0].attempts) == ("timeout", 2)


def test_a_slow_reply_then_a_fast_one_succeeds(generation):
    slow = Turn(tool_calls=[("finish", {})], delay_s=2.0)
    agent, _, proposals, _ = run_agent("claude", generation, [slow, submit(LOWER_LR), tool("finish")],
                                       "agent.timeout_s=0.5", "agent.max_retries=1")
    assert proposals[0].diff == LOWER_LR and agent.calls[0].attempts == 2


def test_the_budget_stops_proposing_cleanly(generation):
    agent, narrative, proposals, server = run_agent("claude", generation, [submit(LOWER_LR), submit(DYNAMIC)],
                                                    "agent.budget.max_tokens=1")
    assert len(server.requests) == 1 and [p.diff for p in proposals] == [LOWER_LR]
    assert "stopped: budget" in narrative


def test_a_candidate_being_retried_when_the_budget_ends_fails_with_its_label(generation):
    _, _, proposals, _ = run_agent("claude", generation, [submit(BAD_CONTEXT)], "agent.budget.max_cost_usd=0.000001")
    (failed,) = proposals
    assert failed.failure_label == "agent_budget_exhausted"


def test_the_budget_is_per_run_across_generations(generation, tmp_path):
    from evotrainer.contracts import agent_calls as calls

    run = tmp_path / "run"
    shutil.copytree(generation, run)
    agent, _, _, _ = run_agent("claude", run, [submit(LOWER_LR), submit(DYNAMIC)])
    calls.write(run / "gen0" / "candidates" / calls.FILE_NAME, agent.calls)
    tokens, cost = calls.spent(run, before_generation=1)
    assert tokens == sum(c.usage.total for c in agent.calls) and cost == pytest.approx(sum(c.cost_usd for c in agent.calls))
    with ScriptedLLM([submit(LOWER_LR)]) as server:
        later = make_agent(agent_cfg("claude", server.url, f"agent.budget.max_tokens={tokens}"))
        context = context_for(run)
        context.generation = 1
        assert later.propose(context, 2) == [] and server.requests == []


def test_human_feedback_is_put_in_the_prompt(generation):
    _, _, _, server = run_agent("claude", generation, [tool("finish")], feedback="Do not touch the reward; try KL.")
    assert "Do not touch the reward; try KL." in json.dumps(server.requests[0]["body"]["messages"])


def test_the_key_comes_from_the_environment_and_is_redacted_from_errors(generation, monkeypatch):
    echo = HttpError(401, "authentication_error", f"invalid x-api-key: {KEY}")
    agent, _, proposals, server = run_agent("claude", generation, [echo])
    headers = {k.lower(): v for k, v in server.requests[0]["headers"].items()}
    assert KEY in headers.get("authorization", "") + headers.get("x-api-key", "")  # it was sent ...
    assert proposals[0].failure_label == "agent_api_error"
    assert KEY not in json.dumps([c.row() for c in agent.calls]) and KEY not in proposals[0].error  # ... never kept
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(Exception, match="ANTHROPIC_API_KEY is not set"):
        make_agent(agent_cfg("claude", server.url))


def test_every_call_is_recorded_in_agent_calls_parquet(generation, tmp_path):
    from evotrainer.contracts import agent_calls as calls

    limited = HttpError(429, "rate_limit_error", "slow down", {"retry-after-ms": "10"})
    agent, _, _, _ = run_agent("claude", generation, [limited, submit(BAD_CONTEXT), submit(LOWER_LR), tool("finish")])
    calls.write(tmp_path / calls.FILE_NAME, agent.calls)
    table = pd.read_parquet(tmp_path / calls.FILE_NAME)
    assert pq.read_schema(tmp_path / calls.FILE_NAME).names == calls.SCHEMA.names
    assert list(table["call_index"]) == [0, 1, 2] and list(table["attempts"]) == [2, 1, 1]
    assert list(table["tool_calls"].map(list)) == [["submit_candidate"], ["submit_candidate"], ["finish"]]
    assert (table["model"] == "claude-sonnet-5-5").all() and (table["latency_s"] > 0).all()
    prices = compose(["agent=claude"]).agent.prices
    expected = (table["input_tokens"] * prices.input + table["output_tokens"] * prices.output
                + table["cache_read_tokens"] * prices.cache_read + table["cache_creation_tokens"] * prices.cache_write) / 1e6
    assert table["cost_usd"].to_numpy() == pytest.approx(expected.to_numpy())


# -- the tools ----------------------------------------------------------------------------------------

def toolbox(run: Path, max_chars: int = 6000) -> Toolbox:
    return Toolbox.from_context(context_for(run), max_chars)


def test_every_tool_output_is_bounded(generation):
    box = toolbox(generation, max_chars=300)
    calls = [("read_harness_file", {"file": "diagnostics.py"}), ("read_findings", {}),
             ("read_lineage", {"include_diffs": True}), ("read_skills", {"k": 10})]
    calls += [("query_evidence", {"aggregation": a, "group_by": "sample_idx", "limit": 50})
              for a in ("overview", "group_signal", "reward_components", "length_vs_reward")]
    calls += [("query_evidence", {"aggregation": "examples", "limit": 50}), ("query_evidence", {"aggregation": "diagnostics"})]
    for name, args in calls:
        assert len(box.run(name, args)) <= 300, name
    full = toolbox(generation).run("query_evidence", {"aggregation": "examples", "limit": 50})
    assert len(json.loads(full)["rows"]) == 20  # the row limit of examples


def test_evidence_queries_are_whitelisted_and_never_show_the_test_split(generation, tmp_path):
    from evotrainer.agents.tools import ToolError
    from evotrainer.contracts import evidence

    run = tmp_path / "run"
    shutil.copytree(generation, run)
    frame = evidence.read(run / "gen0" / "rollouts.parquet")
    planted = frame.head(8).assign(split="test", prompt_id="TEST-ONLY", group_id="TEST-ONLY")
    evidence.write(pd.concat([frame, planted], ignore_index=True), run / "gen0" / "rollouts.parquet")
    box = toolbox(run)
    assert "TEST-ONLY" not in box.run("query_evidence", {"aggregation": "examples", "limit": 50})
    assert json.loads(box.run("query_evidence", {"aggregation": "overview"}))["rows"][0]["rows"] == len(frame)
    for bad in ({"aggregation": "eval"}, {"aggregation": "overview", "group_by": "split"},
                {"aggregation": "overview", "where": {"split": "test"}}, {"aggregation": "overview", "limit": 10_000},
                {"aggregation": "overview", "where": {"correct": "__import__('os')"}},
                {"aggregation": "overview", "sql": "select *"}):
        with pytest.raises(ToolError):
            box.run("query_evidence", bad)
    for bad in ("../data/test.parquet", "/etc/passwd", "reward.py/../../config.yaml"):
        with pytest.raises(ToolError):
            box.run("read_harness_file", {"file": bad})


def test_a_harness_file_that_links_outside_the_run_is_refused(generation, tmp_path):
    from evotrainer.agents.tools import ToolError

    run = tmp_path / "run"
    shutil.copytree(generation, run)
    secret = tmp_path / "outside.txt"
    secret.write_text("outside the run")
    (run / "gen0" / "harness" / "reward.py").unlink()
    (run / "gen0" / "harness" / "reward.py").symlink_to(secret)
    with pytest.raises(ToolError, match="not a regular file inside the harness"):
        toolbox(run).run("read_harness_file", {"file": "reward.py"})


AUDIT = r"""
import json, sys
from pathlib import Path
from tests.agents.test_llm_agents import toolbox
from evotrainer.agents.tools import TOOL_SPECS
run = Path(sys.argv[1])
box = toolbox(run)
events = []
sys.addaudithook(lambda event, args: events.append((event, str(args[0]) if args else ""))
                 if event == "open" or event.startswith("socket.") else None)
for name, args in json.loads(sys.argv[2]):
    try:
        box.run(name, args)
    except Exception as err:
        events.append(("error", f"{name}: {err}"))
print(json.dumps(events))
"""


def test_tools_open_only_the_run_files_they_are_given_and_no_socket(generation):
    import subprocess
    import sys

    calls = [("read_harness_file", {"file": f}) for f in ("recipe.yaml", "reward.py", "curriculum.py", "diagnostics.py")]
    calls += [("query_evidence", {"aggregation": a}) for a in
              ("overview", "group_signal", "reward_components", "length_vs_reward", "examples", "diagnostics")]
    calls += [("read_findings", {}), ("read_lineage", {}), ("read_skills", {}),
              ("read_harness_file", {"file": "../data/test.parquet"})]
    result = subprocess.run([sys.executable, "-c", AUDIT, str(generation), json.dumps(calls)], capture_output=True,
                            text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr[-2000:]
    events = json.loads(result.stdout.strip().splitlines()[-1])
    assert not [e for e in events if e[0].startswith("socket.")]
    run = str(generation.resolve())
    opened = {Path(p).resolve() for kind, p in events if kind == "open" and p.startswith(("/", "."))}
    inside_run = {p for p in opened if str(p).startswith(run)}
    allowed = {(generation / "gen0" / f).resolve() for f in ("rollouts.parquet", "diagnostics.parquet")}
    allowed |= {(generation / "gen0" / "harness" / f).resolve() for f in
                ("recipe.yaml", "reward.py", "curriculum.py", "diagnostics.py")}
    assert inside_run <= allowed, inside_run - allowed
    assert (generation / "gen0" / "rollouts.parquet").resolve() in inside_run  # the hook did see the reads
    assert not any("test.parquet" in str(p) for p in opened)
    assert len([e for e in events if e[0] == "error"]) == 1  # the path outside the harness was refused


def test_tool_specs_are_valid_for_both_apis():
    names = [spec["name"] for spec in TOOL_SPECS]
    assert names == ["read_harness_file", "query_evidence", "read_findings", "read_lineage", "read_skills",
                     "submit_candidate", "finish"]
    for spec in TOOL_SPECS:
        assert spec["parameters"]["type"] == "object" and len(spec["description"]) < 1024


# -- the propose stage and the workflow ------------------------------------------------------------------

def test_a_500_storm_fails_one_candidate_and_the_heuristic_fills_the_free_slots(generation, tmp_path):
    from evotrainer.atomic import read_json
    from evotrainer.contracts import agent_calls as calls
    from evotrainer.stages import propose

    run = tmp_path / "r"
    shutil.copytree(generation, run)
    storm = [HttpError(500, "api_error", "Internal server error")] * 3
    with ScriptedLLM(storm) as server:
        conf = run / "config.yaml"
        conf.write_text(to_yaml(compose(["experiment=quick", "run=r", "agent=claude", f"agent.base_url={server.url}",
                                         "agent.max_retries=2"])))
        gen = run / "gen0"
        propose.run(str(conf), str(gen / "diagnosis.json"), str(gen / "harness"), str(run / "lineage.parquet"),
                    str(gen / "candidates"), 0)
    assert len(server.requests) == 3
    folders = sorted(p.name for p in (gen / "candidates").iterdir() if p.is_dir())
    assert folders[0] == "c1" and folders[-1] == "control" and len(folders) >= 3
    failed = read_json(gen / "candidates" / "c1" / "proposal.json")
    assert failed["validation"]["failure_label"] == "agent_api_error" and failed["agent"] == "claude"
    assert "InternalServerError after 3 attempt(s)" in failed["validation"]["error"]
    assert read_json(gen / "candidates" / "control" / "proposal.json")["validation"]["ok"]
    # agent.fallback: heuristic (the default): the offline agent fills the free slots, and says so
    for cid in folders[1:-1]:
        stand_in = read_json(gen / "candidates" / cid / "proposal.json")
        assert stand_in["fallback"] is True and stand_in["proposed_by"] == "heuristic-fallback"
        assert stand_in["hypothesis"].startswith("[heuristic fallback: the endpoint failed (api_error)]")
        assert stand_in["validation"]["ok"]
    table = pd.read_parquet(gen / "candidates" / calls.FILE_NAME)
    assert list(table["outcome"]) == ["server_error"] and list(table["attempts"]) == [3]
    assert list(table["label"]) == ["agent_api_error"]
    narrative = (gen / "candidates" / "narrative.md").read_text()
    assert "stopped: api_error" in narrative and "Heuristic fallback" in narrative


@pytest.mark.e2e
def test_snakemake_run_with_agent_claude_completes_and_never_writes_the_key(tmp_path):
    """A hostile endpoint in a real run: it echoes the key it received (in its text, a hypothesis and a
    diff) and submits a reward.py that tries to steal it from the environment; the key is nowhere in
    the results tree, Snakemake's files, its output or any request body, and the report shows the calls."""
    import os
    import subprocess
    import sys

    from tests.agents.test_agent_endpoint import exfiltrating_reward

    repo = Path(__file__).resolve().parents[2]
    script = [
        HttpError(429, "rate_limit_error", "slow down", {"retry-after-ms": "100"}),
        Turn(text=f"Many GRPO groups carry no signal; the recipe is the first lever. (Your key: {KEY})",
             tool_calls=[("read_harness_file", {"file": "recipe.yaml"})]),
        tool("query_evidence", aggregation="group_signal"),
        submit(WRONG_FILE, "edit_outside"),
        tool("submit_candidate", intervention="exfil", hypothesis=f"leak {KEY}", targeted_findings=[],
             success_criterion="the key", diff=exfiltrating_reward(conditional=False)),
        submit(LOWER_LR.replace("+lr: 1.00e-04", f"+lr: 1.00e-04  # {KEY}")),
    ]
    with ScriptedLLM(script) as server:
        cmd = [sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "--directory", str(tmp_path),
               "--cores", "2", "--config", "experiment=quick", "run=default", "search__generations=1", "search__headline_seeds=1",
               "search__steps_per_generation=4", "search__baseline=false", "search__baseline_matched=false",
               "search__baseline_search=false", "policy__sft__max_steps=50",
               "agent=claude", f"agent__base_url={server.url}", "agent__max_candidates=3",
               "agent__max_invalid_replies=1"]
        env = os.environ | {"ANTHROPIC_API_KEY": KEY}
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert server.remaining == 0 and len(server.requests) == 6
    headers = {k.lower(): v for k, v in server.requests[0]["headers"].items()}
    assert KEY in headers.get("authorization", "") + headers.get("x-api-key", "")
    assert not [r for r in server.requests if KEY.encode() in r["raw"]]  # never sent back in a body
    results = tmp_path / "results" / "default"
    assert (results / "summary.json").exists() and (results / "report.html").exists()
    rows = lineage.read(results / "lineage.parquet").set_index("candidate_id")
    assert rows.loc["c1", "intervention"] == "lower_lr" and rows.loc["c1", "verdict"] != "failed"
    assert (rows.loc["c2", "verdict"], rows.loc["c2", "failure_label"]) == ("failed", "agent_wrong_file")
    assert (rows.loc["c3", "verdict"], rows.loc["c3", "failure_label"]) == ("failed", "import_error")
    table = pd.read_parquet(results / "gen0" / "candidates" / "agent_calls.parquet")
    assert len(table) == 5 and table["attempts"].iloc[0] == 2 and (table["outcome"] == "ok").all()
    # the report reads the call log where propose writes it
    assert "5 API call(s)" in (results / "report.html").read_text()
    # the key was sent to the endpoint, and is nowhere in results, logs or Snakemake's own files
    leaks = [str(p) for p in tmp_path.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert leaks == []
    assert KEY not in result.stdout + result.stderr


def test_read_skills_returns_the_matching_skills_of_the_library(generation, tmp_path):
    from evotrainer.atomic import write_json
    from evotrainer.contracts import skill as skills

    store = tmp_path / "library"
    outcome = {"run_dir": "results/old", "generation": 0, "candidate_id": "c1", "verdict": "worked",
               "domain": "arithmetic", "gain": 0.04, "diff": DYNAMIC, "hypothesis": "dynamic sampling helps",
               "success_criterion": "val accuracy above control"}
    skill = skills.summarise({"skill_id": "dyn", "intervention": "dynamic_sampling",
                              "trigger": {"signature": ["dead_group_ratio"], "severity": {"dead_group_ratio": "warn"}},
                              "validation": {"outcomes": [outcome]}})
    write_json(store / "dyn.json", skill)
    box = toolbox(generation)
    box.skills, box.skills_dirs, box.signature = None, [store], ["dead_group_ratio"]
    found = json.loads(box.run("read_skills", {"k": 3}))["skills"]
    assert [s["intervention"] for s in found] == ["dynamic_sampling"] and "+dynamic_sampling: true" in found[0]["diff"]
    box.signature = ["truncation_rate"]  # nothing in common: nothing returned
    assert json.loads(box.run("read_skills", {}))["skills"] == []


def test_read_lineage_shows_verdicts_and_failure_labels(generation, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(generation, run)
    base = {"run": "r", "generation": 0, "parent_harness_id": "p", "harness_id": None, "hypothesis": "h" * 500,
            "targeted_findings": ["dead_group_ratio", "reward_spread"], "signature": ["dead_group_ratio"],
            "val_accuracy": None, "control_val_accuracy": 0.3, "delta_vs_control": None, "train_reward_final": None,
            "dead_group_ratio_final": None, "samples_generated": None, "train_wall_s": None, "error": None,
            "recorded_at": 0.0}
    rows = [base | {"candidate_id": "c1", "intervention": "lower_lr", "diff_hash": "a", "diff": LOWER_LR,
                    "verdict": "promoted", "failure_label": None, "val_accuracy": 0.35, "delta_vs_control": 0.05},
            base | {"candidate_id": "c2", "intervention": "edit_outside", "diff_hash": "b", "diff": WRONG_FILE,
                    "verdict": "failed", "failure_label": "agent_wrong_file"}]
    lineage.write_generation(run / "lineage.parquet", pd.DataFrame(rows))
    shown = json.loads(toolbox(run).run("read_lineage", {"include_diffs": True}))
    assert shown["candidates"] == 2
    c1, c2 = shown["rows"]
    assert (c1["verdict"], c1["delta_vs_control"], c1["targeted_findings"]) == ("promoted", 0.05, ["dead_group_ratio", "reward_spread"])
    assert (c2["verdict"], c2["failure_label"]) == ("failed", "agent_wrong_file")
    assert len(c1["hypothesis"]) <= 201 and c1["diff"] == LOWER_LR
