"""A grant held by an HTTP client, as ``health.report`` sees a lease.

The server keeps no lease in memory: a report names its grant by the signed lease id
(``LeaseRef``: row, holder, fence, and the resource's backoff level as granted, which decides
whether the grant is a probation grant). The report's statement is fenced like a renewal, so a
report from a grant no longer held changes nothing (``LeaseLost``, answered 410).
"""

from __future__ import annotations

from types import SimpleNamespace

from resource_lease import health
from resource_lease.api.ids import LeaseRef


class ReportedGrant:
    """What ``health.report`` asks of a lease, for a grant named by its id."""

    def __init__(self, ref: LeaseRef, alias: str) -> None:
        self.kind = ref.kind
        self.using = alias
        self.resource = SimpleNamespace(pk=ref.pk)
        self.holder = ref.holder
        self.fence = ref.fence
        #: None: not carried by the grant (an idempotent replay): ``health.level_of`` reads it.
        self.granted_level = ref.level
        #: What the grant is for: a report of "blocked" cools the resource down for it.
        self.target = ref.target
        #: One report of a grant trips at most one quarantine (judged by the statement itself:
        #: this only keeps the log line to the first).
        self.tripped = False
        self.lost_reason: str | None = None
        #: What the release's write stores for the policy's target_rate (``targets.used_elsewhere``).
        self.counted: tuple[list[float], int, float] | None = None

    def __repr__(self) -> str:
        return f"<grant {self.fence} of row {self.resource.pk} over HTTP, holder {self.holder!r}>"

    def check(self) -> None:
        """The server keeps no deadline: the report's statement is fenced (held or nothing)."""

    @property
    def probation(self) -> bool:
        return health.level_of(self) > 0

    def mark_lost(self, reason: str) -> None:
        self.lost_reason = reason
