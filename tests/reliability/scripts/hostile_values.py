"""Hostile values in marks, attributes, names and errors, with every local sink on.

    python hostile_values.py PATH LOG_FILE

Profiles with ``output=["spool", "stdout", "log"]`` (the log sink and cirron's
warnings go to LOG_FILE, one record a line) and records spans whose values
carry control characters, ANSI escapes, line and paragraph separators, a lone
surrogate, and 10 MB strings. Prints ``RESULT {...}`` with the number of spans
and ``ci.health()`` after shutdown.
"""

import json
import logging
import sys

import cirron as ci

path, log_file = sys.argv[1], sys.argv[2]
handler = logging.FileHandler(log_file, encoding="utf-8")
handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
logging.getLogger().addHandler(handler)
logging.getLogger().setLevel(logging.INFO)

HUGE = "A" * 10_000_000
NASTY = [
    "line\nbreak",
    "carriage\rreturn",
    "nul\x00byte",
    "\x1b[31mred\x1b[0m",
    "tab\tand\vvertical\ffeed",
    "separators\u2028\u2029",
    "lone \ud800 surrogate",
    '{"json": "injection"}\n[cirron] fake line',
    "\x7f\x85 del and nel",
]

handle = ci.profile(
    path=path, output=["spool", "stdout", "log"], flush_interval=0.05, frameworks=[]
)
spans = 1  # the session
for number, text in enumerate(NASTY + [HUGE]):
    with ci.scope("hostile", index=number, value=text, values=[text, "x"]):
        ci.mark("text", text)
        ci.mark("summary", text, kind="summary")
        ci.mark(text[:100], 1.0)  # a hostile mark name
    spans += 1
    with ci.scope(text[:1000]):  # a hostile scope name
        pass
    spans += 1
try:
    with ci.scope("failing"):
        raise ValueError("bad input:\n" + HUGE)
except ValueError:
    pass
spans += 1
ci.mark("huge_on_session", HUGE, kind="summary")
ci.shutdown()
health = handle.health()
sys.stdout.flush()
print("RESULT " + json.dumps({"spans": spans, "health": health}), flush=True)
