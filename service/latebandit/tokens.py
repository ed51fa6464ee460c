"""Decision ids: HMAC-signed tokens that carry their campaign, arm, decision time and policy version.

A conversion names only its decision id, so the token must tell, without a lookup, which arm and which
moment the conversion belongs to, and whether its pull was counted (not a fallback, current policy
version). The signature makes a forged or corrupted id fail verification; the random nonce makes two
decisions of the same arm in the same microsecond distinct.

Layout: ``base64url(payload) + "." + base64url(HMAC-SHA256(key, payload)[:16])``, the payload packed
big-endian: format byte 1, key id (2 bytes), flags (1: fallback), arm index (uint16), decided_at
(µs, int64), policy version (uint32), nonce (6 bytes), then the campaign id (ASCII, at most 128 bytes).
So an id is at most 226 characters, within the 256 docs/reference/http-api.md promises, which fixes no more than that.

Rotation: the key id names the secret that signed the token (the first two bytes of
HMAC-SHA256(secret, "latebandit key id"), which tell nothing about the secret), so verification takes
that key straight away: one HMAC per id whatever the number of keys held. The signer holds the current
secret, which signs, and the previous ones, which only verify: an id signed before a rotation keeps
verifying while its secret is listed (keep it for the longest window, plus the deduplication
retention). An id naming a key not held is refused like any other bad id.

Ids issued before key ids existed (a text payload ``campaign|arm|µs|version|hex nonce|flags``, whose
first byte is a campaign id's character, never 1) verify against each held key in turn, so an upgrade
strands no pending conversion; none is issued any more.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import os
import struct
from collections.abc import Iterable
from typing import NamedTuple

MAX_TOKEN_LENGTH = 256
_SIGNATURE_BYTES = 16
_KEYED_FORMAT = b"\x01"  # the first payload byte of an id with a key id
_KEY_ID_BYTES = 2
_FIELDS = struct.Struct(">?HqI6s")  # flags, arm, decided_at, version, nonce: after format and key id
_HEADER_BYTES = 1 + _KEY_ID_BYTES + _FIELDS.size
_KEY_ID_LABEL = b"latebandit key id"
_LEGACY_FALLBACK_FLAG = "f"


TokenFields = tuple[str, int, int, int, bytes, bool]  # a DecisionToken's fields, as TokenSigner.fields gives them


class InvalidToken(ValueError):
    """The decision id is malformed, corrupted, or was not signed with a key this service holds."""


class DecisionToken(NamedTuple):
    """What a decision id carries (a named tuple: /feedback verifies one per event)."""

    campaign: str
    arm: int
    decided_at: int  # epoch microseconds
    version: int
    nonce: bytes  # 6 random bytes
    fallback: bool = False


def new_nonce() -> bytes:
    return os.urandom(6)


def key_id(secret: bytes) -> bytes:
    """The 2 bytes a token carries to name the secret that signed it."""
    return hmac.digest(secret, _KEY_ID_LABEL, "sha256")[:_KEY_ID_BYTES]


_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")


def _b64(data: bytes) -> bytes:
    """base64.urlsafe_b64encode without its padding, and without its layers (four per /feedback event)."""
    return binascii.b2a_base64(data, newline=False).translate(_TO_URLSAFE).rstrip(b"=")


def _unb64(text: bytes) -> bytes:
    """base64.urlsafe_b64decode without its layers: the same alphabet and leniency (``verify`` then accepts
    only the canonical spelling). Two pad characters always: the decoder ignores those a complete group does
    not need."""
    return binascii.a2b_base64(text.translate(_FROM_URLSAFE) + b"==")


_BLOCK = 64  # SHA-256's block, in bytes
_INNER_PAD = bytes(byte ^ 0x36 for byte in range(256))
_OUTER_PAD = bytes(byte ^ 0x5C for byte in range(256))


class _Signature:
    """HMAC-SHA256 under one key, truncated to 16 bytes, with the key's two padded blocks hashed once (RFC
    2104 section 4): a signature is then two copies of a hash state and two short updates, about half of
    hmac.digest's time (OpenSSL sets the key up on every call), paid by every /choose and every conversion.
    The same bytes as ``hmac.digest(key, payload, "sha256")[:16]`` (tested)."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        block = (hashlib.sha256(key).digest() if len(key) > _BLOCK else key).ljust(_BLOCK, b"\0")
        self._inner = hashlib.sha256(block.translate(_INNER_PAD))
        self._outer = hashlib.sha256(block.translate(_OUTER_PAD))

    def __call__(self, payload: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(payload)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()[:_SIGNATURE_BYTES]


def _as_bytes(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret


class TokenSigner:
    """Signs with ``secret``; verifies what ``secret`` or any of ``previous`` signed."""

    def __init__(self, secret: str | bytes, previous: Iterable[str | bytes] = ()) -> None:
        current = _as_bytes(secret)
        self._prefix = _KEYED_FORMAT + key_id(current)
        self._signature = _Signature(current)
        keys: dict[bytes, bytes] = {}
        for key in (current, *map(_as_bytes, previous)):
            if keys.setdefault(key_id(key), key) != key:
                raise ValueError(
                    "two of the configured secrets have the same key id (a 1 in 65,536 chance): "
                    "generate another current secret"
                )
        self._signatures = {held: _Signature(key) for held, key in keys.items()}  # by key id

    def sign(self, token: DecisionToken) -> str:
        payload = (
            self._prefix
            + _FIELDS.pack(token.fallback, token.arm, token.decided_at, token.version, token.nonce)
            + token.campaign.encode()
        )
        return (_b64(payload) + b"." + _b64(self._signature(payload))).decode("ascii")

    def verify(self, decision_id: str) -> DecisionToken:
        return DecisionToken._make(self.fields(decision_id))

    def fields(self, decision_id: str) -> TokenFields:
        """``verify``'s token as a plain tuple, in DecisionToken's order: /feedback verifies one per event,
        and building the named tuple was a good part of a verification (docs/benchmarks.md)."""
        if not isinstance(decision_id, str) or len(decision_id) > MAX_TOKEN_LENGTH:
            raise InvalidToken("decision_id must be a string of at most 256 characters")
        try:  # the id's ASCII bytes, which every step below reads (a non-ASCII id is no id issued here)
            body, _, signature_text = decision_id.encode("ascii").partition(b".")
            payload, given = _unb64(body), _unb64(signature_text)
        except (binascii.Error, UnicodeEncodeError) as error:
            raise InvalidToken("decision_id is not a token this service issued") from error
        # Only the encoding the service issues: the decoder skips characters outside its alphabet, reads "+"
        # and "/" as "-" and "_", and ignores excess padding and the last character's unused bits, and a
        # decision's conversion is remembered by its id as sent, so another spelling would count again.
        if _b64(payload) != body or _b64(given) != signature_text:
            raise InvalidToken("decision_id is not a token this service issued")
        if payload[:1] != _KEYED_FORMAT:
            return self._verify_legacy(payload, given)
        signature = self._signatures.get(payload[1 : 1 + _KEY_ID_BYTES])
        if signature is None:
            raise InvalidToken("decision_id was signed with a key this service does not hold (rotated out?)")
        if not hmac.compare_digest(given, signature(payload)):
            raise InvalidToken("decision_id signature does not verify")
        try:
            fallback, arm, decided_at, version, nonce = _FIELDS.unpack_from(payload, 1 + _KEY_ID_BYTES)
            return payload[_HEADER_BYTES:].decode(), arm, decided_at, version, nonce, fallback
        except (struct.error, UnicodeDecodeError) as error:
            raise InvalidToken("decision_id payload is malformed") from error

    def _verify_legacy(self, payload: bytes, given: bytes) -> DecisionToken:
        """An id of the text layout that had no key id: whichever held key signed it."""
        for signature in self._signatures.values():
            if hmac.compare_digest(given, signature(payload)):
                return _parse_legacy(payload)
        raise InvalidToken("decision_id signature does not verify")


def _parse_legacy(payload: bytes) -> DecisionToken:
    try:
        campaign, arm, decided_at, version, nonce, flags = payload.decode().split("|")
        return DecisionToken(
            campaign, int(arm), int(decided_at), int(version), bytes.fromhex(nonce), flags == _LEGACY_FALLBACK_FLAG
        )
    except (UnicodeDecodeError, ValueError) as error:
        raise InvalidToken("decision_id payload is malformed") from error


class BatchVerifier:
    """``TokenSigner.fields`` for one /feedback batch: an id the batch sends again (a decision's several
    purchases, which a ``sum`` campaign credits) is verified once, then found by a dictionary lookup. A
    refused id is not remembered: it is refused again, as the first time."""

    __slots__ = ("_known", "_signer")

    def __init__(self, signer: TokenSigner) -> None:
        self._signer = signer
        self._known: dict[str, TokenFields] = {}

    def fields(self, decision_id: str) -> TokenFields:
        known = self._known.get(decision_id)
        if known is None:
            known = self._known[decision_id] = self._signer.fields(decision_id)
        return known
