"""Proxy URLs: parse and normalise a line of a proxy list, mask passwords for display, and put
the stored password back into a masked URL an operator sends back (``unmask_url``).

Accepted: ``host:port``, ``scheme://host:port`` and ``scheme://user[:password]@host:port``
(``user:password@host:port`` too), with ``scheme`` one of ``SCHEMES`` (``http`` when none is
given). The normalised URL has a lower-case scheme and host, an IPv6 address in its short
form between brackets, no trailing slash, and the user information exactly as written
(percent-encoded where the list encoded it).

A proxy is identified by ``[user@]host:port`` (its ``name``): the same gateway with other
credentials is another proxy (rotating providers hand out exits per user name), while a new
scheme or password for the same name updates the proxy.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

SCHEMES = ("http", "https", "socks4", "socks4a", "socks5", "socks5h")
DEFAULT_SCHEME = "http"
MASK = "***"

# Written out by hand rather than with urllib and ipaddress: a list of 100,000 proxies
# should parse in well under a second.
_BLANK = re.compile(r"\s")
_SCHEME_LIKE = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*:/")
_URL_TAIL = re.compile(r"[/?#]")
_HOSTNAME = re.compile(r"(?=.{1,253}$)(?:(?!-)[a-z0-9_-]{1,63}(?<!-)\.)*(?!-)[a-z0-9_-]{1,63}(?<!-)")
_DOTTED_NUMBERS = re.compile(r"[0-9.]+")
_IPV4 = re.compile(r"(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})")
_INLINE_COMMENT = re.compile(r"\s+#")


@dataclass(frozen=True, slots=True)
class ProxyURL:
    """A parsed, normalised proxy URL."""

    url: str
    scheme: str
    host: str
    port: int
    username: str
    password: str

    @property
    def name(self) -> str:
        """The proxy's identity within its kind: ``[user@]host:port``, never the password."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.username}@{host}:{self.port}" if self.username else f"{host}:{self.port}"

    @property
    def masked(self) -> str:
        return mask_url(self.url)


def strip_line(line: str) -> str:
    """A list line without its comment (``#`` at the start, or after blanks) and blanks."""
    line = _INLINE_COMMENT.split(line, maxsplit=1)[0].strip()
    return "" if line.startswith("#") else line


def parse_proxy(text: str) -> ProxyURL:
    """Parse one proxy (see the module's docstring); ``ValueError`` says what is wrong."""
    text = text.strip()
    if not text:
        raise ValueError("empty proxy")
    if _BLANK.search(text):
        raise ValueError("blanks inside the proxy")
    scheme, sep, rest = text.partition("://")
    if not sep:
        if _SCHEME_LIKE.match(text):
            raise ValueError("malformed scheme (expected scheme://)")
        scheme, rest = DEFAULT_SCHEME, text
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(f"unsupported scheme {scheme!r} (expected one of {', '.join(SCHEMES)})")
    tail = _URL_TAIL.search(rest)
    netloc = rest if tail is None else rest[: tail.start()]
    if tail is not None and rest[tail.start() :] != "/":
        raise ValueError("a proxy URL has no path, query or fragment (encode '/', '?' or '#' in a password)")
    userinfo, at, hostport = netloc.rpartition("@")
    username, colon, password = userinfo.partition(":")
    if at and not username:
        raise ValueError("empty user name before '@'")
    if colon and not password:
        raise ValueError("empty password after 'user:'")
    host, port = _host_port(hostport)
    userpart = f"{username}:{password}@" if colon else f"{username}@" if username else ""
    shown_host = f"[{host}]" if ":" in host else host
    proxy = ProxyURL(f"{scheme}://{userpart}{shown_host}:{port}", scheme, host, port, username, password)
    if len(proxy.name) > 255:
        raise ValueError(f"too long: user@host:port has {len(proxy.name)} characters (at most 255)")
    return proxy


def _host_port(hostport: str) -> tuple[str, int]:
    if hostport.startswith("["):
        literal, bracket, after = hostport[1:].partition("]")
        if not bracket:
            raise ValueError("unclosed '[' around an IPv6 address")
        try:
            host = str(ipaddress.IPv6Address(literal))
        except ValueError:
            raise ValueError(f"bad IPv6 address {literal!r}") from None
        if not after.startswith(":"):
            raise ValueError(f"missing port in {hostport!r} (expected [address]:port)")
        return host, _port(after[1:], hostport)
    host, colon, port = hostport.rpartition(":")
    if not colon:
        raise ValueError(f"missing port in {hostport!r} (expected host:port)")
    host = host.lower().rstrip(".")
    if not host:
        raise ValueError(f"missing host in {hostport!r}")
    if ":" in host:
        raise ValueError(f"an IPv6 address goes between brackets: [{host}]:{port}")
    if _DOTTED_NUMBERS.fullmatch(host):
        match = _IPV4.fullmatch(host)
        if match is None or any(int(octet) > 255 for octet in match.groups()):
            raise ValueError(f"bad IPv4 address {host!r}")
    elif not _HOSTNAME.fullmatch(host):
        raise ValueError(f"bad host name {host!r}")
    return host, _port(port, hostport)


def _port(text: str, hostport: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) <= 65535:
        raise ValueError(f"bad port in {hostport!r} (expected 1-65535)")
    return int(text)


def _credentials(url: str) -> tuple[str, str, str | None, str]:
    """``(scheme + "://", user, password, rest)`` of ``url`` as ``mask_url`` reads it: the user
    information is everything before the last ``@`` (so a password with an unencoded ``/`` or
    ``@`` is still masked whole); ``password`` is None when there is none (no ``user:``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, hostpart = rest.rpartition("@")
    if not at:
        return scheme + sep, "", None, rest
    username, colon, password = userinfo.partition(":")
    return scheme + sep, username, password if colon else None, hostpart


def mask_url(url: Any) -> str:
    """``url`` with its password replaced by ``***`` (for lists, logs and the admin)."""
    if not isinstance(url, str):
        return "" if url is None else str(url)
    prefix, username, password, hostpart = _credentials(url)
    if password is None:
        return url
    return f"{prefix}{username}:{MASK}@{hostpart}"


def unmask_url(submitted: Any, stored: Any) -> Any:
    """A URL shown masked and sent back (``submitted``) with the ``***`` placeholder replaced by
    the password of ``stored``; anything without the placeholder is returned as it is.

    The placeholder keeps the stored password only for the same user name and the same host,
    port (and anything after them): ``ValueError`` says why not otherwise, so a masked
    password can never be carried to another host. The scheme may change (it is the same proxy).
    """
    if not isinstance(submitted, str):
        return submitted
    prefix, username, password, hostpart = _credentials(submitted)
    if password != MASK:
        return submitted
    if not isinstance(stored, str):
        raise ValueError(
            f"the password {MASK} stands for the stored one, and there is no stored URL: type the password"
        )
    _, stored_username, stored_password, stored_hostpart = _credentials(stored)
    if stored_password is None:
        raise ValueError(
            f"the password {MASK} stands for the stored one, and the stored URL has none: type the password"
        )
    if (username, hostpart) != (stored_username, stored_hostpart):
        raise ValueError(
            f"the password is still the mask {MASK} but the user, host or port changed"
            f" (stored: {stored_username}@{stored_hostpart}, now: {username}@{hostpart}):"
            " type the password for the new address (a masked password is kept only for the same user@host:port)"
        )
    return f"{prefix}{username}:{stored_password}@{hostpart}"
