"""A pool that learns: per-kind policies (``pool_policy``) and shared health (``Lease.report``).

Every report is one fenced statement of the leased row (``db/health.py``): the database
computes the new error score and backoff from the row's own values, so concurrent reports
never lose an update, and a report from a lease that is no longer held changes nothing
(``LeaseLost``). A score that reaches the policy's ``error_threshold`` quarantines the resource
automatically for a duration between half and all of ``min(cap, base * 2 ** (level - 1))``
(full jitter), ``level`` counting the automatic quarantines since it was last healthy. The
next grant after such a quarantine is a probation grant (``lease.probation``): its report
decides. A policy's ``max_uses`` and ``max_age`` retire a resource (disabled, reason given)
when a grant finds it due (``retire_due``).

Policies are rows of ``models.PoolPolicy`` (defaults for a kind without one), read through a
cache of ``POLICY_CACHE`` seconds per process: a change made elsewhere is in force here
within that time, at once in the process that made it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from resource_lease import signals, targets
from resource_lease.conf import lease_settings
from resource_lease.db.health_operations import Health
from resource_lease.db.operations import ops
from resource_lease.exceptions import LeaseError, LeaseLost
from resource_lease.forking import at_fork
from resource_lease.models import COORDINATION_PREFIX, PoolPolicy, Resource
from resource_lease.validation import check_alias, check_kind, check_seconds

logger = logging.getLogger("resource_lease")

#: The outcomes ``Lease.report`` takes.
OUTCOMES = ("ok", "error", "blocked")
#: Seconds a process trusts the policy it read (a change elsewhere is in force within this).
POLICY_CACHE = 2.0
# Bounds a policy without max_uses / max_age passes to RETIRE (never reached).
_NO_MAX_USES = 2**62
_NO_MAX_AGE = 1e9


@dataclass(frozen=True)
class Policy:
    """A pool's policy (``pool_policy``). ``backoff`` is ``(base, cap)`` seconds;
    ``target_rate`` ``(n, per)`` or None; ``max_uses`` and ``max_age`` None for never."""

    kind: str
    error_threshold: float = 3.0
    error_decay: float = 0.5
    backoff: tuple[float, float] = (60.0, 3600.0)
    target_rate: tuple[int, float] | None = None
    cooldown: float = 0.0
    session_idle: float = 600.0
    max_uses: int | None = None
    max_age: float | None = None

    def retires(self) -> bool:
        return self.max_uses is not None or self.max_age is not None


_FIELDS = tuple(f.name for f in dataclasses.fields(Policy) if f.name != "kind")
_NOT_GIVEN: Any = object()


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def _pair(value: Any, name: str) -> tuple[Any, Any]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{name} must be a pair, got {value!r}")
    return value[0], value[1]


def check_policy(kind: str, changes: dict[str, Any], current: Policy) -> Policy:
    """``current`` with ``changes`` applied, each checked (``ValueError`` naming it)."""
    values: dict[str, Any] = {}
    for name, value in changes.items():
        if name == "error_threshold":
            if _number(value, name) <= 0:
                raise ValueError(f"error_threshold must be > 0, got {value!r}")
            values[name] = float(value)
        elif name == "error_decay":
            if not 0 <= _number(value, name) < 1:
                raise ValueError(f"error_decay must be in [0, 1), got {value!r}")
            values[name] = float(value)
        elif name == "backoff":
            base, cap = _pair(value, name)
            base, cap = check_seconds(base, "backoff base"), check_seconds(cap, "backoff cap")
            if base > cap:
                raise ValueError(f"backoff base must be <= its cap, got base {base:g} > cap {cap:g}")
            values[name] = (base, cap)
        elif name == "target_rate":
            if value is None:
                values[name] = None
            else:
                n, per = _pair(value, name)
                values[name] = (_count(n, "target_rate n"), check_seconds(per, "target_rate per"))
        elif name == "cooldown":
            values[name] = check_seconds(value, name, allow_zero=True)
        elif name == "session_idle":
            values[name] = check_seconds(value, name)
        elif name == "max_uses":
            values[name] = None if value is None else _count(value, name)
        elif name == "max_age":
            values[name] = None if value is None else check_seconds(value, name)
        else:
            raise ValueError(f"{name} is no policy setting (settings: {', '.join(_FIELDS)})")
    return dataclasses.replace(current, kind=kind, **values)


def _from_row(kind: str, row: tuple[Any, ...] | None) -> Policy:
    if row is None:
        return Policy(kind)
    threshold, decay, base, cap, rate_n, rate_per, cooldown, idle, max_uses, max_age = row
    return Policy(
        kind,
        error_threshold=float(threshold),
        error_decay=float(decay),
        backoff=(float(base), float(cap)),
        target_rate=None if rate_n is None or rate_per is None else (int(rate_n), float(rate_per)),
        cooldown=float(cooldown),
        session_idle=float(idle),
        max_uses=None if max_uses is None else int(max_uses),
        max_age=None if max_age is None else float(max_age),
    )


_cache: dict[tuple[str, str], tuple[float, Policy]] = {}
_cache_lock = threading.Lock()


def forget_policies() -> None:
    """Forget the policies this process has read (a forked child's, tests' between databases)."""
    global _cache_lock
    _cache.clear()
    _cache_lock = threading.Lock()


at_fork(after_in_child=forget_policies)


def policy_of(alias: str, kind: str) -> Policy:
    """The policy of ``kind`` on ``alias`` in force here (cached ``POLICY_CACHE`` seconds)."""
    now = time.monotonic()
    with _cache_lock:
        cached = _cache.get((alias, kind))
    if cached is not None and now - cached[0] < POLICY_CACHE:
        return cached[1]
    policy = _from_row(kind, ops(alias).health.read_policy(kind))
    with _cache_lock:
        _cache[(alias, kind)] = (now, policy)
    return policy


def pool_policy(
    kind: str,
    *,
    using: str | None = None,
    error_threshold: float = _NOT_GIVEN,
    error_decay: float = _NOT_GIVEN,
    backoff: tuple[float, float] = _NOT_GIVEN,
    target_rate: tuple[int, float] | None = _NOT_GIVEN,
    cooldown: float = _NOT_GIVEN,
    session_idle: float = _NOT_GIVEN,
    max_uses: int | None = _NOT_GIVEN,
    max_age: float | None = _NOT_GIVEN,
) -> Policy:
    """The policy of the pool ``kind``; with settings given, those changed (the others kept)
    and stored in the database first. Defaults where never set: ``error_threshold=3.0``,
    ``error_decay=0.5``, ``backoff=(60, 3600)``, ``target_rate=None``, ``cooldown=0``,
    ``session_idle=600``, ``max_uses=None``, ``max_age=None``. Bad input (a threshold <= 0,
    a decay outside [0, 1), a backoff base above its cap, ...): ``ValueError`` naming the
    setting, nothing written."""
    kind = check_kind(kind)
    alias = check_alias(str(lease_settings.DATABASE) if using is None else using)
    given = {
        "error_threshold": error_threshold,
        "error_decay": error_decay,
        "backoff": backoff,
        "target_rate": target_rate,
        "cooldown": cooldown,
        "session_idle": session_idle,
        "max_uses": max_uses,
        "max_age": max_age,
    }
    changes = {name: value for name, value in given.items() if value is not _NOT_GIVEN}
    with _cache_lock:
        _cache.pop((alias, kind), None)
    current = policy_of(alias, kind)
    if not changes:
        return current
    policy = check_policy(kind, changes, current)
    store(alias, policy)
    return policy


def store(alias: str, policy: Policy) -> None:
    """Write ``policy`` (checked) as its kind's row, created race-safely on first use."""
    base, cap = policy.backoff
    rate_n, rate_per = policy.target_rate if policy.target_rate is not None else (None, None)
    fields = {
        "error_threshold": policy.error_threshold,
        "error_decay": policy.error_decay,
        "backoff_base": base,
        "backoff_cap": cap,
        "target_rate_n": rate_n,
        "target_rate_per": rate_per,
        "cooldown": policy.cooldown,
        "session_idle": policy.session_idle,
        "max_uses": policy.max_uses,
        "max_age": policy.max_age,
    }
    rows = PoolPolicy.objects.using(alias)
    for _ in range(2):  # two processes creating a kind's policy at once: one inserts, one updates
        try:
            with transaction.atomic(using=alias):
                if rows.filter(kind=policy.kind).update(**fields):
                    break
                rows.create(kind=policy.kind, **fields)
                break
        except IntegrityError:
            continue
    with _cache_lock:
        _cache.pop((alias, policy.kind), None)


