"""Leadership terms: ``LeadershipTerm``, the log that ``Election.observe`` follows."""

from __future__ import annotations

from typing import ClassVar

from django.db import models


class LeadershipTerm(models.Model):
    """One term of an election: its fence (the grant's) and who won it.

    Written by the winner right after its grant and before it acts as leader (and by an
    observer that sees a live term not yet written), each time with the term before it (the
    granted row's ``previous_holder``), by a statement that reads them from the election's row
    and writes nothing once that row has moved on: so every term a leader acted on is here, in
    fence order, and a term is written with one leader only. Read by ``Election.observe``.
    """

    election = models.CharField(max_length=255, help_text="The election's name.")
    fence = models.BigIntegerField(help_text="The term's fence: the election row's fence when it was granted.")
    leader = models.CharField(max_length=255, help_text="Who won the term (the candidate's holder id).")
    recorded_at = models.DateTimeField(help_text="When the term was written down (database clock).")

    # Made exact by migration 0011 (ExactCollation); check W010 keeps watching it.
    exact_text_fields: ClassVar[tuple[str, ...]] = ("election",)

    class Meta:
        ordering = ["election", "-fence"]
        constraints = [
            models.UniqueConstraint(fields=["election", "fence"], name="resource_lease_term_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.election} #{self.fence}: {self.leader}"
