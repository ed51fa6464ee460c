"""Decision ids: HMAC-signed tokens that carry their campaign, arm, decision time and policy version.

A conversion names only its decision id, so the token must tell, without a lookup, which arm and which
moment the conversion belongs to, and whether its pull was counted (not a fallback, current policy
version). The signature makes a forged or corrupted id fail verification; the random nonce makes two
decisions of the same arm in the same microsecond distinct.

Layout: ``base64url(payload) + "." + base64url(HMAC-SHA256(secret, payload)[:16])`` with payload
``campaign|arm index|decided_at µs|policy version|nonce|flags``. Ids cannot contain ``|`` (ids.py), and a
128-character campaign id still gives a token under the 256 characters CONTRACT.md allows.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
from typing import NamedTuple

MAX_TOKEN_LENGTH = 256
_SIGNATURE_BYTES = 16
_FALLBACK_FLAG = "f"


class InvalidToken(ValueError):
    """The decision id is malformed, corrupted, or was not signed with this service's secret."""


class DecisionToken(NamedTuple):
    """What a decision id carries (a named tuple: /feedback verifies one per event)."""

    campaign: str
    arm: int
    decided_at: int  # epoch microseconds
    version: int
    nonce: str
    fallback: bool = False


def new_nonce() -> str:
    return os.urandom(6).hex()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")


def _unb64(text: str) -> bytes:
    """base64.urlsafe_b64decode without its layers (two per /feedback event): the same alphabet, padding
    and leniency; a non-ASCII character raises UnicodeEncodeError, a ValueError, as there."""
    return binascii.a2b_base64((text + "=" * (-len(text) % 4)).encode("ascii").translate(_FROM_URLSAFE))


class TokenSigner:
    def __init__(self, secret: str | bytes) -> None:
        self._key = secret.encode() if isinstance(secret, str) else secret

    def _signature(self, payload: bytes) -> bytes:
        return hmac.digest(self._key, payload, "sha256")[:_SIGNATURE_BYTES]

    def sign(self, token: DecisionToken) -> str:
        flags = _FALLBACK_FLAG if token.fallback else ""
        payload = f"{token.campaign}|{token.arm}|{token.decided_at}|{token.version}|{token.nonce}|{flags}".encode()
        return f"{_b64(payload)}.{_b64(self._signature(payload))}"

    def verify(self, decision_id: str) -> DecisionToken:
        if not isinstance(decision_id, str) or len(decision_id) > MAX_TOKEN_LENGTH:
            raise InvalidToken("decision_id must be a string of at most 256 characters")
        body, _, signature = decision_id.partition(".")
        try:
            payload, given = _unb64(body), _unb64(signature)
        except (binascii.Error, ValueError) as error:
            raise InvalidToken("decision_id is not a token this service issued") from error
        if not hmac.compare_digest(given, self._signature(payload)):
            raise InvalidToken("decision_id signature does not verify")
        return parse_payload(payload)


def parse_payload(payload: bytes) -> DecisionToken:
    try:
        campaign, arm, decided_at, version, nonce, flags = payload.decode().split("|")
        return DecisionToken(campaign, int(arm), int(decided_at), int(version), nonce, flags == _FALLBACK_FLAG)
    except (UnicodeDecodeError, ValueError) as error:
        raise InvalidToken("decision_id payload is malformed") from error
