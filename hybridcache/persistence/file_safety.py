"""Files the server trusts or writes: created private, refused when someone else could have written them.

The prefix-cache file and the event journal hold prompt tokens, so every file the server writes is created
with mode 0600 in the same call that creates it (never chmod-ed afterwards, which leaves a moment with the
umask's permissions). A cache file is served from: its checksums prove it is intact, not who wrote it, so
one that another local user could have written is refused, as is one in a directory where another user
could replace it (the rule OpenSSH's StrictModes applies to authorized_keys). Every check here reads only;
nothing is created, renamed or removed before start-up has validated every path.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

PRIVATE_FILE_MODE = 0o600
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


class UnsafeFileError(ValueError):
    """A path the server would read or write is unsafe or conflicts with another; the message says why."""


def create_private_file(path: str | os.PathLike[str]) -> int:
    """Create `path` (it must not exist) readable and writable by this user only; returns a descriptor
    open for writing. Raises FileExistsError when it exists (also for a symlink planted there) and
    OSError for the rest."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags, PRIVATE_FILE_MODE)


def check_trusted_file(path: str | os.PathLike[str], what: str) -> None:
    """Refuse `path` when another user could have written it: the file (if it exists) must be a regular
    file owned by this user and not group- or world-writable, reached through no symlink of another
    user; its directory must be owned by this user or root and not writable by others unless sticky (as
    /tmp is). Reads only. Raises UnsafeFileError."""
    target = Path(path)
    me = os.geteuid()
    directory = target.parent
    info = os.stat(directory)
    if info.st_uid not in (me, 0):
        raise UnsafeFileError(f"the directory {directory} of the {what} is owned by another user "
                              f"(uid {info.st_uid}); another user could replace the file")
    if info.st_mode & _OTHERS_WRITE and not info.st_mode & stat.S_ISVTX:
        raise UnsafeFileError(f"the directory {directory} of the {what} is group- or world-writable "
                              f"(mode {stat.S_IMODE(info.st_mode):04o}); another user could replace the file")
    try:
        link = os.lstat(target)
        info = os.stat(target)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        raise UnsafeFileError(f"the {what} {target} is a symlink owned by another user (uid {link.st_uid}); "
                              "they could point it elsewhere")
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFileError(f"the {what} {target} is not a regular file")
    if info.st_uid != me:
        raise UnsafeFileError(f"the {what} {target} is owned by another user (uid {info.st_uid}); "
                              "its checksums cannot prove who wrote it")
    if info.st_mode & _OTHERS_WRITE:
        raise UnsafeFileError(f"the {what} {target} is group- or world-writable "
                              f"(mode {stat.S_IMODE(info.st_mode):04o}); run chmod 600 on it")


def check_trusted_directory(path: str | os.PathLike[str], what: str) -> None:
    """Refuse a directory the server keeps files in (``--cache-dir``) when another user could write
    into it: it (if it exists) must be a directory owned by this user and not group- or world-writable
    (sticky or not: another user could plant a missing file); its parent must be owned by this user or
    root and not writable by others unless sticky. Reads only. Raises UnsafeFileError."""
    target = Path(path)
    me = os.geteuid()
    parent = os.stat(target.parent)
    if parent.st_uid not in (me, 0) or (parent.st_mode & _OTHERS_WRITE and not parent.st_mode & stat.S_ISVTX):
        raise UnsafeFileError(f"the directory {target.parent} holding the {what} is owned or writable by "
                              f"another user (uid {parent.st_uid}, mode {stat.S_IMODE(parent.st_mode):04o})")
    try:
        link = os.lstat(target)
        info = os.stat(target)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        raise UnsafeFileError(f"the {what} {target} is a symlink owned by another user (uid {link.st_uid})")
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeFileError(f"the {what} {target} is not a directory")
    if info.st_uid != me:
        raise UnsafeFileError(f"the {what} {target} is owned by another user (uid {info.st_uid})")
    if info.st_mode & _OTHERS_WRITE:
        raise UnsafeFileError(f"the {what} {target} is group- or world-writable "
                              f"(mode {stat.S_IMODE(info.st_mode):04o}); run chmod 700 on it")


def journal_names(event_log: str | os.PathLike[str]) -> re.Pattern[str]:
    """The file names the journal at `event_log` uses in its directory: PATH and its rotations PATH.<n>."""
    return re.compile(re.escape(Path(event_log).name) + r"(\.\d+)?")


def check_distinct_files(prefix_cache_file: str | None, event_log: str | None) -> None:
    """Refuse a cache file that is the event journal or one of its rotated segments (PATH.<n>), by name,
    through a symlink or as a hard link: the journal would rename the cache file away and the save would
    overwrite the live journal. Reads only. Raises UnsafeFileError."""
    if prefix_cache_file is None or event_log is None:
        return
    cache = Path(os.path.realpath(prefix_cache_file))
    log = Path(os.path.realpath(event_log))
    same_directory = cache.parent == log.parent
    if same_directory and journal_names(log).fullmatch(cache.name):
        raise UnsafeFileError(f"the prefix-cache file {prefix_cache_file} is the event log {event_log} "
                              "or one of its rotated segments (PATH.<n>); give them different names")
    if cache.exists():
        for segment in _existing_journal_files(log):
            if os.path.samefile(cache, segment):
                raise UnsafeFileError(f"the prefix-cache file {prefix_cache_file} is the same file as the "
                                      f"event-log segment {segment} (a hard link)")


def _existing_journal_files(log: Path) -> list[Path]:
    if not log.parent.is_dir():
        return []
    names = journal_names(log)
    return [entry for entry in log.parent.iterdir() if names.fullmatch(entry.name)]
