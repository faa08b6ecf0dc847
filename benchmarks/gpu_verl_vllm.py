"""The steps of benchmarks/gpu_verl_vllm.sh that run Python, one subcommand each; each prints one JSON line.

    python benchmarks/gpu_verl_vllm.py imports MANIFEST     # the machine's versions, then the pack's project modules
    python benchmarks/gpu_verl_vllm.py model DIR            # a Qwen2 chat model built in code, saved as an HF folder
    python benchmarks/gpu_verl_vllm.py engine DIR           # (a) vLLM's offline engine on it: tokens/s
    python benchmarks/gpu_verl_vllm.py rollout DIR WORK     # (b) the project's rollout=vllm player on it
    python benchmarks/gpu_verl_vllm.py verl DIR WORK        # (c) one verl main_ppo GRPO step through trainer=verl

(b) and (c) call the project's own code as the workflow does: the rollout stage's player (backends.rollouts.sampler
with the sandboxed harness reward) and the backtest's verl trainer (backends.trainer("verl") = verl.launch.train:
data export, overrides, preflight, main_ppo, checkpoint merge, train log), on the default arithmetic task and the
default harness. The single-GPU settings verl needs on this machine go through ``trainer.verl.overrides``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# verl on one GPU without flash-attn: async vLLM rollout, eager (no CUDA graphs to capture), sdpa attention, no
# remove-padding (it needs flash-attn), no Ray dashboard (its web client is not in the pack)
SINGLE_GPU_VERL = [
    "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.enforce_eager=True",
    "actor_rollout_ref.model.use_remove_padding=False",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "+ray_kwargs.ray_init.include_dashboard=False",
]
RECIPE_STEPS = 1


def machine_packages(provided: dict[str, dict]) -> dict:
    """The distributions the pack left to the machine (the manifest's ``machine.provided``, scripts/gpu_machine.py):
    each one's version here must meet what the pack's set asks of it (``requires``; for most the machine's version
    was unknown where the pack was built), and its own requirements must hold among what is importable here, the
    pack first. Returns what does not hold."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    missing, fails, unmet = [], {}, {}
    for name, entry in sorted(provided.items()):
        here = version(name)
        if here is None:
            missing.append(name)
            continue
        if not SpecifierSet(entry["requires"]).contains(here, prereleases=True):
            fails[name] = f"{here}, the pack's set asks {entry['requires']} ({', '.join(entry['by'])})"
        for line in metadata.requires(name) or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            got = version(req.name)
            if got is None or not req.specifier.contains(got, prereleases=True):
                unmet.setdefault(name, []).append(f"{req.name}{req.specifier} (here {got})")
    return {"checked": len(provided), "missing": missing, "version_fails": fails, "requirements_unmet": unmet}


def imports(manifest: str) -> dict:
    """First the distributions the pack left to the machine (``machine_packages``); then the project modules the
    pack's manifest names (``project_modules``: the sampler, the verl trainer, snakemake's CLI, the stages), then
    vLLM and verl themselves, each imported here: on the GPU machine the compiled cp312 wheels that the CPU check
    could not load do load. Which failed, with the error."""
    import importlib

    data = json.loads(Path(manifest).read_text())
    provided = dict(data.get("machine", {}).get("provided", {}))
    if data.get("machine_torch"):  # torch too: its own requirements must hold with the pack's copies in front
        provided.setdefault("torch", {"requires": f"=={data['machine_torch']}", "by": ["vllm"]})
    machine = machine_packages(provided)
    names = [*data.get("project_modules", []), "vllm", "verl", "verl.trainer.main_ppo"]
    failed = {}
    began = time.monotonic()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 (reported, the next one still tried)
            failed[name] = f"{type(err).__name__}: {err}"[:300]
    return {"step": "imports", "modules": len(names), "ok": len(names) - len(failed), "failed": failed,
            "machine_packages": machine, "seconds": round(time.monotonic() - began, 1)}


def model(folder: str) -> dict:
    """A random-init Qwen2 (hidden 256, 4 heads of 64: vLLM's default attention backends take head size 64) with
    the ChatML template on its tokenizer."""
    from evotrainer.policy.qwen2_tiny import build_model, build_tokenizer
    from evotrainer.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask()
    texts = [str(p) + " " + str(a) for p, a in zip(*_prompts_and_answers(task), strict=True)]
    tokenizer = build_tokenizer(texts, vocab_size=512)
    net = build_model(tokenizer, hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024,
                      max_positions=2048, seed=0)
    net.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {"step": "model", "params": sum(p.numel() for p in net.parameters()), "path": folder,
            "chat_template": bool(tokenizer.chat_template)}


def _prompts_and_answers(task):
    frame = task.splits({"train": 400}, seed=1)["train"]
    return frame["prompt"].astype(str).tolist(), frame["ground_truth"].astype(str).tolist()


def engine(folder: str, prompts: int = 256, max_tokens: int = 128) -> dict:
    """vLLM's offline engine alone: ``prompts`` chat prompts, ``max_tokens`` each, ignoring eos; tokens/s."""
    import torch
    import vllm
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    started = time.monotonic()
    llm = vllm.LLM(model=folder, seed=0, gpu_memory_utilization=0.3, enforce_eager=True, dtype="bfloat16")
    load_s = time.monotonic() - started
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": f"{i} + {i} = ?"}], tokenize=False,
                                           add_generation_prompt=True) for i in range(prompts)]
    params = vllm.SamplingParams(n=1, temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=0)
    llm.generate(chats[:8], params, use_tqdm=False)  # warm-up
    began = time.monotonic()
    outputs = llm.generate(chats, params, use_tqdm=False)
    seconds = time.monotonic() - began
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"step": "engine", "vllm": vllm.__version__, "torch": torch.__version__, "prompts": prompts,
            "generated_tokens": tokens, "generate_s": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1),
            "engine_start_s": round(load_s, 1)}


