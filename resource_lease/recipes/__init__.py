"""The coordination recipes: one module per primitive, each built on the lease engine.

A recipe (kazoo's and Curator's word) is a coordination pattern written on top of the
shared engine pieces: rows created on demand and leased like a resource
(``resource_lease.named``), the grant and its ``Lease`` (``resource_lease.lease``), the one
renewal step and its failure policy (``resource_lease.renewal``) and the one wait-for-a-grant
loop (``resource_lease.backoff``). The dispenser and the notifications have tables of their own,
with their statements in ``resource_lease/db/`` (``dispenser.py``, ``topics.py``).

=================  ================================================================
module             public names (re-exported from ``resource_lease``)
=================  ================================================================
``locks``          ``lock``, ``semaphore``, ``synchronized`` (``LockHeld``)
``rwlock``         ``rwlock`` (``arwlock`` in ``resource_lease.aio``)
``election``       ``Election``, ``leader_only``
``groups``         ``Group``
``barrier``        ``DoubleBarrier`` (``BarrierTimeout``)
``dispenser``      ``Dispenser``, ``WorkItem``
``worker``         ``Worker``, ``FolderWorker``
``notifications``  ``notify``, ``watch``, ``Watch``
``config``         ``Config``
=================  ================================================================

Import the public names from ``resource_lease``; the modules themselves also hold what the
admin and the commands need (``groups.groups()``, ``barrier.barriers()``, ...).
"""
