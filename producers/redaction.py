"""What of the training command line may leave the process: argv with secrets redacted.

The ``run_start`` event records the command line so that a violation can be traced
back to the exact invocation, but command lines carry credentials (``--api-key sk-…``,
``DB_PASSWORD=…``, ``https://user:pass@host``) and events reach Kafka and trace files
that many people can read.  So by default every value that looks secret is replaced by
`REDACTED`; ``TRAINWATCH_RECORD_FULL_ARGV=1`` opts in to the verbatim command line.

Secret-looking means: the value of an option or ``KEY=VALUE`` whose name ends in a
secret word (``--hf-token``, ``--db-password``, ``wandb.api_key=``), the password of a
URL and secret-named query parameters, and tokens that are secret by their shape
(well-known key prefixes such as ``sk-`` or ``ghp_``, long high-entropy strings).
Redaction errs towards hiding: a hidden harmless value costs less than a leaked key.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from typing import Mapping, Sequence
from urllib.parse import parse_qsl, urlsplit, urlunsplit

ENV_RECORD_FULL_ARGV = "TRAINWATCH_RECORD_FULL_ARGV"
REDACTED = "<redacted>"

_SECRET_WORDS = frozenset({
    "password", "passwd", "pwd", "passphrase", "secret", "token", "credential", "credentials",
    "apikey", "secretkey", "accesskey", "privatekey", "sig", "signature",
})
#: ``<qualifier>-key`` names a secret (``--api-key``); a bare ``--key`` may be a column name.
_KEY_QUALIFIERS = frozenset({"api", "access", "secret", "private", "auth", "signing", "encryption", "client"})
_NAME_PARTS = re.compile(r"[^a-z0-9]+")
_OPTION = re.compile(r"^(-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*)(=(.*))?$", re.DOTALL)
_ASSIGNMENT = re.compile(r"^(\+{0,2}[A-Za-z_][A-Za-z0-9_.-]*)=(.*)$", re.DOTALL)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")
_KNOWN_PREFIXES = re.compile(
    r"(?:sk-|sk_live_|rk_live_|ghp_|gho_|ghu_|ghs_|github_pat_|glpat-|hf_|xox[abprs]-|AKIA|ASIA|AIza)"
    r"[A-Za-z0-9_\-]{16,}"
    r"|eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"  # a JSON web token
)
_LONG_TOKEN = re.compile(r"[A-Za-z0-9_\-+=]{32,}")  # no "/": path components stay
#: Bits per character above which a long mixed-case alphanumeric run is a key, not a word.
_ENTROPY_BITS = 4.0


def recorded_argv(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """The command line as ``run_start`` records it: redacted unless the user opted in."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV_RECORD_FULL_ARGV, "").strip().lower() in {"1", "true", "yes", "on"}:
        return list(argv)
    return redact_argv(argv)


def redact_argv(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    secret_value_next = False
    for arg in argv:
        if secret_value_next and arg != "--":
            secret_value_next = False
            if not arg.startswith("--"):
                out.append(REDACTED)
                continue
        secret_value_next = False
        option = _OPTION.match(arg)
        if option and is_secret_name(option.group(1)):
            if option.group(2) is None:
                secret_value_next = True
                out.append(arg)
            else:
                out.append(f"{option.group(1)}={REDACTED}")
            continue
        assignment = _ASSIGNMENT.match(arg)
        if assignment and is_secret_name(assignment.group(1)):
            out.append(f"{assignment.group(1)}={REDACTED}")
            continue
        out.append(redact_text(arg))
    return out


def is_secret_name(name: str) -> bool:
    """``--hf-token``, ``DB_PASSWORD``, ``wandb.api_key``: the last word names a secret."""
    parts = [p for p in _NAME_PARTS.split(name.lower()) if p]
    if not parts:
        return False
    last = parts[-1]
    if last in _SECRET_WORDS:
        return True
    return last == "key" and len(parts) > 1 and parts[-2] in _KEY_QUALIFIERS


def redact_text(text: str) -> str:
    """Secrets inside one argument: URL credentials, then tokens secret by their shape."""
    text = _URL.sub(lambda m: _redact_url(m.group(0)), text)
    text = _KNOWN_PREFIXES.sub(REDACTED, text)
    return _LONG_TOKEN.sub(lambda m: REDACTED if _looks_random(m.group(0)) else m.group(0), text)


def _redact_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    netloc = parts.netloc
    if password is not None:
        netloc = f"{parts.username or ''}:{REDACTED}@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_name(key) for key, _ in pairs):
            query = "&".join(f"{key}={REDACTED if is_secret_name(key) else value}" for key, value in pairs)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _looks_random(token: str) -> bool:
    """Mixed case and digits with high per-character entropy: a generated key, not prose."""
    if not (any(c.islower() for c in token) and any(c.isupper() for c in token) and any(c.isdigit() for c in token)):
        return False
    counts = Counter(token)
    entropy = -sum(n / len(token) * math.log2(n / len(token)) for n in counts.values())
    return entropy >= _ENTROPY_BITS
