"""One way to turn chat messages into token ids, used by SFT, local rollout, evaluation, vLLM and verl.

A prompt is rendered with the tokenizer's own chat template (``add_generation_prompt=True``) and the
rendered text is tokenized with ``add_special_tokens=False``, exactly as verl's RLHFDataset and vLLM's
chat path do: the template decides about BOS (Qwen-style templates have none, Llama-style ones write
``bos_token`` themselves), nothing here adds one. A tokenizer without a template gets
``PLAIN_CHAT_TEMPLATE`` (its BOS if it has one, then the last user message), so base models work too.

A response ends with the tokenizer's EOS token; generation stops on any id of ``eos_token_ids``
(every EOS of the model's generation_config and of the tokenizer: chat models often have two).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

# The last user message verbatim, after the BOS token when the tokenizer has one. The embedded tiny
# policy uses it, so an arithmetic prompt renders to "<bos>23-58+7=" exactly as before chat templates.
PLAIN_CHAT_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{{ (messages | selectattr('role', 'equalto', 'user') | list | last)['content'] }}"
)
# ChatML (Qwen-style), without Qwen's default system message: no BOS, every turn closed by <|im_end|>.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def as_messages(prompt: Any) -> list[dict[str, str]]:
    """A prompt as a list of {role, content} dicts: chat messages as stored (a list, or the numpy array
    parquet gives back) or a plain string, taken as the user's message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]


def ensure_chat_template(tokenizer) -> None:
    """Give a tokenizer without a chat template the plain one (see module docstring)."""
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE


def render_prompts(tokenizer, prompts: Iterable[Any]) -> list[str]:
    """The text the policy sees for each prompt (messages or a user string), generation prompt included."""
    template = getattr(tokenizer, "chat_template", None) or PLAIN_CHAT_TEMPLATE
    rendered: dict[tuple, str] = {}  # a GRPO batch repeats every prompt group_size times: render each once
    out = []
    for prompt in prompts:
        msgs = as_messages(prompt)
        key = tuple((m["role"], m["content"]) for m in msgs)
        if key not in rendered:
            rendered[key] = tokenizer.apply_chat_template(msgs, chat_template=template, tokenize=False,
                                                          add_generation_prompt=True)
        out.append(rendered[key])
    return out


def encode_rendered(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of rendered text; special tokens are written by the template, never added here."""
    unique = list(dict.fromkeys(texts))
    if not unique:
        return []
    ids = dict(zip(unique, tokenizer(unique, add_special_tokens=False)["input_ids"], strict=True))
    return [list(ids[text]) for text in texts]


def prompt_token_ids(tokenizer, prompts: Iterable[Any]) -> list[list[int]]:
    return encode_rendered(tokenizer, render_prompts(tokenizer, prompts))


def response_token_ids(tokenizer, responses: Sequence[str], eos_id: int | None = None) -> list[list[int]]:
    """Token ids of target responses followed by EOS (what SFT supervises and the sampler stops on);
    ``eos_id`` defaults to the tokenizer's."""
    eos = eos_token_ids(None, tokenizer)[0] if eos_id is None else eos_id
    return [ids + [eos] for ids in encode_rendered(tokenizer, responses)]


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS first, then the model's generation_config and
    config EOS ids (an int or a list each). ``model`` may be None."""
    found: list[int] = []
    sources = [getattr(tokenizer, "eos_token_id", None)]
    if model is not None:
        sources += [getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                    getattr(getattr(model, "config", None), "eos_token_id", None)]
    for value in sources:
        for token in value if isinstance(value, list | tuple) else [value]:
            if token is not None and int(token) not in found:
                found.append(int(token))
    if not found:
        raise ValueError("the tokenizer has no eos_token and the model's generation_config names no eos_token_id")
    return found


def pad_token_id(tokenizer) -> int:
    """The pad id (the EOS id when the tokenizer defines no pad token; padding is always masked)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad) if pad is not None else eos_token_ids(None, tokenizer)[0]
