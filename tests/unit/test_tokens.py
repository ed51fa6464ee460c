"""Decision ids: round trip, every corruption or foreign signature rejected, rotation by key id, and the ids
issued before key ids still verified."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from latebandit.engine.feedback import Reason, Rejection, parse_conversion
from latebandit.tokens import (
    MAX_TOKEN_LENGTH,
    BatchVerifier,
    DecisionToken,
    InvalidToken,
    TokenSigner,
    _Signature,
    key_id,
    new_nonce,
)

SECRET = "unit-test-secret-0123456789abcdefghijklmnopqrstuvwxyz"
OLD_SECRET = "the-secret-before-the-rotation-0123456789abcdef"
ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}", fullmatch=True)
tokens = st.builds(
    DecisionToken,
    campaign=ids,
    arm=st.integers(0, 255),
    decided_at=st.integers(0, 2**62),
    version=st.integers(1, 10**6),
    nonce=st.binary(min_size=6, max_size=6),
    fallback=st.booleans(),
)


@given(tokens)
def test_round_trip_and_length(token: DecisionToken) -> None:
    signer = TokenSigner(SECRET)
    signed = signer.sign(token)
    assert len(signed) <= MAX_TOKEN_LENGTH
    assert signer.verify(signed) == token


@given(st.binary(max_size=200), st.binary(max_size=300))
def test_the_precomputed_signature_is_hmac_sha256(key: bytes, payload: bytes) -> None:
    """Against the standard library's HMAC, for keys shorter than, as long as and longer than a block."""
    assert _Signature(key)(payload) == hmac.digest(key, payload, "sha256")[:16]


def test_a_batch_verifier_answers_as_its_signer_and_refuses_a_bad_id_each_time() -> None:
    """The fields of an id sent twice in a batch are the signer's both times; a refusal is not remembered as
    an answer (the second sending of a forged id is refused too)."""
    signer = TokenSigner(SECRET)
    batch = BatchVerifier(signer)
    token = DecisionToken("c", 3, 1_767_225_600_000_000, 2, new_nonce(), fallback=True)
    issued = signer.sign(token)
    assert batch.fields(issued) == signer.fields(issued) == tuple(token)
    assert batch.fields(issued) == tuple(token)
    forged = issued[:-2] + ("AA" if issued[-2:] != "AA" else "BA")
    for _ in range(2):
        with pytest.raises(InvalidToken):
            batch.fields(forged)


URLSAFE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def test_only_the_issued_spelling_of_an_id_verifies() -> None:
    """Characters the base64 decoder skips, excess padding, and a last character whose unused bits differ
    all decode to the issued token: each such spelling is refused, or a conversion sent under it would
    count again (a decision's conversion is remembered by its id as sent)."""
    signer = TokenSigner(SECRET)
    issued = signer.sign(DecisionToken("c", 1, 1_767_225_600_000_000, 1, new_nonce()))
    body, signature = issued.split(".")
    # 16 bytes take 22 characters, whose last carries 4 unused bits (zero as issued): set one of them
    unused_bit = signature[:-1] + URLSAFE[URLSAFE.index(signature[-1]) + 1]
    spellings = [issued + "\n", issued + " ", issued + ".", issued + "=", f" {body}.{signature}",
                 f"{body}.{signature[:5]} {signature[5:]}", f"{body}.{unused_bit}"]  # fmt: skip
    for spelling in spellings:
        with pytest.raises(InvalidToken):
            signer.verify(spelling)
    assert signer.verify(issued).arm == 1


def test_the_longest_id_fits_the_contract() -> None:
    """Every field at its largest (128-character campaign, 256th arm, the last int64 microsecond)."""
    token = DecisionToken("c" * 128, 255, 2**63 - 1, 2**32 - 1, b"\xff" * 6, True)
    signed = TokenSigner(SECRET).sign(token)
    assert len(signed) == 226 <= MAX_TOKEN_LENGTH
    assert TokenSigner(SECRET).verify(signed) == token


@given(tokens, st.data())
def test_any_single_character_change_is_rejected(token: DecisionToken, data: st.DataObject) -> None:
    signer = TokenSigner(SECRET)
    signed = signer.sign(token)
    position = data.draw(st.integers(0, len(signed) - 1))
    replacement = data.draw(st.sampled_from("AQgw_-.x0").filter(lambda c: c != signed[position]))
    forged = signed[:position] + replacement + signed[position + 1 :]
    try:
        decoded = signer.verify(forged)
    except InvalidToken:
        return
    # base64 padding bits can absorb a change that decodes to the same bytes: then nothing changed.
    assert decoded == token


