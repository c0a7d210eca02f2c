"""Signed tokens (gateway.tokens): minting, and every way a token is refused.

protocol 1.1, "Signed connection tokens and token lifetime": JWT HS256 with
``sub`` and ``exp`` required and ``scopes`` a list of scope strings. Pure: the
clock is injected, the key passed in; tokens other than ours are built with
PyJWT and by hand (``alg: none``).
"""

from __future__ import annotations

import base64
import json
import time

import jwt
import pytest

from gateway.access.tokens import (
    DEFAULT_MAX_TTL,
    is_signed_token,
    principal_for_claims,
    signed_token,
    verify_signed_token,
)
from gateway.core.errors import Invalid, Unauthorized
from gateway.core.scopes import MAX_SCOPES, parse_scopes
from tests.support.tokens import encode

KEY = "unit-test-signing-key-" + "0123456789abcdef" * 3  # 70 bytes: long enough for HS512
KEYB = KEY.encode()
NOW = 1_700_000_000.0


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _raw(header: dict[str, object], claims: dict[str, object], signature: str = "") -> str:
    """A JWT put together by hand: any header, any claims, any signature."""
    head = _b64(json.dumps(header).encode())
    body = _b64(json.dumps(claims).encode())
    return f"{head}.{body}.{signature}"


def _refusal(token: str, key: bytes = KEYB, now: float = NOW) -> str:
    with pytest.raises(Unauthorized) as info:
        verify_signed_token(token, key, now=now)
    return info.value.detail


# -- minting and the round trip


def test_minted_token_carries_sub_exp_and_scopes() -> None:
    token = signed_token("42", ["subscribe:orders.*"], ttl=60, key=KEY, now=NOW)
    assert is_signed_token(token)
    claims = verify_signed_token(token, KEYB, now=NOW + 1)
    assert claims.sub == "42"
    assert claims.exp == NOW + 60
    assert claims.scopes == ("subscribe:orders.*",)
    # Any standard library reads it too.
    decoded = jwt.decode(token, KEY, algorithms=["HS256"], options={"verify_exp": False})
    assert decoded["sub"] == "42" and decoded["exp"] == int(NOW + 60)


def test_ttl_rounds_exp_up_to_a_whole_second() -> None:
    token = signed_token("a", [], ttl=1.2, key=KEY, now=NOW + 0.5)
    assert verify_signed_token(token, KEYB, now=NOW).exp == NOW + 2


def test_principal_of_a_signed_token_has_its_scopes_subject_and_expiry() -> None:
    claims = verify_signed_token(
        signed_token("alice", ["subscribe:news.*", "publish:chat"], 30, key=KEY, now=NOW),
        KEYB,
        now=NOW,
    )
    p = principal_for_claims(claims)
    assert p.name == "signed:alice" and p.subject == "alice"
    assert p.expires_at == NOW + 30
    assert p.token_id is None and not p.is_admin
    assert p.allows("subscribe", "news.eu")
    assert not p.allows("subscribe", "secret")
    assert p.allows("publish", "chat")
    assert not p.allows("consume", "chat")


def test_scopes_left_out_allow_nothing() -> None:
    claims = verify_signed_token(encode({"sub": "a", "exp": int(NOW) + 10}, KEY), KEYB, now=NOW)
    assert claims.scopes == ()
    assert not principal_for_claims(claims).allows("subscribe", "x")


def test_minting_checks_its_arguments() -> None:
    with pytest.raises(Invalid):
        signed_token("", [], 10, key=KEY)
    with pytest.raises(Invalid):
        signed_token("x" * 201, [], 10, key=KEY)
    with pytest.raises(Invalid):
        signed_token("a", ["subscribe:no spaces"], 10, key=KEY)
    with pytest.raises(Invalid):
        signed_token("a", ["delete:x"], 10, key=KEY)
    with pytest.raises(Invalid):
        signed_token("a", [], 0, key=KEY)
    with pytest.raises(Invalid):
        signed_token("a", [], -5, key=KEY)
    with pytest.raises(Invalid):
        signed_token("a", [], 10, key="")


def test_stored_tokens_never_look_signed() -> None:
    assert not is_signed_token("lc_" + "A-b_9" * 8)
    assert is_signed_token("a.b.c")


# -- every refusal


def test_expired_token_is_refused_at_exp_not_before() -> None:
    token = signed_token("a", [], ttl=10, key=KEY, now=NOW)
    verify_signed_token(token, KEYB, now=NOW + 9.999)
    assert "expired" in _refusal(token, now=NOW + 10)
    assert "expired" in _refusal(token, now=NOW + 1000)


def test_wrong_key_is_refused() -> None:
    token = signed_token("a", ["admin"], ttl=10, key="another-key-of-enough-length-0123456")
    assert "signature" in _refusal(token, now=time.time())


