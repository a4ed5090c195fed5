"""``Returning``: how a statement template names a single-row UPDATE and the row it changed."""

from __future__ import annotations

from typing import NamedTuple


class Returning(NamedTuple):
    """A single-row UPDATE and the row it changed.

    The vendor's ``RETURNING`` template joins the parts: ``UPDATE ... RETURNING {returning}``,
    or on MySQL, which has no RETURNING (docs/pitfalls.md#no-returning), the UPDATE and a
    SELECT of the ``read_back`` row sent as one query. ``read_back`` names the changed row by
    its own parameters, which the caller passes after the UPDATE's.
    """

    update: str
    returning: str = "{columns}"
    read_back: str = ""
    #: The table ``read_back`` reads (the lease table unless the UPDATE is of another).
    table: str = "{table}"
