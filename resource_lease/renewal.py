"""Renewal: the one renewal step and its failure policy, and the process's renewal thread.

Anything renewable (a ``Lease``; a ``ResourceHolder``'s current lease; through their leases a
lock, an election, a group membership) is renewed by ``renew_once``, which applies the one
failure policy:

- renewed: fine; a renewal that took longer than the renew interval is logged as a warning
  (the renewals are falling behind, and the next one may come too late);
- refused (``LeaseLost`` from ``renew()``): the grant is gone; ``renew()`` has recorded the
  loss itself (``Lease.renew`` marks the lease lost before it raises); stop;
- the database could not answer (``LeaseDatabaseError``): try again shortly while the local
  deadline has not passed; past it, ``mark_lost("could not renew before the local deadline:
  ...")`` and stop;
- anything else is a bug: logged with its traceback, ``mark_lost("renewal failed: ...")``,
  stop. A renewal never dies quietly.

What ``renew_once`` needs of the renewable is the ``Renewable`` protocol below; it knows
nothing else about it (this module imports no lease).

``Renewer`` (``renewer()``) is the background renewal of ``auto_renew`` leases and anything
else renewable (a worker's claims, a place in line): jobs of the process's one keeper
(``resource_lease.keeper``), whose thread and connection serve every renewable instead of a
thread per lease. It holds them weakly, so a lease that is garbage-collected stops being
renewed and simply expires; a forked child starts with a keeper of its own.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from resource_lease.conf import lease_settings
from resource_lease.db.connections import Disconnected
from resource_lease.exceptions import LeaseDatabaseError, LeaseLost
from resource_lease.keeper import keeper

logger = logging.getLogger("resource_lease")


class Renewable(Protocol):
    """What ``renew_once`` needs of a renewable grant."""

    def renew(self) -> object:
        """Renew once, by the database. Raise ``LeaseLost`` when the grant is gone (having
        recorded the loss itself) or was given back, ``LeaseDatabaseError`` when the
        database could not answer."""

    def remaining(self) -> float:
        """Seconds the grant may still be trusted here: its local deadline, counted from when
        the grant or the last renewal was sent; 0 once it has passed."""

    def mark_lost(self, reason: str) -> None:
        """Take the policy's verdict that the grant is lost (``reason`` says why). Called at
        most once per ``renew_once``; a renewable that already knows it is lost ignores it."""


class BackgroundRenewable(Renewable, Protocol):
    """What the renewal thread (``Renewer``) needs: a ttl, which sets the first renewal at ttl
    x ``RENEW_FRACTION``, and one step that says when to come back."""

    ttl: float

    def renew_in_background(self) -> float | None:
        """One renewal (``renew_once``); seconds until the next, or None to stop."""


@dataclass(frozen=True)
class Step:
    """What one ``renew_once`` came to: renewed; not renewed but still trusted, to be tried
    again in ``retry_in`` seconds; or lost (neither), the renewable told."""

    renewed: bool
    retry_in: float | None = None

    @property
    def lost(self) -> bool:
        return not self.renewed and self.retry_in is None


RENEWED = Step(renewed=True)
LOST = Step(renewed=False)


def retry_delay(remaining: float) -> float:
    """The pause before retrying a renewal the database could not answer: a quarter of the
    trust left (so a few tries fit before the local deadline), between 50 ms and 1 s."""
    return max(0.05, min(1.0, remaining / 4))


def renew_once(target: Renewable, *, interval: float, prefix: str = "") -> Step:
    """Renew ``target`` once under the failure policy (see the module's docstring).

    ``interval`` is the renew interval (a renewal that took longer is warned about);
    ``prefix`` starts every log message (e.g. the holder's name).
    """
    started = time.monotonic()
    try:
        target.renew()
    except LeaseLost:
        return LOST
    except (LeaseDatabaseError, Disconnected) as exc:
        remaining = target.remaining()
        if remaining <= 0:
            target.mark_lost(f"could not renew before the local deadline: {exc}")
            return LOST
        logger.warning("%srenewing %r failed, retrying: %s", prefix, target, exc)
        return Step(renewed=False, retry_in=retry_delay(remaining))
    except Exception as exc:  # a bug must be loud, never a quietly dead renewal
        logger.exception("%srenewing %r failed unexpectedly", prefix, target)
        target.mark_lost(f"renewal failed: {exc!r}")
        return LOST
    took = time.monotonic() - started
    if took > interval:
        logger.warning("%srenewing %r took %.3fs, longer than the renew interval %.3fs", prefix, target, took, interval)
    return RENEWED


class Renewer:
    """The background renewal of what was ``add``ed, until it is ``discard``ed (a lease does so
    when it is released or lost) or garbage-collected: jobs of the process's keeper
    (``resource_lease.keeper``), each renewed every ttl x ``RENEW_FRACTION``, one step
    (``renew_in_background``) at a time."""

    def add(self, renewable: BackgroundRenewable) -> None:
        """Renew ``renewable`` every ttl x ``RENEW_FRACTION`` from now on (until ``discard``);
        a renewable renewed already keeps its schedule."""
        current = keeper()
        if not current.scheduled(renewable):
            first = renewable.ttl * float(lease_settings.RENEW_FRACTION)
            current.schedule(renewable, first, step="renew_in_background")

    def discard(self, renewable: BackgroundRenewable) -> None:
        """Stop renewing ``renewable`` (no-op if it was not renewed)."""
        keeper().cancel(renewable)

    def renewing(self, renewable: BackgroundRenewable) -> bool:
        """Whether ``renewable`` is renewed in the background now."""
        return keeper().scheduled(renewable)

    @property
    def thread(self) -> threading.Thread | None:
        """The keeper's thread while it runs (None once it has nothing left to keep)."""
        return keeper().thread


_renewer = Renewer()


def renewer() -> Renewer:
    """The background renewal (a thin face of the process's keeper)."""
    return _renewer