def test_no_key_configured_refuses_every_signed_token() -> None:
    # Never checked against an empty key: anyone could sign with that.
    token = encode({"sub": "a", "exp": int(NOW) + 10}, KEY)
    detail = _refusal(token, key=b"")
    assert "not accepted" in detail


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
def test_alg_none_is_refused(alg: str) -> None:
    token = _raw(
        {"alg": alg, "typ": "JWT"}, {"sub": "a", "exp": int(NOW) + 10, "scopes": ["admin"]}
    )
    assert "HS256" in _refusal(token)


def test_other_algorithms_are_refused_even_with_the_right_key() -> None:
    for alg in ("HS384", "HS512"):
        token = encode({"sub": "a", "exp": int(NOW) + 10}, KEY, alg)
        assert "HS256" in _refusal(token)


def test_a_signature_stripped_from_a_valid_token_is_refused() -> None:
    head, body, _sig = signed_token("a", ["admin"], 10, key=KEY, now=NOW).split(".")
    assert "signature" in _refusal(f"{head}.{body}.")


def test_tampered_claims_are_refused() -> None:
    head, _body, sig = signed_token("a", [], 10, key=KEY, now=NOW).split(".")
    body = _b64(json.dumps({"sub": "a", "exp": int(NOW) + 10, "scopes": ["admin"]}).encode())
    assert "signature" in _refusal(f"{head}.{body}.{sig}")


def test_missing_exp_is_refused() -> None:
    assert "'exp'" in _refusal(encode({"sub": "a", "scopes": []}, KEY))


def test_missing_sub_is_refused() -> None:
    assert "'sub'" in _refusal(encode({"exp": int(NOW) + 10, "scopes": []}, KEY))


@pytest.mark.parametrize("sub", ["", 42, None, ["a"], "x" * 201])
def test_sub_of_the_wrong_type_or_length_is_refused(sub: object) -> None:
    assert _refusal(encode({"sub": sub, "exp": int(NOW) + 10}, KEY))


@pytest.mark.parametrize("exp", ["tomorrow", None, True, [1]])
def test_exp_that_is_not_a_number_is_refused(exp: object) -> None:
    assert _refusal(encode({"sub": "a", "exp": exp}, KEY))


@pytest.mark.parametrize(
    "scopes",
    [
        "subscribe:a",  # a string, not a list
        {"subscribe": "a"},
        [1],
        [None],
        ["subscribe:a", 2],
        ["subscribe:bad name"],
        ["read:a"],
        ["subscribe"],
        ["subscribe:"],
        ["subscribe:a"] * (MAX_SCOPES + 1),
    ],
)
def test_scopes_not_a_list_of_valid_scope_strings_are_refused(scopes: object) -> None:
    detail = _refusal(encode({"sub": "a", "exp": int(NOW) + 10, "scopes": scopes}, KEY))
    assert "bad claims" in detail
    assert len(detail) < 300  # a huge claim is not echoed back whole


@pytest.mark.parametrize(
    "token",
    [
        "a.b.c",
        "..",
        "not-a-jwt",
        "eyJhbGciOiJIUzI1NiJ9.!!!.xyz",
        _b64(b"[]") + "." + _b64(b"{}") + ".",
        _b64(b'{"alg": "HS256"}') + "." + _b64(b"[1, 2]") + "." + _b64(b"sig"),
        _b64(b'{"alg": "HS256"}') + "." + _b64(b"not json") + "." + _b64(b"sig"),
    ],
)
def test_malformed_tokens_are_refused(token: str) -> None:
    assert _refusal(token)


def test_not_yet_valid_token_is_refused() -> None:
    token = encode({"sub": "a", "exp": int(time.time()) + 100, "nbf": int(time.time()) + 50}, KEY)
    assert "not valid yet" in _refusal(token, now=time.time())


def test_refusals_never_name_the_key() -> None:
    tokens = [
        signed_token("a", [], 10, key="wrong-key-of-enough-length-0123456789", now=NOW),
        encode({"sub": "a"}, KEY),
        _raw({"alg": "none"}, {"sub": "a", "exp": 1}),
        "x.y.z",
    ]
    for token in tokens:
        detail = _refusal(token)
        assert KEY not in detail and KEYB.decode() not in detail


# -- scope lists (gateway.core.scopes.parse_scopes)


def test_parse_scopes_takes_a_list_of_valid_scopes() -> None:
    assert parse_scopes(["admin", "consume:jobs.*", "subscribe:*"]) == (
        "admin",
        "consume:jobs.*",
        "subscribe:*",
    )
    assert parse_scopes([]) == ()


