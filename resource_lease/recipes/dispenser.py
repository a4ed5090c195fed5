"""A dispenser of work items: ``Dispenser`` hands out keys (with JSON payloads) to workers.

Each item is claimed the way a resource is leased: by one conditional statement judged by
the database's clock, with a ttl, a claim counter that only goes up (``WorkItem.fence``) and
no cleanup needed when a worker dies. See docs/dispenser.md.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Q

from resource_lease.conf import lease_settings
from resource_lease.db import dispenser as item_sql
from resource_lease.db.clock import DbNow
from resource_lease.db.connections import database_errors
from resource_lease.db.operations import ops
from resource_lease.doorbell import Doorbell
from resource_lease.models import DispenserItem
from resource_lease.offload import async_twin
from resource_lease.validation import check_json, check_name, check_text, resolve_ttl, resolve_using

logger = logging.getLogger("resource_lease")

#: Rows per statement when putting or recreating a pool.
CHUNK = 500
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


def check_key(value: Any, name: str = "key") -> str:
    if not isinstance(value, str) or value == "":
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    if len(value) > MAX_KEY:
        raise ValueError(f"{name} must be at most {MAX_KEY} characters, got {len(value)}")
    return check_text(value, name)


def check_file_key(value: Any, name: str = "key") -> str:
    """A key that is one plain file name, as a ``FolderWorker``'s keys must be (its task
    file is ``<key>.<extension>`` in its folder): a key (``check_key``) with no ``/`` or
    ``\\`` and not ``.`` or ``..``, so that no key names a file outside the folder
    (``manage.py enqueue --file-names`` refuses the others)."""
    key = check_key(value, name)
    if key in (".", "..") or "/" in key or "\\" in key:
        raise ValueError(f"{name} must be one plain file name (no '/', '\\', '.' or '..'), got {key!r}")
    return key


def check_count(value: Any, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_pattern(value: Any, name: str = "pattern") -> str | None:
    """A worker's pattern (None: every key): the portable subset of Python's regular
    expressions that every database matches alike, checked before anything is sent
    (``db.dispenser.pattern_parts``: literal text, ``.``, ``.*``, ``.+``, ``\\`` before a
    character to take it literally; matched against the whole key, ``.`` matching a newline
    too). ``ValueError`` naming ``name`` for anything else."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a pattern string or None, got {value!r}")
    if len(value) > item_sql.MAX_PATTERN:
        raise ValueError(f"{name} must be at most {item_sql.MAX_PATTERN} characters, got {len(value)}")
    check_text(value, name)
    try:
        item_sql.pattern_parts(value)
    except ValueError as exc:
        raise ValueError(
            f"{name} {value!r} is not in the portable pattern language (literal text, '.', '.*', '.+', and"
            f" '\\' before a character to take it literally; the whole key is matched): {exc}"
        ) from None
    return value


def key_matches(pattern: str | None, key: str) -> bool:
    """Whether a checked ``pattern`` matches the whole ``key``, as the databases judge it
    (None matches every key)."""
    return pattern is None or item_sql.pattern_matches(item_sql.pattern_parts(pattern), key)


