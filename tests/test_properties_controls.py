"""Negative controls of the property tests: the same properties, run with the same strategies
against a deliberately broken library, must fail. A property that cannot fail proves nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from resource_lease import validation
from resource_lease.db import base
from resource_lease.models import Resource
from tests import test_properties_lease as lease_properties
from tests.properties import budget, names, refused

pytestmark = pytest.mark.django_db(transaction=True)


def run(test: Any, examples: int, **strategies: Any) -> None:
    """The body of the property test ``test`` under up to ``examples`` fresh examples, up to
    the first failure (not shrunk: the control only has to fail)."""
    control = settings(budget(examples), phases=[Phase.generate], report_multiple_bugs=False)
    control(given(**strategies)(test.hypothesis.inner_test))()


def test_negative_control_a_check_that_lets_nul_and_surrogates_through_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Text checks that accept anything: MariaDB and SQLite store a NUL, PostgreSQL refuses it
    # (with an error that names no argument); either way the property fails.
    monkeypatch.setattr(validation, "check_text", lambda value, name: value)
    with pytest.raises(Exception):  # noqa: B017,PT011  (whatever the property raises)
        run(
            lease_properties.test_acquire_kind_name_and_holder_round_trip_exactly,
            60,
            kind=names(100),
            name=names(255),
            holder=st.one_of(st.none(), names(255)),
        )


def test_negative_control_where_keys_looked_up_as_written_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    if connection.vendor == "postgresql":
        pytest.skip("PostgreSQL's jsonb has no spelling of a key: the paths are not used there")

    # The lookup before the fix: the key's path as the caller wrote it, whatever the document's
    # spelling (the first property test found that 'é' never matched).
    def as_written(key: str) -> dict[str, str]:
        path = '$."' + key + '"'
        return {"pa": path, "pu": path}

    monkeypatch.setattr(base, "key_paths", as_written)
    with pytest.raises(Exception) as failure:  # noqa: B017,PT011  (one failure, or a group of them)
        run(lease_properties.test_where_compares_type_and_value_exactly, 60, pair=lease_properties.data_and_filter())
    assert "did not match" in str(failure.value) or "JSON path" in str(failure.value), failure.value


def test_negative_control_a_refusal_that_writes_is_caught() -> None:
    def careless(kind: str) -> None:
        Resource.objects.create(kind="written", name="anyway", data={"kind": json.dumps(kind)})
        raise ValueError(f"kind must not contain NUL characters, got {kind!r}")

    with pytest.raises(AssertionError, match="wrote to"):
        with refused("kind"):
            careless("a\x00b")


def test_negative_control_a_refusal_that_names_another_argument_is_caught() -> None:
    with pytest.raises(AssertionError, match="does not name 'ttl'"):
        with refused("ttl"):
            raise ValueError("timeout must be a number of seconds, got 'x'")