def test_foreign_secret_garbage_and_overlong_ids_are_rejected() -> None:
    token = DecisionToken("c", 1, 123, 1, new_nonce())
    with pytest.raises(InvalidToken):
        TokenSigner("other-" + SECRET).verify(TokenSigner(SECRET).sign(token))
    for garbage in ("", ".", "abc", "a.b.c", "%%%.%%%", "AQ.AAAA", "x" * 300):
        with pytest.raises(InvalidToken):
            TokenSigner(SECRET).verify(garbage)


def test_an_id_signed_before_a_rotation_verifies_while_its_secret_is_listed() -> None:
    token = DecisionToken("summer-sale", 2, 1_767_225_600_000_000, 3, new_nonce())
    before = TokenSigner(OLD_SECRET).sign(token)
    rotated = TokenSigner(SECRET, previous=[OLD_SECRET])
    assert rotated.verify(before) == token
    after = rotated.sign(token)
    assert after != before and rotated.verify(after) == token
    assert TokenSigner(OLD_SECRET).verify(before) == token  # the old key id is the old secret's alone
    with pytest.raises(InvalidToken, match="does not hold"):
        TokenSigner(OLD_SECRET).verify(after)  # signed with the new secret, which the old signer never had


def test_an_unknown_key_id_is_a_bad_decision_id() -> None:
    """The old secret dropped from the list: its ids are refused with the contract's reason."""
    token = DecisionToken("summer-sale", 0, 1_767_225_600_000_000, 1, new_nonce())
    dropped = TokenSigner(OLD_SECRET).sign(token)
    event = {"type": "conversion", "decision_id": dropped, "occurred_at": "2026-01-01T00:00:01Z"}
    with pytest.raises(Rejection) as refused:
        parse_conversion(event, TokenSigner(SECRET), 1_767_225_601_000_000, 300_000_000)
    assert refused.value.reason is Reason.BAD_DECISION_ID and "does not hold" in str(refused.value)


def test_a_forged_id_with_a_held_key_id_is_rejected() -> None:
    """A payload naming the current key id but signed by someone else, and a signature moved onto another
    payload: neither verifies."""
    signer = TokenSigner(SECRET, previous=[OLD_SECRET])
    genuine = signer.sign(DecisionToken("c", 0, 1, 1, new_nonce()))
    wanted = signer.sign(DecisionToken("c", 1, 1, 1, new_nonce(), fallback=False))
    body, signature = wanted.split(".")[0], genuine.split(".")[1]
    with pytest.raises(InvalidToken, match="signature"):
        signer.verify(f"{body}.{signature}")
    payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    guessed = hmac.digest(b"guessed-" + SECRET.encode(), payload, "sha256")[:16]
    with pytest.raises(InvalidToken, match="signature"):
        signer.verify(f"{body}.{base64.urlsafe_b64encode(guessed).rstrip(b'=').decode()}")


def legacy_id(secret: str, token: DecisionToken) -> str:
    """An id as issued before key ids: text payload, the same signature."""
    flags = "f" if token.fallback else ""
    text = f"{token.campaign}|{token.arm}|{token.decided_at}|{token.version}|{token.nonce.hex()}|{flags}".encode()
    signature = hmac.digest(secret.encode(), text, "sha256")[:16]
    return ".".join(base64.urlsafe_b64encode(part).rstrip(b"=").decode() for part in (text, signature))


def test_ids_issued_before_key_ids_still_verify_with_any_held_secret() -> None:
    token = DecisionToken("summer-sale", 2, 1_767_225_600_000_000, 1, new_nonce(), fallback=True)
    assert TokenSigner(SECRET).verify(legacy_id(SECRET, token)) == token
    assert TokenSigner(SECRET, previous=[OLD_SECRET]).verify(legacy_id(OLD_SECRET, token)) == token
    with pytest.raises(InvalidToken):
        TokenSigner(SECRET).verify(legacy_id(OLD_SECRET, token))


def test_two_secrets_with_one_key_id_are_refused() -> None:
    """A collision of the 16-bit key ids would make one secret's ids unverifiable: found by search here."""
    first = SECRET.encode()
    candidates = (hashlib.sha256(str(n).encode()).hexdigest().encode() for n in range(10**7))
    second = next(candidate for candidate in candidates if key_id(candidate) == key_id(first))
    with pytest.raises(ValueError, match="same key id"):
        TokenSigner(first, previous=[second])
    assert TokenSigner(first, previous=[first]).verify(TokenSigner(first).sign(DecisionToken("c", 0, 1, 1, b"n" * 6)))