@pytest.mark.parametrize(
    "value", ["admin", ("admin",), None, [1], ["admin", "nope"], ["enqueue:a b"]]
)
def test_parse_scopes_refuses_anything_else(value: object) -> None:
    with pytest.raises(Invalid):
        parse_scopes(value)


# -- the revocation watch's task: runs only while it watches a socket


class _Socket:
    """A watched socket that records being told (implements auth.Watched)."""

    def __init__(self) -> None:
        self.revoked = 0

    def token_revoked(self) -> None:
        self.revoked += 1


async def test_revocation_watch_runs_only_while_it_watches_sockets() -> None:
    import asyncio

    from gateway.access.auth import RevocationWatch

    watch = RevocationWatch()
    assert not watch.running()
    a, b = _Socket(), _Socket()
    watch.add(1, a)
    watch.add(2, b)
    assert watch.running() and watch.watched() == 2
    task = watch._task
    watch.discard(1, a)
    assert watch.running() and watch.watched() == 1
    watch.discard(2, b)
    assert not watch.running() and watch.watched() == 0
    await asyncio.sleep(0)
    assert task is not None and task.cancelled()
    # stop() at shutdown: no task left either.
    watch.add(3, a)
    task = watch._task
    watch.stop()
    await asyncio.sleep(0)
    assert task is not None and task.cancelled() and not watch.running()
    assert a.revoked == 0 and b.revoked == 0


# -- lifetime and binding (issue 22.12)


@pytest.mark.parametrize("exp", [float("nan"), float("inf"), float("-inf"), 1e308, NOW + 10**9])
def test_exp_that_never_comes_is_refused(exp: float) -> None:
    # NaN compares false with every clock reading, so "now >= exp" never held.
    detail = _refusal(encode({"sub": "a", "exp": exp}, KEY))
    assert "exp" in detail


def test_a_lifetime_over_the_maximum_is_refused() -> None:
    token = encode({"sub": "a", "exp": int(NOW) + 3600}, KEY)
    verify_signed_token(token, KEYB, now=NOW, max_ttl=3600)
    with pytest.raises(Unauthorized, match="GATEWAY_SIGNING_MAX_TTL"):
        verify_signed_token(token, KEYB, now=NOW, max_ttl=600)
    # Once enough of it has passed, what is left is within the maximum.
    verify_signed_token(token, KEYB, now=NOW + 3000, max_ttl=600)
    # The default maximum is a day.
    assert DEFAULT_MAX_TTL == 86400
    verify_signed_token(encode({"sub": "a", "exp": int(NOW) + 86400}, KEY), KEYB, now=NOW)
    assert "GATEWAY_SIGNING_MAX_TTL" in _refusal(
        encode({"sub": "a", "exp": int(NOW) + 86400 * 2}, KEY)
    )


def test_minting_refuses_a_ttl_over_the_maximum() -> None:
    with pytest.raises(Invalid, match="GATEWAY_SIGNING_MAX_TTL"):
        signed_token("a", [], ttl=86400 * 2, key=KEY)
    with pytest.raises(Invalid, match="GATEWAY_SIGNING_MAX_TTL"):
        signed_token("a", [], ttl=601, key=KEY, max_ttl=600)
    signed_token("a", [], ttl=86400, key=KEY)


def test_audience_and_issuer_bind_a_token_when_configured() -> None:
    bound = signed_token("a", [], ttl=60, key=KEY, now=NOW, audience="gw-eu", issuer="shop")
    claims = jwt.decode(
        bound, KEY, algorithms=["HS256"], options={"verify_exp": False, "verify_aud": False}
    )
    assert claims["aud"] == "gw-eu" and claims["iss"] == "shop"
    verify_signed_token(bound, KEYB, now=NOW, audience="gw-eu", issuer="shop")
    # Not configured: the claims are not looked at.
    verify_signed_token(bound, KEYB, now=NOW)
    unbound = signed_token("a", [], ttl=60, key=KEY, now=NOW)
    for token, audience, issuer, what in (
        (unbound, "gw-eu", None, "aud"),
        (unbound, None, "shop", "iss"),
        (bound, "gw-us", None, "aud"),
        (bound, None, "billing", "iss"),
    ):
        with pytest.raises(Unauthorized, match=what):
            verify_signed_token(token, KEYB, now=NOW, audience=audience, issuer=issuer)
    # A list of audiences binds it to each of them (RFC 7519).
    listed = encode({"sub": "a", "exp": int(NOW) + 10, "aud": ["gw-us", "gw-eu"]}, KEY)
    verify_signed_token(listed, KEYB, now=NOW, audience="gw-eu")
    with pytest.raises(Unauthorized, match="aud"):
        verify_signed_token(
            encode({"sub": "a", "exp": int(NOW) + 10, "aud": 7}, KEY), KEYB, now=NOW, audience="7"
        )
