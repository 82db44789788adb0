"""Where the user's training loop is, and whether the program has left it.

A step found by hooks (an optimizer step, a backward) stays open after its
work is done, so that a ``ci.mark`` made after ``optimizer.step()`` still
lands on it. What comes after the loop must not: a summary mark or a scope
made once the loop is over belongs to what encloses the loop. The hooks
cannot see a ``for`` statement end, but the interpreter can tell where a
frame is: :func:`position` finds, from the frame that completed the step
outwards, the innermost frame that is executing inside a loop of its code
(a loop is a backward jump: a ``for``, a ``while``, a comprehension), and
remembers that frame and the loop's span of bytecode. :func:`left` later says
whether that frame has returned or has moved past the loop.

Frames of the packages named in ``skip`` (the framework's own and cirron's)
are passed over: a loop inside ``torch`` is not the user's loop. With
:data:`GENERATORS` in ``skip``, generator frames are too: a loader wrapper
that yields batches (a prefetcher) is not the loop that trains on them. No frame is
kept alive: the position holds the frame's id and code object, and a frame
is found again by walking the current stack.
"""

from __future__ import annotations

import dis
import inspect
import sys
import threading
from types import CodeType, FrameType

from ..recording.training_state import LoopPosition

Ranges = tuple[tuple[int, int], ...]
# skip -> id of a code object -> (that code, the (start, end) offsets of its loops; () for code
# of the skipped packages). By id: hashing a code object hashes its bytecode and constants,
# every time (Python caches no code hash), which cost more than the rest of a step's lookups.
_loops: dict[tuple[str, ...], dict[int, tuple[CodeType, Ranges]]] = {}
_lock = threading.Lock()
MAX_DEPTH = 64  # frames walked outwards at most
GENERATORS = "<generators>"  # in `skip`: pass over generator frames too
_CO_GENERATOR = inspect.CO_GENERATOR


def _loops_of(frame: FrameType, skip: tuple[str, ...]) -> Ranges:
    """The (start, end) offsets of every loop in the frame's code; none for skipped packages."""
    code = frame.f_code
    name = frame.f_globals.get("__name__", "")
    if isinstance(name, str) and name.startswith(skip):
        found: Ranges = ()
    elif code.co_flags & _CO_GENERATOR and GENERATORS in skip:
        found = ()
    else:
        ends: dict[int, int] = {}
        for instruction in dis.get_instructions(code):
            target = instruction.argval
            jumps = instruction.opcode in dis.hasjrel or instruction.opcode in dis.hasjabs
            # A backward jump closes a loop; NO_INTERRUPT ones are `yield from` / await.
            if jumps and isinstance(target, int) and target < instruction.offset:
                if "NO_INTERRUPT" not in instruction.opname:
                    ends[target] = max(ends.get(target, target), instruction.offset)
        found = tuple(sorted(ends.items()))
    with _lock:
        # The code is kept alive with its entry, so its id is never another's meanwhile.
        _loops.setdefault(skip, {})[id(code)] = (code, found)
    return found


# The last answer of position(), per skip: (the code of the frame it started from, the bytecode
# offset its caller was at, the answer). A loop asks from the same place at every step.
_last: dict[tuple[str, ...], tuple[CodeType, int, LoopPosition]] = {}


def position(frame: FrameType | None, skip: tuple[str, ...]) -> LoopPosition | None:
    """The innermost loop around ``frame``'s current point, outside the ``skip`` packages.

    Runs once per step: each code object is analysed once, then looked up,
    and when the step ends where the last one did (the same frame calling
    from the same point) the last answer is given again without a walk.
    """
    last = _last.get(skip)
    if last is not None and frame is not None and frame.f_code is last[0]:
        caller, found = frame.f_back, last[2]
        if caller is not None and id(caller) == found[0] and caller.f_code is found[1]:
            if caller.f_lasti == last[1]:
                return found
    found_here = _walk(frame, skip)
    if found_here is not None and frame is not None and frame.f_back is not None:
        caller = frame.f_back
        if id(caller) == found_here[0]:  # the loop is in the caller: the next step may reuse it
            _last[skip] = (frame.f_code, caller.f_lasti, found_here)
    return found_here


def _walk(frame: FrameType | None, skip: tuple[str, ...]) -> LoopPosition | None:
    """:func:`position`, walking out from ``frame``."""
    loops = _loops[skip] if skip in _loops else {}
    depth = 0
    while frame is not None and depth < MAX_DEPTH:
        code = frame.f_code
        known = loops.get(id(code))
        ranges = known[1] if known is not None and known[0] is code else _loops_of(frame, skip)
        if ranges:
            at = frame.f_lasti
            best = None
            for start, end in ranges:
                if start <= at <= end and (best is None or end - start < best[1] - best[0]):
                    best = (start, end)
            if best is not None:
                return (id(frame), code, best[0], best[1])
        frame = frame.f_back
        depth += 1
    return None


def left(loop: LoopPosition) -> bool:
    """Has the program left ``loop``: its frame returned, or it runs past the loop's end?"""
    frame_id, code, start, end = loop
    frame: FrameType | None = sys._getframe(1)
    depth = 0
    while frame is not None and depth < MAX_DEPTH * 4:
        if id(frame) == frame_id and frame.f_code is code:
            return not start <= frame.f_lasti <= end
        frame = frame.f_back
        depth += 1
    return True  # the frame is gone (or suspended: a generator that yielded)
