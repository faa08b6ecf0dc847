"""The split secret: what decides held-out membership, kept outside every sandbox mount.

Split membership (train / val / test) and the generators of the seeded tasks are keyed by a random secret,
so neither can be rebuilt from public information (the package source, the run config's ``task.seed``, the
training pool a curriculum is handed). One secret per results folder, ``<results_dir>/.evotrainer/split_secret``
(32 random bytes as hex, mode 0600, created atomically by the first data stage that needs it): every run of
that folder (a run, its headline seeds ``<run>-seed<s>`` and their search arms) gets the same splits for the
same task config, so arms compare prompt by prompt. ``$EVOTRAINER_SPLIT_SECRET_FILE`` names another file
(e.g. a copy of that one) to reproduce the splits on another machine or in another folder.

- :func:`split_seed` folds the secret into the config's seed: the integer a task's ``splits`` receives;
- :func:`prompt_id` is the opaque id of a split row (no split name, no order).

Standard library only (a bottom-floor module, like ``layout``): the data stage and the task modules use it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from evotrainer.layout import SPLIT_SECRET

ENV_VAR = "EVOTRAINER_SPLIT_SECRET_FILE"
SECRET_BYTES = 32
MIN_HEX_CHARS = 32  # a user's own secret: at least 128 bits as hex
SEED_BITS = 63  # split_seed's range: a non-negative int64 (numpy, torch and random.Random take it)


class SplitSecretError(ValueError):
    """The secret file is unreadable or malformed; the message names the file and the fix."""


def secret_path(results_dir: str | os.PathLike) -> Path:
    """Where the secret of ``results_dir`` lives: ``$EVOTRAINER_SPLIT_SECRET_FILE``, else
    ``<results_dir>/.evotrainer/split_secret``."""
    override = os.environ.get(ENV_VAR)
    return Path(override).expanduser() if override else Path(results_dir) / SPLIT_SECRET


def load_or_create(results_dir: str | os.PathLike) -> str:
    """The split secret of ``results_dir`` (hex text), created on first use. Concurrent first uses (several
    arms' data stages at once) agree: the file is written whole under a temporary name, then hard-linked into
    place, which fails when another process got there first; that one's secret is read and used. A file named
    by ``$EVOTRAINER_SPLIT_SECRET_FILE`` is never created: it must exist."""
    path = secret_path(results_dir)
    if os.environ.get(ENV_VAR):
        return _read(path)
    if not path.exists():
        _create(path)
    return _read(path)


def _create(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".split_secret.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(os.urandom(SECRET_BYTES).hex() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)  # atomic and exclusive: never replaces a secret another stage already uses
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links: exclusive create, then the whole text at once
            _create_exclusive(path, Path(tmp).read_text())
    finally:
        os.unlink(tmp)


def _create_exclusive(path: Path, text: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _read(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError as err:
        raise SplitSecretError(f"split secret {path}: unreadable ({err}); it is created in the results folder on "
                               f"first use, or ${ENV_VAR} names an existing file") from err
    try:
        bytes.fromhex(text)
    except ValueError:
        text = ""
    if len(text) < MIN_HEX_CHARS:
        raise SplitSecretError(f"split secret {path}: must hold at least {MIN_HEX_CHARS} hex characters (e.g. "
                               f"python -c 'import secrets; print(secrets.token_hex(32))'); check ${ENV_VAR} "
                               "or delete the file to have a new one made (new splits)")
    return text.lower()


def split_seed(secret: str, seed: int | str) -> int:
    """The seed a task's ``splits`` receives: the config's ``task.seed`` keyed by the secret, an integer in
    [0, 2**63). Without the secret it cannot be told from the public seed."""
    digest = hashlib.blake2b(f"split-seed:{seed}".encode(), key=_key(secret), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - SEED_BITS)


def prompt_id(secret: str, split: str, prompt_text: str, index: int) -> str:
    """An opaque id of row ``index`` of ``split``: ``p`` + 16 hex characters of a keyed hash. It names neither
    the split nor the row's position, and it is the same in every run sharing the secret and the data."""
    digest = hashlib.blake2b(f"prompt-id:{split}:{index}:{prompt_text}".encode(), key=_key(secret), digest_size=8)
    return "p" + digest.hexdigest()


def fingerprint(secret: str) -> str:
    """A short public name of the secret (for messages: which secret made a split), not the secret."""
    return hashlib.blake2b(b"fingerprint", key=_key(secret), digest_size=4).hexdigest()


def _key(secret: str) -> bytes:
    return hashlib.blake2b(secret.encode(), digest_size=32).digest()  # blake2b keys are at most 64 bytes
