"""Tokens per agent call, measured on a scripted Claude conversation, and the per-generation cost
estimate at list prices. Prints JSON.

The agent (evotrainer.agents.claude, the real anthropic SDK) runs one generation's conversation
against the scripted endpoint of tests/llm_server.py on 127.0.0.1: a diagnosis with a file read,
findings, two evidence queries, the lineage, then three submissions of which one is rejected and
fixed (9 calls for 3 candidates). What is measured is what the agent sends: system prompt, tools,
and the growing conversation with real tool outputs on real rollouts (a fresh tiny policy sampled on
ArithmeticTask's probe split, verified by the task, scored in process by the default harness reward, then
diagnosed by the real diagnose stage). The endpoint converts
characters to tokens at 4 characters per token and reports the system prompt and tools as a cache
write on the first call and a cache read after, like the Messages API with prompt caching. The
model's own output here is scripted and short; a real model writes more (diagnosis text, adaptive
thinking), so the estimate adds ``--output-tokens-per-call`` (assumed, not measured).

    .venv/bin/python benchmarks/agent_tokens.py [--output-tokens-per-call 800]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # for tests.llm_server, the scripted endpoint


def generation_dir(root: Path) -> Path:
    """Real rollouts of a fresh tiny policy on the probe split, and their diagnosis."""
    import torch

    from evotrainer.backends.local.rollouts import evidence_rows, sample_and_score
    from evotrainer.config import compose, to_yaml
    from evotrainer.contracts import evidence
    from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module, load_recipe
    from evotrainer.policy.tiny import build_model, build_tokenizer
    from evotrainer.scoring import InProcessReward
    from evotrainer.stages import diagnose
    from evotrainer.tasks.arithmetic import ArithmeticTask, Level

    torch.set_num_threads(2)
    task = ArithmeticTask(ops="+-", levels=[Level(2, 19, 0.2), Level(2, 99, 0.5), Level(3, 99, 0.3)])
    splits = task.splits({"train": 100, "val": 20, "test": 20, "probe": 32}, seed=7)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=0)
    recipe = load_recipe(DEFAULT_HARNESS)
    repeated, batch = sample_and_score(model, tokenizer, splits["probe"], group_size=recipe["group_size"], recipe=recipe,
                                       reward=InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score),
                                       task=task, generator=torch.Generator().manual_seed(0))
    frame = evidence_rows(repeated, batch, group_size=recipe["group_size"], run="bench", generation=0, split="probe",
                          step=0, policy_id="p", harness_id="h", seed=0)
    run = root / "bench"
    gen = run / "gen0"
    shutil.copytree(DEFAULT_HARNESS, gen / "harness")
    evidence.write(frame, gen / "rollouts.parquet")
    conf = run / "config.yaml"
    conf.write_text(to_yaml(compose(["run=bench"])))
    diagnose.run(str(conf), str(gen / "rollouts.parquet"), str(gen / "harness"), None, str(gen / "diagnostics.parquet"),
                 str(gen / "diagnosis.json"), str(gen / "diagnosis.md"), 0)
    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-tokens-per-call", type=int, default=800)
    args = parser.parse_args()

    from evotrainer.agents import ProposalContext, make_agent
    from evotrainer.agents.heuristic import set_recipe_values, unified_diff
    from evotrainer.atomic import read_json
    from evotrainer.config import compose
    from evotrainer.contracts import lineage
    from evotrainer.contracts.harness import DEFAULT_HARNESS, harness_id
    from tests.llm_server import ScriptedLLM, Turn, tool

    recipe = (DEFAULT_HARNESS / "recipe.yaml").read_text()

    def submit(name: str, **changes) -> Turn:
        return tool("submit_candidate", intervention=name, targeted_findings=["dead_group_ratio"],
                    hypothesis=f"If {name} is applied then val accuracy rises because more groups carry signal.",
                    success_criterion="val accuracy above the control's after the same steps",
                    diff=unified_diff("recipe.yaml", recipe, set_recipe_values(recipe, changes)))

    bad = submit("dynamic_sampling", dynamic_sampling=True)
    bad.tool_calls[0][1]["diff"] = bad.tool_calls[0][1]["diff"].replace(" group_size: 8", " group_size: 9")
    script = [
        Turn(text="Most GRPO groups have zero reward variance, so most of the batch carries no gradient. The "
                  "recipe's sampling and learning-rate knobs are the first levers; let me read the recipe.",
             tool_calls=[("read_harness_file", {"file": "recipe.yaml"})]),
        tool("read_findings"),
        tool("query_evidence", aggregation="group_signal", group_by="difficulty"),
        tool("query_evidence", aggregation="examples", where={"correct": False}, limit=10),
        tool("read_lineage"),
        submit("lower_lr", lr=1e-4),
        bad,
        submit("dynamic_sampling", dynamic_sampling=True),
        submit("clip_higher", clip_high=0.28),
    ]
    with tempfile.TemporaryDirectory() as scratch:
        run = generation_dir(Path(scratch))
        os.environ["ANTHROPIC_API_KEY"] = "benchmark-key"
        with ScriptedLLM(script) as server:
            cfg = compose(["agent=claude", f"agent.base_url={server.url}", "agent.max_candidates=3"]).agent
            agent = make_agent(cfg)
            gen = run / "gen0"
            context = ProposalContext(0, gen / "harness", harness_id(gen / "harness"),
                                      read_json(gen / "diagnosis.json")["findings"], lineage.read(run / "lineage.parquet"))
            context.extra.update(run="bench", run_dir=run, rollouts=gen / "rollouts.parquet",
                                 diagnostics=gen / "diagnostics.parquet")
            proposals = agent.propose(context, 3)
    rows = [c.row() for c in agent.calls]
    prices = cfg.prices
    measured = {k: sum(r[k] for r in rows) for k in ("input_tokens", "output_tokens", "cache_read_tokens",
                                                    "cache_creation_tokens", "request_chars")}
    measured_cost = sum(r["cost_usd"] for r in rows)
    extra_output = args.output_tokens_per_call * len(rows)
    estimate = measured_cost + extra_output * prices.output / 1e6
    print(json.dumps({
        "model": cfg.model, "prices_usd_per_mtok": dict(prices), "calls": len(rows),
        "candidates": [(p.intervention, getattr(p, "failure_label", None)) for p in proposals],
        "per_call": [{k: r[k] for k in ("call_index", "tool_calls", "input_tokens", "output_tokens", "cache_read_tokens",
                                        "cache_creation_tokens", "request_chars", "cost_usd")} for r in rows],
        "measured_totals": measured, "measured_cost_usd": round(measured_cost, 4),
        "assumed_output_tokens_per_call": args.output_tokens_per_call,
        "estimated_cost_per_generation_usd": round(estimate, 4),
        "estimated_cost_per_generation_usd_if_30pct_more_tokens": round(estimate * 1.3, 4),
    }, indent=2, default=str))


if __name__ == "__main__":
    main()
