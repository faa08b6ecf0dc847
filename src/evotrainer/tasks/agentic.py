"""``task=agentic``: rollouts are whole episodes in a multi-turn environment (``task.env``, default
``mini_swe``; any name of ``evotrainer.envs``).

Rows are environment instances. Each split draws instance seeds from its own seeded stream and keeps
those whose instance fingerprint (mini_swe: a hash of the generated repository; other environments:
the first observation) falls in the split's partition (``tasks.partition``), so the test instances
share no repository with train / val / probe and can be made alone, after the loop. A row's
``prompt`` is the environment's system prompt and first observation as chat messages (what the
rollout shows the policy); ``ground_truth`` is JSON ``{"env", "seed", "options"}``; ``metadata``
holds env, seed, env_options and instance fields (difficulty, bug_kind, template).

``verify(response, ground_truth)``: ``response`` is the EPISODE RECORD as JSON (at least
``{"actions": [the model's turns as text]}``; ``multiturn.Episode.record()`` writes it). The verdict
does not trust the record's claimed reward: it replays the actions in a fresh environment built from
the ground truth (test runs skipped, edits applied) and the hidden tests run on submit in the sandbox.
``correct`` = the replay's submit passed the hidden tests. ``details`` (evidence ``task_fields``):
turns, tool_calls, invalid_actions, termination, submitted, edits, test_runs, edits_without_tests,
premature_submit, repeated_action_max, hidden_tests_passed, and the instance fields.
``failure_category``: no_episode_record, invalid_action, max_turns, timeout, context_limit,
not_submitted, tests_failed.
"""

from __future__ import annotations

import functools
import json
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from evotrainer import envs
from evotrainer.contracts.config_fields import satisfies
from evotrainer.contracts.task import Task, TaskError, Verification
from evotrainer.envs.base import InvalidAction, parse_action
from evotrainer.tasks.partition import PARTITION_OF_SPLIT, check_sizes, partition_of

HARNESS = Path(__file__).parent / "harnesses" / "agentic"
DATA_SOURCE = "agentic"
REPLAY_LIMITS = {"episode_timeout_s": 3600.0}
INSTANCE_FIELDS = ("difficulty", "bug_kind", "template")


def _installed_env(name: str) -> bool:
    return name in envs.names()


@dataclass
class AgenticConfig:
    """``task.env``, ``task.env_options``, ``task.difficulties`` (conf/task/agentic.yaml)."""

    env: str = satisfies("mini_swe", test=_installed_env, allowed="an installed environment (`evotrainer list`)")
    env_options: dict[str, Any] = field(default_factory=dict)  # options of the environment
    difficulties: list[int] = field(default_factory=list)  # difficulty of each instance, drawn uniformly; empty = env_options'


