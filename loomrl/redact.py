"""Secrets out of URLs before they reach errors, logs, reprs or a run's ``config.toml``.

A URL's userinfo (``user:pass@``, or a token standing alone before ``@``) becomes
``***@`` and the value of every secret-looking key in its query (or in a ``k=v``
fragment such as ``#access_token=...``) becomes ``***``. A key looks secret when one
of its words (split at ``_``, ``-``, ``.`` and camelCase), or all of them joined, is in
``SECRET_WORDS``, in any case: ``token``, ``api_key``, ``apiKey``, ``X-Amz-Signature``,
``client_secret`` and ``sig`` are; ``keyword`` and ``design`` are not. Everything else
is kept as written, so a URL without secrets comes back unchanged. The parsing is plain
string work (no ``urlsplit``, which refuses some malformed hosts): a URL that is not
well formed is still redacted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_plus

MASK = "***"
SECRET_WORDS = frozenset(
    {
        "token", "key", "apikey", "secret", "password", "passwd", "pwd", "passphrase",
        "sig", "signature", "auth", "authorization", "credential", "credentials",
        "accesstoken", "apitoken", "authtoken",
    }
)  # fmt: skip
_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*+://"
_URL = re.compile(_SCHEME + r"[^\s/?#]\S*+")
# A URL in free text: a scheme that starts a word, then no space or quote. The lookbehind
# lets each run of scheme characters be tried once, so the search is linear in the text.
_URL_IN_TEXT = re.compile(r"(?<![A-Za-z0-9+.\-])" + _SCHEME + r"[^\s'\"<>`]++")
_TRAILING = ".,;:!?)]}"  # sentence punctuation after a URL in text is not part of it
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_AUTHORITY_END = re.compile(r"[/?#]")


def is_url(value: str) -> bool:
    """Whether ``value`` is one URL with a scheme and a host (``https://h/...``)."""
    return _URL.fullmatch(value) is not None


def secret_key(key: str) -> bool:
    """Whether a query key names a secret (see the module docstring)."""
    words = [w.lower() for w in _WORD.findall(key)]
    return any(w in SECRET_WORDS for w in words) or "".join(words) in SECRET_WORDS


def redact_url(url: str) -> str:
    """``url`` with its userinfo and secret query/fragment values masked (else unchanged)."""
    scheme_end = url.find("://")
    if scheme_end < 0:
        return url
    start = scheme_end + 3
    end_match = _AUTHORITY_END.search(url, start)
    end = end_match.start() if end_match else len(url)
    authority = url[start:end]
    if "@" in authority:
        authority = f"{MASK}@{authority.rpartition('@')[2]}"
    rest, hash_mark, fragment = url[end:].partition("#")
    path, question_mark, query = rest.partition("?")
    return (
        url[:start]
        + authority
        + path
        + question_mark
        + _redact_pairs(query)
        + hash_mark
        + _redact_pairs(fragment)
    )


def redact_text(text: str) -> str:
    """Free text (an error message, a log line) with every URL in it redacted."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(_redact_match, text)


def redact_value(value: Any) -> Any:
    """A config value with every string that is a URL redacted, in nested dicts and lists."""
    if isinstance(value, str):
        return redact_url(value) if is_url(value) else value
    if isinstance(value, Mapping):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(redact_value(v) for v in value)
    return value


def _redact_match(match: re.Match[str]) -> str:
    found = match.group()
    url = found.rstrip(_TRAILING)
    return redact_url(url) + found[len(url) :]


def _redact_pairs(text: str) -> str:
    """``k=v&k2=v2`` with the values of secret keys masked."""
    if "=" not in text:
        return text
    return "&".join(_redact_pair(pair) for pair in text.split("&"))


def _redact_pair(pair: str) -> str:
    key, sep, value = pair.partition("=")
    return f"{key}={MASK}" if sep and value and secret_key(unquote_plus(key)) else pair
