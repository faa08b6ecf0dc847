"""Any OpenAI-compatible chat-completions endpoint with tool calling, through the openai SDK
(agent=openai): OpenAI itself or a local server such as vLLM.

Tool arguments arrive as a JSON string; one that does not parse is shown to the model as an error.
``usage.prompt_tokens`` includes cached tokens; they are split out as cache reads. The reply is read
from the raw JSON, checked field by field and capped (evotrainer.agents.replies); retries,
deadlines and bounded bodies are evotrainer.agents.transport's. A local server needs no key: with
``agent.api_key_env: null`` (or the variable unset) a placeholder is sent.
"""

from __future__ import annotations

import json

from evotrainer.agents.llm import LLMAgent, api_key
from evotrainer.agents.replies import (
    MAX_TOOL_CALLS,
    Caps,
    Reply,
    TextBudget,
    ToolCall,
    arguments_of,
    checked_usage,
    clean,
    name_or_id,
    need,
    stub_arguments,
)
from evotrainer.agents.transport import MalformedReply, SDKProvider
from evotrainer.contracts.agent_calls import Usage

NO_KEY = "no-key"  # sent to endpoints that need none (the SDK refuses an empty key)


class OpenAIProvider(SDKProvider):
    name = "openai"

    def __init__(self, agent_cfg, key: str | None):
        import openai

        super().__init__(openai, "OpenAI", agent_cfg, key or NO_KEY)
        self.caps = Caps.of(agent_cfg)

    def request(self, system: str, messages: list[dict], tools: list[dict]) -> dict:
        kwargs = {
            "model": self.model, "max_completion_tokens": int(self.cfg.max_tokens),
            "messages": [{"role": "system", "content": system}, *messages],
            "tools": [{"type": "function", "function": t} for t in tools],
        }
        if self.cfg.temperature is not None:
            kwargs["temperature"] = float(self.cfg.temperature)
        return kwargs

    def post(self, kwargs: dict):
        return self.client.chat.completions.with_raw_response.create(**kwargs).http_response

    def parse(self, payload: dict) -> Reply:
        choices = need(payload, "choices", list, "completion")
        if not choices:
            raise MalformedReply("completion: 'choices' is empty")
        choice = choices[0]
        message = need(choice, "message", dict, "completion.choices[0]")
        text = TextBudget(self.caps.reply_chars)
        content = _content_text(message.get("content"))
        kept = text.take(content) if content else ""
        calls, wire_calls = [], []
        for index, tool_call in enumerate(need(message, "tool_calls", list, "message", required=False) or []):
            where = f"message.tool_calls[{index}]"
            call_id = name_or_id(need(tool_call, "id", str, where), f"{where}.id")
            if len(calls) >= MAX_TOOL_CALLS:
                continue  # dropped: neither run nor sent back
            function = tool_call.get("function")
            if not isinstance(function, dict):  # a non-function tool call: nothing this agent offered
                calls.append(ToolCall(call_id, "unknown", None, "only function tool calls are supported"))
                wire_calls.append({"id": call_id, "type": "function", "function": {"name": "unknown", "arguments": "{}"}})
                continue
            name = name_or_id(function.get("name"), f"{where}.function.name")
            raw = function.get("arguments")
            raw = raw if isinstance(raw, str) or raw is None else json.dumps(raw, default=str)
            arguments, error, label, too_large = arguments_of(raw, name, self.caps, json_text=True)
            calls.append(ToolCall(call_id, name, arguments, error, label))
            wire_calls.append({"id": call_id, "type": "function", "function": {
                "name": name, "arguments": json.dumps(stub_arguments(error)) if too_large else (raw or "")}})
        assistant = {"role": "assistant", "content": kept or ""}
        if wire_calls:
            assistant["tool_calls"] = wire_calls
        usage, problem = _usage(payload.get("usage"))
        finish = choice.get("finish_reason")
        return Reply(text=kept or "", tool_calls=calls, stop_reason=finish if isinstance(finish, str) else None,
                     usage=usage, assistant_messages=[clean(assistant)], usage_problem=problem)

    def user_text(self, text: str) -> list[dict]:
        return [{"role": "user", "content": text}]

    def tool_results(self, results: list[tuple[ToolCall, str, bool]]) -> list[dict]:
        return [{"role": "tool", "tool_call_id": call.id, "content": clean(("ERROR: " if is_error else "") + text)}
                for call, text, is_error in results if call.id]


def _content_text(content) -> str:
    """The message text: a string, or (some compatible servers) a list of {type: text, text} parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        if all(isinstance(p, str) for p in parts):
            return "\n".join(parts)
    raise MalformedReply(f"message: 'content' is a {type(content).__name__}, not text")


def _usage(raw) -> tuple[Usage, str | None]:
    if not isinstance(raw, dict):
        return Usage(), f"usage is {'missing' if raw is None else 'not an object'}"
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    counts, problem = checked_usage({"prompt_tokens": raw.get("prompt_tokens"),
                                     "completion_tokens": raw.get("completion_tokens"), "cached_tokens": cached},
                                    required=("prompt_tokens", "completion_tokens"))
    if problem is None and counts["cached_tokens"] > counts["prompt_tokens"]:
        problem = f"cached_tokens={counts['cached_tokens']} exceeds prompt_tokens={counts['prompt_tokens']}"
    return Usage(input_tokens=max(0, counts["prompt_tokens"] - counts["cached_tokens"]),
                 output_tokens=counts["completion_tokens"], cache_read_tokens=counts["cached_tokens"]), problem


def make(agent_cfg) -> LLMAgent:
    # the official endpoint needs the key; a local server (base_url set) may need none
    key = api_key(agent_cfg, required=bool(agent_cfg.api_key_env) and not agent_cfg.base_url)
    return LLMAgent(agent_cfg, OpenAIProvider(agent_cfg, key), secret=key)
