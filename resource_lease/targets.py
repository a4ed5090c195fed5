"""Targets and cooldowns: what a grant is for, and when a resource may next be used for it.

``acquire(kind, target="shop.example")`` grants only a resource whose cooldown for that target
has passed by the database's clock: the grant statement itself checks it (``OWN_TARGET`` in
``db/statements.py``), and the line of waiters sets aside, for each row, the waiters whose
target it is cooling down for (``WAITER_COOLS``), so a waiter never holds up the rows it may
not take. A waiter with a target looks again when the first cooldown of its target ends (no
release tells it). Cooldowns are rows of ``models.Cooldown``, written by a fenced upsert
(``db/cooldowns.py``): ``lease.release(cooldown=s)`` (default: the policy's ``cooldown``),
``lease.report("blocked", retry_after=s)``, and each targeted grant when the kind's policy
caps grants per target (``target_rate=(n, per)``: the times of the last n grants are kept,
and after the n-th the resource cools down until the oldest of them is ``per`` seconds old,
so no ``per`` seconds hold more than n grants). A release moves its grant's time to the
release (``used``), so the window counts each use from its end: a site that counts the
request the holder sent some time after its grant sees no more than n in its own window
either. Other targets are unaffected (docs/learning.md#targets).
"""

from __future__ import annotations

import math
import time
from typing import Any

from django.db.models import DurationField, ExpressionWrapper, F

from resource_lease.db.clock import DbNow
from resource_lease.db.operations import ops
from resource_lease.exceptions import LeaseLost
from resource_lease.models import Cooldown
from resource_lease.validation import check_seconds


def aimed(lease: Any, target: str | None, *, cooldown: float, target_rate: tuple[int, float] | None) -> Any:
    """A grant for ``target``, as its caller gets it: ``lease.target`` set, its release's
    default ``cooldown`` (the kind's policy's), and the grant counted for the policy's
    ``target_rate``."""
    lease.target = target
    if target is None:
        return lease
    lease.default_cooldown = cooldown
    if target_rate is not None:
        count(lease, *target_rate)
    return lease


def count(lease: Any, n: int, per: float) -> None:
    """Count a targeted grant for ``target_rate=(n, per)``: keep the times of its resource's
    last ``n`` grants for the target (the database's clock, as the grant wrote them); after
    the n-th, cool the resource down for the target until the oldest is ``per`` seconds old.
    The lease holds the resource, and the write is fenced, so no other grant of it counts
    meanwhile."""
    at = lease.resource.acquired_at.timestamp()
    engine = ops(lease.using)
    recent = [t for t in engine.cooldowns.read_recent(pk=lease.resource.pk, target=lease.target) if t > at - per]
    recent = [*recent, at][-n:]
    seconds = recent[0] + per - at if len(recent) >= n else 0.0
    key = {"pk": lease.resource.pk, "holder": lease.holder, "fence": lease.fence}
    if not engine.cooldowns.count_grant(**key, target=lease.target, recent=recent, seconds=max(seconds, 0.0)):
        lease.mark_lost("counting its grant for the policy's target_rate found the lease expired or taken")
        return
    lease.counted = (recent, n, per)


def used(lease: Any, cooldown: float) -> None:
    """Before ``lease`` is released: cool its resource down for its target for ``cooldown``
    seconds (0: none) and, if its grant was counted for ``target_rate``, move the grant's time
    to now, so the window counts the use from its end (the holder's request went out between
    the grant and now; a site counts it when it arrives). One fenced write, none if there is
    nothing to write; a lease no longer held writes nothing (``LeaseLost``).

    Now is the database's clock at the grant plus this machine's seconds since the grant was
    sent: never earlier than the database's now (the grant ran after it was sent), so the
    window ends no earlier than the use."""
    if lease.counted is None:
        if cooldown > 0:
            cool(lease, cooldown)
        return
    recent = lease.counted[0]
    now = lease.resource.acquired_at.timestamp() + (time.monotonic() - lease.sent_at)
    _write_used(lease, [*recent[:-1], max(recent[-1], now)], now, cooldown)


