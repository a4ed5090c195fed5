"""The HTTP API's tables: ``ApiToken`` (who may call it) and ``IdempotencyKey`` (what a
retried acquire must find again). See docs/http.md.

A token is stored as the SHA-256 digest of its text: the text is shown once, when it is made
(``lease_token create`` or the admin), and cannot be read back. Tokens are revoked, never
deleted by the API, so a name is never reused by another token (a lease's holder names its
token: ``http:<token name>:...``).
"""

from __future__ import annotations

import hashlib
import secrets
from typing import ClassVar

from django.core.validators import RegexValidator
from django.db import models

from resource_lease.models.resource import _never

#: What every token's text starts with (so a leaked one is recognisable in logs and scanners).
TOKEN_PREFIX = "rl_"

#: A token's name: it is part of the holder recorded on every grant it takes.
token_name_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
    "A token's name is 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit.",
)


def token_digest(text: str) -> str:
    """The stored form of a token's text (tokens are random: a fast digest suffices)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def parse_kinds(text: str) -> list[str]:
    """``"gpu, proxy"`` -> ``["gpu", "proxy"]`` (empty: every kind)."""
    return sorted({part.strip() for part in text.split(",") if part.strip()})


class ApiToken(models.Model):
    """A bearer token of the HTTP API, limited to some kinds (none listed: every kind)."""

    name = models.CharField(
        max_length=64,
        unique=True,
        validators=[token_name_validator],
        help_text="Recorded in the holder of every lease this token takes (http:<name>:...).",
    )
    digest = models.CharField(max_length=64, unique=True, editable=False, help_text="SHA-256 of the token's text.")
    prefix = models.CharField(max_length=12, editable=False, help_text="The token's first characters, to recognise it.")
    kinds = models.CharField(
        max_length=1000,
        blank=True,
        help_text="Comma-separated kinds this token may lease; empty: every kind.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="Updated at most once a minute."
    )
    revoked_at = models.DateTimeField(null=True, blank=True, help_text="Set: the token is refused (401).")

    class Meta:
        ordering: ClassVar[list[str]] = ["name"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return self.name

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def kind_list(self) -> list[str]:
        return parse_kinds(self.kinds)

    def allows(self, kind: str) -> bool:
        kinds = self.kind_list()
        return not kinds or kind in kinds

    def set_new_secret(self) -> str:
        """Give the token a new random text; returns it (the only time it can be read)."""
        text = TOKEN_PREFIX + secrets.token_urlsafe(32)
        self.digest = token_digest(text)
        self.prefix = text[:10]
        return text


class IdempotencyKey(models.Model):
    """One ``idempotency_key`` of one token: the request it named (``fingerprint``), the
    holder every attempt with it records (the same, so a grant made by a server that died before
    answering is found again), a claim on the key while one attempt waits (``claimed_until``,
    by the database's clock, refreshed while it waits) and the grant it got."""

    token = models.ForeignKey(ApiToken, on_delete=models.CASCADE, related_name="idempotency_keys")
    key = models.CharField(max_length=200)
    kind = models.CharField(max_length=100)
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of the request's kind and where.")
    holder = models.CharField(max_length=255)
    attempt = models.IntegerField(default=0, help_text="How many attempts have claimed the key.")
    claimed_until = models.DateTimeField(default=_never, help_text="An attempt waits with this key until then.")
    resource_id = models.BigIntegerField(null=True, blank=True, help_text="The resource granted, once granted.")
    fence = models.BigIntegerField(null=True, blank=True, help_text="The grant's fence, once granted.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.UniqueConstraint(fields=["token", "key"], name="resource_lease_idempotency_key_unique"),
        ]
        verbose_name = "idempotency key"

    def __str__(self) -> str:
        return f"{self.token_id}:{self.key}"

    @property
    def granted(self) -> bool:
        return self.fence is not None


#: Every holder of a lease taken over HTTP starts with this (then the token's name).
HTTP_HOLDER_PREFIX = "http:"


def http_holder(token_name: str, label: str | None, nonce: str) -> str:
    """The holder recorded on a grant made over HTTP: ``http:<token>:<label>:<nonce>``
    (``label``: the client's ``holder``, else ``-``; the nonce tells grants apart)."""
    return f"{HTTP_HOLDER_PREFIX}{token_name}:{label or '-'}:{nonce}"[:255]


def is_http_holder(holder: str) -> bool:
    """Whether a row's holder is a lease taken over HTTP (the admin, ``inspect_pool``)."""
    return holder.startswith(HTTP_HOLDER_PREFIX)


def http_token_name(holder: str) -> str:
    """The name of the token that took a lease over HTTP (its holder's second part)."""
    return holder[len(HTTP_HOLDER_PREFIX) :].split(":", 1)[0]
