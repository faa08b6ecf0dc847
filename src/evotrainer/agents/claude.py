"""Claude through the anthropic SDK: the Messages API with tool use (agent=claude).

The tool definitions, the system prompt and the newest message are marked for prompt caching, so
every call after the first in a generation reads the conversation so far from the cache. Assistant
content is sent back as received (thinking blocks included, as the API requires for tool use with
thinking), after the caps of evotrainer.agents.replies. The reply is read from the raw JSON, checked
field by field; retries, deadlines and bounded bodies are evotrainer.agents.transport's.
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
from evotrainer.agents.transport import SDKProvider
from evotrainer.contracts.agent_calls import Usage

USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


class ClaudeProvider(SDKProvider):
    name = "claude"

    def __init__(self, agent_cfg, key: str):
        import anthropic

        super().__init__(anthropic, "Anthropic", agent_cfg, key)
        self.caps = Caps.of(agent_cfg)

    def request(self, system: str, messages: list[dict], tools: list[dict]) -> dict:
        specs = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in tools]
        if specs:
            specs[-1] = specs[-1] | {"cache_control": {"type": "ephemeral"}}
        kwargs = {
            "model": self.model, "max_tokens": int(self.cfg.max_tokens), "messages": _mark_last(messages), "tools": specs,
            "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
        }
        if self.cfg.temperature is not None:
            kwargs["temperature"] = float(self.cfg.temperature)
        return kwargs

    def post(self, kwargs: dict):
        return self.client.messages.with_raw_response.create(**kwargs).http_response

    def parse(self, payload: dict) -> Reply:
        content = need(payload, "content", list, "message")
        text = TextBudget(self.caps.reply_chars)
        blocks, texts, calls = [], [], []
        for index, block in enumerate(content):
            where = f"message.content[{index}]"
            kind = need(block, "type", str, where)
            if kind == "text":
                kept = text.take(need(block, "text", str, where))
                if kept is not None:
                    texts.append(kept)
                    blocks.append({"type": "text", "text": kept})
            elif kind == "tool_use":
                call_id, name = name_or_id(block.get("id"), f"{where}.id"), name_or_id(block.get("name"), f"{where}.name")
                if len(calls) >= MAX_TOOL_CALLS:
                    continue  # dropped: neither run nor sent back
                arguments, error, label, too_large = arguments_of(block.get("input"), name, self.caps)
                calls.append(ToolCall(call_id, name, arguments, error, label))
                sent = stub_arguments(error) if too_large else block.get("input")
                blocks.append({"type": "tool_use", "id": call_id, "name": name,
                               "input": sent if isinstance(sent, dict) else {}})
            else:  # thinking, redacted_thinking, ...: returned unchanged unless over the text cap
                size = len(json.dumps(block, default=str))
                if size <= text.left:
                    text.left -= size
                    blocks.append(block)
        usage_raw = payload.get("usage")
        if not isinstance(usage_raw, dict):
            counts, problem = {k: 0 for k in USAGE_KEYS}, f"usage is {'missing' if usage_raw is None else 'not an object'}"
        else:
            counts, problem = checked_usage({k: usage_raw.get(k) for k in USAGE_KEYS}, required=USAGE_KEYS[:2])
        stop = payload.get("stop_reason")
        return Reply(
            text="\n".join(texts), tool_calls=calls, stop_reason=stop if isinstance(stop, str) else None,
            usage=Usage(input_tokens=counts["input_tokens"], output_tokens=counts["output_tokens"],
                        cache_read_tokens=counts["cache_read_input_tokens"],
                        cache_creation_tokens=counts["cache_creation_input_tokens"]),
            assistant_messages=[{"role": "assistant", "content": clean(blocks)}] if blocks else [],
            usage_problem=problem,
        )

    def user_text(self, text: str) -> list[dict]:
        return [{"role": "user", "content": [{"type": "text", "text": text}]}]  # blocks: the cached form

    def tool_results(self, results: list[tuple[ToolCall, str, bool]]) -> list[dict]:
        content = [{"type": "tool_result", "tool_use_id": call.id, "content": clean(text), "is_error": is_error}
                   for call, text, is_error in results]
        return [{"role": "user", "content": content}]


def _mark_last(messages: list[dict]) -> list[dict]:
    """A cache breakpoint on the newest message: the next call reads the whole conversation so far from
    the cache instead of paying for it again (system + tools + 1 message = 3 of the 4 breakpoints)."""
    if not messages:
        return messages
    last = dict(messages[-1])
    content = last["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else [dict(b) for b in content]
    if blocks:
        blocks[-1]["cache_control"] = {"type": "ephemeral"}
    last["content"] = blocks
    return [*messages[:-1], last]


def make(agent_cfg) -> LLMAgent:
    key = api_key(agent_cfg)
    return LLMAgent(agent_cfg, ClaudeProvider(agent_cfg, key), secret=key)