def _write_used(lease: Any, recent: list[float], now: float, cooldown: float) -> None:
    """Store ``recent`` (the grant's time moved to ``now``) and the cooldown it and
    ``cooldown`` call for, in one fenced write; ``LeaseLost`` if the lease is no longer held."""
    _, n, per = lease.counted
    window = recent[0] + per - now if len(recent) >= n else 0.0
    key = {"pk": lease.resource.pk, "holder": lease.holder, "fence": lease.fence}
    if not ops(lease.using).cooldowns.count_grant(
        **key, target=lease.target, recent=recent, seconds=max(window, cooldown, 0.0)
    ):
        lease.mark_lost("a release's cooldown found the lease expired or taken: nothing recorded")
        raise LeaseLost(f"{lease!r}: {lease.lost_reason}")


def used_elsewhere(lease: Any, cooldown: float, target_rate: tuple[int, float] | None, now: float) -> None:
    """``used`` for a grant whose count this process did not keep (a lease over HTTP, granted
    in another request): the stored times are read, and the last one, this grant's (the
    resource has been held since, so no grant for the target came after it), moved to
    ``now`` (the database's clock, epoch seconds, read before this call). Without a
    ``target_rate`` only the cooldown, if any."""
    if target_rate is None:
        if cooldown > 0:
            cool(lease, cooldown)
        return
    n, per = target_rate
    recent = ops(lease.using).cooldowns.read_recent(pk=lease.resource.pk, target=lease.target)
    lease.counted = ([*recent[:-1], max(recent[-1], now)] if recent else [now], n, per)
    _write_used(lease, lease.counted[0], now, cooldown)


def release_cooldown(lease: Any, cooldown: float | None) -> float:
    """The cooldown a release of ``lease`` sets for its target, checked (``ValueError``,
    nothing written): ``cooldown`` seconds, else the policy's default; 0 for none. A lease
    without a target takes no ``cooldown``."""
    if cooldown is None:
        return float(getattr(lease, "default_cooldown", 0.0)) if getattr(lease, "target", None) else 0.0
    seconds = check_seconds(cooldown, "cooldown")
    if getattr(lease, "target", None) is None:
        raise ValueError(f"cooldown={cooldown!r}: {lease!r} was not acquired with a target= to cool down for")
    return seconds


def cool(lease: Any, seconds: float) -> None:
    """Cool ``lease``'s resource down for its target for ``seconds`` from now (database
    clock), if the lease is still held: else ``LeaseLost`` (nothing written)."""
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a cooldown must be finite and > 0 seconds, got {seconds!r}")
    key = {"pk": lease.resource.pk, "holder": lease.holder, "fence": lease.fence}
    if not ops(lease.using).cooldowns.cool(**key, target=lease.target, seconds=seconds):
        lease.mark_lost("a cooldown found the lease expired or taken: nothing recorded")
        raise LeaseLost(f"{lease!r}: {lease.lost_reason}")


def live_cooldowns(pks: list[int], using: str) -> dict[int, list[dict[str, Any]]]:
    """The cooldowns still running of the resources ``pks`` (operators' views: the admin,
    ``inspect_pool``): per resource, each target with its end and the seconds left, by the
    database's clock, the longest first."""
    found: dict[int, list[dict[str, Any]]] = {}
    rows = (
        Cooldown.objects.using(using)
        .filter(resource_id__in=pks, until__gt=DbNow())
        .annotate(left=ExpressionWrapper(F("until") - DbNow(), output_field=DurationField()))
        .order_by("-until")
        .values_list("resource_id", "target", "until", "left")
    )
    for pk, target, until, left in rows:
        found.setdefault(pk, []).append({"target": target, "until": until, "left": left})
    return found
