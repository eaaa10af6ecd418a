"""Secrets a task declares (``environment.required_env_keys``): passed in, never written out.

The sandbox hands each declared key's value to the agent's commands; every
text that leaves the trial (observations kept in trajectories, logs,
telemetry attributes, dumps) goes through :func:`redact` first.
"""
from __future__ import annotations

import base64
import logging
from collections.abc import Mapping
from typing import Any

from rl.errors import TaskError

REDACTED = "[REDACTED:{key}]"
MIN_SECRET_CHARS = 4   # shorter values would redact ordinary words; refuse them instead


def collect_secrets(keys: tuple[str, ...] | list[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The values of a task's required env keys; a missing or too-short value is a TaskError."""
    missing = [k for k in keys if not environ.get(k)]
    if missing:
        raise TaskError(f"task requires env keys {missing} that are not set; export them before "
                        "starting the run", missing=missing)
    short = [k for k in keys if len(environ[k]) < MIN_SECRET_CHARS]
    if short:
        raise TaskError(f"secret env keys {short} hold fewer than {MIN_SECRET_CHARS} characters; "
                        "they could not be redacted safely", short=short)
    return {k: environ[k] for k in keys}


def encoded_forms(value: str) -> list[str]:
    """``value`` and the encodings an agent could use to smuggle it out: reversed, hex (both
    cases), base64 and urlsafe base64 at each of the three byte alignments (the part of the
    encoding that depends on the secret alone, so it is found inside a longer encoded text)."""
    raw = value.encode()
    forms = [value, value[::-1], raw.hex(), raw.hex().upper()]
    for enc in (base64.b64encode, base64.urlsafe_b64encode):
        for pad in range(3):
            coded = enc(b"\0" * pad + raw).decode()
            start, stop = (0, 2, 3)[pad], (8 * (pad + len(raw))) // 6
            piece = coded[start:stop]
            if len(piece) >= MIN_SECRET_CHARS + 2:
                forms.append(piece)
    return list(dict.fromkeys(f for f in forms if f))


def redact(text: str, secrets: Mapping[str, str]) -> str:
    """``text`` with every secret value, and each of its :func:`encoded_forms`, replaced by
    ``[REDACTED:<key>]`` (longest first, so a secret that contains another is replaced whole)."""
    pairs = [(form, key) for key, value in secrets.items() if value for form in encoded_forms(value)]
    for form, key in sorted(pairs, key=lambda fk: -len(fk[0])):
        text = text.replace(form, REDACTED.format(key=key))
    return text


def redact_obj(obj: Any, secrets: Mapping[str, str]) -> Any:
    """:func:`redact` applied to every string inside nested dicts/lists/tuples (for dumps)."""
    if isinstance(obj, str):
        return redact(obj, secrets)
    if isinstance(obj, Mapping):
        return {redact_obj(k, secrets): redact_obj(v, secrets) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_obj(v, secrets) for v in obj)
    return obj


class RedactingFilter(logging.Filter):
    """A logging filter that redacts secrets from each record's rendered message."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        super().__init__()
        self.secrets = dict(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage(), self.secrets)
        record.args = None
        return True
