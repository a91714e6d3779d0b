"""The access-control model: operation implication and the cluster -> database -> table hierarchy."""

from __future__ import annotations

import pytest

from flightstore.acl import CLUSTER, Grant, Operation, Permission, Resource
from flightstore.errors import InvalidInput

TABLE = Resource.of_table("shop", "orders")
DATABASE = Resource.of_database("shop")


def test_operation_implication_follows_fluss():
    for operation in Operation:
        assert Operation.ALL.implies(operation)
        assert operation.implies(Operation.DESCRIBE)
        assert operation.implies(operation)
    assert not Operation.READ.implies(Operation.WRITE)
    assert not Operation.WRITE.implies(Operation.READ)
    assert not Operation.DESCRIBE.implies(Operation.READ)
    assert not Operation.CREATE.implies(Operation.ALL)


def test_resources_cover_what_lies_below_them():
    assert CLUSTER.covers(TABLE) and CLUSTER.covers(DATABASE) and CLUSTER.covers(CLUSTER)
    assert DATABASE.covers(TABLE) and DATABASE.covers(DATABASE) and not DATABASE.covers(CLUSTER)
    assert not DATABASE.covers(Resource.of_table("other", "orders"))
    assert TABLE.covers(TABLE) and not TABLE.covers(DATABASE)
    assert not TABLE.covers(Resource.of_table("shop", "items"))
    assert [r.kind for r in TABLE.ancestors()] == ["table", "database", "cluster"]
    assert str(TABLE) == "table shop.orders" and str(DATABASE) == "database shop" and str(CLUSTER) == "cluster"


def test_grants_allow_by_principal_resource_and_operation():
    grant = Grant("bob", DATABASE, Operation.WRITE)
    assert grant.allows("bob", Permission(Operation.WRITE, TABLE))
    assert grant.allows("bob", Permission(Operation.DESCRIBE, TABLE))
    assert not grant.allows("bob", Permission(Operation.READ, TABLE))
    assert not grant.allows("alice", Permission(Operation.WRITE, TABLE))
    assert not grant.allows("bob", Permission(Operation.WRITE, CLUSTER))
    assert Grant.from_json(grant.to_json()) == grant


def test_bad_names_are_refused():
    with pytest.raises(InvalidInput, match="unknown operation 'SELECT'"):
        Operation.parse("SELECT")
    assert Operation.parse(" read ") is Operation.READ
    with pytest.raises(InvalidInput):
        Resource(None, "orders")
