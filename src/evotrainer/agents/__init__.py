"""Agents read a diagnosis and propose single-variable harness diffs. Chosen by the agent/ config group."""

from __future__ import annotations

from evotrainer.agents.base import Agent, ProposalContext


def make_agent(agent_cfg) -> Agent:
    if agent_cfg.name == "heuristic":
        from evotrainer.agents.heuristic import HeuristicAgent

        return HeuristicAgent()
    if agent_cfg.name in ("search_control", "random"):  # baseline arms of the headline (agents/baselines.py)
        from evotrainer.agents.baselines import RandomSearchAgent, SearchControlAgent

        return SearchControlAgent() if agent_cfg.name == "search_control" else RandomSearchAgent()
    if agent_cfg.name == "claude":  # the SDKs are imported only when chosen
        from evotrainer.agents import claude

        return claude.make(agent_cfg)
    if agent_cfg.name == "openai":
        from evotrainer.agents import openai_agent

        return openai_agent.make(agent_cfg)
    raise ValueError(f"agent.name={agent_cfg.name!r} is not available; choose one of ['heuristic', 'claude', 'openai', 'search_control', 'random']")


__all__ = ["Agent", "ProposalContext", "make_agent"]
