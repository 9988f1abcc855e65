"""The node inventory's rule without a database: what a node's heartbeat claim gets against
its declaration (``inventory.cap``), in each mode, and the reasons given for what it does
not get."""

from __future__ import annotations

import pytest

from trainyard_platform.services.scheduler.inventory import (
    CAPPED_FIELDS,
    NO_FLAVOR,
    Claim,
    Declared,
    InventoryMode,
    Supply,
    cap,
)

OPTIONAL, REQUIRED = InventoryMode.OPTIONAL, InventoryMode.REQUIRED
H200x8 = Declared("h200", 8)


@pytest.mark.parametrize("mode", list(InventoryMode))
def test_a_claim_within_its_declaration_gets_what_it_claims(mode: InventoryMode) -> None:
    assert cap(Claim("h200", 8, "rack-1"), H200x8, mode) == Supply("h200", 8, "rack-1")
    # Fewer than declared (a GPU gone bad): fewer, and nothing to report.
    assert cap(Claim("h200", 3, "rack-1"), H200x8, mode) == Supply("h200", 3, "rack-1")


@pytest.mark.parametrize("mode", list(InventoryMode))
def test_more_gpus_than_declared_get_the_declared_count(mode: InventoryMode) -> None:
    supply = cap(Claim("h200", 64, "rack-1"), H200x8, mode)
    assert (supply.gpu_flavor, supply.gpu_count) == ("h200", 8)
    assert supply.capped_fields == ["gpu_count"]
    assert "claims 64 GPUs, declared 8" in supply.capped[0].message


@pytest.mark.parametrize("mode", list(InventoryMode))
def test_another_flavor_than_declared_gets_no_gpu(mode: InventoryMode) -> None:
    # A dearer flavor, with fewer or more GPUs: neither figure can be trusted.
    for claimed in (2, 8, 16):
        supply = cap(Claim("b200", claimed, "rack-1"), H200x8, mode)
        assert (supply.gpu_flavor, supply.gpu_count) == ("h200", 0)
        assert supply.capped_fields == ["gpu_flavor"]
        assert "claims flavor b200, declared h200" in supply.capped[0].message


def test_a_declared_topology_wins_and_none_takes_the_claimed_one() -> None:
    declared = Declared("h200", 8, "rack-1")
    supply = cap(Claim("h200", 8, "rack-9"), declared, REQUIRED)
    assert (supply.topology, supply.gpu_count, supply.capped_fields) == ("rack-1", 8, ["topology"])
    assert cap(Claim("h200", 8, "rack-9"), H200x8, REQUIRED).topology == "rack-9"
    # Every field at once, each named.
    supply = cap(Claim("b200", 16, "rack-9"), declared, REQUIRED)
    assert supply.capped_fields == ["gpu_flavor", "topology"]


def test_an_undeclared_node_gets_its_word_only_while_the_inventory_is_optional() -> None:
    claim = Claim("h200", 8, "rack-1")
    assert cap(claim, None, OPTIONAL) == Supply("h200", 8, "rack-1")
    supply = cap(claim, None, REQUIRED)
    # No flavor either: a name the node chose must not become a flavor's node or a label.
    assert (supply.gpu_flavor, supply.gpu_count, supply.topology) == (NO_FLAVOR, 0, "rack-1")
    assert supply.capped_fields == ["undeclared"]
    assert "does not declare it" in supply.capped[0].message


def test_every_reason_is_a_catalogued_field() -> None:
    reasons = {
        field
        for claim in (Claim("b200", 16, "x"), Claim("h200", 16, "x"))
        for declared in (None, Declared("h200", 8, "y"))
        for mode in InventoryMode
        for field in cap(claim, declared, mode).capped_fields
    }
    assert reasons == set(CAPPED_FIELDS)
