"""A lease's opaque id: everything a renewal or release needs (row, fence, holder, kind,
ttl, token), signed with the project's ``SECRET_KEY``. The server keeps no lease in memory:
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

    def dumps(self) -> str:
        return signing.dumps(
            [self.pk, self.fence, self.holder, self.kind, self.ttl, self.token_id], salt=_SALT, compress=True
        )

    @classmethod
    def loads(cls, text: str) -> LeaseRef:
        """The lease an id names; ``ApiError`` 404 for an id this project never gave out."""
        try:
            pk, fence, holder, kind, ttl, token_id = signing.loads(text, salt=_SALT)
            return cls(int(pk), int(fence), str(holder), str(kind), float(ttl), int(token_id))
        except (signing.BadSignature, ValueError, TypeError) as exc:
            raise ApiError(404, "no such lease (the id is not one this server gave out)", field="id") from exc
