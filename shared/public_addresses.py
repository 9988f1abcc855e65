"""Whether an IP address is public: globally routable, so that asking it from inside a
node reaches nothing of the node's own network.

``address_problem`` names what makes an address no public one (loopback, private,
link-local, shared CGNAT, unique-local, site-local, multicast, unspecified, reserved, or an
IPv6 form of such an IPv4 address); ``literal_address`` reads a host that is an address
written out, in every form the resolver takes, without asking DNS. The runner judges a job's git
repository and its wheel URLs by them before fetching them (``services.runner.git_remote``),
the submission API a repository or wheel URL written with an address
(``services.submission.schemas``, ``shared.requirements``).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import Final

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

NOT_PRINTABLE_ASCII: Final = re.compile(r"[^\x21-\x7e]")
"""What a URL to be judged must not hold: whitespace, a control character or one beyond
ASCII. ``urlsplit`` drops tabs and line breaks and lowers some letters (the Kelvin sign)
to ASCII, so the host judged would not be the one git or an installer is given."""

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_PRIVATE = tuple(
    ipaddress.IPv4Network(net) for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
)
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")
_UNIQUE_LOCAL = ipaddress.IPv6Network("fc00::/7")


def address_problem(address: IPAddress) -> str | None:
    """What makes ``address`` no public address ("a private address", ...), None when it is
    globally routable. An IPv6 address carrying an IPv4 one (mapped ``::ffff:a.b.c.d``,
    NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``) is judged by the IPv4 address too, which is
    where a node's NAT64 or 6to4 relay (or its own stack, for a mapped one) sends it: such
    an address is judged by that alone."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour
        if inner is None and address in _NAT64:
            inner = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if inner is not None:  # judged by where it leads alone
            problem = address_problem(inner)
            return None if problem is None else f"{problem} (as {inner})"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if any(address in network for network in _PRIVATE):
        return "a private address"
    if address in _SHARED:
        return "a shared (CGNAT) address"
    if address in _UNIQUE_LOCAL:
        return "a unique-local address"
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        # fec0::/10, deprecated but still routed by some sites as their own network; Python
        # counts it as global.
        return "a site-local address"
    if not address.is_global or address.is_reserved:
        return "a reserved address, not globally routable"
    return None


def literal_address(host: str) -> IPAddress | None:
    """``host`` as the address the resolver reads it as without asking DNS: an IPv6 or
    dotted IPv4 address, and the older IPv4 forms too (``127.1``, ``0x7f.1``,
    ``2130706433``), as ``inet_aton`` (and so ``getaddrinfo`` and curl) take them."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None
