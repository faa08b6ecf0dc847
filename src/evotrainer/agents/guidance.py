"""What steers the offline agent besides the findings: skills from earlier outcomes and human feedback.

Skills (evotrainer.contracts.skill, retrieved by signature similarity into ``context.extra["skills"]``): an
intervention whose matching skill *worked* is tried first (the more similar and the larger its gain,
the earlier); one whose matching skill *failed* is not proposed again. A worked skill whose
intervention the catalogue does not know (an LLM's or a user's) is proposed with its recorded diff
when that diff still applies to the current harness.

Feedback (``context.feedback``, from ``evotrainer revise``) is read clause by clause (split at
``.``, ``;``, new lines and "but"). A clause with a negative word (avoid, don't, do not, no, never,
skip, stop, without, not) *avoids* every term it names; a clause with a positive word (prefer, try,
use, focus on, favour/favor, more) *prefers* them. Terms are catalogue intervention names
(``dynamic_sampling`` or "dynamic sampling"), recipe keys (``lr``, ``kl_coef``, ...; plus "learning
rate", "kl", "clip", "group size", "temperature") and harness files (reward, curriculum, diagnostics).
Avoided interventions (by name, by a recipe key they change, or by the file they edit) are dropped;
preferred ones rank before everything else. Feedback that names nothing known changes nothing, and
the narrative says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

NEGATIVE = re.compile(r"\b(avoid|don'?t|do not|no|never|skip|stop|without|not)\b", re.IGNORECASE)
POSITIVE = re.compile(r"\b(prefer|try|use|focus on|favou?r|more)\b", re.IGNORECASE)
CLAUSES = re.compile(r"[.;\n]+|,?\s+but\s+", re.IGNORECASE)
ALIASES = {"learning rate": "lr", "kl": "kl_coef", "clip": "clip_high", "clipping": "clip_high",
           "group size": "group_size", "entropy bonus": "entropy_coef"}


def _term_pattern(term: str) -> re.Pattern:
    parts = [re.escape(p) for p in re.split(r"[ _-]+", term) if p]
    return re.compile(r"(?<![A-Za-z0-9])" + r"[ _-]?".join(parts) + r"(?![A-Za-z0-9])", re.IGNORECASE)


def parse_feedback(text: str | None, vocabulary: set[str]) -> tuple[set[str], set[str]]:
    """(avoid, prefer): the vocabulary terms each clause of the feedback names, by the clause's polarity."""
    avoid: set[str] = set()
    prefer: set[str] = set()
    if not text:
        return avoid, prefer
    terms = {t: t for t in vocabulary} | {alias: t for alias, t in ALIASES.items() if t in vocabulary}
    # "lower learning rate" names lower_lr
    terms |= {re.sub(r"(^|_)lr($|_)", r"\1learning rate\2", t): t for t in vocabulary if re.search(r"(^|_)lr($|_)", t)}
    patterns = {alias: _term_pattern(alias) for alias in sorted(terms, key=len, reverse=True)}  # longest first
    for clause in CLAUSES.split(text):
        spans = [(m.start(), m.end(), terms[alias]) for alias, pattern in patterns.items() for m in pattern.finditer(clause)]
        # a mention inside a longer one is part of it ("lr" in "lower_lr", "clip" in "clip_higher")
        named = {term for s, e, term in spans
                 if not any(s2 <= s and e <= e2 and (e2 - s2) > (e - s) for s2, e2, _ in spans)}
        words = clause
        for pattern in patterns.values():  # "no_std_normalisation" is a name, not the word "no"
            words = pattern.sub(" ", words)
        if NEGATIVE.search(words):
            avoid |= named
        elif POSITIVE.search(words):
            prefer |= named
    return avoid, prefer - avoid


@dataclass
class Guidance:
    avoid: set[str] = field(default_factory=set)
    prefer: set[str] = field(default_factory=set)
    worked: dict[str, dict] = field(default_factory=dict)  # intervention -> best matching worked skill
    failed: dict[str, dict] = field(default_factory=dict)  # intervention -> matching failed skill

    @classmethod
    def from_context(cls, context, vocabulary: set[str]) -> Guidance:
        avoid, prefer = parse_feedback(context.feedback, vocabulary)
        worked: dict[str, dict] = {}
        failed: dict[str, dict] = {}
        for skill in context.extra.get("skills", []):
            name = skill["intervention"]
            if skill["verdict"] == "worked":
                if name not in worked or skill_score(skill) > skill_score(worked[name]):
                    worked[name] = skill
            elif skill["verdict"] == "failed":
                failed.setdefault(name, skill)
        for name in set(worked) & set(failed):  # the closer match decides
            if failed[name]["similarity"] >= worked[name]["similarity"]:
                del worked[name]
            else:
                del failed[name]
        return cls(avoid, prefer, worked, failed)

    def blocked(self, names: set[str]) -> str | None:
        """Why an intervention touching these names (its own, its keys, its files) is not proposed."""
        hit = sorted(names & self.avoid)
        if hit:
            return f"human feedback avoids {', '.join(hit)}"
        failed = [self.failed[n] for n in sorted(names) if n in self.failed]
        if failed:
            return f"skill {failed[0]['skill_id']} failed before"
        return None

    def rank(self, name: str, names: set[str]) -> tuple[int, float]:
        """Sort key part (smaller first): preferred by feedback, then worked skills by score."""
        skill = self.worked.get(name)
        return (0 if names & self.prefer else 1), -(skill_score(skill) if skill else 0.0)

    def summary(self, feedback: str | None) -> str:
        lines = []
        if feedback:
            acted = [f"avoid {sorted(self.avoid)}" if self.avoid else "", f"prefer {sorted(self.prefer)}" if self.prefer else ""]
            acted = [a for a in acted if a]
            lines.append(f"Human feedback: \"{feedback.strip()}\" -> "
                         + ("; ".join(acted) if acted else "names no known intervention, recipe key or file; no change"))
        for name, skill in sorted(self.worked.items()):
            lines.append(f"Skill {skill['skill_id']} ({name}) worked before (mean gain "
                         f"{_gain(skill)}, similarity {skill['similarity']:.2f}, {skill['status']}): tried first.")
        for name, skill in sorted(self.failed.items()):
            lines.append(f"Skill {skill['skill_id']} ({name}) failed before (mean gain {_gain(skill)}, "
                         f"similarity {skill['similarity']:.2f}): not repeated.")
        return "\n".join(lines)


def skill_score(skill: dict) -> float:
    """Similarity, then gain: a close match that worked by a lot comes first."""
    return skill["similarity"] + max(0.0, skill["validation"].get("mean_gain") or 0.0)


def _gain(skill: dict) -> str:
    gain = skill["validation"].get("mean_gain")
    return "n/a" if gain is None else f"{gain:+.3f}"
