"""Rollout tokens/s of the hand-written KV-cached sampler vs `model.generate`, same model, same batch.

Both generate exactly batch x new_tokens tokens (eos is disabled) with greedy decoding on arithmetic
prompts (chat messages from ArithmeticTask.splits, rendered with the tokenizer's chat template by
encode_prompts); the figure is the median of `--repeats` timed runs after one warm-up. Prints JSON.

    .venv/bin/python benchmarks/sampler_throughput.py [--threads 2] [--batches 64 128 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial

import torch

from evotrainer.backends.local.sampler import encode_prompts, sample
from evotrainer.policy.chat import pad_token_id
from evotrainer.policy.tiny import build_model, build_tokenizer, param_count
from evotrainer.tasks.arithmetic import ArithmeticTask, Level

SIZES = {"tiny-default": (64, 2, 4, 256), "tiny-x4": (128, 4, 4, 512), "small": (256, 4, 8, 1024)}


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = build_tokenizer()
    task = ArithmeticTask(ops="+-", levels=[Level(2, 99, 0.5), Level(3, 99, 0.5)])
    prompts = task.splits({"val": max(args.batches)}, seed=0)["val"]
    pad = pad_token_id(tok)
    rows = []
    for name, (hidden, layers, heads, inter) in SIZES.items():
        model = build_model(tok, hidden, layers, heads, inter).eval()
        model.generation_config.eos_token_id = None
        for batch in args.batches:
            ids, mask = encode_prompts(tok, prompts["prompt"].tolist()[:batch])
            ours = timed(partial(sample, model, ids, mask, max_new_tokens=args.new_tokens, eos_id=[-1],  # no eos
                                 pad_id=pad, greedy=True), args.repeats)
            with torch.no_grad():
                ref = timed(partial(model.generate, input_ids=ids, attention_mask=mask, do_sample=False,
                                    max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                    pad_token_id=pad), args.repeats)
            tokens = batch * args.new_tokens
            rows.append({"model": name, "params": param_count(model), "batch": batch,
                         "sampler_tokens_per_s": round(tokens / ours), "generate_tokens_per_s": round(tokens / ref),
                         "speedup": round(ref / ours, 2)})
    print(json.dumps({"benchmark": "sampler_throughput", "threads": args.threads, "new_tokens": args.new_tokens,
                      "torch": torch.__version__, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
