"""Live configuration on the database: ``Config(namespace, defaults={...})``.

Each key is one row (``ConfigEntry``) holding its type and default as declared by the code
(so the admin validates an edit as ``set`` does), the stored value (NULL: the default
applies) and a version raised by one on every change. A ``Config`` reads its namespace at
most once per ``poll`` seconds when asked for a value, so every process sees a change within
``poll`` seconds; ``watch`` calls back with ``(key, old, new)`` from a background thread
(woken at once by PostgreSQL NOTIFY, polling elsewhere), like ``resource_lease.watch``.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import reprlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

from resource_lease.db.operations import ops
from resource_lease.db.topics import channel
from resource_lease.models import ConfigEntry
from resource_lease.offload import async_twin
from resource_lease.recipes.notifications import POLL, check_poll, decode_json
from resource_lease.validation import (
    check_callable,
    check_name,
    check_text,
    encode_json,
    refuse_inside_single_writer_transaction,
    resolve_using,
)
from resource_lease.watching import Watch

logger = logging.getLogger("resource_lease")

#: The types a key's default may have, by the name stored with the key.
TYPES: dict[str, type] = {"bool": bool, "int": int, "float": float, "str": str, "list": list, "dict": dict}
_NAMES = {cls: name for name, cls in TYPES.items()}
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlist, _SHOWN.maxdict = 6, 200, 200, 20, 20


def type_name_of(default: Any, name: str) -> str:
    """The stored type name of a default value; ValueError naming ``name`` if unsupported."""
    found = _NAMES.get(type(default))
    if found is None:
        raise ValueError(
            f"{name} must be a bool, int, float, str, list or dict (its type is the key's), got {default!r}"
        )
    coerce(found, default, name)
    return found


def coerce(type_name: str, value: Any, key: str) -> Any:
    """``value`` as a value of a key whose default has type ``type_name``: an int becomes a
    float for a float key; anything else of another type is a ValueError naming the key."""
    expected = TYPES[type_name]
    wrong = ValueError(
        f"config key {key!r} takes {_article(type_name)} {type_name} (the type of its default),"
        f" got {_SHOWN.repr(value)}"  # a short repr: a value nested too deep has no full one
    )
    if type_name in ("int", "float") and isinstance(value, bool):
        raise wrong  # a bool is an int to Python, never a number here
    if type_name == "float" and isinstance(value, int):
        value = float(value)
    if not isinstance(value, expected):
        raise wrong
    value = cast(Any, value)
    if type_name == "float" and not math.isfinite(value):
        raise ValueError(f"config key {key!r} takes a finite float, got {value!r}")
    if type_name == "str":
        check_text(value, f"config key {key!r}")
    if type_name in ("list", "dict"):
        encode_json(value, f"config key {key!r}")
    return value


def parse_text(type_name: str, text: str, key: str) -> Any:
    """A value typed as text (the admin's form): a str as it is; a bool as true/false; a
    number, list or dict as JSON; then checked by ``coerce``. ValueError naming the key."""
    if type_name == "str":
        value: Any = text
    elif type_name == "bool" and text.strip().lower() in ("true", "false"):
        value = text.strip().lower() == "true"
    else:
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"config key {key!r} takes {_article(type_name)} {type_name}, got {text!r}") from exc
    return coerce(type_name, value, key)


def store_entry(entry: ConfigEntry, value: Any, *, using: str | None = None) -> int:
    """Store ``value`` for an existing entry (None: back to its default), validated by the
    type recorded with it, through the same upsert as ``Config.set``; its new version."""
    text = None if value is None else encode_json(coerce(entry.type, value, entry.key), f"config key {entry.key!r}")
    alias = resolve_using(using)
    refuse_inside_single_writer_transaction(alias, "storing a config value")
    default = encode_json(entry.default, "default")
    wake = channel("config", entry.namespace)

    return ops(alias).set_config(
        entry.namespace, entry.key, type_name=entry.type, default=default, value=text, channel=wake
    )


def _article(type_name: str) -> str:
    return "an" if type_name == "int" else "a"


def _conflicts(stored: Mapping[str, str], declared: Mapping[str, str]) -> list[str]:
    """The keys whose stored type is not the one declared here, sorted."""
    return sorted(key for key, type_name in declared.items() if stored.get(key, type_name) != type_name)


def _argument(type_name: str, value: Any, key: str, name: str) -> Any:
    """``coerce`` for an argument other than the value of ``set``: its error names it."""
    try:
        return coerce(type_name, value, key)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and bool(a == b)


class Config:
    """Typed parameters of ``namespace``, stored in the database and seen by every process.

    ``defaults`` declares the keys: a key's type is its default's (bool, int, float, str,
    list, dict). Constructing a Config records the keys' types and defaults in the database
    (for the admin); it is cheap to construct once per process, after ``django.setup()``.
    The first declaration of a key fixes its type for every process: a Config declaring
    another type is a ``ValueError`` (nothing written), and ``Config.retype`` changes it.
    """

    def __init__(
        self, namespace: str, defaults: Mapping[str, Any] | None = None, *, poll: float = POLL, using: str | None = None
    ) -> None:
        self.namespace = check_name(namespace, "namespace")
        if defaults is None:
            defaults = {}
        if not isinstance(defaults, Mapping):
            raise ValueError(f"defaults must be a mapping of key to default value, got {defaults!r}")
        self._types: dict[str, str] = {}
        self._defaults: dict[str, Any] = {}
        for key, default in defaults.items():
            check_name(key, "defaults key")
            self._types[key] = type_name_of(default, f"defaults[{key!r}]")
            self._defaults[key] = copy.deepcopy(default)
        self.poll = check_poll(poll)
        self.using = resolve_using(using)
        self._channel = channel("config", self.namespace)
        self._lock = threading.Lock()
        self._stored: dict[str, tuple[int, Any]] = {}  # key: (version, value or the default)
        self._loaded_at = -math.inf
        self._failing = False
        self._declare()
        self._refresh(force=True)

    def __repr__(self) -> str:
        return f"<Config {self.namespace!r} keys={sorted(self._defaults)}>"

    # -- reading ---------------------------------------------------------------------

    def __getitem__(self, key: str) -> Any:
        """The key's current value (at most ``poll`` seconds old); its default if none is stored."""
        self._known(key)
        self._refresh()
        with self._lock:
            value = self._stored.get(key, (0, self._defaults[key]))[1]
        return copy.deepcopy(value) if isinstance(value, (list, dict)) else value

    def __contains__(self, key: object) -> bool:
        return key in self._defaults

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._defaults))

    def __len__(self) -> int:
        return len(self._defaults)

    def keys(self) -> list[str]:
        return sorted(self._defaults)

    def as_dict(self) -> dict[str, Any]:
        """Every key's current value."""
        return {key: self[key] for key in self.keys()}

    aget = async_twin(__getitem__)

    aas_dict = async_twin(as_dict)

    @property
    def defaults(self) -> dict[str, Any]:
        return copy.deepcopy(self._defaults)

    # -- writing ---------------------------------------------------------------------

    def set(self, key: str, value: Any) -> None:
        """Store ``value`` for ``key`` (committed at once): every process sees it within its
        poll interval. KeyError for a key with no default; ValueError (nothing written) for
        a value whose type is not the default's (an int is taken for a float key)."""
        self._known(key)
        value = coerce(self._types[key], value, key)
        self._write(key, encode_json(value, f"config key {key!r}"), value)

    aset = async_twin(set)  # noqa: A003 - the method above, not the builtin

    def compare_and_set(self, key: str, expected: Any, new: Any) -> bool:
        """Store ``new`` for ``key`` only if its current value is ``expected`` (its default
        counts when no value is stored): True if it was (and ``new`` is stored now), False if
        the value was something else. Validated like ``set`` (KeyError for an unknown key,
        ValueError naming ``expected`` or ``new`` for a value of the wrong type, nothing
        written). The value is read, then written by one conditional statement that only
        matches while the key's version is still the one read; a miss is read again, so a
        concurrent change is never overwritten and False means the value really differed.
        Watchers see a change as after ``set``. A connection lost during the write raises
        ``OutcomeUnknown``."""
        self._known(key)
        type_name = self._types[key]
        expected = _argument(type_name, expected, key, "expected")
        new = _argument(type_name, new, key, "new")
        text = encode_json(new, f"config key {key!r}")
        refuse_inside_single_writer_transaction(self.using, "Config.compare_and_set()")
        operations = ops(self.using)
        while True:
            rows = self._read()
            found = [version for k, _, version in rows if k == key]
            if not found:  # the key's row is gone (deleted in the admin): declare it again
                self._declare()
                continue
            version, current = self._effective(rows)[key]
            if not same(current, expected):
                return False
            if same(current, new):
                return True  # nothing to change (a set would only raise the version)
            if operations.compare_and_set_config(
                self.namespace, key, version=version, value=text, channel=self._channel
            ):
                with self._lock:
                    if version + 1 > self._stored.get(key, (0, None))[0]:
                        self._stored[key] = (version + 1, new)
                return True

    acompare_and_set = async_twin(compare_and_set)

    def reset(self, key: str) -> None:
        """Remove the stored value of ``key``: its default applies again (a change watchers see)."""
        self._known(key)
        self._write(key, None, self._defaults[key])

    areset = async_twin(reset)

    def _write(self, key: str, text: str | None, value: Any) -> None:
        refuse_inside_single_writer_transaction(self.using, "Config.set()")
        default = encode_json(self._defaults[key], "default")
        type_name = self._types[key]

        version = ops(self.using).set_config(
            self.namespace, key, type_name=type_name, default=default, value=text, channel=self._channel
        )
        with self._lock:
            if version > self._stored.get(key, (0, None))[0]:
                self._stored[key] = (version, value)

    # -- watching --------------------------------------------------------------------

    def watch(self, callback: Callable[[str, Any, Any], Any], *, poll: float | None = None) -> Watch:
        """Call ``callback(key, old, new)`` (on the watch's callback thread) whenever a key's value
        changes after this call (by ``set``, the admin, any process). Changes close together
        may be coalesced (old is what the callback last saw); calls never overlap; a callback
        that raises is logged and the watch goes on. ``stop()`` ends it."""
        if check_callable(callback, "callback") is None:
            raise ValueError("callback must be callable, got None")
        interval = self.poll if poll is None else check_poll(poll)
        seen = self._effective(self._read())

        def check(emit: Callable[..., None]) -> None:
            rows = self._read()
            now = self._effective(rows)
            for key in sorted(now):
                version, value = now[key]
                old_version, old = seen[key]
                if version == old_version:
                    continue
                seen[key] = (version, value)
                if same(old, value):
                    continue  # changed and changed back between two reads
                emit(key, copy.deepcopy(old), copy.deepcopy(value))

        return Watch(
            name=f"config:{self.namespace}",
            using=self.using,
            poll=interval,
            wake_channel=self._channel,
            check=check,
            callback=callback,
        ).start()

    @property
    def alias(self) -> str:
        """The database alias (``using``), by its older name."""
        return self.using

    # -- the database ----------------------------------------------------------------

    def _known(self, key: str) -> None:
        if key not in self._defaults:
            raise KeyError(f"config {self.namespace!r} has no key {key!r} (keys: {', '.join(self.keys()) or 'none'})")

    def _declare(self) -> None:
        if not self._defaults:
            return
        refuse_inside_single_writer_transaction(self.using, "Config()")
        declared = [(key, self._types[key], encode_json(self._defaults[key], "default")) for key in self.keys()]

        operations = ops(self.using)
        # Refused before anything is written when the types read now conflict; read again
        # after declaring: another process may have declared a key first, meanwhile.
        self._refuse_conflicts(operations.config_types(self.namespace))
        self._refuse_conflicts(operations.declare_config(self.namespace, declared))

    def _refuse_conflicts(self, stored: Mapping[str, str]) -> None:
        conflicts = _conflicts(stored, self._types)
        if not conflicts:
            return
        key = conflicts[0]
        raise ValueError(
            f"defaults[{key!r}] is {_article(self._types[key])} {self._types[key]}, but config"
            f" {self.namespace!r} key {key!r} was declared {_article(stored[key])} {stored[key]} first (its type"
            f" holds for every process, the admin included). To change it, run"
            f" Config.retype({self.namespace!r}, {key!r}, <new default>) once, then deploy the code that"
            " declares the new type."
        )

    @staticmethod
    def retype(namespace: str, key: str, default: Any, *, using: str | None = None) -> None:
        """Change the type (and default) of a declared key: the explicit step a change of type
        needs, since the first declaration's type holds. A stored value that does not fit the
        new type is removed (the default applies, watchers see the change); one that fits is
        kept. Processes that still declare the old type are refused when they build their
        ``Config``, and read the key's default meanwhile. KeyError for a key never declared."""
        namespace = check_name(namespace, "namespace")
        key = check_name(key, "key")
        type_name = type_name_of(default, "default")
        text = encode_json(default, "default")
        alias = resolve_using(using)
        refuse_inside_single_writer_transaction(alias, "Config.retype()")
        operations = ops(alias)
        if not operations.retype_config(namespace, key, type_name=type_name, default=text):
            raise KeyError(f"config {namespace!r} has no declared key {key!r}")
        stored = next((value for k, value, _ in operations.read_config(namespace) if k == key), None)
        if stored is None:
            return
        try:
            coerce(type_name, decode_json(stored), key)
        except ValueError:
            entry = ConfigEntry(namespace=namespace, key=key, type=type_name, default=default)
            store_entry(entry, None, using=alias)
            logger.warning(
                "Config %r: the stored value of %r did not fit its new type %s: removed", namespace, key, type_name
            )

    def _read(self) -> list[tuple[str, str | None, int]]:
        rows = ops(self.using).read_config(self.namespace)
        self._merge(rows)
        return rows

    def _effective(self, rows: list[tuple[str, str | None, int]]) -> dict[str, tuple[int, Any]]:
        """``{key: (version, value)}`` for every declared key (a stored value that does not
        fit the key's type is logged and its default used)."""
        found = {key: (version, text) for key, text, version in rows}
        out: dict[str, tuple[int, Any]] = {}
        for key, default in self._defaults.items():
            version, text = found.get(key, (0, None))
            value = default
            if text is not None:
                try:
                    value = coerce(self._types[key], decode_json(text), key)
                except ValueError:
                    logger.error(
                        "Config %r: the stored value of %r does not fit its default %r; using the default",
                        self.namespace,
                        key,
                        default,
                        exc_info=True,
                    )
            out[key] = (version, value)
        return out

    def _merge(self, rows: list[tuple[str, str | None, int]]) -> None:
        effective = self._effective(rows)
        with self._lock:
            for key, (version, value) in effective.items():
                if version >= self._stored.get(key, (-1, None))[0]:
                    self._stored[key] = (version, value)
            self._loaded_at = time.monotonic()

    def _refresh(self, *, force: bool = False) -> None:
        if not force and time.monotonic() - self._loaded_at < self.poll:
            return
        try:
            self._read()
        except Exception:
            if force:
                raise
            with self._lock:
                self._loaded_at = time.monotonic()  # serve the last values; try again after poll
                first = not self._failing
                self._failing = True
            if first:
                logger.error(
                    "Config %r: cannot read the database; serving the last known values", self.namespace, exc_info=True
                )
            return
        if self._failing:
            self._failing = False
            logger.warning("Config %r: the database answers again", self.namespace)


__all__ = ["Config", "coerce", "parse_text", "store_entry", "type_name_of"]
