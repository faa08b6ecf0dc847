"""An episode as data: what to play (``EpisodeSpec``), its token stream with the loss mask
(``ChatTokens``), and the finished trajectory (``Episode``, whose ``record()`` is the JSON the agentic
task's ``verify`` replays and the evidence writer stores).

The token stream: the environment's first observation rendered with the policy's chat template, then
model turns and observations alternating, as ONE sequence with a loss mask: 1 on tokens the model
sampled (its end-of-turn token included), 0 on prompt and environment tokens. The model's tokens are
kept exactly as sampled (never re-tokenized); the environment's part of each turn is the text the chat
template adds between the model's turn and the next generation prompt (ChatML:
``\n<|im_start|>user\n{observation}<|im_end|>\n<|im_start|>assistant\n``), tokenized on its own.
``conversation_tokens`` builds the same sequence from a finished conversation, so SFT on expert
demonstrations sees the token boundaries rollouts produce. The chat template must be prefix-stable
(rendering a longer conversation extends the shorter one's text, as ChatML, Llama and Qwen2 templates
do); where it is not, ``template_mismatches`` counts the turns that fell back to a plain re-render.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from evotrainer.policy.chat import eos_token_ids

PRIVATE_INFO = ("hidden_output",)  # info an environment keeps out of records (it would reveal hidden tests)


@dataclass
class EpisodeSpec:
    """One environment instance to play (a task row)."""

    instance_id: str
    env: str
    seed: int
    env_options: dict = field(default_factory=dict)
    data_source: str = "agentic"
    ground_truth: str = ""
    metadata: dict = field(default_factory=dict)


class ChatTokens:
    """The token sequence of one conversation, grown turn by turn, with its loss mask."""

    def __init__(self, tokenizer, messages: list[dict]):
        self.tokenizer = tokenizer
        self.messages = list(messages)
        self.rendered = self._render(True)
        self.ids = self._encode(self.rendered)
        self.mask = [0] * len(self.ids)
        self.logprobs = [0.0] * len(self.ids)
        self.turn_of = [-1] * len(self.ids)
        self.prompt_len = len(self.ids)
        self.template_mismatches = 0
        self._glue = ""

    def _render(self, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(self.messages, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def _extend(self, ids: Sequence[int], masked: int, logprobs: Sequence[float] | None, turn: int) -> None:
        self.ids += list(ids)
        self.mask += [masked] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        self.turn_of += [turn] * len(ids)

    def add_model_turn(self, ids: Sequence[int], text: str, finished: bool, turn: int,
                       logprobs: Sequence[float] | None = None) -> None:
        """The model's sampled ids (end-of-turn token included when ``finished``) and their text."""
        self._extend(ids, 1, logprobs, turn)
        before = self.rendered
        self.messages.append({"role": "assistant", "content": text})
        self.rendered = self._render(False)
        # what the template writes after the content that the model did not sample (ChatML: "\n")
        delta = self.rendered[len(before):] if self.rendered.startswith(before) else None
        if delta is None or not delta.startswith(text):
            self.template_mismatches += 1
            self._glue = ""
            return
        rest = delta[len(text):]
        end = self.tokenizer.decode(list(ids[-1:])) if finished and len(ids) else ""
        self._glue = rest[len(end):] if end and rest.startswith(end) else rest

    def add_observation(self, observation: str) -> None:
        before = self.rendered
        self.messages.append({"role": "user", "content": observation})
        self.rendered = self._render(True)
        if not self.rendered.startswith(before):
            self.template_mismatches += 1
            before = ""
        self._extend(self._encode(self._glue + self.rendered[len(before):]), 0, None, -1)
        self._glue = ""


def conversation_tokens(tokenizer, messages: list[dict], eos_id: int | None = None) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of a whole conversation (system/user prompt, then assistant and user turns), built
    as rollouts build it: assistant content tokenized + EOS (mask 1), the rest mask 0. For SFT."""
    eos = eos_token_ids(None, tokenizer)[0] if eos_id is None else eos_id
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    chat = ChatTokens(tokenizer, messages[:first])
    turn = 0
    for message in messages[first:]:
        if message["role"] == "assistant":
            ids = chat._encode(message["content"]) + [eos]
            chat.add_model_turn(ids, message["content"], True, turn)
            turn += 1
        else:
            chat.add_observation(message["content"])
    return chat.ids, chat.mask


@dataclass
class Episode:
    spec: EpisodeSpec
    group: int  # index of the instance in the batch (the GRPO group)
    sample_idx: int
    chat: ChatTokens
    env: object = None
    actions: list[str] = field(default_factory=list)
    per_turn: list[dict] = field(default_factory=list)
    termination: str | None = None
    env_reward: float = 0.0
    tool_calls: int = 0
    invalid_actions: int = 0
    final_info: dict = field(default_factory=dict)
    reward: float = 0.0
    components: dict = field(default_factory=dict)
    turn_rewards: list[float] | None = None
    started: float = field(default_factory=time.monotonic)
    wall_time_s: float = 0.0

    @property
    def episode_id(self) -> str:
        return f"{self.spec.instance_id}#{self.sample_idx}"

    @property
    def turns(self) -> int:
        return len(self.actions)

    @property
    def response_tokens(self) -> int:
        return int(sum(self.chat.mask))

    @property
    def done(self) -> bool:
        return self.termination is not None

    def transcript(self) -> str:
        """Every message after the prompt, as "<role>: content" blocks (the reward's solution_str)."""
        body = self.chat.messages[self._prompt_messages():]
        return "\n\n".join(f"{m['role']}: {m['content']}" for m in body)

    def _prompt_messages(self) -> int:
        return next((i for i, m in enumerate(self.chat.messages) if m["role"] == "assistant"),
                    len(self.chat.messages))

    def record(self) -> dict:
        """The episode as JSON-able data: what the task's verify and the evidence writer consume."""
        return {"episode_id": self.episode_id, "instance_id": self.spec.instance_id, "env": self.spec.env,
                "seed": self.spec.seed, "actions": list(self.actions), "turns": self.turns,
                "tool_calls": self.tool_calls, "invalid_actions": self.invalid_actions,
                "termination": self.termination, "env_reward": self.env_reward,
                "response_tokens": self.response_tokens, "per_turn": list(self.per_turn),
                "final_info": {k: v for k, v in self.final_info.items() if k not in PRIVATE_INFO and _jsonable(v)}}


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
        return True
    except TypeError:
        return False
