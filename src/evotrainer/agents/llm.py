"""The LLM agent: one tool-use conversation per generation, shared by the Claude and OpenAI-compatible
providers (evotrainer.agents.claude, evotrainer.agents.openai_agent).

The model narrates the diagnosis, reads evidence through bounded tools (evotrainer.agents.tools) and
submits candidates with ``submit_candidate``. Every submission is checked at once (UTF-8, size, only
harness files, applies strictly, recipe schema, imports); an invalid reply, or a reply with no tool
call, goes back to the model with the error, up to ``agent.max_invalid_replies`` times per candidate,
after which that candidate is recorded as failed with a label.

Against a broken or hostile endpoint (evotrainer.agents.transport, evotrainer.agents.replies): every
call has a deadline and capped retries; an unusable reply is a failed call labelled
``agent_malformed_reply``; usage that is not a non-negative integer is counted conservatively (the
request's characters as input tokens, ``agent.max_tokens`` as output); replies, tool arguments and
the whole conversation are capped; every request body and call-log field is redacted
(evotrainer.secrets). When the endpoint fails for good, the step's deadline passes or the per-run
budget is spent, the conversation stops cleanly, the candidate in progress fails with its label, and
with ``agent.fallback: heuristic`` the offline agent fills the free slots. Nothing raises out of
``narrate`` / ``propose``; every call is recorded (evotrainer.contracts.agent_calls).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from evotrainer import secrets
from evotrainer.agents.base import FailedProposal, FallbackProposal, ProposalContext
from evotrainer.agents.prompts import first_message, system_prompt
from evotrainer.agents.replies import Reply, ToolCall
from evotrainer.agents.submission import (  # noqa: F401  (the labels are re-exported)
    BAD_TOOL_CALL,
    BUDGET,
    DOES_NOT_APPLY,
    DUPLICATE,
    FAILURE_LABELS,
    FIELD_CHARS,
    NO_DIFF,
    NO_TOOL_CALL,
    NON_UTF8,
    NOT_A_DIFF,
    TOO_LARGE,
    WRONG_FILE,
    check_submission,
    cut_text,
)
from evotrainer.agents.tools import TOOL_SPECS, Toolbox, ToolError, cap
from evotrainer.agents.transport import API_ERROR, MALFORMED, TIMEOUT, CallFailed, Deadline
from evotrainer.contracts import agent_calls as call_records
from evotrainer.contracts.candidate import Proposal
from evotrainer.runtime import diff_hash

USAGE_INVALID = "agent_usage_invalid"  # a call label (agent_calls.parquet), not a candidate's
STOP_OF_LABEL = {API_ERROR: "api_error", TIMEOUT: "timeout", MALFORMED: "malformed_reply"}
# stops for which the offline agent fills the free slots (agent.fallback: heuristic)
FALLBACK_STOPS = ("budget", "api_error", "timeout", "malformed_reply", "deadline", "agent_error")
MIN_CHARS_PER_TOKEN_REPORTED = 8  # fewer input tokens than request chars / 8 is under-reported usage


class AgentSetupError(RuntimeError):
    """The agent cannot start (no API key in the environment, SDK missing, a bad agent.* value)."""


class Provider(Protocol):
    """One SDK behind a minimal surface (evotrainer.agents.transport.SDKProvider implements it)."""

    name: str
    model: str

    def send(self, system: str, messages: list[dict], tools: list[dict], deadline: Deadline) -> Reply:
        """The reply, or CallFailed once retries, time or patience are spent."""
        ...

    def user_text(self, text: str) -> list[dict]: ...

    def tool_results(self, results: list[tuple[ToolCall, str, bool]]) -> list[dict]: ...


def api_key(agent_cfg, required: bool = True) -> str | None:
    name = agent_cfg.api_key_env
    secrets.register(name)  # its value is redacted from everything this process writes or sends
    if not name:
        if required:
            raise AgentSetupError(f"agent.api_key_env is not set; agent={agent_cfg.name} needs the name of the "
                                  "environment variable that holds the API key (e.g. ANTHROPIC_API_KEY)")
        return None
    value = os.environ.get(name)
    if not value:
        if required:
            raise AgentSetupError(f"agent={agent_cfg.name}: environment variable {name} is not set; export your API "
                                  f"key as {name} (it is read from the environment only, never from config files)")
        return None
    return value


@dataclass
class Budget:
    max_tokens: int | None
    max_cost_usd: float | None
    tokens: int = 0
    cost_usd: float = 0.0

    def exhausted(self) -> bool:
        return ((self.max_tokens is not None and self.tokens >= self.max_tokens)
                or (self.max_cost_usd is not None and self.cost_usd >= self.max_cost_usd))

    def describe(self) -> str:
        limits = [f"{self.tokens} of {self.max_tokens} tokens" if self.max_tokens is not None else f"{self.tokens} tokens",
                  f"${self.cost_usd:.4f} of ${self.max_cost_usd}" if self.max_cost_usd is not None else f"${self.cost_usd:.4f}"]
        return ", ".join(limits)


@dataclass
class Session:
    narrative: str
    proposals: list[Proposal]
    stop: str
    calls: list[call_records.CallRecord] = field(default_factory=list)


class LLMAgent:
    """The agent interface over a Provider: narrate() and propose() share one conversation."""

    def __init__(self, agent_cfg, provider: Provider, secret: str | None = None):
        self.cfg = agent_cfg
        self.provider = provider
        self.name = agent_cfg.name
        self.calls: list[call_records.CallRecord] = []
        self._secret = secret
        self._sessions: dict[tuple[int, int], Session] = {}

    def narrate(self, context: ProposalContext) -> str:
        return self._session(context, self.cfg.max_candidates).narrative

    def propose(self, context: ProposalContext, k: int) -> list[Proposal]:
        return self._session(context, k).proposals

    def _session(self, context: ProposalContext, k: int) -> Session:
        key = (id(context), k)
        if key not in self._sessions:
            session = self._converse(context, k)
            self._sessions[key] = self._with_fallback(context, k, session)
        return self._sessions[key]

    # -- the conversation ------------------------------------------------------------------------------

    def _converse(self, context: ProposalContext, k: int) -> Session:
        cfg = self.cfg
        step = Deadline(float(cfg.step_timeout_s))
        budget = Budget(cfg.budget.max_tokens, cfg.budget.max_cost_usd)
        accepted: list[Proposal] = []
        failed: list[FailedProposal] = []
        narrative: list[str] = []
        invalid, pending = 0, None  # pending: (label, error, arguments) of the candidate being retried
        turns, stop, note = 0, "complete", ""
        try:
            toolbox = Toolbox.from_context(context, cfg.tool_output_chars)
            run_dir = context.extra.get("run_dir")
            if run_dir is not None:
                budget.tokens, budget.cost_usd = call_records.spent(run_dir, context.generation)
            tried = set()
            if context.lineage is not None and not context.lineage.empty:
                same_parent = context.lineage[context.lineage["parent_harness_id"] == context.harness_id]
                tried = set(same_parent["diff_hash"]) - context.worth_retrying(same_parent)
            system, tools = system_prompt(), TOOL_SPECS
            messages = self.provider.user_text(first_message(context, k))
            while len(accepted) + len(failed) < k:
                if budget.exhausted():
                    stop = "budget"
                    break
                if turns >= cfg.max_turns:
                    stop = "max_turns"
                    break
                if step.expired():
                    stop = "deadline"
                    break
                if _chars(system, messages, tools) > cfg.max_conversation_chars:
                    stop = "conversation_limit"
                    break
                try:
                    reply = self._call(context, system, messages, tools, budget, step)
                except CallFailed as err:
                    failed.append(self._failed(err.label, str(err), pending[2] if pending else None))
                    pending, stop = None, STOP_OF_LABEL.get(err.label, "api_error")
                    break
                turns += 1
                if reply.text.strip():
                    narrative.append(reply.text.strip())
                messages += reply.assistant_messages
                if not reply.tool_calls:
                    invalid += 1
                    pending = (NO_TOOL_CALL, "the reply had no tool call", pending[2] if pending else None)
                    text = ("Your reply contained no tool call. Answer with a tool call: submit_candidate with a diff, "
                            "a read tool, or finish.")
                    if invalid >= cfg.max_invalid_replies:
                        failed.append(self._failed(*pending))
                        text += f" After {invalid} such replies this candidate is recorded as failed ({NO_TOOL_CALL})."
                        invalid, pending = 0, None
                    messages += self.provider.user_text(text)
                    continue
                results: list[tuple[ToolCall, str, bool]] = []
                finished = False
                for call in reply.tool_calls:
                    if call.name == "submit_candidate":
                        if len(accepted) + len(failed) >= k:
                            results.append((call, "No candidate slots are left; call finish.", True))
                            continue
                        proposal, label, error = ((None, call.label or BAD_TOOL_CALL, call.error) if call.error else
                                                  check_submission(context.harness_dir, call.arguments,
                                                                   cfg.max_diff_bytes, tried))
                        if proposal is not None:
                            accepted.append(proposal)
                            tried.add(diff_hash(proposal.diff))
                            invalid, pending = 0, None
                            left = k - len(accepted) - len(failed)
                            results.append((call, f"Accepted as candidate {len(accepted)}. {left} slot(s) left"
                                                  + ("; submit the next one or finish." if left else "; call finish."), False))
                            continue
                        invalid += 1
                        pending = (label, error, call.arguments)
                        message = f"Rejected ({label}): {error}"
                        if invalid >= cfg.max_invalid_replies:
                            failed.append(self._failed(*pending))
                            message += (f"\nThat was attempt {invalid} of {cfg.max_invalid_replies}: this candidate is "
                                        f"recorded as failed ({label}). Propose a different change or finish.")
                            invalid, pending = 0, None
                        else:
                            message += f"\nFix it and call submit_candidate again (attempt {invalid} of {cfg.max_invalid_replies})."
                        results.append((call, cap(message, cfg.tool_output_chars), True))
                    elif call.name == "finish":
                        finished = True
                        results.append((call, "Proposals closed for this generation.", False))
                    elif call.error:
                        results.append((call, f"{call.name}: {call.error}", True))
                    else:
                        results.append(_run_tool(toolbox, call))
                messages += self.provider.tool_results(results)
                if finished:
                    stop = "finished"
                    break
        except Exception as err:  # an unforeseen reply or a bug: this generation keeps what it has
            stop, note = "agent_error", f"\n\nAgent error: {type(err).__name__}: {secrets.redact(str(err))[:500]}"
        if pending is not None:  # a candidate was being retried when the conversation stopped
            label = BUDGET if stop == "budget" else TIMEOUT if stop == "deadline" else pending[0]
            failed.append(self._failed(label, f"{pending[1]} (conversation stopped: {stop})", pending[2]))
        spent_here = [c for c in self.calls if c.generation == context.generation]
        summary = (f"Agent {self.name} ({self.provider.model}): {len(accepted)} candidate(s) accepted, "
                   f"{len(failed)} failed; stopped: {stop}; {len(spent_here)} call(s); run budget used: {budget.describe()}.")
        text = cut_text("\n\n".join(narrative), int(cfg.max_reply_chars)) if narrative else "The model wrote no diagnosis text."
        return Session(narrative=secrets.redact(f"{text}\n\n{summary}{note}"), proposals=[*accepted, *failed][:k],
                       stop=stop, calls=spent_here)

    def _call(self, context: ProposalContext, system: str, messages: list[dict], tools: list[dict],
              budget: Budget, step: Deadline) -> Reply:
        request_chars = _chars(system, messages, tools)
        started, t0 = time.time(), time.perf_counter()
        record = call_records.CallRecord(
            run=str(context.extra.get("run", "")), generation=context.generation, agent=self.name,
            model=str(self.provider.model), call_index=len(self.calls), outcome="ok", attempts=0, started_at=started,
            latency_s=0.0, request_chars=request_chars,
        )
        # what an unreadable or timed-out reply may have cost: every character a token, the whole max_tokens
        estimate = call_records.Usage(input_tokens=request_chars, output_tokens=int(self.cfg.max_tokens))
        try:
            reply = self.provider.send(system, messages, tools, Deadline(float(self.cfg.call_timeout_s), parent=step))
        except CallFailed as err:
            record.outcome, record.status_code, record.error_type, record.label = err.outcome, err.status, err.error_type, err.label
            record.attempts, record.error = err.attempts, self._redact(str(err))[:2000]
            self._account(record, call_records.Usage(), estimate, err.charged, budget, t0)
            raise
        usage, problem = reply.usage, reply.usage_problem
        reported_input = usage.input_tokens + usage.cache_read_tokens + usage.cache_creation_tokens
        if problem is None and reported_input < request_chars // MIN_CHARS_PER_TOKEN_REPORTED:
            problem = f"{reported_input} input tokens reported for a request of {request_chars} characters"
        if problem is not None:
            usage, record.label, record.error = estimate, USAGE_INVALID, self._redact(f"usage not believed: {problem}")[:2000]
            record.usage_estimated = True
        record.attempts, record.stop_reason = reply.attempts, reply.stop_reason
        record.tool_calls = [c.name for c in reply.tool_calls]
        self._account(record, usage, estimate, reply.charged, budget, t0)
        return reply

    def _account(self, record: call_records.CallRecord, usage: call_records.Usage, estimate: call_records.Usage,
                 charged: int, budget: Budget, t0: float) -> None:
        """Record the call and charge the budget (earlier unusable or timed-out attempts at the estimate)."""
        record.latency_s = time.perf_counter() - t0
        record.usage = usage.plus(estimate, times=charged)
        record.usage_estimated = record.usage_estimated or charged > 0
        record.cost_usd = record.usage.cost(self.cfg.prices)
        self.calls.append(record)
        budget.tokens += record.usage.total
        budget.cost_usd += record.cost_usd

    def _redact(self, text: str) -> str:
        text = secrets.redact(text)
        return text.replace(self._secret, secrets.REDACTED) if self._secret else text

    def _failed(self, label: str, error: str | None, arguments: Any) -> FailedProposal:
        args = arguments if isinstance(arguments, dict) else {}

        def text(key: str, default: str = "") -> str:
            value = args.get(key, default)
            return self._redact(cut_text(value, FIELD_CHARS.get(key, int(self.cfg.max_diff_bytes)))) if isinstance(value, str) else default

        targeted = args.get("targeted_findings", [])
        return FailedProposal(
            intervention=text("intervention", "llm_candidate").strip() or "llm_candidate",
            hypothesis=text("hypothesis"),
            targeted_findings=[cut_text(t, 100) for t in targeted[:20] if isinstance(t, str)] if isinstance(targeted, list) else [],
            success_criterion=text("success_criterion"), diff=text("diff"), failure_label=label,
            error=self._redact(cut_text(error or "", 2000)),
        )

    # -- the fallback ----------------------------------------------------------------------------------

    def _with_fallback(self, context: ProposalContext, k: int, session: Session) -> Session:
        """With agent.fallback: heuristic, the offline agent's candidates fill the slots the endpoint
        (or the budget, or the deadline) left free; they say so in proposal.json and the lineage."""
        free = k - sum(not isinstance(p, FailedProposal) for p in session.proposals)
        if self.cfg.fallback != "heuristic" or session.stop not in FALLBACK_STOPS or free <= 0:
            return session
        from evotrainer.agents.heuristic import HeuristicAgent

        reason = {"budget": "the agent budget is spent", "deadline": "the propose step ran out of time",
                  "agent_error": "the agent failed"}.get(session.stop, f"the endpoint failed ({session.stop})")
        taken = {diff_hash(p.diff) for p in session.proposals}
        try:
            offline = [p for p in HeuristicAgent().propose(context, free + len(taken)) if diff_hash(p.diff) not in taken]
        except Exception as err:  # the fallback must not fail the stage either
            session.narrative += f"\n\nHeuristic fallback failed: {type(err).__name__}: {secrets.redact(str(err))[:300]}"
            return session
        added = [FallbackProposal(**(asdict(p) | {"hypothesis": f"[heuristic fallback: {reason}] {p.hypothesis}"}),
                                  fallback_reason=reason) for p in offline[:free]]
        session.proposals = [*session.proposals, *added]
        session.narrative += (f"\n\nHeuristic fallback ({reason}): {len(added)} candidate(s) from the offline agent "
                              f"({', '.join(p.intervention for p in added) or 'none applicable'}).")
        return session


def _run_tool(toolbox: Toolbox, call: ToolCall) -> tuple[ToolCall, str, bool]:
    try:
        return call, toolbox.run(call.name, call.arguments or {}), False
    except ToolError as err:
        return call, str(err), True
    except Exception as err:  # an argument of the wrong kind reached the tool
        return call, cap(f"{call.name}: bad arguments ({type(err).__name__}: {err})", toolbox.max_chars), True


def _chars(system: str, messages: list[dict], tools: list[dict]) -> int:
    """Characters of the JSON the agent sends (system + tools + messages)."""
    return len(json.dumps([system, messages, tools], ensure_ascii=False, default=str))
