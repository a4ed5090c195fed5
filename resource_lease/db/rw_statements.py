"""The statements of the read/write locks (recipes/rwlock.py), each whole under its name.

They are rendered with the lease statements (``statements.TEMPLATES`` takes them in) and use
its pieces and fragments by name (``{free_at}``, ``{delay_over}``, ``{grant_set}``, ...): see
``resource_lease.db.statements`` for what each piece is. Run by ``db/rwlock.py``.
"""

from __future__ import annotations

from resource_lease.db.returning import Returning

# One row per rwlock (kind '@rwlock', its name), which every grant updates: the row lock orders
# readers and writers, and one conditional UPDATE of the row's own columns decides each grant
# (a condition on other rows would read a snapshot: two UPDATEs could each miss the other's
# grant). Every grant raises the one fence. A writer holds it like a lock, readers 0. Readers
# share a *read period*: ``readers`` counts its grants not given back, ``read_fence`` is its
# first grant's fence, ``busy_before`` the latest expiry any of its readers asked for. A read
# grant is live while its period is (readers > 0, busy_before not passed, read_fence <= its
# fence). A reader that dies stays counted until the period expires: the period ends at the
# last release, or at its expiry (a dead reader delays writers up to ttl after the last grant
# or renewal of a live reader, never lets one in early).

# The row is open to a read grant: free (enabled, no quarantine, the last grant over and past
# its lock delay), or in a live read period.
RW_READABLE = (
    "enabled = {true} AND (quarantined_until IS NULL OR quarantined_until <= {now})"
    " AND ((busy_before <= {now} AND {delay_over}) OR (readers > 0 AND busy_before > {now}))"
)

# A reader's turn: no live *writer* waiting ahead of it in the row's line (readers ahead are
# served with it); a caller without a live place has every live writer of the line ahead.
# (line name, id, priority, priority, id, id): LINE_CLEAR's.
RW_READ_CLEAR = (
    "NOT EXISTS (SELECT 1 FROM {waiters} w WHERE w.kind = {table}.kind AND w.name = {p}"
    " AND w.expires_at > {now} AND w.shared = {false} AND w.id <> {p}"
    " AND (w.priority > {p} OR (w.priority = {p} AND w.id < {p})"
    " OR NOT EXISTS (SELECT 1 FROM {waiters} me WHERE me.id = {p} AND me.expires_at > {now})))"
)

# A read grant's new fence (MySQL also hands it back: LAST_INSERT_ID).
RW_NEXT_FENCE = "fence + 1"

# A read grant's SET list: joins the live period or starts one (readers 1, read_fence this
# grant's). MySQL assigns left to right with the values already assigned
# (docs/pitfalls.md#set-order): everything that reads busy_before or fence comes before them.
RW_READ_SET = (
    "took_over = (busy_before <= {now} AND grant_token <> ''), previous_holder = holder,"
    " read_fence = CASE WHEN busy_before > {now} THEN read_fence ELSE fence + 1 END,"
    " readers = CASE WHEN busy_before > {now} THEN readers + 1 ELSE 1 END,"
    " acquired_at = CASE WHEN busy_before > {now} THEN acquired_at ELSE {now} END,"
    " fence = {rw_next_fence}, holder = {p}, grant_token = {p},"
    " busy_before = CASE WHEN busy_before > {expiry} THEN busy_before ELSE {expiry} END,"
    " renewed_at = {now}, released_at = NULL, lock_delay = {p}"
)

# A read grant of the rwlock (kind, name): (holder, token, ttl, ttl, lock_delay, name, kind,
# *line); the
# row and the grant's fence (where the row is read back, by (kind, name), another reader may
# have been granted since: the fence is the one this UPDATE wrote).
RW_READ = Returning(
    "UPDATE {table} SET {rw_read_set} WHERE name = {p} AND kind = {p} AND {rw_readable} AND {rw_read_clear}",
    returning="{columns}, fence",
    read_back="kind = {p} AND name = {p}",
)

# A write grant: GRANT_BY_NAME that also ends whatever read period had expired (readers 0).
# (holder, token, ttl, lock_delay, name, kind, *line), read back by (kind, name, token).
RW_WRITE = Returning(
    "UPDATE {table} SET {grant_set}, readers = 0 WHERE name = {p} AND {grantable}",
    read_back="kind = {p} AND name = {p} AND grant_token = {p}",
)

# A read grant still live: its period is the row's live one. (id, fence)
RW_READ_OURS = "id = {p} AND readers > 0 AND read_fence <= {p} AND busy_before > {now}"

# Keep a read grant: the period lasts at least ttl more. (ttl, ttl, id, fence), read back by (id).
RW_READ_RENEW = Returning(
    "UPDATE {table} SET busy_before = CASE WHEN busy_before > {expiry} THEN busy_before ELSE {expiry} END,"
    " renewed_at = {now} WHERE {rw_read_ours}",
    returning="busy_before",
    read_back="id = {p}",
)

# Give a read grant back; the last reader of the period frees the row (as RELEASE does). Never
# run twice for one grant (a second run would count another reader out): a lost answer is
# left unknown, the period then lasting until its expiry. (id, fence)
RW_READ_GIVE_BACK = (
    "busy_before = CASE WHEN readers = 1 THEN {freed_at} ELSE busy_before END,"
    " released_at = CASE WHEN readers = 1 THEN {now} ELSE released_at END,"
    " grant_token = CASE WHEN readers = 1 THEN '' ELSE grant_token END,"
    " readers = readers - 1"
)
RW_READ_RELEASE = "UPDATE {table} SET {rw_read_give_back} WHERE {rw_read_ours}"

# Whether a read grant is live: (id, fence).
RW_READ_HELD = "SELECT 1 FROM {table} WHERE {rw_read_ours}"

# A reader's look at an rwlock's line (LOOK_NAMED's columns): only writers ahead of it count
# (readers are served together), and the row is free to it when a read grant could join it
# (RW_READABLE). (id, kind, name, id, priority, priority, id, kind, name, kind, name)
LOOK_READ = (
    "SELECT (SELECT COUNT(*) FROM {waiters} me WHERE me.id = {p} AND me.expires_at > {now}),"
    " (SELECT COUNT(*) FROM {waiters} w WHERE w.kind = {p} AND w.name = {p} AND w.expires_at > {now}"
    " AND w.shared = {false} AND w.id <> {p} AND (w.priority > {p} OR (w.priority = {p} AND w.id < {p}))),"
    " 0,"
    " (SELECT COUNT(*) FROM {table} WHERE kind = {p} AND name = {p} AND {rw_readable}),"
    " (SELECT MAX({free_at}) FROM {table} WHERE kind = {p} AND name = {p}),"
    " {now}, NULL"
)


#: The rwlock templates, in the order a dialect renders them.
TEMPLATES: dict[str, str | Returning] = {
    "RW_READABLE": RW_READABLE,
    "RW_READ_CLEAR": RW_READ_CLEAR,
    "RW_NEXT_FENCE": RW_NEXT_FENCE,
    "RW_READ_SET": RW_READ_SET,
    "RW_READ": RW_READ,
    "RW_WRITE": RW_WRITE,
    "RW_READ_OURS": RW_READ_OURS,
    "RW_READ_RENEW": RW_READ_RENEW,
    "RW_READ_GIVE_BACK": RW_READ_GIVE_BACK,
    "RW_READ_RELEASE": RW_READ_RELEASE,
    "RW_READ_HELD": RW_READ_HELD,
    "LOOK_READ": LOOK_READ,
}
