"""A lease's opaque id: everything a renewal, release or report needs (row, fence, holder,
kind, ttl, token, the resource's backoff level as granted, its target), signed with the project's
``SECRET_KEY``. The server keeps no lease in memory:
any server process of the project answers for any lease, and every renewal and release is
conditional on the row's holder and fence, so a stale id can never touch a later grant."""

from __future__ import annotations

from dataclasses import dataclass

from django.core import signing

from resource_lease.api.errors import ApiError

_SALT = "resource_lease.api.lease"


@dataclass(frozen=True)
class LeaseRef:
    pk: int
    fence: int
    holder: str
    kind: str
    ttl: float
    token_id: int
    #: The resource's backoff level when it was granted (a report judges a probation grant by
    #: it: docs/learning.md#health); None where the grant did not say (read when reported).
    level: int | None = None
    #: What the grant is for (``acquire(target=...)``): a release's cooldown and a report of
    #: "blocked" cool the resource down for it (docs/learning.md#targets).
    target: str | None = None

    def dumps(self) -> str:
        fields = [self.pk, self.fence, self.holder, self.kind, self.ttl, self.token_id, self.level, self.target]
        return signing.dumps(fields, salt=_SALT, compress=True)

    @classmethod
    def loads(cls, text: str) -> LeaseRef:
        """The lease an id names; ``ApiError`` 404 for an id this project never gave out."""
        try:
            pk, fence, holder, kind, ttl, token_id, level, *rest = signing.loads(text, salt=_SALT)
            target = rest[0] if rest else None  # ids given out before targets have none
            return cls(
                int(pk),
                int(fence),
                str(holder),
                str(kind),
                float(ttl),
                int(token_id),
                None if level is None else int(level),
                None if target is None else str(target),
            )
        except (signing.BadSignature, ValueError, TypeError) as exc:
            raise ApiError(404, "no such lease (the id is not one this server gave out)", field="id") from exc
