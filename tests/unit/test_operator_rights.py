"""Operator rights of principals (issue 22, item 5): pure, no Django.

Staff is not enough: a session principal has the operator rights of its
user's Django permissions (``view_queue``, ``change_queue``,
``change_topic``), a superuser and an ``admin`` token have them all, and a
token without ``admin`` has none, whatever its other scopes.
"""

from __future__ import annotations

import pytest

from gateway.core.errors import Forbidden
from gateway.core.scopes import OPERATOR_RIGHTS, Principal, operator_principal


def test_an_admin_token_has_every_operator_right_and_other_tokens_none() -> None:
    admin = Principal.from_scopes("a", ["admin"])
    worker = Principal.from_scopes("w", ["consume:*", "enqueue:*", "publish:*", "subscribe:*"])
    for right in OPERATOR_RIGHTS:
        assert admin.allows(right)
        assert not worker.allows(right)
        with pytest.raises(Forbidden):
            worker.require(right)


def test_a_staff_session_has_the_rights_of_its_permissions_only() -> None:
    nothing = operator_principal("nobody", 1, superuser=False, permissions=set())
    assert not any(nothing.allows(right) for right in OPERATOR_RIGHTS)
    assert not nothing.allows("metrics") and not nothing.allows("admin")
    # A client's work is not an operator action: any staff session may do it.
    for action in ("enqueue", "consume", "publish", "subscribe"):
        assert nothing.allows(action, "any.name")
    with pytest.raises(Forbidden, match=r"gateway\.view_queue"):
        nothing.require("view_queue")

    viewer = operator_principal("viewer", 2, superuser=False, permissions={"view_queue"})
    assert viewer.allows("view_queue") and viewer.allows("metrics")
    assert viewer.allows("subscribe", "any.topic")  # reading a topic is reading
    assert not viewer.allows("change_queue") and not viewer.allows("change_topic")
    assert not viewer.allows("admin")

    changer = operator_principal("changer", 3, superuser=False, permissions={"change_queue"})
    # As in the Django admin, changing implies viewing.
    assert changer.allows("change_queue") and changer.allows("view_queue")
    assert changer.allows("enqueue", "q") and changer.allows("consume", "q")
    assert not changer.allows("change_topic")

    topics = operator_principal("topics", 4, superuser=False, permissions={"change_topic"})
    assert topics.allows("change_topic")
    assert not topics.allows("view_queue") and not topics.allows("change_queue")

    root = operator_principal("root", 5, superuser=True, permissions=set())
    assert root.is_admin and all(root.allows(right) for right in OPERATOR_RIGHTS)


def test_a_principal_covers_another_only_with_every_right_of_it() -> None:
    both = operator_principal("u", 1, superuser=False, permissions={"view_queue", "change_topic"})
    viewer = operator_principal("u", 1, superuser=False, permissions={"view_queue"})
    root = operator_principal("u", 1, superuser=True, permissions=set())
    assert both.covers(viewer) and both.covers(both)
    assert not viewer.covers(both)  # change_topic lost
    assert root.covers(both) and not both.covers(root)
