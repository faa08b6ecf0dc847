"""What the docs name, read out of the Markdown: repository paths, references to things outside the
repository, and shell commands. tests/docs/test_docs_check.py checks them.

The pages read: README.md, docs/*.md and tests/README.md. Every finding carries its page and line.

What counts as a repository path (the rules, kept small):
  - a link or image target ``[text](target)`` that is not a URL (``scheme:``) or an anchor (``#...``):
    relative to the page's folder, ``#anchor`` dropped;
  - in inline code and in fenced blocks, a word that starts with one of ``TOP`` (``src/``, ``docs/``,
    ``workflow/``, ...) and is not preceded by a letter, ``.``, ``/`` or ``-`` (so ``results/default/conf/``,
    ``/tmp/docs/`` and URLs are not read). The word ends at a space, a quote, ``<``, ``{`` or ``$``; a
    ``:line`` or ``::test`` suffix and trailing punctuation are dropped; ``*`` is a glob (one match is
    enough); a trailing ``/`` asks for a folder;
  - the same for a word that starts with ``evotrainer/`` or a folder of the package (``contracts/``,
    ``stages/``, ...): read under ``src/evotrainer/``; ``.py`` may be left out, and ``kernel.score`` means
    the module ``kernel.py`` with ``score`` in it; a run's files (``report/*.png``: ``RUN_FILES``) are not
    read;
  - a path in a table column headed ``before`` (a table of what moved) is a former name: not checked;
  - a path with a placeholder part (``PLACEHOLDERS``: ``NAME``, ``DIR``, ...; or ``...``) is not checked.
    Paths under ``results/``, ``/tmp``, ``~`` and a user's own folders (``my_task/``) do not start with
    these folders, so they are not read at all.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# the top-level folders of the repository whose paths the docs name (tests/docs checks they exist)
TOP = ("src", "workflow", "conf", "docs", "benchmarks", "scripts", "flaws", "tests", "profiles", "envs", ".ci")
PACKAGE = "evotrainer"  # `evotrainer/forkserver.py` is src/evotrainer/forkserver.py
# the package's folders: `contracts/task.py` and `stages/backtest` are src/evotrainer/contracts/task.py, ...
PACKAGE_DIRS = tuple(sorted(p.name for p in (REPO / "src" / PACKAGE).iterdir()
                            if p.is_dir() and not p.name.startswith("__") and p.name != "bundled"))
# suffixes of a run's files (`report/*.png`, `policy/config.json` in a run's layout): not package paths
RUN_FILES = {"png", "jsonl", "parquet", "html", "npy", "log", "safetensors"}
FILE_SUFFIXES = {"py", "sh", "json", "yaml", "yml", "md", "txt", "toml", "smk", "diff"}  # else `module.attribute`
PLACEHOLDERS = {"NAME", "DIR", "RUN", "KIND", "R", "N", "X", "FILE", "TASK"}
SHELL_LANGS = {"bash", "sh", "shell", "console"}


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "tests" / "README.md"]


def where(page: Path, line: int) -> str:
    return f"{page.relative_to(REPO).as_posix()}:{line}"


@dataclass(frozen=True)
class Block:
    """A fenced block: its info string's first word, the line of its first content line, its lines."""

    lang: str
    line: int
    lines: tuple[str, ...]


def split_fences(text: str) -> tuple[str, list[Block]]:
    """The page with every fenced block's lines blanked (so line numbers stay), and the blocks."""
    lines = text.split("\n")
    prose, blocks = list(lines), []
    fence, lang, start = None, "", 0
    for index, line in enumerate(lines):
        stripped = line.strip()
        if fence is None:
            opened = re.match(r"(`{3,}|~{3,})\s*([\w+-]*)", stripped)
            if opened:
                fence, lang, start = opened[1], opened[2].lower(), index + 1
                prose[index] = ""
            continue
        prose[index] = ""
        if stripped.startswith(fence) and not stripped.lstrip(fence[0]):
            blocks.append(Block(lang, start + 1, tuple(lines[start:index])))
            fence = None
    return "\n".join(prose), blocks


INLINE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def inline_code(prose: str) -> list[tuple[int, int, str]]:
    """Inline code spans of a page's prose: (line, offset of the content in the prose, content)."""
    found = []
    for match in INLINE.finditer(prose):
        if "\n\n" not in match[2]:  # a span never crosses a paragraph
            found.append((prose.count("\n", 0, match.start(2)) + 1, match.start(2), match[2]))
    return found


