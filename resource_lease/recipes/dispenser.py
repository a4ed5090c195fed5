"""A dispenser of work items: ``Dispenser`` hands out keys (with JSON payloads) to workers.

Each item is claimed the way a resource is leased: by one conditional statement judged by
the database's clock, with a ttl, a claim counter that only goes up (``WorkItem.fence``) and
no cleanup needed when a worker dies. See docs/dispenser.md.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Q

from resource_lease.conf import lease_settings
from resource_lease.db import DbNow
from resource_lease.db.base import Dialect
from resource_lease.db.connections import Disconnected, run, run_repeatable
from resource_lease.db.dispenser import item_statements
from resource_lease.models import DispenserItem
from resource_lease.validation import check_alias, check_seconds, check_text

logger = logging.getLogger("resource_lease")

#: Rows per statement when putting or recreating a pool.
CHUNK = 500
MAX_NAME = 200
MAX_KEY = 255


@dataclass(frozen=True)
class WorkItem:
    """An item ``Dispenser.assign`` handed out: valid while its claim is live.

    ``fence`` is the item's claim counter at this claim: pass the WorkItem (not just its key)
    to ``done``/``fail``/``release`` so a former self of the worker (paused, then restarted
    under the same name) is refused.
    """

    key: str
    payload: Any
    attempts: int
    fence: int = 0
    dispenser: str = ""
    expires_at: dt.datetime | None = field(default=None, compare=False)


def check_name(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    if len(value) > MAX_NAME:
        raise ValueError(f"{name} must be at most {MAX_NAME} characters, got {len(value)}")
    return check_text(value, name)


def check_key(value: Any, name: str = "key") -> str:
    if not isinstance(value, str) or value == "":
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    if len(value) > MAX_KEY:
        raise ValueError(f"{name} must be at most {MAX_KEY} characters, got {len(value)}")
    return check_text(value, name)


def check_count(value: Any, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_payload(value: Any, name: str) -> Any:
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be JSON-serialisable: {exc}") from None
    check_text(text, name)
    return value


def check_pattern(value: Any, name: str = "pattern") -> str | None:
    if value is None:
        return None
    import re

    if not isinstance(value, str):
        raise ValueError(f"{name} must be a regular expression string or None, got {value!r}")
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{name} is not a valid regular expression: {exc}") from None
    return check_text(value, name)


def _statement(method: str, **kwargs: Any) -> Callable[[Dialect, Any], Any]:
    """``ItemStatements.<method>(cursor, **kwargs)`` as a statement for ``run``."""
    return lambda d, c: getattr(item_statements(d), method)(c, **kwargs)


def _tokened(method: str, **kwargs: Any) -> Callable[[Dialect, Any, str], Any]:
    """The same for an outcome statement, which also takes the token it writes."""
    return lambda d, c, token: getattr(item_statements(d), method)(c, token=token, **kwargs)


def _chunks(seq: Sequence[Any], size: int = CHUNK) -> Iterable[Sequence[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


class Dispenser:
    """A named pool of work items, created on first use.

    ``ttl`` is how long a claim lasts unless renewed (by the next ``assign`` or ``renew``);
    ``max_attempts`` how many claims an item gets (an expired claim counts) before it is
    failed. Safe to share between threads; every statement runs on the engine's own
    connection, in autocommit, independent of the caller's transaction
    (docs/pitfalls.md#own-connection).
    """

    def __init__(self, name: str, *, ttl: float | None = None, max_attempts: int = 3, using: str | None = None) -> None:
        self.name = check_name(name, "name")
        self.ttl = check_seconds(300.0 if ttl is None else ttl, "ttl")
        self.max_attempts = check_count(max_attempts, "max_attempts")
        self.using = check_alias(lease_settings.DATABASE if using is None else using)

    def __repr__(self) -> str:
        return f"<Dispenser {self.name!r} ttl={self.ttl:g} max_attempts={self.max_attempts}>"

    # -- filling the pool ------------------------------------------------------------------

    def _items(self, items: Mapping[str, Any] | Iterable[str], name: str) -> list[tuple[str, Any]]:
        if isinstance(items, (str, bytes)):
            raise ValueError(f"{name} must be a mapping of keys to payloads or an iterable of keys, got {items!r}")
        if isinstance(items, Mapping):
            pairs = [(check_key(k, f"{name} key"), check_payload(v, f"{name}[{k!r}]")) for k, v in items.items()]
        else:
            try:
                pairs = [(check_key(k, f"{name} key"), None) for k in items]
            except TypeError:
                raise ValueError(f"{name} must be a mapping or an iterable of keys, got {items!r}") from None
        return pairs

    def put(self, items: Mapping[str, Any] | Iterable[str]) -> int:
        """Add items (keys with JSON payloads, or keys alone); how many keys were new.

        Existing keys are left as they are, whatever their state.
        """
        pairs = self._items(items, "items")
        new = 0
        for chunk in _chunks(pairs):
            # Idempotent (INSERT ... ignoring duplicates): safe to repeat after a lost
            # connection, though a repeat counts as new only what the first run had not added.
            new += run_repeatable(
                self.using,
                _statement("put", dispenser=self.name, items=chunk),
                what=f"putting items into {self.name!r}",
            )
        return new

    def recreate(self, mapping: Mapping[str, Any] | Iterable[str]) -> dict[str, int]:
        """Make the pending pool exactly ``mapping`` (the seed's ``recreate_task_pool``).

        Pending items (and items whose claim expired) not in ``mapping`` are deleted; keys
        assigned to a live worker stay with it, untouched; done and failed keys in ``mapping``
        are queued again with attempts reset; new keys are added. Returns the numbers
        ``{"added", "requeued", "removed"}``.
        """
        pairs = self._items(mapping, "mapping")
        wanted = dict(pairs)
        items = DispenserItem.objects.using(self.using).filter(dispenser=self.name)
        removed = 0
        stale = [
            pk
            for pk, key in items.filter(
                Q(state=DispenserItem.PENDING) | Q(state=DispenserItem.ASSIGNED, expires_at__lte=DbNow())
            ).values_list("id", "key")
            if key not in wanted
        ]
        for chunk in _chunks(stale):
            removed += run_repeatable(
                self.using,
                _statement("delete_unclaimed", dispenser=self.name, ids=chunk),
                what=f"recreating {self.name!r}",
            )
        requeued = 0
        keys = list(wanted)
        for chunk in _chunks(keys):
            now = DbNow()
            rows = items.filter(key__in=chunk).annotate(
                live=Count("id", filter=Q(state=DispenserItem.ASSIGNED, expires_at__gt=now))
            )
            for key, state, payload, live in rows.values_list("key", "state", "payload", "live"):
                if live or (state == DispenserItem.PENDING and payload == wanted[key]):
                    continue
                requeued += run_repeatable(
                    self.using,
                    _statement("requeue", dispenser=self.name, key=key, payload=wanted[key]),
                    what=f"recreating {self.name!r}",
                )
        added = self.put(wanted)
        return {"added": added, "requeued": requeued, "removed": removed}

    # -- claims ------------------------------------------------------------------------------

    def assign(self, worker: str, limit: int = 1, *, pattern: str | None = None) -> list[WorkItem]:
        """Claim work for ``worker``: its own unfinished items first, then new ones up to
        ``limit`` (pending items oldest first, then items whose claim expired).

        Every returned item is claimed afresh: a new fence, the claim renewed for ``ttl``.
        Own items beyond ``limit`` go back to the pool. ``pattern`` (a regular expression,
        matched against the whole key by the database) restricts which new items are taken.
        """
        worker = check_name(worker, "worker")
        limit = check_count(limit, "limit")
        pattern = check_pattern(pattern)
        # Own items are claimed under one token, new ones under another: the read-back by
        # these tokens returns the own ones first.
        own_token, token = secrets.token_hex(16), secrets.token_hex(16)
        name, ttl, max_attempts = self.name, self.ttl, self.max_attempts
        what = f"assigning items of {name!r} to {worker!r}"
        try:
            got = run(
                self.using,
                lambda d, c: item_statements(d).reclaim_own(
                    c, dispenser=name, worker=worker, token=own_token, ttl=ttl, max_attempts=max_attempts
                ),
                what=what,
            )
            if got < limit:
                got += run(
                    self.using,
                    lambda d, c: item_statements(d).claim_pending(
                        c, dispenser=name, worker=worker, token=token, ttl=ttl, n=limit - got, pattern=pattern
                    ),
                    what=what,
                )
            if got < limit:
                run(
                    self.using,
                    lambda d, c: item_statements(d).fail_expired(c, dispenser=name, max_attempts=max_attempts),
                    what=what,
                )
                got += run(
                    self.using,
                    lambda d, c: item_statements(d).claim_expired(
                        c,
                        dispenser=name,
                        worker=worker,
                        token=token,
                        ttl=ttl,
                        n=limit - got,
                        pattern=pattern,
                        max_attempts=max_attempts,
                    ),
                    what=what,
                )
        except Disconnected as exc:
            # A connection lost during a statement's commit leaves its outcome unknown, and
            # running it again blindly could claim twice: whatever this assign claimed
            # carries its token, so the read below settles it (docs/pitfalls.md#unknown-outcome).
            logger.warning("connection lost while %s; settling by reading back: %s", what, exc)
        rows = run_repeatable(
            self.using,
            lambda d, c: item_statements(d).claimed(c, dispenser=name, worker=worker, tokens=(own_token, token)),
            what=what,
        )
        items = [
            WorkItem(key, payload, attempts, fence, name, expiry) for _pk, key, payload, attempts, fence, expiry in rows
        ]
        if len(items) > limit:
            self.release(worker, items[limit:])
            items = items[:limit]
        return items

    def _outcomes(
        self, method: str, worker: str, keys: list[str], fences: list[int] | None, what: str, **extra: Any
    ) -> int:
        """Run the outcome statement ``method`` over ``keys`` (and their fences) in chunks;
        how many rows it changed in all."""
        total = 0
        for i, chunk in enumerate(_chunks(keys)):
            fchunk = None if fences is None else fences[i * CHUNK : (i + 1) * CHUNK]
            statement = _tokened(method, dispenser=self.name, worker=worker, keys=chunk, fences=fchunk, **extra)
            total += self._outcome(worker, statement, what)
        return total

    def _outcome(self, worker: str, statement: Any, what: str) -> int:
        """Run an outcome statement ``statement(dialect, cursor, token)`` that writes a fresh
        token on the rows it changes; a count lost with the connection is settled by running
        it again (it matches nothing the first run changed) and counting the token's rows."""
        token = secrets.token_hex(16)
        try:
            return int(run(self.using, lambda d, c: statement(d, c, token), what=what))
        except Disconnected as exc:
            logger.warning("connection lost while %s; settling by reading back: %s", what, exc)

        def settle(d: Any, c: Any) -> int:
            statement(d, c, token)
            return item_statements(d).count_token(c, dispenser=self.name, worker=worker, token=token)

        return int(run_repeatable(self.using, settle, what=what))

    def _keys(self, items: Iterable[str | WorkItem], name: str = "keys") -> tuple[list[str], list[int] | None]:
        if isinstance(items, (str, WorkItem)):
            items = [items]
        keys: list[str] = []
        fences: list[int] = []
        kinds = set()
        for item in items:
            if isinstance(item, WorkItem):
                kinds.add("item")
                keys.append(check_key(item.key, name))
                fences.append(item.fence)
            else:
                kinds.add("key")
                keys.append(check_key(item, name))
        if len(kinds) > 1:
            raise ValueError(f"{name} must be all keys or all WorkItems, not a mix")
        if len(set(keys)) != len(keys):
            raise ValueError(f"{name} must not repeat a key")
        return keys, (fences if kinds == {"item"} else None)

    def done(self, worker: str, keys: Iterable[str | WorkItem], result: Any = None) -> int:
        """Mark items done; how many were: only live claims of ``worker`` count (with the
        fence checked too when given WorkItems). A refused item keeps the state another
        worker gave it."""
        worker = check_name(worker, "worker")
        key_list, fences = self._keys(keys)
        result = check_payload(result, "result")
        return self._outcomes(
            "done", worker, key_list, fences, f"marking items of {self.name!r} done for {worker!r}", result=result
        )

    def fail(self, worker: str, keys: Iterable[str | WorkItem], error: str = "") -> int:
        """Give items back as failed attempts: to the pool, or failed for good once their
        attempts reach ``max_attempts``. Counts only live claims of ``worker``."""
        worker = check_name(worker, "worker")
        key_list, fences = self._keys(keys)
        if not isinstance(error, str):
            raise ValueError(f"error must be a string, got {error!r}")
        error = check_text(error, "error")
        return self._outcomes(
            "fail",
            worker,
            key_list,
            fences,
            f"failing items of {self.name!r} for {worker!r}",
            error=error,
            max_attempts=self.max_attempts,
        )

    def release(self, worker: str, keys: Iterable[str | WorkItem] | None = None) -> int:
        """Give the worker's live claims (all, or these) back to the pool, not counted as
        attempts: a graceful stop. How many were given back."""
        worker = check_name(worker, "worker")
        key_list, fences = ([], None) if keys is None else self._keys(keys)
        if keys is not None and not key_list:
            return 0
        chunks = list(_chunks(key_list)) or [[]]
        total = 0
        for i, chunk in enumerate(chunks):
            fchunk = None if fences is None else fences[i * CHUNK : (i + 1) * CHUNK]
            total += self._outcome(
                worker,
                _tokened("release", dispenser=self.name, worker=worker, keys=chunk, fences=fchunk),
                f"releasing items of {self.name!r} held by {worker!r}",
            )
        return total

    def retry_failed(self, keys: Iterable[str] | None = None) -> int:
        """Queue failed items (all, or these keys) again with attempts reset; how many.
        The last error stays on the item until its next outcome."""
        key_list, _ = ([], None) if keys is None else self._keys(keys)
        if keys is not None and not key_list:
            return 0
        return sum(
            run_repeatable(
                self.using,
                _statement("retry_failed", dispenser=self.name, keys=chunk),
                what=f"retrying failed items of {self.name!r}",
            )
            for chunk in (list(_chunks(key_list)) or [[]])
        )

    def renew(self, worker: str, keys: Iterable[str | WorkItem] | None = None) -> int:
        """Extend the worker's live claims (all, or these) by ``ttl`` from now; how many."""
        worker = check_name(worker, "worker")
        key_list, fences = ([], None) if keys is None else self._keys(keys)
        if keys is not None and not key_list:
            return 0
        total = 0
        for i, chunk in enumerate(list(_chunks(key_list)) or [[]]):
            fchunk = None if fences is None else fences[i * CHUNK : (i + 1) * CHUNK]
            total += run_repeatable(
                self.using,
                _statement("renew", dispenser=self.name, worker=worker, keys=chunk, fences=fchunk, ttl=self.ttl),
                what=f"renewing items of {self.name!r} held by {worker!r}",
            )
        return total

    def check(self, worker: str, keys: Iterable[str | WorkItem]) -> bool:
        """True when these are exactly the worker's live claims (and fences, for WorkItems)."""
        worker = check_name(worker, "worker")
        key_list, fences = self._keys(keys)
        claims = run_repeatable(
            self.using,
            lambda d, c: item_statements(d).live_claims(c, dispenser=self.name, worker=worker),
            what=f"checking items of {self.name!r} held by {worker!r}",
        )
        if fences is None:
            return sorted(k for k, _ in claims) == sorted(key_list)
        return sorted(claims) == sorted(zip(key_list, fences, strict=True))

    # -- reading -----------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """``{"pending", "assigned", "done", "failed"}`` by the database's clock: an expired
        claim counts as pending (or failed when its attempts are used up)."""
        return dispenser_counts(self.using, name=self.name, max_attempts=self.max_attempts).get(
            self.name, {"pending": 0, "assigned": 0, "done": 0, "failed": 0}
        )

    def is_empty(self) -> bool:
        """Whether nothing is pending or assigned (``run(until_empty=True)`` stops then)."""
        return not (
            DispenserItem.objects.using(self.using)
            .filter(dispenser=self.name, state__in=[DispenserItem.PENDING, DispenserItem.ASSIGNED])
            .exists()
        )

    def items(self, *, state: str | None = None) -> list[DispenserItem]:
        rows = DispenserItem.objects.using(self.using).filter(dispenser=self.name).order_by("id")
        if state is not None:
            rows = rows.filter(state=state)
        return list(rows)


def dispenser_counts(
    using: str, *, name: str | None = None, max_attempts: int | None = None
) -> dict[str, dict[str, int]]:
    """Per dispenser: pending, assigned, done, failed (expired claims as pending, or as
    failed when their attempts reached ``max_attempts``; without it, as pending)."""
    now = DbNow()
    expired = Q(state=DispenserItem.ASSIGNED, expires_at__lte=now)
    used_up = expired & Q(attempts__gte=max_attempts) if max_attempts is not None else Q(pk__in=[])
    rows = DispenserItem.objects.using(using)
    if name is not None:
        rows = rows.filter(dispenser=name)
    per = (
        rows.values("dispenser")
        .annotate(
            pending=Count("id", filter=Q(state=DispenserItem.PENDING) | (expired & ~used_up)),
            assigned=Count("id", filter=Q(state=DispenserItem.ASSIGNED, expires_at__gt=now)),
            done=Count("id", filter=Q(state=DispenserItem.DONE)),
            failed=Count("id", filter=Q(state=DispenserItem.FAILED) | used_up),
        )
        .order_by("dispenser")
    )
    return {row["dispenser"]: {k: int(row[k]) for k in ("pending", "assigned", "done", "failed")} for row in per}