def _config(folder: str, work: Path, extra: list[str]):
    from evotrainer.config import compose, to_yaml

    cfg = compose(["trainer=verl", "rollout=vllm", "policy=hf", f"policy.path={folder}", "trainer.device=cuda",
                   "sandbox.isolation=process", "rollout.gpu_memory_utilization=0.3", *extra])
    path = work / "config.yaml"
    path.write_text(to_yaml(cfg))
    return path


def rollout(folder: str, work_dir: str) -> dict:
    """The rollout stage's player (rollout.name=vllm) on the probe prompts, scored by the sandboxed default
    harness reward, as stages/rollout.py plays it."""
    from evotrainer.backends import rollouts
    from evotrainer.contracts.harness import DEFAULT_HARNESS, harness_id, load_recipe
    from evotrainer.sandbox.harness_code import harness_reward
    from evotrainer.stages.common import config, task_of

    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    cfg = config(_config(folder, work, []))
    task = task_of(cfg)
    prompts = task.splits({"probe": 64}, seed=3)["probe"]
    recipe = load_recipe(DEFAULT_HARNESS)
    began = time.monotonic()
    with harness_reward(str(DEFAULT_HARNESS), cfg.sandbox) as reward:
        player = rollouts.sampler(rollouts.Setting(cfg, task, Path(DEFAULT_HARNESS), reward, 1), folder)
        played = player.sample(prompts, group_size=recipe["group_size"], sampling_seed=0,
                               harness_id=harness_id(DEFAULT_HARNESS), run="gpu-check", generation=0, split="probe",
                               step=0, policy_id="qwen2-random", seed=0)
    frame = played.frame
    frame.to_parquet(work / "rollouts.parquet")
    return {"step": "rollout", "rows": len(frame), "prompts": len(prompts), "group_size": recipe["group_size"],
            "response_tokens": int(frame["response_tokens"].sum()), "reward_mean": float(frame["reward"].mean()),
            "seconds": round(time.monotonic() - began, 1)}


def verl(folder: str, work_dir: str) -> dict:
    """One GRPO step of verl's main_ppo through the project's verl trainer (backends.trainer("verl")), whose reward
    workers run the reward adapter with its own sandboxed worker on the default harness."""
    import numpy as np

    from evotrainer import backends
    from evotrainer.backends import TrainJob
    from evotrainer.contracts.harness import DEFAULT_HARNESS
    from evotrainer.stages.common import config, task_of

    work = Path(work_dir)
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    overrides = "[" + ",".join(f"'{o}'" for o in SINGLE_GPU_VERL) + "]"
    # each verl command's own deadline ends inside the step's (STEP_LIMIT_S, set by the shell script), so the
    # trainer's supervisor, not the step's `timeout`, stops main_ppo and its Ray workers
    timeout_s = max(60, int(os.environ.get("STEP_LIMIT_S", "420")) - 25)
    conf = _config(folder, work, ["trainer.verl.n_gpus_per_node=1", "trainer.verl.nnodes=1",
                                  "trainer.verl.gpu_memory_utilization=0.3", f"trainer.verl.timeout_s={timeout_s}",
                                  f"trainer.verl.overrides={overrides}"])
    cfg = config(conf)
    task = task_of(cfg)
    splits = task.splits({"train": 256, "val": 32}, seed=5)
    for split, frame in splits.items():
        frame.to_parquet(data / f"{split}.parquet")
    job = TrainJob(config=str(conf), parent_policy=folder, harness=str(DEFAULT_HARNESS), data_dir=str(data),
                   evidence=None, out=str(work / "out"), generation=0, steps=RECIPE_STEPS, restarts=1)
    began = time.monotonic()
    log = backends.trainer("verl")(job, reward=None, task=task, weights=np.ones(len(splits["train"])), cfg=cfg)
    row = log.iloc[-1].to_dict()
    return {"step": "verl", "steps": len(log), "seconds": round(time.monotonic() - began, 1),
            "policy_saved": (work / "out" / "policy" / "config.json").exists(),
            "last_step": {k: (float(v) if isinstance(v, int | float) else str(v)) for k, v in row.items()}}


def main(argv: list[str]) -> int:
    commands = {"imports": imports, "model": model, "engine": engine, "rollout": rollout, "verl": verl}
    if not argv or argv[0] not in commands:
        print(f"usage: gpu_verl_vllm.py {{{'|'.join(commands)}}} DIR [WORK]", file=sys.stderr)
        return 2
    print(json.dumps(commands[argv[0]](*argv[1:]), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
