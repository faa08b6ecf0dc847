"""Scratch directories for sandboxed code, and their removal, which never fails.

Whatever a candidate leaves in its scratch (a 3,000-deep directory chain, paths longer than PATH_MAX,
directories without write or search permission, symbolic links to places outside) is removed by
``remove_tree`` without recursion and without following links: it walks down one directory at a time
with directory file descriptors (``os.open(name, O_DIRECTORY | O_NOFOLLOW, dir_fd=...)``), unlinks with
``dir_fd``, climbs back up through ``..`` (checking that it lands in the directory it came from), and
never holds more than three descriptors open. A directory it cannot enter or empty gets its permissions
fixed through a descriptor; what it still cannot remove is logged and left behind. It never raises
(``KeyboardInterrupt`` aside), so a candidate's scratch can never fail the trusted process that cleans up.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_PATH = getattr(os, "O_PATH", 0)
_DENIED = (errno.EACCES, errno.EPERM)


MAX_ENTRIES = 100_000  # a scratch with more entries than this counts as full (its scan would cost too much)


def tree_bytes(path: str | os.PathLike | None, max_entries: int = MAX_ENTRIES) -> float:
    """Bytes allocated to the regular files under ``path`` (links not followed, no recursion); ``inf`` once
    more than ``max_entries`` entries were seen, so a scratch of millions of empty files is full too."""
    if path is None:
        return 0
    total, seen, stack = 0, 0, [os.fspath(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    seen += 1
                    if seen > max_entries:
                        return float("inf")
                    with contextlib.suppress(OSError):
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_blocks * 512
        except OSError:
            continue
    return total


def remove_tree(path: str | os.PathLike) -> None:
    """Remove ``path`` and everything under it (a file or a symlink: just that entry). Never raises."""
    try:
        left = _remove(os.path.abspath(os.fspath(path)))
    except Exception as err:  # noqa: BLE001 - cleanup must never fail the caller
        log.warning("could not remove scratch %s: %s: %s", path, type(err).__name__, str(err)[:500])
        return
    if left:
        log.warning("left %d entr%s behind in scratch %s", left, "y" if left == 1 else "ies", path)


@contextlib.contextmanager
def scratch_dir(prefix: str = "evotrainer-") -> Iterator[Path]:
    """A fresh private directory (``tempfile.mkdtemp``), removed by ``remove_tree`` on exit (never raises)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        remove_tree(path)


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _chmod_entry(parent: int, name: str, mode: int) -> bool:
    """chmod the directory ``name`` in ``parent`` without following a link (through an O_PATH descriptor)."""
    try:
        fd = os.open(name, _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return False
    try:
        os.chmod(f"/proc/self/fd/{fd}", mode)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _fix(fd: int) -> bool:
    """Give the owner full access to the open directory ``fd`` (to unlink in it and search it)."""
    try:
        os.fchmod(fd, stat.S_IRWXU)
        return True
    except OSError:
        return False


def _open_dir(parent: int, name: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as err:
        if err.errno not in _DENIED:
            raise
        # not readable or not searchable: its parent must be searchable to chmod it
        if not (_chmod_entry(parent, name, stat.S_IRWXU) or (_fix(parent) and _chmod_entry(parent, name, stat.S_IRWXU))):
            raise
        return os.open(name, _DIR_FLAGS, dir_fd=parent)


def _unlink(fd: int, name: str, is_dir: bool) -> None:
    remove = os.rmdir if is_dir else os.unlink
    try:
        remove(name, dir_fd=fd)
    except FileNotFoundError:
        pass
    except OSError as err:
        if err.errno not in _DENIED or not _fix(fd):
            raise
        remove(name, dir_fd=fd)


def _remove(path: str) -> int:
    """Remove ``path``; returns how many entries were left behind."""
    parent_path, name = os.path.split(path)
    if not name:
        raise ValueError(f"refusing to remove {path!r}")
    top = os.open(parent_path or ".", _DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        try:
            st = os.stat(name, dir_fd=top, follow_symlinks=False)
        except FileNotFoundError:
            return 0
        if not stat.S_ISDIR(st.st_mode):
            _unlink(top, name, False)
            return 0
        return _empty_and_remove(top, name)
    finally:
        os.close(top)


def _empty_and_remove(top: int, name: str) -> int:
    """Depth-first without recursion: ``stack`` holds (name, identity, names left behind) per level below
    ``top``; ``cur`` is the one descriptor open on the deepest level."""
    left = 0
    top_id = _identity(top)
    cur = _open_dir(top, name)
    stack: list[tuple[str, tuple[int, int], set[str]]] = [(name, _identity(cur), set())]
    try:
        while stack:
            failed = stack[-1][2]
            child = None
            os.lseek(cur, 0, os.SEEK_SET)
            with os.scandir(cur) as entries:
                for entry in entries:
                    if entry.name in failed:
                        continue
                    try:
                        is_dir = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        is_dir = False
                    if is_dir:
                        child = entry.name
                        break
                    try:
                        _unlink(cur, entry.name, False)
                    except OSError as err:
                        if err.errno == errno.EISDIR:  # its type was unknown: a directory after all
                            child = entry.name
                            break
                        failed.add(entry.name)
                        left += 1
                        log.debug("could not remove %s: %s", entry.name, err)
            if child is not None:
                try:
                    down = _open_dir(cur, child)
                except OSError as err:
                    failed.add(child)
                    left += 1
                    log.debug("could not enter %s: %s", child, err)
                    continue
                os.close(cur)
                cur = down
                stack.append((child, _identity(cur), set()))
                continue
            done, _, failed_here = stack.pop()
            up = os.open("..", _DIR_FLAGS, dir_fd=cur)
            os.close(cur)
            cur = up
            expected = stack[-1][1] if stack else top_id
            if _identity(cur) != expected:  # moved under us: stop rather than remove elsewhere
                log.warning("scratch changed while being removed; stopping")
                return left + 1
            parent_failed = stack[-1][2] if stack else set()
            if failed_here:
                parent_failed.add(done)
                continue
            try:
                _unlink(cur, done, True)
            except OSError as err:
                parent_failed.add(done)
                left += 1
                log.debug("could not remove directory %s: %s", done, err)
        return left
    finally:
        os.close(cur)
