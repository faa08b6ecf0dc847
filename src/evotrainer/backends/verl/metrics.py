"""verl's outputs -> our artifacts: train_log rows and evidence rows.

A verl run (as the backend launches it) leaves behind:
- ``metrics.jsonl`` from verl's ``file`` logger: one line per step, ``{"step": s, "data": {name: value}}``
  (names such as ``actor/entropy``, ``actor/pg_clipfrac``, ``critic/score/mean``, ``timing_s/gen``);
- ``train_generations/<step>.jsonl`` (``trainer.rollout_data_dir``): every training sample of a step,
  ``{input, output, gts, score, step, uid}`` with uid = ``<prompt uuid>_<sample>_<turn>``;
- a validation dump (``trainer.validation_data_dir``, when a run asks for one; the backend's own runs do
  not, the backtest stage evaluates the saved policy): the same, plus the reward's components and
  ``reward``. ``evidence_rows`` turns such a dump into evidence.

Each dumped prompt is matched back to its split row (the row's prompt rendered by evotrainer.policy.chat
and decoded as verl decodes it, and its ground truth): correctness, format and failure category come
from the task's ``verify`` on the row's metadata, difficulty from the row. The per-sample dumps give
what the local trainer logs (accuracy, dead groups, lengths, truncation, tokens); the metrics give what
only the trainer knows (entropy, KL, clipping, loss, grad norm, timings). verl's dumps hold decoded text
only: response tokens are re-counted with the policy's tokenizer, prompt tokens are the matched rows'
rendered prompts, and ``mean_logprob`` is NaN (verl does not dump log-probs). Columns verl cannot give
are NaN (``generated_tokens``/``trained_tokens`` too when dynamic sampling evicted groups: verl dumps
only the kept samples).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from evotrainer.backends.local.grpo import TRAIN_LOG_COLUMNS
from evotrainer.contracts.task import Task
from evotrainer.policy.chat import prompt_token_ids
from evotrainer.scoring import Verdicts, verify
from evotrainer.scoring.evidence import evidence_frame

# train_log column -> verl metric names, first present wins
FROM_METRICS = {
    "entropy": ("actor/entropy", "actor/entropy_loss"),
    "kl": ("actor/kl_loss", "kl_loss"),
    "clip_frac": ("actor/pg_clipfrac",),
    "loss": ("actor/pg_loss",),
    "grad_norm": ("actor/grad_norm",),
    "sample_time_s": ("timing_s/gen",),
}
# used only when a step's sample dump is missing
FALLBACK_METRICS = {
    "reward_mean": ("critic/score/mean",),
    "response_len_mean": ("response_length/mean",),
    "truncation_rate": ("response_length/clip_ratio",),
}
EVICTED = "training/filter_groups/evicted_samples"
DUMP_FIELDS = {"input", "output", "gts", "score", "step", "uid", "reward"}


class VerlOutputError(ValueError):
    pass


def read_metrics(path: str | Path) -> dict[int, dict[str, Any]]:
    """verl's file-logger jsonl -> {step: metrics}; later lines of a step update earlier ones."""
    steps: dict[int, dict[str, Any]] = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step, data = int(record["step"]), record["data"]
        except (ValueError, KeyError, TypeError) as err:
            raise VerlOutputError(f"{path}:{number}: not a verl file-logger line ({err}): {line[:120]!r}") from err
        steps.setdefault(step, {}).update(data)
    return steps


def read_generations(path: str | Path) -> pd.DataFrame:
    frame = pd.read_json(path, lines=True, dtype=False)
    missing = [c for c in ("input", "output", "gts", "score", "step", "uid") if c not in frame.columns]
    if missing:
        raise VerlOutputError(f"{path}: verl generation dump lacks {missing}")
    parts = frame["uid"].astype(str).str.rsplit("_", n=2, expand=True)
    frame["group"] = parts[0]
    frame["sample_idx"] = pd.to_numeric(parts[1], errors="coerce").fillna(0).astype(np.int64) if parts.shape[1] > 1 else 0
    return frame


