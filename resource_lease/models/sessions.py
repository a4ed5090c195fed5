"""``SessionBinding``: the resource a sticky session uses (``acquire(kind, session=...)``)."""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from resource_lease.models.resource import Resource


class SessionBinding(models.Model):
    """A session of a pool bound to one of its resources: ``acquire(kind, session=S)`` grants
    that resource while the binding lives (``last_used`` less than the policy's
    ``session_idle`` ago, by the database's clock), waiting for it in its own line if another
    holds it; a resource that can no longer serve the session (quarantined, disabled, retired,
    deleted, cooling down for the caller's target, not matching its ``where=``) is replaced by
    a new binding (``lease.rebound``)."""

    kind = models.CharField(max_length=100, help_text="The pool.")
    session = models.CharField(max_length=200, help_text="The caller's session (an account, a login, a crawl).")
    resource = models.ForeignKey(
        Resource,
        null=True,
        on_delete=models.SET_NULL,
        related_name="session_bindings",
        help_text="The bound resource (empty: it was deleted; the next grant binds another).",
    )
    last_used = models.DateTimeField(help_text="The binding's last grant (database clock).")

    # Made exact by the migration that creates it (ExactCollation); check W010 keeps watching them.
    exact_text_fields: ClassVar[tuple[str, ...]] = ("kind", "session")

    class Meta:
        ordering = ["kind", "session"]
        constraints = [models.UniqueConstraint(fields=["kind", "session"], name="resource_lease_session_once")]

    def __str__(self) -> str:
        return f"{self.kind}:{self.session}"
