"""The LLM agent: one tool-use conversation per generation, shared by the Claude and OpenAI-compatible
providers (evotrainer.agents.claude, evotrainer.agents.openai_agent).

The model narrates the diagnosis, reads evidence through bounded tools (evotrainer.agents.tools) and
submits candidates with ``submit_candidate``. Every submission is checked at once (UTF-8, size, only
harness files, applies strictly, recipe schema, imports); an invalid reply, or a reply with no tool
call, goes back to the model with the error, up to ``agent.max_invalid_replies`` times per candidate,
after which that candidate is recorded as failed with a label. Endpoint errors are retried by the
SDK (backoff on 429/529/5xx/timeouts); when retries run out the candidate in progress fails with
``agent_api_error`` / ``agent_timeout`` and the generation goes on with what was accepted. A per-run
budget (tokens and estimated cost over all generations) stops proposing cleanly once spent. Every
call is recorded (evotrainer.agents.calls).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from evotrainer.agents import calls as call_records
from evotrainer.agents.base import FailedProposal, ProposalContext
from evotrainer.agents.tools import TOOL_SPECS, Toolbox, ToolError
from evotrainer.contracts.candidate import CandidateError, Proposal, touched_files, validate
from evotrainer.contracts.harness import HARNESS_FILES, RECIPE_SCHEMA
from evotrainer.runtime import diff_hash

# labels of candidates the agent failed to produce (evotrainer.contracts.lineage.FAILURE_LABELS lists them too)
NO_TOOL_CALL = "agent_no_tool_call"
BAD_TOOL_CALL = "agent_bad_tool_call"
NO_DIFF = "agent_no_diff"
NON_UTF8 = "agent_non_utf8"
TOO_LARGE = "agent_diff_too_large"
WRONG_FILE = "agent_wrong_file"
NOT_A_DIFF = "agent_not_a_diff"
DOES_NOT_APPLY = "agent_diff_does_not_apply"
DUPLICATE = "agent_duplicate"
API_ERROR = "agent_api_error"
TIMEOUT = "agent_timeout"
BUDGET = "agent_budget_exhausted"
FAILURE_LABELS = (NO_TOOL_CALL, BAD_TOOL_CALL, NO_DIFF, NON_UTF8, TOO_LARGE, WRONG_FILE, NOT_A_DIFF,
                  DOES_NOT_APPLY, DUPLICATE, API_ERROR, TIMEOUT, BUDGET)


class AgentSetupError(RuntimeError):
    """The agent cannot start (no API key in the environment, SDK missing): a config problem."""


class ApiFailure(Exception):
    """The endpoint failed after the SDK's retries; ``label`` is the candidate failure label."""

    def __init__(self, message: str, label: str):
        super().__init__(message)
        self.label = label


class MalformedReply(Exception):
    """The endpoint answered 200 with a body the agent cannot use (e.g. no choices)."""


def classify_sdk_error(sdk, err: Exception) -> tuple[str, int | None, str]:
    """(outcome, HTTP status, failure label) of an exception from the anthropic or openai SDK (both
    name their error classes alike), once the SDK's own retries are spent."""
    if isinstance(err, sdk.APITimeoutError):
        return "timeout", None, TIMEOUT
    if isinstance(err, sdk.APIConnectionError):
        return "connection_error", None, API_ERROR
    if isinstance(err, sdk.APIStatusError):
        status = err.status_code
        outcome = ("rate_limited" if status == 429 else "overloaded" if status == 529
                   else "server_error" if status >= 500 else "api_error")
        return outcome, status, API_ERROR
    if isinstance(err, sdk.APIError | MalformedReply):  # e.g. a body the SDK could not read
        return "api_error", None, API_ERROR
    return "unexpected", None, API_ERROR


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict | None  # None when the model's arguments were not a JSON object
    error: str | None = None


@dataclass
class Reply:
    text: str
    tool_calls: list[ToolCall]
    stop_reason: str | None
    usage: call_records.Usage
    assistant_messages: list[dict]  # what to append to the conversation, in the provider's format


class Provider(Protocol):
    """One SDK behind a minimal surface; raises the SDK's own exceptions from ``send``."""

    name: str
    model: str

    def send(self, system: str, messages: list[dict], tools: list[dict]) -> Reply: ...

    def attempts(self) -> int:
        """HTTP attempts made by the last ``send`` (the SDK's retries included)."""
        ...

    def classify(self, err: Exception) -> tuple[str, int | None, str]:
        """(outcome, HTTP status or None, failure label) of an exception raised by ``send``."""
        ...

    def user_text(self, text: str) -> list[dict]: ...

    def tool_results(self, results: list[tuple[ToolCall, str, bool]]) -> list[dict]: ...


