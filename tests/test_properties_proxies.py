"""Generated proxy lists for ``manage.py seed_proxies`` (Hypothesis; tests/properties.py has the
budget): a list whose every line is a proxy (any scheme's spelling, user names and passwords,
host names in any case, IPv4, IPv6 in any spelling, any port, comments and blank lines around)
is stored exactly as the independent expectation below spells it; a list with one bad line is
refused naming that line, and nothing is written.

The expectation is built from the parts the test generated (and ``ipaddress`` for IPv6's short
form), never by calling the parser under test."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from hypothesis import example, given
from hypothesis import strategies as st

from resource_lease.models import Resource
from resource_lease.proxy_urls import SCHEMES
from tests.properties import app_tables, budget, delete_everything, tally

pytestmark = pytest.mark.django_db(transaction=True)

KIND = "proxy"
# What a user name or password may hold here: RFC 3986's unreserved characters, sub-delims
# that need no encoding in user information, and percent-encodings (kept as written).
USER_CHARS = st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=")
PERCENT = st.sampled_from(["%40", "%3A", "%2F", "%23", "%20", "%C3%A9"])
userinfo_text = st.lists(st.one_of(USER_CHARS, PERCENT), min_size=1, max_size=40).map("".join)
long_user = st.text(alphabet="abcdefghij", min_size=200, max_size=240)


@dataclass(frozen=True)
class Proxy:
    line: str  # as the list spells it
    name: str  # as it must be stored: [user@]host:port
    url: str  # as it must be stored: scheme://[user[:password]@]host:port


def _label(letters: str) -> st.SearchStrategy[str]:
    """A DNS label: no '-' at either end."""
    edge = st.sampled_from(letters)
    inner = st.text(alphabet=letters + "-", min_size=1, max_size=18)
    return st.one_of(edge, st.builds(lambda a, mid, b: a + mid + b, edge, inner, edge))


hostnames = (
    st.lists(_label("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"), min_size=1, max_size=4)
    .map(".".join)
    .filter(lambda h: not all(c.isdigit() or c == "." for c in h))
)


@st.composite
def hosts(draw: st.DrawFn) -> tuple[str, str]:
    """(the host as written, as stored)."""
    which = draw(st.sampled_from(["name", "ipv4", "ipv6"]))
    if which == "name":
        host = draw(hostnames)
        dot = draw(st.sampled_from(["", "."]))
        return host + dot, host.lower()
    if which == "ipv4":
        address = draw(st.ip_addresses(v=4))
        return str(address), str(address)
    address6 = draw(st.ip_addresses(v=6))
    written = draw(st.sampled_from([address6.exploded, address6.compressed, address6.exploded.upper()]))
    return f"[{written}]", f"[{ipaddress.IPv6Address(written)}]"


@st.composite
def proxies(draw: st.DrawFn) -> Proxy:
    scheme = draw(st.one_of(st.none(), st.sampled_from(SCHEMES)))
    written_scheme = "" if scheme is None else draw(st.sampled_from([scheme, scheme.upper()])) + "://"
    host, stored_host = draw(hosts())
    port = draw(st.integers(1, 65535))
    user = draw(st.one_of(st.none(), userinfo_text, long_user))
    password = None if user is None else draw(st.one_of(st.none(), userinfo_text))
    info = "" if user is None else (user if password is None else f"{user}:{password}") + "@"
    slash = draw(st.sampled_from(["", "/"]))
    line = f"{written_scheme}{info}{host}:{port}{slash}"
    name = f"{user + '@' if user else ''}{stored_host}:{port}"
    url = f"{scheme or 'http'}://{info}{stored_host}:{port}"
    return Proxy(line, name, url)


#: Lines every list reader must refuse, with a word of why (the message names the line only).
BAD_LINES = [
    "gateway.example:0",
    "gateway.example:65536",
    "gateway.example:8o80",
    "gateway.example",
    "ftp://gateway.example:80",
    "http:/gateway.example:80",
    "@gateway.example:80",
    "user:@gateway.example:80",
    "gateway.example:80/path",
    "gateway.example:80?x=1",
    "[::1:80",
    "[::g]:80",
    "::1:80",
    "300.1.2.3:80",
    "1.2.3:80",
    "-bad-.example:80",
    "bad..example:80",
    "bad_host name.example:80",
    "gate\x00way.example:80",
]

decorations = st.sampled_from(["", "", "", "   ", "# a comment", "  # indented comment"])


def write_list(path: Path, lines: list[str], bom: bool) -> None:
    path.write_text(("\ufeff" if bom else "") + "\n".join(lines) + "\n", "utf-8")


def refused_at(path: Path, line_number: int) -> None:
    before = app_tables()
    with pytest.raises(CommandError) as error:
        call_command("seed_proxies", str(path), "--kind", KIND, stdout=open("/dev/null", "w"))  # noqa: SIM115
    assert app_tables() == before, "a refused list wrote"
    assert f"line {line_number}:" in str(error.value), str(error.value)


@budget(25)
@given(
    items=st.lists(st.tuples(proxies(), decorations, st.booleans()), max_size=6),
    bom=st.booleans(),
    bad=st.one_of(st.none(), st.tuples(st.sampled_from(BAD_LINES), st.integers(0, 6))),
)
@example(
    items=[
        (
            Proxy("SOCKS5H://u%40x:p@GW.Example.:1080/", "u%40x@gw.example:1080", "socks5h://u%40x:p@gw.example:1080"),
            "",
            False,
        )
    ],
    bom=True,
    bad=None,
)
def test_seed_proxies_stores_every_line_exactly_or_refuses_the_bad_one(
    tmp_path: Path, items: list[tuple[Proxy, str, bool]], bom: bool, bad: tuple[str, int] | None
) -> None:
    delete_everything()
    # The list, line by line: (text, the proxy it spells or None for a comment, blank or bad line).
    listed: list[tuple[str, Proxy | None]] = []
    for proxy, decoration, inline_comment in items:
        if decoration:
            listed.append((decoration, None))
        listed.append((proxy.line + ("  # note" if inline_comment else ""), proxy))
    if bad is not None:
        text, at = bad
        listed.insert(min(at, len(listed)), (text, None))
    lines = [text for text, _ in listed]
    path = tmp_path / "proxies.txt"
    # What must be stored, and the first line that must be refused: the bad line; a name over
    # 255 characters; a name already listed with another URL (the later line is the bad one).
    expected: dict[str, str] = {}
    first_problem: int | None = None
    for number, (text, proxy) in enumerate(listed, 1):
        if proxy is None:
            if bad is not None and text == bad[0]:
                first_problem = first_problem or number
            continue
        if len(proxy.name) > 255 or expected.get(proxy.name, proxy.url) != proxy.url:
            first_problem = first_problem or number
            continue
        expected[proxy.name] = proxy.url
    write_list(path, lines, bom)
    accepted = first_problem is None
    tally("seed_proxies(lines)", accepted)
    if not accepted:
        assert first_problem is not None
        refused_at(path, first_problem)
        return
    call_command("seed_proxies", str(path), "--kind", KIND, stdout=open("/dev/null", "w"))  # noqa: SIM115
    stored = {r.name: r.data for r in Resource.objects.filter(kind=KIND)}
    assert stored.keys() == expected.keys()
    for name, url in expected.items():
        assert stored[name] == {"url": url}, f"{name!r}: expected {url!r}, stored {stored[name]!r}"


def test_every_bad_line_is_refused_alone(tmp_path: Path) -> None:
    """Each of the bad lines above, alone in a list after a good one, is refused naming line 2
    (a negative control for the property test: a reader that skipped it would store a row)."""
    path = tmp_path / "proxies.txt"
    for text in BAD_LINES:
        delete_everything()
        write_list(path, ["good.example:3128", text], bom=False)
        refused_at(path, 2)
    assert not Resource.objects.exists()
