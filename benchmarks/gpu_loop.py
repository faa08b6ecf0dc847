"""The default loop's pieces (rollout sampling and local GRPO training) on CUDA when present, with a larger
tiny model: rollout tokens/s and train steps/s, per precision. Prints JSON.

    .venv/bin/python benchmarks/gpu_loop.py                      # cuda if available, else cpu
    .venv/bin/python benchmarks/gpu_loop.py --device cpu --preset cpu-small --steps 3
    .venv/bin/python benchmarks/gpu_loop.py --arch qwen2                      # the hf policy's Qwen2 architecture

Rollout: one `sample_and_score` call over prompts x group_size completions of the arithmetic task (chat prompts
from ArithmeticTask.splits; the task verifies, the default harness reward scores in process through
InProcessReward, no sandbox), median of --repeats timed calls after a warm-up; tokens = generated response tokens.
Train: `evotrainer.backends.local.grpo.train` for --steps steps (sampling + scoring + update, the backtest's
training work, same in-process reward) after a 1-step warm-up.
The model is untrained (random init): throughput does not depend on what it has learned. ``--arch qwen2``: the
Qwen2 chat model ``policy=hf`` builds in code (evotrainer.policy.qwen2_tiny: a byte-level BPE tokenizer trained on
the task's texts, ChatML template, grouped-query attention) at the preset's sizes instead of the tiny GPT-style one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from evotrainer import runtime
from evotrainer.backends.local.grpo import train
from evotrainer.backends.local.rollouts import sample_and_score
from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module, load_recipe
from evotrainer.policy.tiny import build_model, build_tokenizer, param_count
from evotrainer.scoring import InProcessReward
from evotrainer.tasks.arithmetic import ArithmeticTask, Level

# hidden, layers, heads, intermediate, max positions
PRESETS = {"cpu-small": (64, 2, 4, 256, 64), "gpu-medium": (512, 8, 8, 2048, 64), "gpu-large": (1024, 12, 16, 4096, 64)}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--preset", default=None, choices=sorted(PRESETS), help="default: gpu-medium on cuda, cpu-small on cpu")
    parser.add_argument("--precisions", nargs="+", default=None, help="default: fp32 bf16 on cuda, fp32 on cpu")
    parser.add_argument("--prompts", type=int, default=256, help="prompts per rollout call / per train step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--arch", default="tiny", choices=["tiny", "qwen2"])
    a = parser.parse_args()

    device = runtime.setup_torch(a.threads, a.device)
    preset = a.preset or ("gpu-medium" if device == "cuda" else "cpu-small")
    precisions = a.precisions or (["fp32", "bf16"] if device == "cuda" else ["fp32"])
    hidden, layers, heads, inter, positions = PRESETS[preset]
    task = ArithmeticTask(ops="+-", levels=[Level(2, 99, 0.5), Level(3, 99, 0.5)])
    splits = task.splits({"train": 4000, "val": 10, "test": 10, "probe": a.prompts}, seed=0)
    if a.arch == "qwen2":
        from evotrainer.policy import qwen2_tiny

        tok = qwen2_tiny.build_tokenizer(qwen2_tiny.training_texts(splits["train"]["prompt"], splits["train"]["ground_truth"]))

        def make(seed: int):
            return qwen2_tiny.build_model(tok, hidden, layers, heads, inter, max(positions, 256), seed=seed)
    else:
        tok = build_tokenizer()

        def make(seed: int):
            return build_model(tok, hidden, layers, heads, inter, positions, seed=seed)
    recipe = load_recipe(DEFAULT_HARNESS) | {"prompts_per_step": a.prompts, "group_size": a.group_size}
    reward = InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score)
    result = {"device": device, "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None, "preset": preset,
              "arch": a.arch,
              "prompts": a.prompts, "group_size": a.group_size, "max_response_len": recipe["max_response_len"],
              "torch": torch.__version__, "threads": a.threads, "runs": []}
    for precision in precisions:
        model = make(0).to(device).eval()
        result["params"] = param_count(model)
        generator = torch.Generator(device=device).manual_seed(0)

        def rollout(model=model, generator=generator, precision=precision):
            with runtime.autocast(device, precision):
                _, batch = sample_and_score(model, tok, splits["probe"], group_size=a.group_size, recipe=recipe,
                                            reward=reward, task=task, generator=generator)
            _sync(device)
            return int(batch.samples.response_mask.sum())

        rollout()
        times, tokens = [], 0
        for _ in range(a.repeats):
            start = time.perf_counter()
            tokens = rollout()
            times.append(time.perf_counter() - start)
        rollout_s = statistics.median(times)
        train(model, tok, recipe, splits["train"], reward, task=task, steps=1, seed=0, show_progress=False,
              precision=precision)
        _sync(device)
        start = time.perf_counter()
        log = train(model, tok, recipe, splits["train"], reward, task=task, steps=a.steps, seed=1, show_progress=False,
                    precision=precision)
        _sync(device)
        train_s = time.perf_counter() - start
        result["runs"].append({
            "precision": precision,
            "rollout_completions": a.prompts * a.group_size,
            "rollout_tokens": tokens,
            "rollout_s": round(rollout_s, 4),
            "rollout_tokens_per_s": round(tokens / rollout_s, 1),
            "train_steps": a.steps,
            "train_s": round(train_s, 3),
            "train_steps_per_s": round(a.steps / train_s, 3),
            "train_samples_per_s": round(float(log["samples_generated"].sum()) / train_s, 1),
            "weights_dtype": str(next(model.parameters()).dtype),
            "final_loss_finite": bool(torch.isfinite(torch.tensor(log["loss"].to_numpy())).all()),
            "peak_gpu_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None,
        })
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
