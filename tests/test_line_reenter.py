"""A waiter whose place was lost takes a new one; if the database refuses that connection, the
driver runs the same step again (it never reached the database), and the lost place must not
be left twice nor the step fail. The nemesis found it: a PostgreSQL restart between the two
made the repeated step raise AssertionError in a lock's waiter."""

from __future__ import annotations

from typing import Any

import pytest

from resource_lease.exceptions import DatabaseUnavailable
from resource_lease.lease import Lease, making
from resource_lease.line import Line, Wait, Waiting, places
from resource_lease.line.steps import Call
from resource_lease.line.wakeups import Waker
from resource_lease.models import Waiter
from resource_lease.recipes.locks import LOCK_KIND

pytestmark = pytest.mark.django_db(transaction=True)


def test_taking_a_new_place_again_after_a_refused_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    request: Wait[Lease] = Wait(
        Line("default", LOCK_KIND, "reenter"),
        lambda grant: None,
        lambda grant: grant,  # type: ignore[arg-type,return-value]
        timeout=None,
        holder="w",
        ttl=30,
        make=making(alias="default"),
    )
    waiting = Waiting(request, timeout=None, waker=Waker())
    try:
        waiting.place = waiting._enter()
        assert waiting.place is not None
        lost = waiting.place.id
        steps = waiting._take_place(reenter=True)
        step = next(steps)
        assert isinstance(step, Call)
        enter = places.enter
        refused = []

        def refuse_once(*args: Any, **kwargs: Any) -> Any:
            if not refused:
                refused.append(True)
                raise DatabaseUnavailable("cannot connect to database 'default' (test)", alias="default", what="test")
            return enter(*args, **kwargs)

        monkeypatch.setattr(places, "enter", refuse_once)
        with pytest.raises(DatabaseUnavailable):
            step.run()
        place = step.run()  # the driver runs the same step again
        assert place is not None and place.id != lost
        assert list(Waiter.objects.filter(name="reenter").values_list("id", flat=True)) == [place.id]
    finally:
        waiting.cleanup()
