"""Gzip members for the spool and its index, by ISA-L where it is installed, else by zlib.

ISA-L (Intel's storage acceleration library) comes with the optional ``isal`` package, the
``speedups`` extra (``pip install "cirron-otel[speedups]"``); it ships wheels for CPython
3.10-3.14 on Linux (x86_64, aarch64), macOS and Windows. On a torch run's spool its level 1
compresses about ten times faster than zlib's level 5 for a file about 8 % bigger (a plain
scope's spans: 2 % bigger), which is most of the spool sink's CPU. Without it, zlib at level
5 writes the same format: either way a file is one standard gzip member (no name, no time),
so ``zcat`` and every reader inflate it, and either releases the GIL while it compresses.

``ci.health()["gzip"]`` says which one a process uses: ``isal`` or ``zlib``.
"""

from __future__ import annotations

import logging
import zlib
from typing import Any

_log = logging.getLogger("cirron")

ZLIB_LEVEL = 5  # level 6 saves 0.5 % more for 40 % more CPU
ISAL_LEVEL = 1  # ISA-L's 2 and 3 are no smaller on spans, and 3 is five times slower
GZIP_WBITS = 31  # a gzip header and trailer around the deflate stream


def _load() -> Any:
    """ISA-L's zlib-like module, or None: not installed, or an install that does not load."""
    try:
        from isal import isal_zlib
    except ImportError:
        return None
    except Exception as error:  # noqa: BLE001 - a broken install only means zlib
        _log.warning("cirron: the isal package does not load (%s); compressing with zlib", error)
        return None
    return isal_zlib


_isal = _load()


def compressor_name() -> str:
    """``isal`` or ``zlib``: what :func:`gzip_member` compresses with (``ci.health()``)."""
    return "zlib" if _isal is None else "isal"


def gzip_member(data: bytes, level: int | None = None) -> bytes:
    """``data`` as one gzip member: by ISA-L at ``ISAL_LEVEL`` where it loaded, else by zlib
    at ``level`` (``ZLIB_LEVEL`` unless given)."""
    if _isal is not None:
        deflate = _isal.compressobj(ISAL_LEVEL, _isal.DEFLATED, GZIP_WBITS)
    else:
        deflate = zlib.compressobj(
            ZLIB_LEVEL if level is None else level, zlib.DEFLATED, GZIP_WBITS
        )
    return deflate.compress(data) + deflate.flush()
