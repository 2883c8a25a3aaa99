"""Filters of the ray_cluster role: is an address reachable from the internet (Ray has no auth)."""

from __future__ import annotations

import ipaddress


def ray_cluster_is_public(address: str) -> bool:
    """True for a globally routable address (not private, loopback, link-local, CGNAT, test-net).

    An empty or malformed address is not public (the role's inventory check reports it).
    """
    try:
        return ipaddress.ip_address(str(address).strip()).is_global
    except ValueError:
        return False


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {"ray_cluster_is_public": ray_cluster_is_public}
