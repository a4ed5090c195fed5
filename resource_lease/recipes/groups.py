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
import json
import logging
import secrets
import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, overload

from resource_lease import named
from resource_lease.conf import lease_settings
from resource_lease.db.connections import close_connections
from resource_lease.exceptions import LeaseError, MemberTaken
from resource_lease.lease import Lease, granted, process_identity, refuse_inside_single_writer_transaction
from resource_lease.validation import check_alias, check_callable, check_name, check_seconds, check_timeout
from resource_lease.waiting import Backoff, wait_for

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


def check_member(value: Any) -> str:
    return default_member() if value is None else check_name(value, "member")


def check_data(value: Any) -> dict[str, Any]:
    """A member's data: a dict that JSON can store (None: empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"data must be a dict or None, got {value!r}")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"data must be JSON-serializable: {exc}") from None
    return value


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


class GroupWatch:
    """A watch on a group's membership: one thread that reads ``members()`` every ``poll``
    seconds and calls ``callback(members)`` when the list changed (never two calls at once)."""

    def __init__(self, group: Group, callback: MembersCallback, poll: float) -> None:
        self.group = group
        self.callback = callback
        self.poll = poll
        self._stop = threading.Event()
        self.last = group.members()  # the view changes are reported against
        self._thread = threading.Thread(target=self._run, name=f"resource-lease-group-watch:{group.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.poll):
                try:
                    current = self.group.members()
                except LeaseError as exc:
                    logger.warning("watching group %r: reading its members failed, retrying: %s", self.group.name, exc)
                    continue
                if current == self.last:
                    continue
                self.last = current
                try:
                    self.callback(list(current))
                except Exception:
                    logger.exception("the watch callback of group %r raised", self.group.name)
        finally:
            close_connections()

    def stop(self) -> None:
        """Stop watching; waits for a callback in progress (unless called from it)."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


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
        self.ttl = check_seconds(lease_settings.TTL if ttl is None else ttl, "ttl")
        self.member = check_member(member)
        self.data = check_data(data)
        self.using = check_alias(lease_settings.DATABASE if using is None else using)
        self.kind = named.row_kind("group", self.name)
        self.holder = process_holder()
        self._lock = threading.RLock()
        self._joining = threading.Lock()
        self._lease: Lease | None = None
        self._joined = False
        self._wake = threading.Event()  # the lease was lost: take the row again
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        self._watches: list[GroupWatch] = []

    def __repr__(self) -> str:
        return f"<Group {self.name!r} member={self.member!r}{' joined' if self._joined else ''}>"

    # -- membership ------------------------------------------------------------------

    def join(self, timeout: float | None = 0) -> Group:
        """Become a member (renewed in the background until ``leave()``). Returns the group.

        ``timeout``: how long to wait for the member name if another live process holds it
        (0: not at all); then ``MemberTaken`` names that holder. Joining again is a no-op.
        """
        wait = check_timeout(timeout)
        refuse_inside_single_writer_transaction(self.using, "Group.join()")
        with self._joining:  # two threads joining at once: one takes the row, the other sees it joined
            self._join(wait)
        return self

    def _join(self, wait: float | None) -> None:
        with self._lock:
            if self._joined:
                return
        lease = wait_for(self._take, timeout=wait)
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
            self._stop.clear()
            self._wake.clear()
            self._lease = lease
            if self._keeper is None or not self._keeper.is_alive():
                self._keeper = threading.Thread(
                    target=self._keep, name=f"resource-lease-group:{self.name}", daemon=True
                )
                self._keeper.start()

    def _take(self) -> Lease | None:
        """One attempt at the member row; on success its data is written (fenced) and its
        background renewal started."""
        lease = named.try_grant(
            self.using, self.kind, self.member, holder=self.holder, ttl=self.ttl, on_lost=self._on_lost
        )
        if lease is None:
            return None
        if not named.write_data(lease, self.data):
            return None  # lost already (a pause right after the grant): try again
        return granted(lease, auto_renew=True)

    def _on_lost(self, lease: Lease) -> None:
        # Called by the renewal thread (or a check()); the keeper thread takes the row again.
        with self._lock:
            if self._joined and lease is self._lease:
                logger.warning("group %r: member %r lost its membership; joining again", self.name, self.member)
                self._wake.set()

    def _keep(self) -> None:
        """The keeper thread: take the member row again whenever its lease is lost."""
        try:
            while True:
                self._wake.wait()
                if self._stop.is_set():
                    return
                self._wake.clear()
                backoff = Backoff()
                warned = False
                while not self._stop.is_set():
                    try:
                        lease = self._take()
                        if lease is None and not warned:
                            row = named.read(self.using, self.kind, [self.member]).live(self.member)
                            if row is not None and row.holder != self.holder:
                                # Another process took our name while we were away: say so once,
                                # and keep trying (it may go away).
                                logger.warning(
                                    "group %r: member name %r is held by %s; waiting to join again",
                                    self.name,
                                    self.member,
                                    row.holder,
                                )
                                warned = True
                    except LeaseError as exc:
                        logger.warning("group %r: joining again failed, retrying: %s", self.name, exc)
                        lease = None
                    if lease is not None:
                        with self._lock:
                            if self._joined:
                                self._lease = lease
                                logger.info("group %r: member %r joined again", self.name, self.member)
                                break
                        lease.release()  # left meanwhile
                        return
                    self._stop.wait(backoff.next())
        finally:
            close_connections()

    def leave(self) -> bool:
        """Stop being a member (and stop this group's watches). True if we were one."""
        with self._lock:
            self._joined = False
            self._stop.set()
            self._wake.set()
            lease, self._lease = self._lease, None
            keeper, self._keeper = self._keeper, None
            watches, self._watches = self._watches, []
        for watch in watches:
            watch.stop()
        if keeper is not None and keeper is not threading.current_thread():
            keeper.join()
        return lease.release() if lease is not None else False

    close = leave

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

    def size(self) -> int:
        """How many live members the group has."""
        return len(self._snapshot().live_names())

    def index(self) -> int:
        """Our position in ``members()``; -1 when we are not a member."""
        snapshot = self._snapshot()
        return snapshot.live_names().index(self.member) if self._ours(snapshot) else -1

    def view(self) -> tuple[list[str], int]:
        """``(members(), index())`` from one read."""
        snapshot = self._snapshot()
        names = snapshot.live_names()
        return names, names.index(self.member) if self._ours(snapshot) else -1

    def owns(self, key: Key) -> bool:
        """Whether this member owns ``key`` among the live members (rendezvous hashing);
        False when we are not a member."""
        _key_bytes(key)
        snapshot = self._snapshot()
        return self._ours(snapshot) and rendezvous_owner(key, snapshot.live_names()) == self.member

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

    def watch(self, callback: MembersCallback, *, poll: float = 1.0) -> GroupWatch:
        """Call ``callback(members)`` whenever the membership changes (read every ``poll``
        seconds, one thread, never overlapping). Stopped by ``leave()`` or ``.stop()``."""
        if check_callable(callback, "callback") is None:
            raise ValueError("callback must be callable, got None")
        poll = check_seconds(poll, "poll")
        watch = GroupWatch(self, callback, poll)
        with self._lock:
            self._watches.append(watch)
        return watch


def groups(using: str = "default") -> list[dict[str, Any]]:
    """Every group with its live members (sorted), their data, holder and expiry, for operators."""
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
