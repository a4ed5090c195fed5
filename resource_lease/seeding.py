"""Loading a list of resources into a pool, all or nothing: what ``seed_proxies`` and
``seed_resources`` share.

A list is read whole into a ``SeedList`` (name -> payload), every entry checked, every
problem collected with where it was (``line 3``, ``item 2``); only a list without problems is
written, in one transaction: new names added, changed payloads merged into the stored ones
(keys the list does not give are kept), and with ``replace`` the kind's other resources
removed, except those leased right now. Re-running a list changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from resource_lease.bulk import insert_many, update_many
from resource_lease.models import Resource, live_q
from resource_lease.validation import check_text, encode_json

#: Rows per UPDATE / DELETE batch, and per batch of INSERTs.
CHUNK = 1000
INSERT_CHUNK = 2000
#: Longest resource name (``Resource.name``).
MAX_NAME = 255

Progress = Callable[[str, bool], None]


def _quiet(text: str, force: bool) -> None:
    pass


@dataclass
class Entry:
    """One resource of a list: its name, the payload to merge into ``data``, and where it was."""

    name: str
    data: dict[str, Any]
    where: str
    enabled: bool | None = None


@dataclass
class SeedList:
    entries: dict[str, Entry] = field(default_factory=dict)
    duplicates: int = 0
    errors: list[str] = field(default_factory=list)

    def error(self, where: str, message: str) -> None:
        self.errors.append(f"{where}: {message}")

    def add(self, entry: Entry, conflict: Callable[[Entry, Entry], str] | None = None) -> None:
        """Add ``entry`` if its name is valid and new; the same entry again is a duplicate
        (skipped), the same name with another payload is an error (``conflict(seen, entry)``
        says how they differ)."""
        problem = name_problem(entry.name) or data_problem(entry.data)
        if problem is not None:
            self.error(entry.where, problem)
            return
        seen = self.entries.get(entry.name)
        if seen is None:
            self.entries[entry.name] = entry
        elif (seen.data, seen.enabled) == (entry.data, entry.enabled):
            self.duplicates += 1
        else:
            detail = conflict(seen, entry) if conflict else f"{entry.name} is already on {seen.where} with other data"
            self.error(entry.where, detail)


def name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be a resource's name, or None."""
    if not isinstance(name, str) or not name.strip():
        return f"the name must be a non-empty string, got {name!r}"
    if name != name.strip():
        return f"the name {name!r} has leading or trailing blanks (names compare exactly)"
    if len(name) > MAX_NAME:
        return f"the name is longer than {MAX_NAME} characters ({len(name)})"
    try:
        check_text(name, "the name")
    except ValueError as exc:
        return str(exc)
    return None


def data_problem(data: Any) -> str | None:
    """Why ``data`` cannot be a resource's payload on every database (NaN or infinity, a NUL
    character anywhere, a lone surrogate: ``encode_json``), or None. Found by the property
    tests: SQLite and MariaDB stored a NUL inside a payload that PostgreSQL refuses."""
    try:
        encode_json(data, "the data")
    except ValueError as exc:
        return str(exc)
    return None


@dataclass
class Plan:
    create: list[Entry] = field(default_factory=list)
    update: list[Resource] = field(default_factory=list)  # pk, name, the merged data and enabled
    unchanged: int = 0
    stale: dict[int, str] = field(default_factory=dict)  # pk -> name, for replace
    removed: list[str] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (name, holder)


def plan(seed: SeedList, *, kind: str, using: str, replace: bool) -> Plan:
    """What writing ``seed`` into ``kind`` changes."""
    # A plain read (no lock): locking the whole kind would stall every acquire while the
    # list loads. Two seedings at once collide on (kind, name) and the loser writes nothing.
    result = Plan()
    existing: set[str] = set()
    rows = Resource.objects.using(using).filter(kind=kind).values_list("pk", "name", "data", "enabled")
    for pk, name, data, enabled in rows.iterator(chunk_size=5000):
        existing.add(name)
        entry = seed.entries.get(name)
        if entry is None:
            if replace:
                result.stale[pk] = name
            continue
        data = data if isinstance(data, dict) else {}
        merged = {**data, **entry.data}
        new_enabled = enabled if entry.enabled is None else entry.enabled
        if merged == data and new_enabled == enabled:
            result.unchanged += 1
        else:
            result.update.append(Resource(pk=pk, kind=kind, name=name, data=merged, enabled=new_enabled))
    result.create = [entry for name, entry in seed.entries.items() if name not in existing]
    return result


def write(result: Plan, *, kind: str, using: str, progress: Progress = _quiet) -> None:
    """Carry out ``result`` (inside the caller's transaction)."""
    total = len(result.create) + len(result.update)
    done = 0
    for start in range(0, len(result.create), INSERT_CHUNK):
        new = result.create[start : start + INSERT_CHUNK]
        insert_many(
            Resource,
            (
                {"name": e.name, "data": e.data}
                if e.enabled is None
                else {"name": e.name, "data": e.data, "enabled": e.enabled}
                for e in new
            ),
            using=using,
            defaults={"kind": kind},
        )
        done += len(new)
        progress(f"writing: {done:,}/{total:,}", done == total)
    for start in range(0, len(result.update), CHUNK):
        chunk = result.update[start : start + CHUNK]
        update_many(Resource, "data", {r.pk: r.data for r in chunk}, using=using)
        update_many(Resource, "enabled", {r.pk: r.enabled for r in chunk}, using=using)
        done += len(chunk)
        progress(f"writing: {done:,}/{total:,}", done == total)
    stale = list(result.stale)
    for start in range(0, len(stale), CHUNK):
        chunk_pks = stale[start : start + CHUNK]
        # Lock the rows that are not leased now; a locked row cannot be granted before
        # this transaction ends, and then it is gone. A leased one is never deleted.
        free = set(
            Resource.objects.using(using)
            .select_for_update()
            .filter(pk__in=chunk_pks)
            .exclude(live_q())
            .values_list("pk", flat=True)
        )
        if free:
            Resource.objects.using(using).filter(pk__in=free).delete()
        result.removed.extend(result.stale[pk] for pk in chunk_pks if pk in free)
        result.kept.extend(_holders([pk for pk in chunk_pks if pk not in free], using))
        progress(f"removing: {start + len(chunk_pks):,}/{len(stale):,}", False)


def dry_run_replace(result: Plan, *, using: str) -> None:
    """Fill in what ``replace`` would remove and keep, writing nothing."""
    stale = list(result.stale)
    for start in range(0, len(stale), CHUNK):
        chunk_pks = stale[start : start + CHUNK]
        held = set(Resource.objects.using(using).filter(pk__in=chunk_pks).live().values_list("pk", flat=True))
        result.removed.extend(result.stale[pk] for pk in chunk_pks if pk not in held)
        result.kept.extend(_holders(sorted(held), using))


def _holders(pks: list[int], using: str) -> list[tuple[str, str]]:
    if not pks:
        return []
    return list(Resource.objects.using(using).filter(pk__in=pks).order_by("name").values_list("name", "holder"))


__all__ = ["Entry", "Plan", "SeedList", "dry_run_replace", "name_problem", "plan", "write"]