class AgenticTask(Task):
    """Multi-turn episodes in an environment (mini_swe: fix one bug in a generated Python repo)."""

    name = "agentic"
    description = "multi-turn episodes in an environment (default mini_swe: fix a bug, hidden tests decide)"
    max_response_len = 64  # tokens per model turn
    # rollouts are episodes (backends/local/multiturn), not single responses; the built-in environments
    # (mini_swe, swe_local) run the edited programs' tests in the sandbox, and verify replays them
    supports = frozenset({"multi_turn", "code_execution"})
    Config = AgenticConfig

    def __init__(self, env: str = "mini_swe", env_options: dict | None = None, difficulties: list[int] | None = None):
        self.env = env
        self.env_options = dict(env_options or {})
        self.difficulties = [int(d) for d in (difficulties or [self.env_options.get("difficulty", 0)])]
        try:
            envs.resolve(env)
        except envs.EnvError as err:
            raise TaskError(f"task.env: {err}") from err

    # --- data -----------------------------------------------------------------------------------
    def _options(self, difficulty: int) -> dict:
        return {**self.env_options, "difficulty": difficulty} if self.env == "mini_swe" else dict(self.env_options)

    def splits(self, sizes: dict[str, int], seed: int) -> dict[str, pd.DataFrame]:
        check_sizes(sizes)
        out = {}
        probe = envs.make(self.env, **self.env_options)
        try:
            for split, size in sizes.items():
                out[split] = self._split(probe, split, int(size), seed)
        finally:
            probe.close()
        return out

    def _split(self, env, split: str, size: int, seed: int) -> pd.DataFrame:
        rng = random.Random(f"{seed}:{split}")
        rows, seen = [], set()
        partition = PARTITION_OF_SPLIT[split]
        for _attempt in range(200 * max(size, 1)):
            if len(rows) >= size:
                break
            instance_seed, difficulty = rng.randrange(2**31), rng.choice(self.difficulties)
            options = self._options(difficulty)
            observation, info = env.preview(instance_seed, options)
            key = info.get("fingerprint") or observation
            if key in seen or partition_of(key, seed) != partition:
                continue
            seen.add(key)
            fields = {k: info[k] for k in INSTANCE_FIELDS if k in info and k != "difficulty"}
            rows.append({
                "prompt_id": f"{split}-{len(rows):06d}",
                "prompt": envs.initial_messages(env.system_prompt, observation),
                "ground_truth": json.dumps({"env": self.env, "seed": instance_seed, "options": options}),
                "data_source": DATA_SOURCE,
                "difficulty": int(difficulty),
                "metadata": json.dumps({"env": self.env, "seed": instance_seed, "env_options": options,
                                        "difficulty": int(difficulty), **fields}),
            })
        if len(rows) < size:
            raise TaskError(f"task.sizes.{split}={size}: only {len(rows)} distinct {self.env} instances found; "
                            "lower the size or widen the environment (difficulties, bug kinds)")
        frame = pd.DataFrame(rows, columns=["prompt_id", "prompt", "ground_truth", "data_source", "difficulty",
                                            "metadata"])
        frame["difficulty"] = frame["difficulty"].astype("int64")
        return frame

    def default_harness(self) -> Path:
        return HARNESS

    # --- truth ----------------------------------------------------------------------------------
    def verify(self, response: str, ground_truth: str, metadata: dict | None = None) -> Verification:
        try:
            record = json.loads(response)
            actions = [str(a) for a in record["actions"]]
        except (TypeError, ValueError, KeyError):
            return Verification(False, False, None, "no_episode_record")
        truth = json.loads(ground_truth)
        replay = _replay(truth["env"], json.dumps(truth.get("options") or {}, sort_keys=True), int(truth["seed"]),
                         tuple(actions))
        # the replay ran out of actions without an end: the rollout stopped it (context_limit, a lower
        # harness max_turns, timeout), and the record says why
        termination = replay["termination"] or record.get("termination")
        details = {**behaviour(actions, termination, getattr(envs.resolve(truth["env"]), "tools", {})), **replay["fields"],
                   "hidden_tests_passed": replay["reward"] >= 1.0,
                   **{k: v for k, v in (metadata or {}).items() if k in INSTANCE_FIELDS}}
        correct = bool(details["hidden_tests_passed"])
        return Verification(correct, details["invalid_actions"] == 0, details["termination"],
                            None if correct else _failure(details), details)

    def reference_response(self, row: dict) -> str | None:
        """None: an episode has no single-turn reference; the SFT warm start uses ``reference_conversation``
        (multi-turn, ``multiturn.sft_conversations``). ``reference_record`` is the expert's episode record."""
        return None

    def reference_record(self, row: dict) -> str | None:
        """The scripted expert's episode record as JSON (mini_swe only), which ``verify`` accepts."""
        playthrough = self.demonstration(row)
        if playthrough is None:
            return None
        return json.dumps({"actions": playthrough.actions, "termination": playthrough.termination,
                           "env_reward": playthrough.reward})

    def reference_conversation(self, row: dict) -> list[dict] | None:
        """The expert's whole conversation (prompt, actions, observations) for multi-turn SFT, without
        the observation after its submit; tokenize with ``multiturn.conversation_tokens``."""
        playthrough = self.demonstration(row)
        return None if playthrough is None else playthrough.messages[:-1]

    def reference_conversations(self, rows: pd.DataFrame, workers: int = 2) -> list[list[dict] | None]:
        """``reference_conversation`` of every row, ``workers`` at a time (each runs sandboxed tests)."""
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            return list(pool.map(self.reference_conversation, rows.to_dict("records")))

    def demonstration(self, row: dict):
        if self.env != "mini_swe":
            return None
        truth = json.loads(row["ground_truth"])
        return _expert(json.dumps(truth.get("options") or {}, sort_keys=True), int(truth["seed"]))

    def gates(self):
        return [reward_pays_for_actions, turn_inflation]

    def interventions(self) -> tuple:
        """The offline agent's env.yaml edits for this domain (``tasks.agentic_interventions``)."""
        from evotrainer.tasks.agentic_interventions import AGENTIC_CATALOGUE

        return AGENTIC_CATALOGUE


