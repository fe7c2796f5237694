"""Webhook signatures, checked against an HMAC computed here by hand (so a mistake shared by the
signer and the verifier would still fail), and secrets that never show themselves."""

from __future__ import annotations

import hashlib
import hmac
import pickle

import pytest

from handlers.signing import Secret, SecretsError, Verification, secrets_from_json, sign, verify

KEY = b"whsec-test-0123456789abcdef"
SECRET = Secret(KEY)
BODY = b'{"amount_minor":100,"order":"o-1"}'
NOW_S = 1_800_000_000


def test_the_signature_is_hmac_sha256_over_the_timestamp_a_dot_and_the_body() -> None:
    expected = hmac.new(KEY, f"{NOW_S}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert sign(SECRET, timestamp_s=NOW_S, body=BODY) == f"t={NOW_S},v1={expected}"


@pytest.mark.parametrize(
    ("header", "body", "now_s", "expected"),
    [
        (sign(SECRET, timestamp_s=NOW_S, body=BODY), BODY, NOW_S + 299, Verification.VALID),
        (sign(SECRET, timestamp_s=NOW_S, body=BODY), BODY, NOW_S - 299, Verification.VALID),
        (sign(SECRET, timestamp_s=NOW_S, body=BODY), BODY, NOW_S + 301, Verification.STALE),
        (sign(SECRET, timestamp_s=NOW_S, body=BODY), BODY.replace(b"100", b"900"), NOW_S, Verification.MISMATCH),
        (sign(Secret(b"another-secret-entirely"), timestamp_s=NOW_S, body=BODY), BODY, NOW_S, Verification.MISMATCH),
        (sign(SECRET, timestamp_s=NOW_S, body=BODY).replace(f"t={NOW_S}", f"t={NOW_S + 1}"), BODY, NOW_S,
         Verification.MISMATCH),
        (f"t={NOW_S},v1=00,v1={sign(SECRET, timestamp_s=NOW_S, body=BODY).split('v1=')[1]}", BODY, NOW_S,
         Verification.VALID),
        (None, BODY, NOW_S, Verification.MISSING),
        ("", BODY, NOW_S, Verification.MISSING),
        ("v1=abc", BODY, NOW_S, Verification.MALFORMED),
        (f"t={NOW_S}", BODY, NOW_S, Verification.MALFORMED),
        (f"t=-{NOW_S},v1=ab", BODY, NOW_S, Verification.MALFORMED),
        (f"t={NOW_S},t={NOW_S},v1=ab", BODY, NOW_S, Verification.MALFORMED),
        ("t=1,v1=" + "a" * 2000, BODY, NOW_S, Verification.MALFORMED),
    ],
    ids=["valid", "valid-early-clock", "stale", "body-tampered", "other-secret", "timestamp-tampered",
         "one-of-two-matches", "none", "empty", "no-timestamp", "no-signature", "negative-time", "two-times",
         "too-long"],
)  # fmt: skip
def test_verification(header: str | None, body: bytes, now_s: int, expected: Verification) -> None:
    assert verify(SECRET, header, body, now_s=now_s) is expected


def test_a_secret_never_shows_its_value() -> None:
    shown = [repr(SECRET), str(SECRET), f"{SECRET}", f"{SECRET!r}", f"{SECRET:>40}", repr([SECRET]), repr({"k": SECRET})]
    assert all(KEY.decode() not in text for text in shown)
    assert shown[0] == "Secret(***)"
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(SECRET)
    same, other = Secret(KEY), Secret(b"x" * 16)
    assert (same == SECRET, other == SECRET) == (True, False)
    with pytest.raises(TypeError):
        hash(SECRET)


def test_secrets_load_from_json_and_errors_name_targets_never_values() -> None:
    loaded = secrets_from_json(b'{"merchant-a": "whsec-aaaaaaaaaaaaaaaa"}', origin="secrets.json")
    assert loaded == {"merchant-a": Secret(b"whsec-aaaaaaaaaaaaaaaa")}
    for document, message in (
        (b'{"merchant-a": "short-value"}', "secrets.json: target 'merchant-a': a secret must be 16..1024 bytes long"),
        (b'{"merchant-a": 12345678901234567890}', "secrets.json: expected a JSON object of target name to secret string"),
        (b'["whsec-aaaaaaaaaaaaaaaa"]', "secrets.json: expected a JSON object of target name to secret string"),
        (b'{"merchant-a": "whsec-aaaaaaaaaaaaaaaa"', "secrets.json: expected a JSON object of target name to secret string"),
    ):  # fmt: skip
        with pytest.raises(SecretsError) as raised:
            secrets_from_json(document, origin="secrets.json")
        assert str(raised.value) == message
        assert b"short-value" not in str(raised.value).encode() and b"whsec" not in str(raised.value).encode()
