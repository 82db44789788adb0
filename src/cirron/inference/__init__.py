"""Inference: ``ci.inference``, LLM calls as OpenTelemetry GenAI spans, and content capture.

Holds ``ci.inference``, the span of one call of a function that serves a model
(``calls``); an LLM call as the GenAI semantic conventions describe it, for
the frameworks' instrumentors to fill in (``genai``: what was asked, the
token counts, the finish reasons, the time to the first token); what a span
may record of a model's inputs and outputs, and in which form (``capture``:
off unless ``ci.profile(capture=...)`` or the environment asks); and the
redaction of secret-looking values from captured text (``redaction``).

May import: :mod:`cirron.otel`, :mod:`cirron.config`, :mod:`cirron.recording`, and modules of
this package. Never a framework: the instrumentors translate theirs into what is here.
"""

from __future__ import annotations

from .api import Inference as Inference
from .api import inference as inference
