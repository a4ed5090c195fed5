"""Group membership: "how many are we, and which one am I", and a partition of keys.

A group ``G`` is the rows of kind ``@group:G``, one per member, named by the member. Being a
member is holding a live lease on one's own row, renewed in the background like any lease:
a member that dies stops renewing, and ttl later it is no longer in ``members()``, with
nobody cleaning up. A member paused past its ttl loses its lease; when it resumes, its
renewal is refused, and the group takes the row again by itself (a new grant, a new fence).

``members()`` is one read of the rows with the database's clock: the live names, sorted, so
two readers at the same instant get the same list. ``owns(key)`` is rendezvous (highest
random weight) hashing over that list with a stable hash (blake2b), so every process agrees
on each key's owner, and a change of membership moves only the keys of members who came or
went.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, overload

from resource_lease import named
from resource_lease.backoff import wait_for
from resource_lease.exceptions import MemberTaken, OutcomeUnknown
from resource_lease.lease import Lease, process_identity
from resource_lease.offload import async_twin, in_thread
from resource_lease.validation import (
    Options,
    check_callable,
    check_json_dict,
    check_name,
    check_seconds,
    check_timeout,
    resolve_using,
)
from resource_lease.watching import Watch

logger = logging.getLogger("resource_lease")

Key = str | bytes | int
MembersCallback = Callable[[list[str]], Any]


def default_member() -> str:
    """``"<host>:<pid>"``: a member name no other live process has."""
    return process_identity()


def process_holder() -> str:
    """The holder recorded on a member's row: this process, and which object in it (two
    objects of one process using the same member name are two claimants too)."""
    return f"{process_identity()}#{secrets.token_hex(3)}"


def member_row(owner: Any, what: str, **hooks: Any) -> named.KeptRow:
    """The row of ``owner.member`` among the rows ``owner.kind`` (a group's or a barrier's),
    held for this process (``process_holder()``) for ``owner.ttl`` on ``owner.using``."""
    return named.KeptRow(
        owner.using,
        owner.kind,
        owner.member,
        holder=process_holder(),
        ttl=owner.ttl,
        owner=owner,
        what=f"{what} {owner.name!r}: member {owner.member!r}",
        **hooks,
    )


def check_member(value: Any) -> str:
    return default_member() if value is None else check_name(value, "member")


def check_data(value: Any) -> dict[str, Any]:
    """A member's data: a dict that JSON can store (None: empty)."""
    return {} if value is None else check_json_dict(value, "data")


def _key_bytes(key: Any) -> bytes:
    if isinstance(key, str):
        return key.encode("utf-8", "surrogatepass")
    if isinstance(key, bytes):
        return key
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key).encode()
    raise ValueError(f"key must be a str, bytes or int, got {key!r}")


