"""Claude through the anthropic SDK: the Messages API with tool use (agent=claude).

The tool definitions, the system prompt and the newest message are marked for prompt caching, so
every call after the first in a generation reads the conversation so far from the cache. Assistant
content is sent back as received (thinking blocks included, as the API requires for tool use with
thinking). Retries with backoff on 408, 409,
429, 5xx, 529 and timeouts are the SDK's own (``max_retries``); ``retry-after`` headers are honoured.
"""

from __future__ import annotations

from evotrainer.agents.calls import Usage
from evotrainer.agents.llm import (
    LLMAgent,
    Reply,
    SDKProvider,
    ToolCall,
    api_key,
    clean,
)


class ClaudeProvider(SDKProvider):
    name = "claude"

    def __init__(self, agent_cfg, key: str):
        import anthropic

        super().__init__(anthropic, "Anthropic", agent_cfg, key)

    def send(self, system: str, messages: list[dict], tools: list[dict]) -> Reply:
        self._before = self._counter.count
        specs = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in tools]
        if specs:
            specs[-1] = specs[-1] | {"cache_control": {"type": "ephemeral"}}
        kwargs = {
            "model": self.model, "max_tokens": int(self.cfg.max_tokens), "messages": _mark_last(messages), "tools": specs,
            "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
        }
        if self.cfg.temperature is not None:
            kwargs["temperature"] = float(self.cfg.temperature)
        message = self.client.messages.create(**kwargs)
        blocks, texts, calls = [], [], []
        for block in message.content:
            if block.type == "text":
                texts.append(block.text)
                blocks.append({"type": "text", "text": block.text})
            elif block.type == "tool_use":
                arguments = block.input if isinstance(block.input, dict) else None
                calls.append(ToolCall(block.id, block.name, arguments,
                                      None if arguments is not None else "arguments must be a JSON object"))
                blocks.append({"type": "tool_use", "id": block.id, "name": block.name, "input": block.input})
            else:  # thinking, redacted_thinking, ...: returned unchanged
                blocks.append(block.model_dump(mode="json", exclude_none=True))
        usage = message.usage
        return Reply(
            text="\n".join(texts), tool_calls=calls, stop_reason=message.stop_reason,
            usage=Usage(input_tokens=usage.input_tokens or 0, output_tokens=usage.output_tokens or 0,
                        cache_read_tokens=usage.cache_read_input_tokens or 0,
                        cache_creation_tokens=usage.cache_creation_input_tokens or 0),
            assistant_messages=[{"role": "assistant", "content": clean(blocks)}] if blocks else [],
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
