"""verl's outputs -> our artifacts: train_log.parquet rows and evidence rows.

A verl run (as the backend launches it) leaves three things behind:
- ``metrics.jsonl`` from verl's ``file`` logger: one line per step, ``{"step": s, "data": {name: value}}``
  (names such as ``actor/entropy``, ``actor/pg_clipfrac``, ``critic/score/mean``, ``timing_s/gen``);
- ``train_generations/<step>.jsonl`` (``trainer.rollout_data_dir``): every training sample of a step,
  ``{input, output, gts, score, step, uid}`` with uid = ``<prompt uuid>_<sample>_<turn>``;
- ``val_generations/<step>.jsonl`` (``trainer.validation_data_dir``): the same for the validation
  pass, plus the reward's components (the harness reward's dict keys) and ``reward``.

The per-sample dumps give what the local trainer logs (accuracy by the task verifier, dead groups,
lengths, truncation); the metrics give what only the trainer knows (entropy, KL, clipping, loss,
grad norm, timings). verl's dumps hold decoded text only: token counts are re-counted with the
policy's tokenizer and ``mean_logprob`` is NaN (verl does not dump log-probs).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from evotrainer.contracts.evidence import COMPONENT_PREFIX
from evotrainer.tasks.arithmetic import is_correct, parse_answer

TRAIN_LOG_COLUMNS = [
    "step", "reward_mean", "reward_std", "accuracy", "dead_group_ratio", "entropy", "kl", "clip_frac",
    "loss", "grad_norm", "response_len_mean", "truncation_rate", "format_ok_rate", "kept_groups",
    "sampled_groups", "samples_generated", "sample_time_s", "wall_time_s",
]  # the local trainer's columns (evotrainer.backends.local.grpo.TRAIN_LOG_COLUMNS), asserted equal in the tests

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


def train_log(metrics_path: str | Path, generations_dir: str | Path | None, *, group_size: int, max_response_len: int,
              tokenizer) -> pd.DataFrame:
    """One row per verl step, in the local trainer's train_log columns (steps renumbered from 0)."""
    metrics = read_metrics(metrics_path)
    steps = sorted(s for s, m in metrics.items() if any(k.startswith(("actor/", "critic/", "timing_s/")) for k in m))
    if not steps:
        raise VerlOutputError(f"{metrics_path}: no training steps logged")
    rows, wall = [], 0.0
    for step in steps:
        m = metrics[step]
        wall += _first(m, ("timing_s/step",)) if "timing_s/step" in m else 0.0
        row: dict[str, Any] = {"step": step - 1, "wall_time_s": wall}
        row |= {column: _first(m, names) for column, names in FROM_METRICS.items()}
        dump = Path(generations_dir) / f"{step}.jsonl" if generations_dir else None
        evicted_groups = int(_first(m, (EVICTED,)) // group_size) if EVICTED in m else 0
        if dump is not None and dump.exists():
            gen = read_generations(dump)
            scores = gen["score"].astype(float)
            tokens, truncated = _token_counts(gen["output"], max_response_len, tokenizer)
            spread = gen.groupby("group")["score"].std(ddof=0).fillna(0.0)
            kept = len(spread)
            row |= {
                "reward_mean": float(scores.mean()),
                "reward_std": float(scores.std(ddof=0)),
                "accuracy": float(np.mean([is_correct(str(o), str(t)) for o, t in zip(gen["output"], gen["gts"], strict=True)])),
                "dead_group_ratio": (int((spread <= 1e-6).sum()) + evicted_groups) / max(kept + evicted_groups, 1),
                "response_len_mean": float(tokens.mean()),
                "truncation_rate": float(truncated.mean()),
                "format_ok_rate": float(np.mean([parse_answer(str(o)) is not None for o in gen["output"]])),
                "kept_groups": kept,
                "sampled_groups": kept + evicted_groups,
                "samples_generated": len(gen) + evicted_groups * group_size,
            }
        else:
            row |= {column: _first(m, names) for column, names in FALLBACK_METRICS.items()}
            row |= {"reward_std": float("nan"), "accuracy": float("nan"), "dead_group_ratio": float("nan"),
                    "format_ok_rate": float("nan"), "kept_groups": -1, "sampled_groups": -1, "samples_generated": -1}
        rows.append(row)
    return pd.DataFrame(rows, columns=TRAIN_LOG_COLUMNS)


def _prompt_index(prompts: pd.DataFrame) -> dict[str, dict[str, Any]]:
    return {str(row.prompt): row._asdict() for row in prompts.itertuples(index=False)}


def _match(text: str, truth: str, index: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The split row a decoded verl prompt came from: exact text, else the longest prompt it contains
    (a chat template wraps the text) with the same ground truth."""
    row = index.get(text) or index.get(text.strip())
    if row is not None:
        return row
    hits = [r for p, r in index.items() if p in text and str(r["ground_truth"]) == truth]
    return max(hits, key=lambda r: len(str(r["prompt"])), default=None)


def evidence_rows(dump_path: str | Path, prompts: pd.DataFrame, *, run: str, generation: int, split: str,
                  max_response_len: int, tokenizer, policy_id: str, harness_id: str, seed: int,
                  step: int | None = None) -> pd.DataFrame:
    """A verl generation dump -> evidence rows (evotrainer.contracts.evidence), matched back to the split's prompts."""
    gen = read_generations(dump_path)
    index = _prompt_index(prompts)
    matched = [_match(str(i), str(t), index) for i, t in zip(gen["input"], gen["gts"], strict=True)]
    unmatched = sum(m is None for m in matched)
    if unmatched:
        raise VerlOutputError(f"{dump_path}: {unmatched} of {len(gen)} prompts match no row of the {split} split; "
                              "was the run given this split's verl parquet?")
    tokens, truncated = _token_counts(gen["output"], max_response_len, tokenizer)
    responses = gen["output"].astype(str)
    truth = gen["gts"].astype(str)
    step_value = int(gen["step"].iloc[0]) if step is None and len(gen) else int(step or 0)
    frame = pd.DataFrame({
        "run": run,
        "generation": generation,
        "split": split,
        "step": step_value,
        "prompt_id": [str(m["prompt_id"]) for m in matched],
        "group_id": [f"{split}:{step_value}:{g}" for g in gen["group"]],
        "sample_idx": gen["sample_idx"].to_numpy(np.int64),
        "data_source": [str(m["data_source"]) for m in matched],
        "prompt": [str(m["prompt"]) for m in matched],
        "response": responses,
        "ground_truth": truth,
        "reward": (gen["reward"] if "reward" in gen.columns else gen["score"]).astype(float).to_numpy(),
        "correct": np.array([is_correct(r, t) for r, t in zip(responses, truth, strict=True)], dtype=bool),
        "response_tokens": tokens,
        "truncated": truncated,
        "finish_reason": np.where(truncated, "length", "eos"),
        "mean_logprob": np.nan,  # verl's dumps carry no log-probs
        "policy_id": policy_id,
        "harness_id": harness_id,
        "seed": seed,
        "wall_time": time.time(),
        "format_ok": np.array([parse_answer(r) is not None for r in responses], dtype=bool),
    })
    if all("level" in m for m in matched):
        frame["difficulty"] = np.array([int(m["level"]) for m in matched], dtype=np.int64)
    for key in gen.columns:
        if key in DUMP_FIELDS or key in ("group", "sample_idx"):
            continue
        values = pd.to_numeric(gen[key], errors="coerce")
        if values.notna().all():  # reward components are numbers; anything else is not evidence
            frame[f"{COMPONENT_PREFIX}{key}"] = values.astype(float).to_numpy()
    return frame