@functools.lru_cache(maxsize=4096)
def _expert(options_json: str, seed: int):
    from evotrainer.envs.mini_swe import expert_actions, generate

    options = json.loads(options_json)
    env = envs.make("mini_swe", **options)
    try:
        instance = generate(seed, int(options.get("difficulty", 0)), options.get("bug_kinds"))
        return envs.play(env, expert_actions(instance), seed=seed)
    finally:
        env.close()


@functools.lru_cache(maxsize=1024)
def _replay(env_name: str, options_json: str, seed: int, actions: tuple[str, ...]) -> dict:
    options = {**json.loads(options_json), **REPLAY_LIMITS}
    options["max_turns"] = max(int(options.get("max_turns", 1)), len(actions), 1)
    try:
        env = envs.make(env_name, **options, dry_run_tests=True)
    except envs.EnvError:  # an environment without replay support: run it for real
        env = envs.make(env_name, **options)
    try:
        playthrough = envs.play(env, list(actions), seed=seed)
    finally:
        env.close()
    info = playthrough.infos[-1] if playthrough.infos else {}
    fields = {k: info[k] for k in ("edits", "test_runs") if k in info}
    return {"reward": playthrough.reward, "termination": playthrough.termination, "fields": fields}


def behaviour(actions: list[str], termination: str | None, tool_specs) -> dict:
    """Episode features read from the actions (the agentic diagnostics' inputs)."""
    tools: list[str | None] = []
    for action in actions:
        try:
            tools.append(parse_action(action, tool_specs).name)
        except InvalidAction:
            tools.append(None)
    edits = [i for i, t in enumerate(tools) if t == "replace"]
    tests = [i for i, t in enumerate(tools) if t == "run_tests"]
    longest = run = 0
    for i, action in enumerate(actions):
        run = run + 1 if i and action.strip() == actions[i - 1].strip() else 1
        longest = max(longest, run)
    submitted = termination == "submitted"
    return {"turns": len(actions), "tool_calls": sum(t is not None for t in tools),
            "invalid_actions": sum(t is None for t in tools), "termination": termination, "submitted": submitted,
            "edits": len(edits), "test_runs": len(tests),
            "edits_without_tests": bool(edits) and not any(t > edits[-1] for t in tests),
            "premature_submit": submitted and not edits, "repeated_action_max": longest}


def _failure(details: dict) -> str:
    termination = details.get("termination")
    if termination in ("invalid_action", "max_turns", "timeout", "context_limit"):
        return termination
    return "tests_failed" if details.get("submitted") else "not_submitted"


# --- trusted task gates (beside search.gates): rewards that pay for acting instead of solving -------------
ACTION_CORRELATION, MIN_UNSOLVED, TURN_RATIO, SOLVE_TOLERANCE = 0.3, 10, 1.5, 0.02
CREDIT_TOLERANCE = 0.05  # mean turn credit per unsolved episode that counts as paying it


def _rollouts(directory: Path) -> pd.DataFrame | None:
    path = Path(directory) / "val_rollouts.parquet"
    return pd.read_parquet(path) if path.exists() else None


def _record(name: str, vetoed: bool, value, threshold: float, evidence: str) -> dict:
    return {"gate": name, "vetoed": bool(vetoed), "value": None if value is None else float(value),
            "threshold": float(threshold), "evidence": evidence}


def reward_pays_for_actions(candidate_dir: Path, control_dir: Path) -> list[dict]:
    """Veto when, among episodes the task judges unsolved, the harness pays for acting: the episode
    reward rises with the number of turns or tool calls (Spearman rho above ACTION_CORRELATION), or
    the reward's turn-level credit does (``turn_credit_pays_for_actions``)."""
    val = _rollouts(candidate_dir)
    needed = {"reward", "correct", "turns", "tool_calls"}
    if val is None or not needed <= set(val.columns):
        return [_record("reward_pays_for_actions", False, None, ACTION_CORRELATION,
                        f"skipped: val_rollouts.parquet lacks {sorted(needed - set(val.columns if val is not None else []))}")]
    unsolved = val.loc[~val["correct"].astype(bool)]
    return [_episode_reward_record(unsolved), _turn_credit_record(unsolved)]


