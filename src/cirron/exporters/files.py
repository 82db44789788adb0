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

import itertools
import os

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