# -- reports ---------------------------------------------------------------------------------


def check_outcome(outcome: Any, retry_after: Any) -> float:
    """The report's arguments, checked: the seconds of ``retry_after`` (0.0 when None)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {', '.join(map(repr, OUTCOMES))}, got {outcome!r}")
    if retry_after is None:
        return 0.0
    if outcome != "blocked":
        raise ValueError(f"retry_after goes with the outcome 'blocked' only, got it with {outcome!r}")
    return check_seconds(retry_after, "retry_after")


def level_as_granted(resource: Resource) -> int | None:
    """A granted row's backoff level, if its grant carried it (a PostgreSQL hand-off and a
    MySQL probe do not: ``level_of`` reads it then)."""
    # A deferred field is one the instance has no value of: what ``get_deferred_fields``
    # tests, without walking every field of the model on every grant.
    return int(resource.backoff_level) if "backoff_level" in resource.__dict__ else None


def level_of(lease: Any) -> int:
    """The backoff level of the lease's resource when it was granted. Where the grant did not
    carry it, read on first use on the engine's connection (not a snapshot of the caller's
    transaction): before any report of this grant, only a report could have changed it."""
    if lease.granted_level is None:
        lease.granted_level = ops(lease.using).health.read_level(lease.resource.pk)
    return int(lease.granted_level)


def report(lease: Any, outcome: str, retry_after: float | None) -> Health:
    """``Lease.report``: the arguments checked (``ValueError``, nothing written), then one
    fenced statement; the resource's health after it. ``LeaseLost`` if the lease is no longer
    held (nothing changed). Only a pool's resources have a health: a lock's, semaphore's or
    election's lease is refused (``LeaseError``), so no report can quarantine a lock."""
    hold = check_outcome(outcome, retry_after)
    if lease.kind.startswith(COORDINATION_PREFIX):
        raise LeaseError(f"{lease!r}: report() is for a pool's resources, not for {lease.kind!r} rows")
    lease.check()
    if hold and getattr(lease, "target", None) is not None:
        # Blocked by one target: the resource cools down for it alone (``targets``), and the
        # report adds to its score as any failure does; it is not quarantined for others.
        targets.cool(lease, hold)
        hold = 0.0
    policy = policy_of(lease.using, lease.kind)
    key = {"pk": lease.resource.pk, "holder": lease.holder, "fence": lease.fence}
    level = level_of(lease)
    if outcome == "ok":
        health = ops(lease.using).health.report_ok(
            **key, probation=lease.probation, level=level, decay=policy.error_decay
        )
    else:
        base, cap = policy.backoff
        health = ops(lease.using).health.report_failure(
            **key,
            probation=lease.probation,
            level=level,
            threshold=policy.error_threshold,
            base=base,
            cap=cap,
            jitter=random.uniform(0.5, 1.0),
            hold=hold,
            reason=f"automatic: {outcome} reported by {lease.holder}"[:500],
            hold_reason=f"{outcome} reported by {lease.holder}, retry after {hold:g}s"[:500],
            outcome=outcome,
        )
    if health is None:
        lease.mark_lost("a report found the lease expired or taken: nothing recorded")
        raise LeaseLost(f"{lease!r}: {lease.lost_reason}")
    quarantined = health.level > level and not lease.tripped
    if quarantined:
        lease.tripped = True
        logger.warning(
            "%r quarantined automatically until %s (level %d, score %.3g) after %r",
            lease,
            health.quarantined_until,
            health.level,
            health.score,
            outcome,
        )
    signals.lease_reported.send(
        sender=Resource,
        lease=lease,
        outcome=outcome,
        quarantined=quarantined,
        score=health.score,
        level=health.level,
        until=health.quarantined_until,
    )
    return health