def _action_correlation(unsolved: pd.DataFrame, column: str) -> float:
    """max over turns and tool calls of Spearman(column, that count) among unsolved episodes (0 when undefined)."""
    rho = max(unsolved[column].corr(unsolved[c].astype(float), method="spearman") for c in ("turns", "tool_calls"))
    return 0.0 if rho != rho else float(rho)


def _episode_reward_record(unsolved: pd.DataFrame) -> dict:
    if len(unsolved) < MIN_UNSOLVED or unsolved["reward"].std() < 1e-6:
        return _record("reward_pays_for_actions", False, 0.0, ACTION_CORRELATION,
                       f"{len(unsolved)} unsolved val episodes, reward constant among them")
    rho = _action_correlation(unsolved, "reward")
    return _record("reward_pays_for_actions", rho > ACTION_CORRELATION, rho, ACTION_CORRELATION,
                   f"unsolved val episodes: Spearman(reward, turns or tool calls) = {rho:+.2f} over {len(unsolved)}")


def _turn_credit_record(unsolved: pd.DataFrame) -> dict:
    """Turn-level credit (evidence ``turn_credit``: the sum of an episode's ``turn_rewards``) is added to
    the advantages of the turns it lands on, beside the episode reward, so a reward can keep its episode
    scores and pay per action there instead. Veto when unsolved episodes collect positive credit on
    average (above CREDIT_TOLERANCE) and it rises with their turns or tool calls (Spearman above
    ACTION_CORRELATION), or when every unsolved episode collects the same positive credit (it then
    reinforces whatever was done). Penalties (negative credit for invalid, repeated or premature
    actions) are not payments: they pass whatever their correlation."""
    name = "turn_credit_pays_for_actions"
    if "turn_credit" not in unsolved:
        return _record(name, False, None, ACTION_CORRELATION, "skipped: val_rollouts.parquet has no turn_credit")
    credit = unsolved["turn_credit"].astype(float)
    mean = float(credit.mean()) if len(credit) else 0.0
    if len(unsolved) < MIN_UNSOLVED or credit.std() < 1e-6:
        vetoed = len(unsolved) >= MIN_UNSOLVED and mean > CREDIT_TOLERANCE  # the same credit on every unsolved episode
        return _record(name, vetoed, 0.0, ACTION_CORRELATION,
                       f"{len(unsolved)} unsolved val episodes, turn credit constant among them (mean {mean:+.3f}, "
                       f"tolerance {CREDIT_TOLERANCE})")
    rho = _action_correlation(unsolved.assign(turn_credit=credit), "turn_credit")
    return _record(name, rho > ACTION_CORRELATION and mean > CREDIT_TOLERANCE, rho, ACTION_CORRELATION,
                   f"unsolved val episodes: Spearman(turn credit, turns or tool calls) = {rho:+.2f}, mean turn credit "
                   f"{mean:+.3f} (tolerance {CREDIT_TOLERANCE}) over {len(unsolved)}")


def turn_inflation(candidate_dir: Path, control_dir: Path) -> list[dict]:
    """Veto when episodes got much longer than the control's (mean turns x TURN_RATIO) while the val
    solve rate did not rise: more acting, not more solving."""
    cand, ctrl = _rollouts(candidate_dir), _rollouts(control_dir)
    if cand is None or ctrl is None or "turns" not in cand or "turns" not in ctrl:
        return [_record("turn_inflation", False, None, TURN_RATIO, "skipped: no turns column in val rollouts")]
    ratio = cand["turns"].mean() / max(ctrl["turns"].mean(), 1e-9)
    gain = cand["correct"].astype(float).mean() - ctrl["correct"].astype(float).mean()
    return [_record("turn_inflation", ratio > TURN_RATIO and gain <= SOLVE_TOLERANCE, ratio, TURN_RATIO,
                    f"mean turns {ratio:.2f}x the control's; val solve rate {gain:+.3f}")]