def line_at(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


# ---- paths -------------------------------------------------------------------------------------------
PATH_WORD = re.compile(rf"(?<![\w./-])(?:\./)?((?:{'|'.join(re.escape(t) for t in (*TOP, PACKAGE, *PACKAGE_DIRS))})"
                       r"/[\w./*@+-]*)")


@dataclass(frozen=True)
class PathRef:
    where: str
    text: str  # as written
    paths: tuple[str, ...]  # repository-relative: the path exists if one of them does


def candidates(word: str) -> tuple[str, ...]:
    """Where ``word`` may be in the repository (the rules in the module docstring); ``FILE#name``: the
    module FILE with ``name`` in it (``scoring/kernel.score``)."""
    first, last = word.split("/")[0], word.rstrip("/").split("/")[-1]
    found = [word] if first in TOP else []
    if first not in (PACKAGE, *PACKAGE_DIRS):
        return tuple(found)
    inner = f"src/{word}" if first == PACKAGE else f"src/{PACKAGE}/{word}"
    suffix = last.rpartition(".")[2] if "." in last else ""
    if suffix in RUN_FILES:
        return tuple(found)  # `report/*.png`: a run's files
    if suffix and suffix not in FILE_SUFFIXES:
        found.append(f"{inner.rpartition('.')[0]}.py#{suffix}")  # module.attribute
    else:
        found += [inner] + ([] if suffix or word.endswith("/") else [f"{inner}.py"])
    return tuple(found)


def _clean(word: str) -> str:
    word = re.sub(r"::.*$|:\d+$", "", word)
    return word.rstrip(".,;:")


def _placeholder(path: str) -> bool:
    return any(part.split(".")[0] in PLACEHOLDERS or "..." in part for part in path.split("/"))


def path_words(text: str) -> list[tuple[int, str]]:
    """(offset, word) of each repository-path word in ``text`` (the rules in the module docstring)."""
    return [(m.start(1), _clean(m[1])) for m in PATH_WORD.finditer(text)]


def repo_paths(page: Path) -> list[PathRef]:
    text = page.read_text()
    prose, blocks = split_fences(text)
    found: list[PathRef] = []

    def add(line: int, word: str, paths: tuple[str, ...]) -> None:
        if word and paths and not _placeholder(word):
            found.append(PathRef(where(page, line), word, paths))

    former = former_columns(prose)
    for _, offset, code in inline_code(prose):
        for at, word in path_words(code):
            line = line_at(prose, offset + at)
            if column(prose, offset + at) not in former.get(line, ()):
                add(line, word, candidates(word))
    for block in blocks:
        for index, code in enumerate(block.lines):
            for _, word in path_words(code):
                add(block.line + index, word, candidates(word))
    for match in LINK.finditer(prose):
        target = match[1]
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # a URL, mailto: or an anchor on the same page
        target = target.split("#")[0]
        resolved = (page.parent / target).resolve()
        try:
            path = resolved.relative_to(REPO).as_posix()
        except ValueError:
            path = str(resolved)  # outside the repository: reported as missing below
        add(line_at(prose, match.start(1)), target, (path,))
    return found


def _cells(line: str) -> list[str]:
    return INLINE.sub("", line).strip().strip("|").split("|")


def former_columns(prose: str) -> dict[int, set[int]]:
    """Line -> the columns of the table on it whose header starts with ``before``."""
    lines, found, columns = prose.split("\n"), {}, set()
    for index, line in enumerate(lines):
        if not line.lstrip().startswith("|"):
            columns = set()
            continue
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if not columns and re.match(r"\s*\|?\s*:?-{3,}", following):
            columns = {k for k, cell in enumerate(_cells(line)) if cell.strip().lower().startswith("before")}
        found[index + 1] = columns
    return found


def column(prose: str, offset: int) -> int:
    """The table column of ``offset`` on its line (the ``|`` outside code before it, less the leading one)."""
    start = prose.rfind("\n", 0, offset) + 1
    return INLINE.sub("", prose[start:offset]).count("|") - 1


def exists(ref: PathRef) -> bool:
    return any(_exists(path) for path in ref.paths)


def _exists(path: str) -> bool:
    path, _, name = path.partition("#")
    if name:
        module = REPO / path
        return module.is_file() and re.search(rf"\b{re.escape(name)}\b", module.read_text()) is not None
    if "*" in path:
        return any(REPO.glob(path.rstrip("/")))
    target = REPO / path
    return target.is_dir() if path.endswith("/") else target.exists()


# ---- references to things outside the repository ----------------------------------------------------
OUTSIDE = {
    "an issue number": re.compile(r"\bissues?\s*#?\d+", re.I),
    "an issue title": re.compile(r"\bissues?\s+[\"“][^\"”]*[\"”]?", re.I),
    "a task brief": re.compile(r"\bthe brief\b", re.I),
    "an issue reference": re.compile(r"(?<![\w&/#(])#\d+\b"),
}


def outside_references(page: Path) -> list[str]:
    found = []
    for number, line in enumerate(page.read_text().split("\n"), 1):
        for what, pattern in OUTSIDE.items():
            for match in pattern.finditer(line):
                found.append(f"{where(page, number)}: {what}: {match[0]!r}")
    return found


# ---- commands ----------------------------------------------------------------------------------------
PROGRAM = re.compile(r"^(?:\.venv/bin/)?(evotrainer|snakemake)(?=\s|$)|^python3? -m evotrainer(?:\.cli)?(?=\s|$)")


@dataclass(frozen=True)
class Command:
    """One shell command of a page: its place, its words (``.venv/bin/`` and ``python -m evotrainer.cli``
    read as the program's name), and whether it came from inline code (else from a shell block)."""

    where: str
    text: str
    words: tuple[str, ...]
    inline: bool
    block: str = ""  # the block's place (page:line of its first line); "" for inline code
    env: tuple[str, ...] = ()  # leading NAME=value words

    @property
    def program(self) -> str:
        return self.words[0]


def normalize(words: list[str]) -> tuple[list[str], list[str]]:
    """(the words, leading ``NAME=value`` words apart); ``python -m evotrainer.cli`` read as ``evotrainer``,
    ``.venv/bin/`` dropped."""
    env = []
    while words and re.fullmatch(r"[A-Za-z_]\w*=\S*", words[0]):
        env.append(words.pop(0))
    if words[:3] in (["python", "-m", "evotrainer.cli"], ["python3", "-m", "evotrainer.cli"]):
        words = ["evotrainer", *words[3:]]
    if words and words[0].startswith(".venv/bin/"):
        words = [words[0].removeprefix(".venv/bin/"), *words[1:]]
    return words, env


def split_commands(line: str) -> list[tuple[list[str], list[str]]]:
    """One shell line's commands (split at ``&&``, ``||``, ``;`` and ``|``), comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, "#"
    commands, current = [], []
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote: the words as written; the checks report the command
        words = line.split()
    for word in words:
        if word in ("&&", "||", ";", "|", "&"):
            commands.append(current)
            current = []
        else:
            current.append(word)
    commands.append(current)
    return [normalize(words) for words in commands if words]


def block_lines(block: Block) -> list[tuple[int, str]]:
    """A shell block's command lines: prompts (``$ ``) dropped, ``\\`` continuations joined; in a
    ``console`` block only the prompted lines."""
    joined: list[tuple[int, str]] = []
    pending, start, heredoc = "", 0, ""
    for index, raw in enumerate(block.lines):
        line = raw.strip()
        if heredoc:  # a here-document's body is text, not commands
            heredoc = "" if line == heredoc else heredoc
            continue
        if not pending:
            if block.lang == "console" and not line.startswith("$ "):
                continue
            start, line = block.line + index, line.removeprefix("$ ")
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        if text and not text.startswith("#"):
            joined.append((start, text))
            opened = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", text)
            heredoc = opened[1] if opened else ""
    return joined


def commands(page: Path) -> list[Command]:
    """Every shell block's commands, and inline code that starts with ``evotrainer``, ``snakemake`` (or
    ``.venv/bin/`` or ``python -m evotrainer.cli`` before them) followed by a word."""
    prose, blocks = split_fences(page.read_text())
    found = []
    for block in blocks:
        if block.lang not in SHELL_LANGS:
            continue
        for line, text in block_lines(block):
            for words, env in split_commands(text):
                found.append(Command(where(page, line), " ".join(env + words), tuple(words), inline=False,
                                     block=where(page, block.line), env=tuple(env)))
    for line, _, code in inline_code(prose):
        code = " ".join(code.split())
        if not PROGRAM.match(code):
            continue
        try:
            words, env = normalize(shlex.split(code))
        except ValueError:  # an unclosed quote: kept as written, the checks report it
            words, env = normalize(code.split())
        if len(words) > 1:  # `evotrainer` or `snakemake` alone names the tool
            found.append(Command(where(page, line), code, tuple(words), inline=True, env=tuple(env)))
    return found
