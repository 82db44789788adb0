"""The files cirron writes (spool files, snapshot blobs): whole or not at all, never world-writable.

A file is written under a temporary name in its final directory and renamed
into place, so a reader never sees half a file; when the write fails (disk
full, a file size limit) the temporary file is removed. Files are created with
mode ``0o664`` and directories with ``0o775``, both minus the user's umask:
the kernel applies the umask itself, so cirron never changes the process's
umask (another thread could create a file in that moment), and nothing it
creates is writable by others, whatever the umask.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
import tempfile
from collections.abc import Callable
from typing import IO

FILE_MODE = 0o664
DIRECTORY_MODE = 0o775
_temporary_names = itertools.count()


def make_directory(path: str) -> None:
    """Create ``path`` and its missing parents, each with :data:`DIRECTORY_MODE` minus umask."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    if parent and parent != os.path.abspath(path):
        make_directory(parent)
    try:
        os.mkdir(path, DIRECTORY_MODE)
    except FileExistsError:
        if not os.path.isdir(path):
            raise NotADirectoryError(f"{path} exists and is not a directory") from None


def write_whole(final: str, data: bytes) -> None:
    """Write ``data`` to the file ``final`` (replacing it), or leave nothing behind."""
    directory, name = os.path.split(final)
    while True:
        temporary = os.path.join(directory, f".{name}.{os.getpid()}.{next(_temporary_names)}.tmp")
        try:
            handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            break
        except FileExistsError:  # left by a killed process with the same pid
            continue
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, final)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def write_output(path: str, write: Callable[[IO[str]], object]) -> None:
    """Write a file a person named (``cirron ... -o``): ``write(stream)`` fills it, as text.

    As a shell's redirection would: through a symlink to the file it names, and
    into a device or a pipe (``/dev/stdout``) as it is, never replacing it. A
    regular file is written whole or not at all (a temporary file beside it,
    renamed over it; on any failure it is left as it was and the temporary one
    removed) and keeps its permissions; a new one gets what ``open()`` gives.
    """
    try:
        mode: int | None = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):  # (the path itself: /dev/stdout, a pipe)
        with open(path, "w", encoding="utf-8") as stream:
            write(stream)
        return
    target = os.path.realpath(path)
    directory, name = os.path.split(target)
    handle, temporary = tempfile.mkstemp(prefix=f".{name[:100]}.", suffix=".tmp", dir=directory)
    try:
        with open(handle, "w", encoding="utf-8") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, stat.S_IMODE(mode) if mode is not None else _new_file_mode())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _new_file_mode() -> int:
    """What ``open()`` gives a new file: 0o666 minus the umask."""
    umask = os.umask(0)  # reading it means setting it: put it back at once
    os.umask(umask)
    return 0o666 & ~umask
