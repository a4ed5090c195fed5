"""Idempotency keys: a retried ``POST leases`` with the same key (same token) finds the grant
of the first attempt, never a second one (docs/http.md#idempotency).

Every attempt with a key records the same holder (``http:<token>:<label>:k<digest>``), and
only one attempt at a time may wait with a key: it claims the key's row
(``claimed_until``, by the database's clock) and keeps the claim fresh while it waits in
line. A claim outlives the place in line of an attempt whose server died (the place lasts
its ttl; the claim, refreshed every ttl/3, lasts ``CLAIM_SPAN`` ttl after its last refresh),
so when the next attempt gets the claim, no grant can still reach the dead attempt's place,
and one that did is read back by its holder (``Resource.live()``) and answered as the lease.
A recorded grant is answered while it is held, and 410 once it is not: a key never grants
twice.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Value

from resource_lease.api.bodies import AcquireBody
from resource_lease.api.errors import ApiError, bad_request
from resource_lease.db.clock import DbNow
from resource_lease.models import Resource
from resource_lease.models.api import ApiToken, IdempotencyKey, http_holder
from resource_lease.models.resource import NEVER

#: A claim lasts this many ttl after its last refresh (refreshed every ttl/3), plus CLAIM_SLACK.
CLAIM_SPAN = 1.5
CLAIM_SLACK = 2.0


def fingerprint(body: AcquireBody) -> str:
    """What a retry must ask again for its key to apply: the kind and the ``where``."""
    text = json.dumps([body.kind, body.where or {}], sort_keys=True)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def key_holder(token: ApiToken, body: AcquireBody) -> str:
    assert body.idempotency_key is not None
    digest = hashlib.sha256(f"{token.pk}\x00{body.idempotency_key}".encode("utf-8", "surrogatepass")).hexdigest()
    return http_holder(token.name, body.holder, "k" + digest[:16])


def _until(seconds: float) -> Any:
    return ExpressionWrapper(
        DbNow() + Value(dt.timedelta(seconds=seconds), output_field=DurationField()), output_field=DateTimeField()
    )


def claim_span(ttl: float) -> float:
    return ttl * CLAIM_SPAN + CLAIM_SLACK


@dataclass(frozen=True)
class Claim:
    """What the key says: ``granted`` (its grant: pk, fence), ``busy`` (another attempt
    waits with it) or ``claimed`` (this attempt may wait: ``attempt`` is its number)."""

    state: str
    row: int
    holder: str
    attempt: int = 0
    pk: int | None = None
    fence: int | None = None


def claim(token: ApiToken, body: AcquireBody) -> Claim:
    """Claim ``body``'s key for this attempt (see the module's docstring); in a worker thread."""
    assert body.idempotency_key is not None
    holder = key_holder(token, body)
    row, _ = IdempotencyKey.objects.get_or_create(
        token=token,
        key=body.idempotency_key,
        defaults={"kind": body.kind, "fingerprint": fingerprint(body), "holder": holder},
    )
    if row.fingerprint != fingerprint(body):
        raise bad_request("idempotency_key", "this idempotency_key was used with another kind or where")
    if row.fence is not None:
        return Claim("granted", row.pk, row.holder, pk=row.resource_id, fence=row.fence)
    won = IdempotencyKey.objects.filter(pk=row.pk, fence__isnull=True, claimed_until__lte=DbNow()).update(
        claimed_until=_until(claim_span(body.ttl)), attempt=F("attempt") + 1
    )
    row.refresh_from_db()
    if row.fence is not None:
        return Claim("granted", row.pk, row.holder, pk=row.resource_id, fence=row.fence)
    if not won:
        return Claim("busy", row.pk, row.holder)
    # A grant an earlier attempt got but never answered (its server died): held by the key's
    # holder. No later grant can reach that attempt's place: its claim has run out.
    found = Resource.objects.live().filter(kind=body.kind, holder=row.holder).order_by("-fence").first()
    if found is not None:
        record(row.pk, row.attempt, found.pk, found.fence)
        return Claim("granted", row.pk, row.holder, pk=found.pk, fence=found.fence)
    return Claim("claimed", row.pk, row.holder, attempt=row.attempt)


def refresh(row: int, attempt: int, ttl: float) -> bool:
    """Keep this attempt's claim (False: it was lost, another attempt took the key over)."""
    return (
        IdempotencyKey.objects.filter(pk=row, attempt=attempt, fence__isnull=True).update(
            claimed_until=_until(claim_span(ttl))
        )
        == 1
    )


def record(row: int, attempt: int, pk: int, fence: int) -> bool:
    """The grant this attempt got, recorded under its key, and the claim let go (False: the
    claim was lost meanwhile, the grant is not this key's and must be given back)."""
    return (
        IdempotencyKey.objects.filter(pk=row, attempt=attempt, fence__isnull=True).update(
            resource_id=pk, fence=fence, claimed_until=NEVER
        )
        == 1
    )


def let_go(row: int, attempt: int) -> None:
    """Let the claim go (the attempt ended without a grant): the next attempt may wait at once."""
    IdempotencyKey.objects.filter(pk=row, attempt=attempt, fence__isnull=True).update(claimed_until=NEVER)


def claim_left(row: int) -> float:
    """Seconds the key's current claim has left, by the database's clock (0 if none)."""
    found = (
        IdempotencyKey.objects.filter(pk=row)
        .annotate(left=ExpressionWrapper(F("claimed_until") - DbNow(), output_field=DurationField()))
        .values_list("left", flat=True)
        .first()
    )
    return max(0.0, found.total_seconds()) if isinstance(found, dt.timedelta) else 0.0


def refuse_busy(left: float) -> ApiError:
    return ApiError(
        423,
        "another request with this idempotency_key is waiting (or its server stopped answering); try again later",
        field="idempotency_key",
        headers={"Retry-After": str(max(1, int(left + 0.999)))},
    )