def _chunks(seq: Sequence[Any], size: int = CHUNK) -> Iterable[Sequence[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


def check_items(items: Mapping[str, Any] | Iterable[str], name: str) -> list[tuple[str, Any]]:
    """(key, payload) pairs of a mapping of keys to JSON payloads, or of an iterable of keys."""
    if isinstance(items, (str, bytes)):
        raise ValueError(f"{name} must be a mapping of keys to payloads or an iterable of keys, got {items!r}")
    if isinstance(items, Mapping):
        pairs = [(check_key(k, f"{name} key"), check_json(v, f"{name}[{k!r}]")) for k, v in items.items()]
    else:
        try:
            pairs = [(check_key(k, f"{name} key"), None) for k in items]
        except TypeError:
            raise ValueError(f"{name} must be a mapping or an iterable of keys, got {items!r}") from None
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"{name} must not repeat a key, got {key!r} twice")
            seen.add(key)
    return pairs


def item_keys(items: Iterable[str | WorkItem], name: str = "keys") -> tuple[list[str], list[int] | None]:
    """Keys, and their fences when given WorkItems (all keys or all WorkItems, none twice)."""
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
        self.ttl = resolve_ttl(ttl, lease_settings.DISPENSER_TTL)
        self.max_attempts = check_count(max_attempts, "max_attempts")
        self.using = resolve_using(using)
        #: Rung when items come to the pool (put, recreate, released, failed back, retried):
        #: an idle ``Worker`` sleeps on it (``resource_lease.doorbell``).
        self.bell = Doorbell(self.using, "dispenser", self.name)

    def __repr__(self) -> str:
        return f"<Dispenser {self.name!r} ttl={self.ttl:g} max_attempts={self.max_attempts}>"

    # -- filling the pool ------------------------------------------------------------------

    def put(self, items: Mapping[str, Any] | Iterable[str]) -> int:
        """Add items (keys with JSON payloads, or keys alone); how many keys were new.

        Existing keys are left as they are, whatever their state.
        """
        pairs = check_items(items, "items")
        # Idempotent (INSERT ... ignoring duplicates): repeated after a lost connection, a
        # repeat counts as new only what the first run had not added.
        added = sum(ops(self.using).items.put_items(self.name, chunk) for chunk in _chunks(pairs))
        if added:
            self.bell.ring()
        return added

    def recreate(self, mapping: Mapping[str, Any] | Iterable[str]) -> dict[str, int]:
        """Make the pending pool exactly ``mapping`` (the Redis TaskDispenser's ``recreate_task_pool``).

        Pending items (and items whose claim expired) not in ``mapping`` are deleted; keys
        assigned to a live worker stay with it, untouched; done and failed keys in ``mapping``
        are queued again with attempts reset; new keys are added. Returns the numbers
        ``{"added", "requeued", "removed"}``.
        """
        wanted = dict(check_items(mapping, "mapping"))
        engine = ops(self.using)
        stale = [pk for pk, key in engine.items.unclaimed_items(self.name) if key not in wanted]
        removed = sum(engine.items.delete_unclaimed(self.name, chunk) for chunk in _chunks(stale))
        requeued = 0
        for chunk in _chunks(list(wanted)):
            for key, state, payload, live in engine.items.items_by_key(self.name, chunk):
                if live or (state == DispenserItem.PENDING and payload == wanted[key]):
                    continue
                requeued += engine.items.requeue_item(self.name, key, wanted[key])
        added = self.put(wanted)  # rings if it added any
        if requeued and not added:
            self.bell.ring()
        return {"added": added, "requeued": requeued, "removed": removed}

    # -- claims ------------------------------------------------------------------------------

    def assign(self, worker: str, limit: int = 1, *, pattern: str | None = None) -> list[WorkItem]:
        """Claim work for ``worker``: its own unfinished items first, then new ones up to
        ``limit`` (pending items oldest first, then items whose claim expired).

        Every returned item is claimed afresh: a new fence, the claim renewed for ``ttl``.
        Own items beyond ``limit`` go back to the pool. ``pattern`` (``check_pattern``: the
        portable subset of regular expressions, matched against the whole key by the
        database) restricts which new items are taken.
        """
        worker = check_name(worker, "worker")
        limit = check_count(limit, "limit")
        pattern = check_pattern(pattern)
        rows = ops(self.using).items.claim_items(
            self.name, worker, limit=limit, ttl=self.ttl, max_attempts=self.max_attempts, pattern=pattern
        )
        items = [
            WorkItem(key, payload, attempts, fence, self.name, expiry)
            for _pk, key, payload, attempts, fence, expiry in rows
        ]
        if len(items) > limit:
            self.release(worker, items[limit:])
            items = items[:limit]
        return items

    def _finish(
        self, outcome: str, worker: str, keys: list[str], fences: list[int] | None, what: str, **values: Any
    ) -> int:
        """Record ``outcome`` for ``keys`` (and their fences) in chunks (no keys: every live
        claim of the worker); how many rows it changed in all."""
        engine = ops(self.using)
        total = 0
        for i, chunk in enumerate(list(_chunks(keys)) or [[]]):
            fchunk = None if fences is None else fences[i * CHUNK : (i + 1) * CHUNK]
            total += engine.items.finish_items(outcome, self.name, worker, chunk, fchunk, what=what, **values)
        if total and outcome != "done":
            self.bell.ring()  # items back in the pool (a failure before max_attempts, a release)
        return total

    def done(self, worker: str, keys: Iterable[str | WorkItem], result: Any = None) -> int:
        """Mark items done; how many were: only live claims of ``worker`` count (with the
        fence checked too when given WorkItems). A refused item keeps the state another
        worker gave it."""
        worker = check_name(worker, "worker")
        key_list, fences = item_keys(keys)
        result = check_json(result, "result")
        if not key_list:
            return 0
        what = f"marking items of {self.name!r} done for {worker!r}"
        return self._finish("done", worker, key_list, fences, what, result=result)

    def fail(self, worker: str, keys: Iterable[str | WorkItem], error: str = "") -> int:
        """Give items back as failed attempts: to the pool, or failed for good once their
        attempts reach ``max_attempts``. Counts only live claims of ``worker``."""
        worker = check_name(worker, "worker")
        key_list, fences = item_keys(keys)
        if not isinstance(error, str):
            raise ValueError(f"error must be a string, got {error!r}")
        error = check_text(error, "error")
        if not key_list:
            return 0
        what = f"failing items of {self.name!r} for {worker!r}"
        return self._finish("fail", worker, key_list, fences, what, error=error, max_attempts=self.max_attempts)

    def release(self, worker: str, keys: Iterable[str | WorkItem] | None = None) -> int:
        """Give the worker's live claims (all, or these) back to the pool, not counted as
        attempts: a graceful stop. How many were given back."""
        worker = check_name(worker, "worker")
        key_list, fences = ([], None) if keys is None else item_keys(keys)
        if keys is not None and not key_list:
            return 0
        return self._finish("release", worker, key_list, fences, f"releasing items of {self.name!r} held by {worker!r}")

    def retry_failed(self, keys: Iterable[str] | None = None) -> int:
        """Queue failed items (all, or these keys) again with attempts reset; how many.
        The last error stays on the item until its next outcome."""
        key_list, _ = ([], None) if keys is None else item_keys(keys)
        if keys is not None and not key_list:
            return 0
        engine = ops(self.using)
        queued = sum(engine.items.retry_failed(self.name, chunk) for chunk in (list(_chunks(key_list)) or [[]]))
        if queued:
            self.bell.ring()
        return queued

    def renew(self, worker: str, keys: Iterable[str | WorkItem] | None = None) -> int:
        """Extend the worker's live claims (all, or these) by ``ttl`` from now; how many."""
        worker = check_name(worker, "worker")
        key_list, fences = ([], None) if keys is None else item_keys(keys)
        if keys is not None and not key_list:
            return 0
        engine = ops(self.using)
        total = 0
        for i, chunk in enumerate(list(_chunks(key_list)) or [[]]):
            fchunk = None if fences is None else fences[i * CHUNK : (i + 1) * CHUNK]
            total += engine.items.renew_claims(self.name, worker, chunk, fchunk, self.ttl)
        return total

    def check(self, worker: str, keys: Iterable[str | WorkItem]) -> bool:
        """True when these are exactly the worker's live claims (and fences, for WorkItems)."""
        worker = check_name(worker, "worker")
        key_list, fences = item_keys(keys)
        claims = ops(self.using).items.live_claims(self.name, worker)
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

    def is_empty(self, *, pattern: str | None = None) -> bool:
        """Whether nothing is pending or assigned (with ``pattern``: nothing whose key it
        matches, so nothing a worker with that pattern could ever claim)."""
        return self.unfinished(pattern=pattern)[1] == 0

    def unfinished(self, *, pattern: str | None = None) -> tuple[int, int]:
        """``(pending or assigned items, how many of them pattern matches)``; without a
        pattern both are the same. The keys are matched by the database, as ``assign`` does."""
        return ops(self.using).items.unfinished_items(self.name, check_pattern(pattern))

    def finished(self, keys: Sequence[str]) -> list[tuple[str, str]]:
        """``(key, "done" or "failed")`` of these keys that are finished."""
        return [
            pair for chunk in _chunks(list(keys)) for pair in ops(self.using).items.finished_items(self.name, chunk)
        ]

    def items(self, *, state: str | None = None) -> list[DispenserItem]:
        """The items as rows (for operators and tests: an ORM read on your connection)."""
        rows = DispenserItem.objects.using(self.using).filter(dispenser=self.name).order_by("id")
        if state is not None:
            rows = rows.filter(state=state)
        return list(rows)

    # -- the same for async code (each runs in a worker thread, never on the event loop) ---

    aput = async_twin(put)
    arecreate = async_twin(recreate)
    aassign = async_twin(assign)
    adone = async_twin(done)
    afail = async_twin(fail)
    arelease = async_twin(release)
    aretry_failed = async_twin(retry_failed)
    arenew = async_twin(renew)
    acheck = async_twin(check)
    acounts = async_twin(counts)
    ais_empty = async_twin(is_empty)
    aunfinished = async_twin(unfinished)
    afinished = async_twin(finished)
    aitems = async_twin(items)


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
    with database_errors(using, "counting the dispensers' items"):
        return {row["dispenser"]: {k: int(row[k]) for k in ("pending", "assigned", "done", "failed")} for row in per}
