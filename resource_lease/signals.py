"""Signals sent by the lease engine (sender is always ``Resource``).

Each keeps its receivers per sender (``use_caching``, as Django's model signals do): a send
finds them without walking every receiver under a lock, which each grant and release paid.

Receivers run synchronously in the thread that granted, released or lost the lease, so they
must be quick; the audit trail buffers and writes in the background. With no receivers a
signal costs next to nothing on the acquire path.
"""

from __future__ import annotations

from django.dispatch import Signal

#: A grant: ``lease`` (its ``resource.took_over`` says whether it took an expired lease).
lease_granted = Signal(use_caching=True)
#: A release: ``lease`` and ``released`` (False when it had expired or been taken).
lease_released = Signal(use_caching=True)
#: A loss noticed by this process: ``lease`` and ``reason``.
lease_lost = Signal(use_caching=True)
#: A caller gave up waiting for a grant (``resource_lease.metrics.waiting``): ``kind`` (as the
#: metrics label it), ``outcome`` ("timeout" or "error"), ``seconds`` waited, ``using``, ``holder``.
lease_not_granted = Signal(use_caching=True)

# Operators' pool operations (``resource_lease.pool``). ``resources`` lists the rows the
# operation matched, read just before its UPDATE and only when the signal has receivers
# (otherwise it is empty); ``count`` is how many rows the UPDATE changed; ``using`` the alias.

#: ``quarantine()``: also ``reason``, and ``seconds`` or ``until`` as given.
resources_quarantined = Signal(use_caching=True)
#: ``restore()``.
resources_restored = Signal(use_caching=True)
#: ``force_release()``: ``resources`` carry the holder and fence that were cut off.
resources_force_released = Signal(use_caching=True)

# Shared health (``Lease.report``, ``resource_lease.health``).

#: A report the database took: ``lease``, ``outcome`` ("ok", "error", "blocked"),
#: ``quarantined`` (True when this report quarantined the resource automatically), ``score``
#: and ``level`` (the resource's health after it), ``until`` (the quarantine's end or None).
lease_reported = Signal(use_caching=True)
#: A resource retired by its policy (``max_uses`` or ``max_age``): ``lease`` (the grant that
#: found it due) and ``reason``.
resource_retired = Signal(use_caching=True)