class AttemptCounter:
    """An httpx request hook: counts HTTP attempts, so the SDK's retries show in agent_calls.parquet."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, request) -> None:
        self.count += 1


def clean(value):
    """Replace lone surrogates (invalid UTF-8 a model may emit) before the text is sent back."""
    if isinstance(value, str):
        return value.encode("utf-8", errors="replace").decode("utf-8")
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    return value


def api_key(agent_cfg, required: bool = True) -> str | None:
    name = agent_cfg.api_key_env
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


class SDKProvider:
    """What the anthropic and openai providers share: the SDK client (its own retries and timeout, a
    request hook counting HTTP attempts) and the mapping of its errors to outcomes and labels."""

    def __init__(self, sdk, client_class: str, agent_cfg, key: str) -> None:
        self._sdk = sdk
        self.cfg = agent_cfg
        self.model = agent_cfg.model
        self._counter = AttemptCounter()
        self._before = 0
        kwargs = {"base_url": agent_cfg.base_url} if agent_cfg.base_url else {}
        self.client = getattr(sdk, client_class)(
            api_key=key, timeout=float(agent_cfg.timeout_s), max_retries=int(agent_cfg.max_retries),
            http_client=sdk.DefaultHttpxClient(event_hooks={"request": [self._counter]}), **kwargs,
        )

    def attempts(self) -> int:
        return self._counter.count - self._before

    def classify(self, err: Exception) -> tuple[str, int | None, str]:
        return classify_sdk_error(self._sdk, err)


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


def system_prompt() -> str:
    schema = "\n".join(
        f"  {key}: {f.kind.__name__}"
        + (f" in [{f.low:g}, {f.high:g}]" if f.low is not None else "")
        + (f" one of {list(f.choices)}" if f.choices else "")
        + f" ({f.help})"
        for key, f in RECIPE_SCHEMA.items()
    )
    return f"""You are the research agent of EvoTrainer. A small policy is trained with GRPO; besides the policy, \
the training harness evolves: {", ".join(HARNESS_FILES)}. Each generation you read the diagnosis of the \
rollout evidence and propose candidate harness changes; each candidate is backtested (a short training \
run from the same parent policy) against an unchanged `control`, and the best one that beats control on \
the validation split is promoted.

Rules for a candidate:
- One variable per candidate (one recipe knob, or one coherent change to one function), so the result is \
attributable. Candidates in one generation must differ from each other and from what the lineage shows \
was already tried from this parent.
- A unified diff against the parent harness as it is now: '--- a/<file>' and '+++ b/<file>' headers, \
'@@' hunks with exact context lines (it is applied with `git apply`, no fuzz). Only edit existing \
harness files. Keep recipe values inside the schema below; reward.py must keep \
compute_score(data_source, solution_str, ground_truth, extra_info=None), curriculum.py prompt_weights, \
diagnostics.py diagnose.
- A falsifiable hypothesis ("if X then metric Y improves because Z"), the findings it targets, and a \
success criterion. Beware of reward hacking: a reward that pays for anything but verified correctness \
is vetoed.
- The test split is never available to you; the evidence is the probe split.

Recipe schema (recipe.yaml):
{schema}

