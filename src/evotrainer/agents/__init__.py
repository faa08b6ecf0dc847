"""Agents read a diagnosis and propose single-variable harness diffs. Chosen by the agent/ config group.

Agents are plug-ins of the ``AGENTS`` registry (``evotrainer.loading.Registry``, entry-point group
``evotrainer.agents``): an agent is a factory called with the ``agent`` config group, ``(agent_cfg) ->
Agent``, or a class whose constructor takes no arguments. The LLM agents' modules (and their SDKs) are
imported only when chosen.
"""

from __future__ import annotations

import inspect

from evotrainer.agents.base import Agent, ProposalContext
from evotrainer.plugins import AGENTS

ENTRY_POINT_GROUP = AGENTS.group
register = AGENTS.register


def _takes_config(factory) -> bool:
    try:
        inspect.signature(factory).bind(None)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): call it with the config
        return True
    return True


def make_agent(agent_cfg) -> Agent:
    """The agent ``agent.name`` names, made from the ``agent`` config group."""
    factory = AGENTS.resolve(agent_cfg.name)
    return factory(agent_cfg) if _takes_config(factory) else factory()


__all__ = ["AGENTS", "Agent", "ProposalContext", "make_agent", "register"]
