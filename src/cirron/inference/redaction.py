"""Secrets out of captured text: what looks like a credential is replaced before it is recorded.

Prompts carry what users paste into them, and that includes API keys. Captured
text (:mod:`cirron.inference.capture`) goes through :func:`redact` first, so a
value that looks like a secret never reaches a span, an event or the spool:
each one is replaced by :data:`REDACTED`, the text around it is kept. What
counts as secret-looking is the list below: provider key formats (OpenAI,
Anthropic, AWS, GitHub, Hugging Face, Google, Slack, Stripe), bearer tokens,
JSON Web Tokens, PEM private keys, and the value of a ``password=`` /
``api_key:`` pair. Redaction runs before the text is cut to its length limit,
so a key is never half-recorded either.
"""

from __future__ import annotations

import functools
import re

REDACTED = "[REDACTED]"

# One alternation, so a text is scanned once, bounded so that ordinary words never match. A
# match is a secret as a whole, except for the two prefixed ones, where only the named group
# is: a bearer token after its keyword, a key pair's value after its name.
_PATTERNS = (
    r"-----BEGIN[A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END[A-Z ]*PRIVATE KEY-----|$)",
    r"\bsk-(?:proj-|ant-|live-|test-)?[A-Za-z0-9_\-]{16,}",  # OpenAI, Anthropic
    r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|AIPA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bgh[pousr]_[A-Za-z0-9]{30,}",  # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",
    r"\bhf_[A-Za-z0-9]{30,}",  # Hugging Face
    r"\bAIza[0-9A-Za-z_\-]{35}",  # Google API keys
    r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack
    r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}",  # Stripe
    r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JSON Web Tokens
    r"\b[Bb]earer\s+(?P<bearer>[A-Za-z0-9._~+/\-]{8,}=*)",  # an Authorization header's
    # `password=...`, `"api_key": "..."`, `secret: ...`
    r"(?i:\b(?:password|passwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token)[\"']?\s*[:=]"
    r"\s*[\"']?)(?P<secret>[^\s\"',;]{6,})",
)


@functools.cache  # compiled at the first redaction (milliseconds), not at ``import cirron``
def _secret() -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{pattern})" for pattern in _PATTERNS))


def _replace(match: re.Match[str]) -> str:
    for group in ("bearer", "secret"):
        start = match.start(group)
        if start >= 0:  # only the secret part of a prefixed match
            return match.string[match.start() : start] + REDACTED
    return REDACTED


def redact(text: str) -> str:
    """``text`` with every secret-looking value replaced by :data:`REDACTED`."""
    return _secret().sub(_replace, text)
