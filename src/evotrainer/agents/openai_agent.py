"""Any OpenAI-compatible chat-completions endpoint with tool calling, through the openai SDK
(agent=openai): OpenAI itself or a local server such as vLLM.

Tool arguments arrive as a JSON string; one that does not parse is shown to the model as an error.
``usage.prompt_tokens`` includes cached tokens; they are split out as cache reads. Retries are the
SDK's own (``max_retries``). A local server needs no key: with ``agent.api_key_env: null`` (or the
variable unset) a placeholder is sent.
"""

from __future__ import annotations

import json

from evotrainer.agents.calls import Usage
from evotrainer.agents.llm import (
    LLMAgent,
    MalformedReply,
    Reply,
    SDKProvider,
    ToolCall,
    api_key,
    clean,
)

NO_KEY = "no-key"  # sent to endpoints that need none (the SDK refuses an empty key)


class OpenAIProvider(SDKProvider):
    name = "openai"

    def __init__(self, agent_cfg, key: str | None):
        import openai

        super().__init__(openai, "OpenAI", agent_cfg, key or NO_KEY)

    def send(self, system: str, messages: list[dict], tools: list[dict]) -> Reply:
        self._before = self._counter.count
        kwargs = {
            "model": self.model, "max_completion_tokens": int(self.cfg.max_tokens),
            "messages": [{"role": "system", "content": system}, *messages],
            "tools": [{"type": "function", "function": t} for t in tools],
        }
        if self.cfg.temperature is not None:
            kwargs["temperature"] = float(self.cfg.temperature)
        completion = self.client.chat.completions.create(**kwargs)
        if not completion.choices:
            raise MalformedReply("the endpoint returned a completion without choices")
        choice = completion.choices[0]
        message = choice.message
        calls, wire_calls = [], []
        for tool_call in message.tool_calls or []:
            function = getattr(tool_call, "function", None)
            if function is None:  # a non-function tool call: nothing this agent offered
                calls.append(ToolCall(tool_call.id, getattr(tool_call, "type", "unknown"), None,
                                      "only function tool calls are supported"))
                continue
            arguments, error = _parse_arguments(function.arguments)
            calls.append(ToolCall(tool_call.id, function.name, arguments, error))
            wire_calls.append({"id": tool_call.id, "type": "function",
                               "function": {"name": function.name, "arguments": function.arguments or ""}})
        assistant = {"role": "assistant", "content": message.content or ""}
        if wire_calls:
            assistant["tool_calls"] = wire_calls
        usage = completion.usage
        prompt = (usage.prompt_tokens or 0) if usage else 0
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        cached = (getattr(details, "cached_tokens", None) or 0) if details else 0
        return Reply(
            text=message.content or "", tool_calls=calls, stop_reason=choice.finish_reason,
            usage=Usage(input_tokens=max(0, prompt - cached), output_tokens=(usage.completion_tokens or 0) if usage else 0,
                        cache_read_tokens=cached),
            assistant_messages=[clean(assistant)],
        )

    def user_text(self, text: str) -> list[dict]:
        return [{"role": "user", "content": text}]

    def tool_results(self, results: list[tuple[ToolCall, str, bool]]) -> list[dict]:
        return [{"role": "tool", "tool_call_id": call.id, "content": clean(("ERROR: " if is_error else "") + text)}
                for call, text, is_error in results if call.id]


def _parse_arguments(raw: str | None) -> tuple[dict | None, str | None]:
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError as err:
        return None, f"the tool arguments are not valid JSON ({err.msg} at position {err.pos})"
    if not isinstance(value, dict):
        return None, "the tool arguments must be a JSON object"
    return value, None


def make(agent_cfg) -> LLMAgent:
    # the official endpoint needs the key; a local server (base_url set) may need none
    key = api_key(agent_cfg, required=bool(agent_cfg.api_key_env) and not agent_cfg.base_url)
    return LLMAgent(agent_cfg, OpenAIProvider(agent_cfg, key), secret=key)
