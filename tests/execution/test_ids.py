"""Execution ids that name their issuing replica (controller/execution/ids.py):
their format, what their signature refuses, the signed take between
replicas, and the replicas' key."""

from __future__ import annotations

import re

import pytest

from controller.execution.ids import (
    MAX_ID_LENGTH,
    TAKE_WINDOW_S,
    Signer,
    nonce_of,
    replica_key,
)

KEY = b"k" * 32
A = Signer("http://10.0.0.5:23456", KEY)
B = Signer("https://controller-b.internal:7200", KEY)
NONCE = "0123456789abcdef" * 2


def test_an_id_names_its_issuer_and_is_url_safe() -> None:
    execution_id = A.new_id(NONCE)
    assert re.fullmatch(r"[0-9a-f]{32}\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{43}", execution_id)
    assert nonce_of(execution_id) == NONCE
    assert A.issuer_of(execution_id) == "http://10.0.0.5:23456"
    assert B.issuer_of(execution_id) == "http://10.0.0.5:23456"  # one key, any replica reads it
    assert A.is_mine(execution_id) and not B.is_mine(execution_id)
    assert A.new_id(NONCE) == execution_id  # deterministic but for the nonce
    assert nonce_of(A.new_id()) != nonce_of(A.new_id())


def test_a_local_id_is_its_own_nonce() -> None:
    assert nonce_of("0" * 32) == "0" * 32
    assert A.issuer_of("0" * 32) is None


def _swap(execution_id: str, index: int, part: str) -> str:
    parts = execution_id.split(".")
    parts[index] = part
    return ".".join(parts)


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(lambda i: _swap(i, 0, "f" * 32), id="another nonce"),
        pytest.param(
            lambda i: _swap(i, 1, Signer("http://169.254.169.254", KEY).new_id().split(".")[1]),
            id="another issuer",
        ),
        pytest.param(lambda i: _swap(i, 2, "A" * 43), id="another mac"),
        pytest.param(lambda i: i[:-1], id="a shortened mac"),
        pytest.param(lambda i: i + "A", id="a longer mac"),
        pytest.param(lambda i: i.upper(), id="case changed"),
        pytest.param(lambda i: Signer("http://10.0.0.5:23456", b"x" * 32).new_id(), id="other key"),
        pytest.param(lambda i: i + ".x", id="four parts"),
        pytest.param(lambda i: _swap(i, 2, "é" * 43), id="not ascii"),
        pytest.param(lambda i: _swap(i, 1, "@@"), id="not base64"),
        pytest.param(lambda i: "", id="empty"),
        pytest.param(lambda i: "." * 2, id="only dots"),
        pytest.param(lambda i: "a" * (MAX_ID_LENGTH + 1), id="too long"),
    ],
)
def test_a_forged_or_altered_id_names_nobody(forge: object) -> None:
    assert callable(forge)
    assert A.issuer_of(forge(A.new_id(NONCE))) is None


def test_a_signed_issuer_that_is_not_a_base_url_is_still_refused() -> None:
    # Only a replica could make such an id; it is refused rather than followed.
    body = "0" * 32 + ".aHR0cDovL3gvcGF0aA"  # "http://x/path"
    execution_id = f"{body}.{A._mac(body)}"
    assert A.issuer_of(execution_id) is None


@pytest.mark.parametrize(
    "url",
    ["10.0.0.5:7200", "ftp://x", "http://x/api", "http://x?q=1", "http://u@x", "http://"],
)
def test_a_signer_needs_a_base_url(url: str) -> None:
    with pytest.raises(ValueError, match="base URL"):
        Signer(url, KEY)


def test_a_signer_needs_a_key_of_16_bytes_and_never_shows_it() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        Signer("http://x", b"short")
    assert "kkkk" not in repr(A)


def test_a_nonce_must_be_32_hex_digits() -> None:
    with pytest.raises(ValueError, match="32 hex"):
        A.new_id("xyz")


def test_the_take_is_signed_over_the_id_the_runner_and_the_second() -> None:
    execution_id = A.new_id(NONCE)
    now = 1_800_000_000
    signature = B.take_signature(execution_id, "runner-1", now)
    assert re.fullmatch(r"[0-9a-f]{64}", signature)
    assert A.take_authentic(execution_id, "runner-1", str(now), signature, now + 1.5)
    assert A.take_authentic(execution_id, "runner-1", str(now), signature, now - TAKE_WINDOW_S)
    # Another runner, id, second, key or a stale clock: refused.
    assert not A.take_authentic(execution_id, "runner-2", str(now), signature, now)
    assert not A.take_authentic(A.new_id(), "runner-1", str(now), signature, now)
    assert not A.take_authentic(execution_id, "runner-1", str(now + 1), signature, now)
    other = Signer(A.url, b"x" * 32)
    assert not other.take_authentic(execution_id, "runner-1", str(now), signature, now)
    assert not A.take_authentic(execution_id, "runner-1", str(now), signature, now + 31)
    for at in ("", "-1", "1e9", " 1800000000", "9" * 13):
        assert not A.take_authentic(execution_id, "runner-1", at, signature, now)
    assert not A.take_authentic(execution_id, "runner-1", str(now), "é" * 64, now)


def test_an_id_signature_is_never_a_take_signature() -> None:
    # One key signs both, under different labels.
    execution_id = A.new_id(NONCE)
    mac = execution_id.split(".")[2]
    assert mac not in B.take_signature(execution_id, "r", 0)


def test_the_replicas_key() -> None:
    assert replica_key(None, None) is None
    from_token = replica_key(None, "api-token-0123456789")
    from_secret = replica_key("s" * 32, "api-token-0123456789")
    assert from_token is not None and from_secret is not None
    assert len(from_token) == len(from_secret) == 32
    assert from_secret == replica_key("s" * 32, None)  # the secret wins over the token
    assert from_token != from_secret
    assert b"api-token" not in from_token
    assert replica_key(None, "another-token-0123456789") != from_token