def retire_due(lease: Any, policy: Policy) -> bool:
    """After a grant: retire its resource if ``policy`` (its kind's, read before the wait:
    nothing is read between a grant and its use) says it is due (``max_uses`` grants,
    ``max_age`` seconds old). True if the grant itself is past the policy (granted after its
    resource was due: the caller gives it back); the ``max_uses``-th grant is kept."""
    if not policy.retires():
        return False
    max_uses = _NO_MAX_USES if policy.max_uses is None else policy.max_uses
    if lease.fence < max_uses and policy.max_age is None:
        return False
    why = []
    if policy.max_uses is not None:
        why.append(f"max_uses {policy.max_uses}")
    if policy.max_age is not None:
        why.append(f"max_age {policy.max_age:g}s")
    reason = f"retired by its policy ({' or '.join(why)} reached)"
    retired = ops(lease.using).health.retire(
        pk=lease.resource.pk,
        max_uses=max_uses,
        max_age=_NO_MAX_AGE if policy.max_age is None else policy.max_age,
        reason=reason,
    )
    if retired:
        logger.info("%s:%s %s", lease.kind, lease.resource.name, reason)
        signals.resource_retired.send(sender=Resource, lease=lease, reason=reason)
    return lease.fence > max_uses or (retired and lease.fence != max_uses)


__all__ = [
    "OUTCOMES",
    "POLICY_CACHE",
    "Policy",
    "check_outcome",
    "forget_policies",
    "policy_of",
    "pool_policy",
    "report",
    "retire_due",
]