def _token_counts(outputs: pd.Series, max_response_len: int, tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Response tokens as the local sampler counts them (eos included) and the truncation flag."""
    text_tokens = np.array([len(tokenizer.encode(str(o), add_special_tokens=False)) for o in outputs], dtype=np.int64)
    truncated = text_tokens >= max_response_len
    return np.where(truncated, text_tokens, text_tokens + 1), truncated


def _first(metrics: dict[str, Any], names: tuple[str, ...]) -> float:
    for name in names:
        if name in metrics and metrics[name] is not None:
            return float(metrics[name])
    return float("nan")


class PromptIndex:
    """The split rows by (prompt as verl decodes it, ground truth); ``prompt_tokens`` per row."""

    def __init__(self, prompts: pd.DataFrame, tokenizer):
        self.rows = prompts.reset_index(drop=True)
        ids = prompt_token_ids(tokenizer, self.rows["prompt"])
        self.prompt_tokens = np.array([len(x) for x in ids], dtype=np.int64)
        self.positions: dict[tuple[str, str], int] = {}
        for position, (row_ids, truth) in enumerate(zip(ids, self.rows["ground_truth"], strict=True)):
            text = tokenizer.decode(row_ids, skip_special_tokens=True).strip()
            self.positions.setdefault((text, str(truth)), position)

    def match(self, gen: pd.DataFrame, where: str, split: str) -> np.ndarray:
        """Row positions of a dump's samples; VerlOutputError when a prompt matches no row."""
        found = [self.positions.get((str(i).strip(), str(t)), -1) for i, t in zip(gen["input"], gen["gts"], strict=True)]
        unmatched = sum(f < 0 for f in found)
        if unmatched:
            raise VerlOutputError(f"{where}: {unmatched} of {len(gen)} prompts match no row of the {split} split; "
                                  "was the run given this split's verl parquet?")
        return np.array(found, dtype=np.int64)


def _verdicts(task: Task, gen: pd.DataFrame, matched: pd.DataFrame) -> Verdicts | None:
    """The task's verdicts on the dumped responses; None for a multi-turn task, whose dump holds the decoded
    transcript but not the episode record its ``verify`` replays (the val/test episodes, played by the
    trusted evaluator, carry its verdicts: a train log's accuracy is then NaN, never a false 0)."""
    if getattr(task, "multi_turn", False):
        return None
    return verify(task, gen["output"].astype(str).tolist(), matched)


def train_log(metrics_path: str | Path, generations_dir: str | Path | None, *, prompts: pd.DataFrame, task: Task,
              tokenizer, group_size: int, max_response_len: int, ppo_epochs: int = 1) -> pd.DataFrame:
    """One row per verl step, in the local trainer's train_log columns (steps renumbered from 0).
    ``prompts``: the training rows verl was given (its dumped prompts are matched back to them)."""
    metrics = read_metrics(metrics_path)
    steps = sorted(s for s, m in metrics.items() if any(k.startswith(("actor/", "critic/", "timing_s/")) for k in m))
    if not steps:
        raise VerlOutputError(f"{metrics_path}: no training steps logged")
    index = PromptIndex(prompts, tokenizer)
    rows, wall = [], 0.0
    for step in steps:
        m = metrics[step]
        wall += _first(m, ("timing_s/step",)) if "timing_s/step" in m else 0.0
        row: dict[str, Any] = {"step": step - 1, "wall_time_s": wall}
        row |= {column: _first(m, names) for column, names in FROM_METRICS.items()}
        dump = Path(generations_dir) / f"{step}.jsonl" if generations_dir else None
        if dump is not None and dump.exists():
            row |= _dump_stats(read_generations(dump), index, task, str(dump), group_size=group_size,
                               evicted_groups=int(_first(m, (EVICTED,)) // group_size) if EVICTED in m else 0,
                               max_response_len=max_response_len, ppo_epochs=ppo_epochs, tokenizer=tokenizer)
        else:
            row |= {column: _first(m, names) for column, names in FALLBACK_METRICS.items()}
        rows.append(row)
    return pd.DataFrame(rows, columns=TRAIN_LOG_COLUMNS).astype(float).astype({"step": np.int64})


def _dump_stats(gen: pd.DataFrame, index: PromptIndex, task: Task, where: str, *, group_size: int, evicted_groups: int,
                max_response_len: int, ppo_epochs: int, tokenizer) -> dict[str, float]:
    positions = index.match(gen, where, "train")
    verdicts = _verdicts(task, gen, index.rows.iloc[positions])
    scores = gen["score"].astype(float)
    tokens, truncated = _token_counts(gen["output"], max_response_len, tokenizer)
    spread = gen.groupby("group")["score"].std(ddof=0).fillna(0.0)
    kept = len(spread)
    generated = float(tokens.sum()) if evicted_groups == 0 else float("nan")  # evicted samples are not dumped
    return {
        "reward_mean": float(scores.mean()),
        "reward_std": float(scores.std(ddof=0)),
        "accuracy": float(verdicts.correct.mean()) if verdicts else float("nan"),
        "dead_group_ratio": (int((spread <= 1e-6).sum()) + evicted_groups) / max(kept + evicted_groups, 1),
        "response_len_mean": float(tokens.mean()),
        "truncation_rate": float(truncated.mean()),
        "format_ok_rate": float(verdicts.format_ok.mean()) if verdicts else float("nan"),
        "kept_groups": kept,
        "sampled_groups": kept + evicted_groups,
        "samples_generated": len(gen) + evicted_groups * group_size,
        "generated_tokens": generated,
        "prompt_tokens": float(index.prompt_tokens[positions].sum()) if evicted_groups == 0 else float("nan"),
        "trained_tokens": float(tokens.sum()) * ppo_epochs,
    }


def evidence_rows(dump_path: str | Path, prompts: pd.DataFrame, *, task: Task, run: str, generation: int, split: str,
                  max_response_len: int, tokenizer, policy_id: str, harness_id: str, seed: int,
                  step: int | None = None) -> pd.DataFrame:
    """A verl generation dump -> evidence rows (evotrainer.contracts.evidence), matched back to the split's
    prompts and built by the one evidence builder (evotrainer.scoring.evidence.evidence_frame)."""
    gen = read_generations(dump_path)
    index = PromptIndex(prompts, tokenizer)
    repeated = index.rows.iloc[index.match(gen, str(dump_path), split)].reset_index(drop=True)
    tokens, truncated = _token_counts(gen["output"], max_response_len, tokenizer)
    components = {}
    for key in gen.columns:
        if key in DUMP_FIELDS or key in ("group", "sample_idx"):
            continue
        values = pd.to_numeric(gen[key], errors="coerce")
        if values.notna().all():  # reward components are numbers; anything else is not evidence
            components[key] = values.astype(float).to_numpy()
    return evidence_frame(
        repeated, gen["output"].astype(str).tolist(),
        (gen["reward"] if "reward" in gen.columns else gen["score"]).astype(float).to_numpy(), components,
        verify(task, gen["output"].astype(str).tolist(), repeated), sample_idx=gen["sample_idx"].to_numpy(np.int64), response_tokens=tokens,
        finished=~truncated, mean_logprob=np.full(len(gen), np.nan), entropy=None, run=run, generation=generation,
        split=split, step=int(gen["step"].iloc[0]) if step is None and len(gen) else int(step or 0),
        policy_id=policy_id, harness_id=harness_id, seed=seed)