def _weight(member: str, key: bytes) -> int:
    digest = hashlib.blake2b(member.encode("utf-8", "surrogatepass") + b"\0" + key, digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_owner(key: Key, members: Iterable[str]) -> str | None:
    """The member that owns ``key`` among ``members`` (None if there are none): the highest
    blake2b weight of (member, key), ties broken by name. The same answer in every process;
    removing or adding a member moves only the keys that member loses or wins."""
    raw = _key_bytes(key)
    return max(members, key=lambda m: (_weight(m, raw), m), default=None)


#: The watch ``Group.watch`` returns (the one ``Watch`` of the library), by its older name.
GroupWatch = Watch


class Group:
    """Membership of a named group, created on first use.

    ``join()`` makes this process a member until ``leave()`` (or ttl after it dies);
    ``members()``, ``size()``, ``index()`` and ``owns(key)`` are asked of the database.
    Safe to share between the threads of one process.
    """

    def __init__(
        self,
        name: str,
        *,
        ttl: float | None = None,
        member: str | None = None,
        data: dict[str, Any] | None = None,
        using: str | None = None,
    ) -> None:
        self.name = check_name(name, "name")
        self.options = Options.of(ttl=ttl, using=using)
        self.ttl, self.using = self.options.ttl, self.options.using
        self.member = check_member(member)
        self.data = check_data(data)
        self.kind = named.row_kind("group", self.name)
        self._lock = threading.RLock()
        self._joining = threading.Lock()
        self._joined = False
        self._watches: list[Watch] = []
        self._row = member_row(self, "group", on_gained=self._write_data, on_lost=self._on_lost, warn_when_taken=True)
        self.holder = self._row.holder

    def __repr__(self) -> str:
        return f"<Group {self.name!r} member={self.member!r}{' joined' if self._joined else ''}>"

    # -- membership ------------------------------------------------------------------

    def join(self, timeout: float | None = 0) -> Group:
        """Become a member (renewed in the background until ``leave()``). Returns the group.

        ``timeout``: how long to wait for the member name if another live process holds it
        (0: not at all); then ``MemberTaken`` names that holder. Joining again is a no-op.
        """
        wait = check_timeout(timeout)
        self.options.refuse_in_transaction("Group.join()")
        with self._joining:  # two threads joining at once: one takes the row, the other sees it joined
            self._join(wait)
        return self

    ajoin = async_twin(join)

    def _join(self, wait: float | None) -> None:
        with self._lock:
            if self._joined:
                return
        lease = wait_for(self._row.take, timeout=wait)
        if lease is None:
            row = named.read(self.using, self.kind, [self.member]).live(self.member)
            holder = row.holder if row is not None else "?"
            raise MemberTaken(
                f"member {self.member!r} of group {self.name!r} is held by another live process ({holder});"
                " two live processes cannot share one member name",
                member=self.member,
                holder=holder,
            )
        with self._lock:
            self._joined = True
        self._row.keep()  # the keeper takes the row again whenever it is lost

    def _write_data(self, lease: Lease) -> bool:
        # The member's data, fenced: False if the grant was lost already (a pause right
        # after it), or lost by the time a write whose answer was lost was asked again (the
        # next attempt writes it again); the next attempt comes as usual.
        try:
            return named.write_data(lease, self.data)
        except OutcomeUnknown:
            return False

    def _on_lost(self, lease: Lease, reason: str) -> None:
        with self._lock:
            joined = self._joined
        if joined:
            logger.warning(
                "group %r: member %r lost its membership (%s); joining again", self.name, self.member, reason
            )

    def leave(self) -> bool:
        """Stop being a member (and stop this group's watches). True if we were one."""
        with self._lock:
            self._joined = False
            watches, self._watches = self._watches, []
        for watch in watches:
            watch.stop()
        _, released = self._row.stop()
        return released

    aleave = async_twin(leave)

    def __enter__(self) -> Group:
        return self.join()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.leave()

    # -- the view --------------------------------------------------------------------

    def _snapshot(self) -> named.Snapshot:
        return named.read(self.using, self.kind)

    def _ours(self, snapshot: named.Snapshot) -> bool:
        row = snapshot.live(self.member)
        return row is not None and row.holder == self.holder

    @overload
    def members(self) -> list[str]: ...
    @overload
    def members(self, with_data: bool) -> list[str] | dict[str, Any]: ...

    def members(self, with_data: bool = False) -> list[str] | dict[str, Any]:
        """The live member names, sorted (the same list for everyone reading at the same
        instant); with ``with_data=True`` a dict ``{name: data}`` in that order."""
        snapshot = self._snapshot()
        names = snapshot.live_names()
        if with_data:
            return {name: snapshot.rows[name].data for name in names}
        return names

    amembers = async_twin(members)

    def size(self) -> int:
        """How many live members the group has."""
        return len(self._snapshot().live_names())

    asize = async_twin(size)

    def index(self) -> int:
        """Our position in ``members()``; -1 when we are not a member."""
        snapshot = self._snapshot()
        return snapshot.live_names().index(self.member) if self._ours(snapshot) else -1

    aindex = async_twin(index)

    def view(self) -> tuple[list[str], int]:
        """``(members(), index())`` from one read."""
        snapshot = self._snapshot()
        names = snapshot.live_names()
        return names, names.index(self.member) if self._ours(snapshot) else -1

    aview = async_twin(view)

    def owns(self, key: Key) -> bool:
        """Whether this member owns ``key`` among the live members (rendezvous hashing);
        False when we are not a member."""
        _key_bytes(key)
        snapshot = self._snapshot()
        return self._ours(snapshot) and rendezvous_owner(key, snapshot.live_names()) == self.member

    aowns = async_twin(owns)

    def owned(self, keys: Iterable[Key]) -> list[Key]:
        """The ``keys`` this member owns, all judged against one read of the members."""
        keys = list(keys)
        for key in keys:
            _key_bytes(key)
        snapshot = self._snapshot()
        if not self._ours(snapshot):
            return []
        names = snapshot.live_names()
        return [key for key in keys if rendezvous_owner(key, names) == self.member]

    async def aowned(self, keys: Iterable[Key]) -> list[Key]:
        """``owned()`` for async code."""

        return await in_thread(self.owned, list(keys))

    def watch(self, callback: MembersCallback, *, poll: float = 1.0) -> Watch:
        """Call ``callback(members)`` whenever the membership changes (read every ``poll``
        seconds by the keeper; calls on one thread, never overlapping). Stopped by
        ``leave()`` or ``.stop()``."""
        if check_callable(callback, "callback") is None:
            raise ValueError("callback must be callable, got None")
        poll = check_seconds(poll, "poll")
        last = self.members()  # the view changes are reported against

        def check(emit: Callable[..., None]) -> None:
            nonlocal last
            current = self.members()
            if current != last:
                last = current
                emit(list(current))

        watch = Watch(name=f"group:{self.name}", using=self.using, poll=poll, check=check, callback=callback)
        with self._lock:
            self._watches.append(watch)
        return watch.start()


def groups(using: str | None = None) -> list[dict[str, Any]]:
    """Every group with its live members (sorted), their data, holder and expiry, for operators
    (``using``: default the lease database, ``RESOURCE_LEASE["DATABASE"]``)."""
    using = resolve_using(using)
    from resource_lease.models import Resource

    prefix = named.row_kind("group", "")
    kinds = Resource.objects.using(using).filter(kind__startswith=prefix).values_list("kind", flat=True).distinct()
    result = []
    for kind in sorted(set(kinds)):
        snapshot = named.read(using, kind)
        result.append(
            {
                "name": kind[len(prefix) :],
                "members": [
                    {
                        "member": name,
                        "holder": snapshot.rows[name].holder,
                        "fence": snapshot.rows[name].fence,
                        "expires_at": snapshot.rows[name].busy_before,
                        "time_left": (snapshot.rows[name].busy_before - snapshot.now).total_seconds(),
                        "data": snapshot.rows[name].data,
                    }
                    for name in snapshot.live_names()
                ],
                "database_time": snapshot.now,
            }
        )
    return result