How to work: first write a short diagnosis in plain text (3-6 sentences: what the evidence says and \
which lever it points to). Use the read tools as needed (read a harness file before you diff it). Then \
call submit_candidate once per candidate. If a submission is rejected, fix it as the error says and \
submit again. Call finish when you have submitted all candidates or nothing further is worth testing. \
Always answer with a tool call."""


def first_message(context: ProposalContext, k: int) -> str:
    flagged = [f for f in context.findings if f.get("severity") in ("warn", "critical")]
    lines = [f"- {f['name']} = {_num(f.get('value'))} ({f['severity']}, threshold {_num(f.get('threshold'))}): "
             f"{f.get('message', '')}" for f in flagged] or ["- none: no diagnostic crossed its threshold"]
    tried = 0 if context.lineage is None else len(context.lineage)
    parts = [
        f"Generation {context.generation}. Parent harness {context.harness_id}.",
        "Flagged findings:\n" + "\n".join(lines),
        f"Diagnostic signature: {context.signature}.",
        f"Lineage: {tried} candidate(s) tried earlier in this run (read_lineage shows them); "
        "matching skills from earlier runs: read_skills.",
    ]
    if context.feedback:
        parts.append("Feedback from the human reviewer on this stage (take it into account):\n" + context.feedback)
    parts.append(f"Propose up to {k} candidate(s) now: diagnosis first, then submit_candidate for each, then finish.")
    return "\n\n".join(parts)


def _num(value) -> str:
    return "n/a" if value is None or (isinstance(value, float) and value != value) else f"{value:.4g}"


def check_submission(harness_dir: Path, arguments: dict | None, max_diff_bytes: int,
                     tried: set[str]) -> tuple[Proposal | None, str | None, str | None]:
    """(proposal, None, None) if valid, else (None, failure label, message for the model)."""
    if not isinstance(arguments, dict):
        return None, BAD_TOOL_CALL, "submit_candidate needs a JSON object of arguments"
    for key in ("intervention", "hypothesis", "success_criterion", "diff"):
        if not isinstance(arguments.get(key), str):
            return None, (NO_DIFF if key == "diff" else BAD_TOOL_CALL), f"'{key}' must be a string"
    targeted = arguments.get("targeted_findings", [])
    if not isinstance(targeted, list) or not all(isinstance(t, str) for t in targeted):
        return None, BAD_TOOL_CALL, "'targeted_findings' must be a list of finding names"
    diff = arguments["diff"]
    if not diff.strip():
        return None, NO_DIFF, "the diff is empty; a candidate must change the harness"
    try:
        size = len(diff.encode("utf-8"))
    except UnicodeEncodeError as err:
        return None, NON_UTF8, f"the diff is not valid UTF-8 (bad character at offset {err.start}); send plain text"
    if size > max_diff_bytes:
        return None, TOO_LARGE, f"the diff has {size} bytes; the limit is {max_diff_bytes}: make one small change"
    try:
        touched_files(diff)
    except CandidateError as err:
        return None, (WRONG_FILE if err.label == "forbidden_path" else NOT_A_DIFF), str(err)
    if diff_hash(diff) in tried:
        return None, DUPLICATE, "this exact diff was already tried from this parent harness; propose a different change"
    result = validate(harness_dir, diff)
    if not result["ok"]:
        label = DOES_NOT_APPLY if result["failure_label"] == "invalid_diff" else result["failure_label"]
        hint = " Read the file again and copy the context lines exactly." if label == DOES_NOT_APPLY else ""
        return None, label, f"{result['error']}{hint}"
    return Proposal(arguments["intervention"].strip() or "llm_candidate", arguments["hypothesis"], list(targeted),
                    arguments["success_criterion"], diff), None, None


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
        return self._session(context, k).proposals[:k]

    def _session(self, context: ProposalContext, k: int) -> Session:
        key = (id(context), k)
        if key not in self._sessions:
            self._sessions[key] = self._converse(context, k)
        return self._sessions[key]

    # -- the conversation ------------------------------------------------------------------------------

    def _converse(self, context: ProposalContext, k: int) -> Session:
        cfg = self.cfg
        toolbox = Toolbox.from_context(context, cfg.tool_output_chars)
        budget = Budget(cfg.budget.max_tokens, cfg.budget.max_cost_usd)
        run_dir = context.extra.get("run_dir")
        if run_dir is not None:
            budget.tokens, budget.cost_usd = call_records.spent(run_dir, context.generation)
        tried = set()
        if context.lineage is not None and not context.lineage.empty:
            tried = set(context.lineage.loc[context.lineage["parent_harness_id"] == context.harness_id, "diff_hash"])
        system, tools = system_prompt(), TOOL_SPECS
        messages = self.provider.user_text(first_message(context, k))
        accepted: list[Proposal] = []
        failed: list[FailedProposal] = []
        narrative: list[str] = []
        invalid, pending = 0, None  # pending: (label, error, arguments) of the candidate being retried
        turns, stop = 0, "complete"
        while len(accepted) + len(failed) < k:
            if budget.exhausted():
                stop = "budget"
                break
            if turns >= cfg.max_turns:
                stop = "max_turns"
                break
            try:
                reply = self._call(context, system, messages, tools, budget)
            except ApiFailure as err:
                args = pending[2] if pending else None
                failed.append(_failed(err.label, str(err), args))
                pending, stop = None, "api_error"
                break
            turns += 1
            if reply.text.strip():
                narrative.append(reply.text.strip())
            messages += reply.assistant_messages
            if not reply.tool_calls:
                invalid += 1
                pending = (NO_TOOL_CALL, "the reply had no tool call", pending[2] if pending else None)
                note = ("Your reply contained no tool call. Answer with a tool call: submit_candidate with a diff, a "
                        "read tool, or finish.")
                if invalid >= cfg.max_invalid_replies:
                    failed.append(_failed(*pending))
                    note += f" After {invalid} such replies this candidate is recorded as failed ({NO_TOOL_CALL})."
                    invalid, pending = 0, None
                messages += self.provider.user_text(note)
                continue
            results: list[tuple[ToolCall, str, bool]] = []
            finished = False
            for call in reply.tool_calls:
                if call.name == "submit_candidate":
                    if len(accepted) + len(failed) >= k:
                        results.append((call, "No candidate slots are left; call finish.", True))
                        continue
                    proposal, label, error = (None, BAD_TOOL_CALL, call.error) if call.error else check_submission(
                        context.harness_dir, call.arguments, cfg.max_diff_bytes, tried)
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
                        failed.append(_failed(*pending))
                        message += (f"\nThat was attempt {invalid} of {cfg.max_invalid_replies}: this candidate is "
                                    f"recorded as failed ({label}). Propose a different change or finish.")
                        invalid, pending = 0, None
                    else:
                        message += f"\nFix it and call submit_candidate again (attempt {invalid} of {cfg.max_invalid_replies})."
                    results.append((call, message, True))
                elif call.name == "finish":
                    finished = True
                    results.append((call, "Proposals closed for this generation.", False))
                elif call.error:
                    results.append((call, f"{call.name}: {call.error}", True))
                else:
                    try:
                        results.append((call, toolbox.run(call.name, call.arguments or {}), False))
                    except ToolError as err:
                        results.append((call, str(err), True))
                    except TypeError as err:  # an argument of the wrong kind reached the tool
                        results.append((call, f"{call.name}: bad arguments ({err})", True))
            messages += self.provider.tool_results(results)
            if finished:
                stop = "finished"
                break
        if pending is not None:  # a candidate was being retried when the conversation stopped
            label = BUDGET if stop == "budget" else pending[0]
            failed.append(_failed(label, f"{pending[1]} (conversation stopped: {stop})", pending[2]))
        spent_here = [c for c in self.calls if c.generation == context.generation]
        summary = (f"Agent {self.name} ({self.provider.model}): {len(accepted)} candidate(s) accepted, "
                   f"{len(failed)} failed; stopped: {stop}; {len(spent_here)} call(s); run budget used: {budget.describe()}.")
        text = "\n\n".join(narrative) if narrative else "The model wrote no diagnosis text."
        return Session(narrative=f"{text}\n\n{summary}", proposals=[*accepted, *failed], stop=stop, calls=spent_here)

    def _call(self, context: ProposalContext, system: str, messages: list[dict], tools: list[dict],
              budget: Budget) -> Reply:
        request_chars = len(json.dumps([system, messages, tools], ensure_ascii=False, default=str))
        started = time.time()
        t0 = time.perf_counter()
        record = call_records.CallRecord(
            run=str(context.extra.get("run", "")), generation=context.generation, agent=self.name,
            model=self.provider.model, call_index=len(self.calls), outcome="ok", attempts=0, started_at=started,
            latency_s=0.0, request_chars=request_chars,
        )
        try:
            reply = self.provider.send(system, messages, tools)
        except Exception as err:
            outcome, status, label = self.provider.classify(err)
            if outcome == "unexpected":
                raise
            record.latency_s = time.perf_counter() - t0
            record.attempts = self.provider.attempts()
            record.outcome, record.status_code, record.error_type = outcome, status, type(err).__name__
            record.error = self._redact(str(err))[:2000]
            self.calls.append(record)
            raise ApiFailure(f"{type(err).__name__} after {record.attempts} attempt(s): {record.error}", label) from err
        record.latency_s = time.perf_counter() - t0
        record.attempts = self.provider.attempts()
        record.usage = reply.usage
        record.cost_usd = reply.usage.cost(self.cfg.prices)
        record.stop_reason = reply.stop_reason
        record.tool_calls = [c.name for c in reply.tool_calls]
        self.calls.append(record)
        budget.tokens += reply.usage.total
        budget.cost_usd += record.cost_usd
        return reply

    def _redact(self, text: str) -> str:
        return text.replace(self._secret, "[redacted]") if self._secret else text


def _failed(label: str, error: str | None, arguments: Any) -> FailedProposal:
    args = arguments if isinstance(arguments, dict) else {}

    def text(key: str, default: str = "") -> str:
        value = args.get(key, default)
        return value if isinstance(value, str) else default

    targeted = args.get("targeted_findings", [])
    return FailedProposal(
        intervention=text("intervention", "llm_candidate").strip() or "llm_candidate",
        hypothesis=text("hypothesis"), targeted_findings=[t for t in targeted if isinstance(t, str)] if isinstance(targeted, list) else [],
        success_criterion=text("success_criterion"), diff=text("diff"), failure_label=label, error=error or "",
    )

