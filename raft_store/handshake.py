"""The first frames of every connection: both sides prove they hold the cluster secret.

    dialer -> node   HELLO      magic | sender id (0: a client) | cluster id | key id | dialer nonce
    node -> dialer   CHALLENGE  node nonce | node proof
    dialer -> node   AUTH       dialer proof
    node -> dialer   WELCOME    (empty), or REFUSED with a short reason, and the node closes

A proof is HMAC-SHA256, under the key derived from the secret the key id names, of a label for
the side and the whole transcript (both nonces, the ids, the cluster). The secret never crosses
the wire; each side's proof is bound to the other side's fresh nonce, so a recorded handshake
replayed on a new connection fails (the node's new nonce changes the proof it expects), and a
node that cannot prove itself is left before anything is sent to it. The key id lets a node accept
several secrets at once (a rotation) and pick the one the dialer uses without trying each.

Sans-IO: these classes turn frames into frames and raise on anything else; the transport
(raft_store/transport.py) and the client (raft_store/client.py) move the bytes. All comparisons
of proofs are constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from dataclasses import dataclass
from typing import Final

from raft_store.auth import KEY_ID_BYTES, Key, SecretFile
from raft_store.codec import HELLO_MAGIC, FrameType, frame

NONCE_BYTES: Final = 32
PROOF_BYTES: Final = 32
HANDSHAKE_TIMEOUT_S: Final = 5.0
_HELLO: Final = struct.Struct(f">5sQQ{KEY_ID_BYTES}s{NONCE_BYTES}s")
_CHALLENGE: Final = struct.Struct(f">{NONCE_BYTES}s{PROOF_BYTES}s")
_NODE_LABEL: Final = b"raft-store v2 node proof\x00"
_DIALER_LABEL: Final = b"raft-store v2 dialer proof\x00"
REFUSED_TEXT: Final = b"authentication failed"
"""All a refused dialer is told: which check failed is for the node's log, not for a prober."""


class Refusal(Exception):
    """The node refuses the connection. `reason` is the metric's label (a fixed word); the
    message, for the node's log, never holds a secret."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class HandshakeFailed(Exception):
    """The dialer gives up on the node: it refused us, or could not prove it holds the secret."""

    def __init__(self, message: str, *, refused_by_node: bool) -> None:
        super().__init__(message)
        self.refused_by_node = refused_by_node


@dataclass(frozen=True, slots=True)
class _Transcript:
    sender: int
    cluster_id: int
    key_id: bytes
    dialer_nonce: bytes
    node_nonce: bytes

    def proof(self, key: Key, label: bytes) -> bytes:
        message = b"".join((label, HELLO_MAGIC, struct.pack(">QQ", self.sender, self.cluster_id), self.key_id,
                            self.dialer_nonce, self.node_nonce))  # fmt: skip
        return hmac.new(key.mac_key, message, hashlib.sha256).digest()


class NodeHandshake:
    """The node's side of one connection: `on_hello`, then `on_auth`."""

    def __init__(self, secrets: SecretFile, cluster_id: int, nonce: bytes | None = None) -> None:
        self._secrets = secrets
        self._cluster_id = cluster_id
        self._nonce = nonce if nonce is not None else os.urandom(NONCE_BYTES)
        self._key: Key | None = None
        self._transcript: _Transcript | None = None

    def on_hello(self, ftype: FrameType, body: bytes) -> bytes:
        """The CHALLENGE frame to send; raises Refusal."""
        if ftype is not FrameType.HELLO:
            raise Refusal("malformed", f"the connection opened with {ftype.name}, not HELLO")
        if len(body) >= 5 and body[:5] != HELLO_MAGIC and body[:4] == HELLO_MAGIC[:4]:
            raise Refusal("version", f"protocol version {body[4]} without authentication (an older client or node?)")
        if len(body) != _HELLO.size:
            raise Refusal("malformed", "HELLO of the wrong length")
        magic, sender, cluster, key_id, dialer_nonce = _HELLO.unpack(body)
        if magic != HELLO_MAGIC:
            raise Refusal("malformed", "bad HELLO magic (not a raft-store client or node)")
        if cluster != self._cluster_id:
            raise Refusal("cluster", f"the dialer belongs to cluster {cluster}, this node to {self._cluster_id}")
        key = self._secrets.accepted(key_id)
        if key is None:
            raise Refusal("unknown_secret", f"{'node ' + str(sender) if sender else 'a client'} presented a cluster"
                          f" secret this node does not accept (key id {key_id.hex()})")  # fmt: skip
        self._key = key
        self._transcript = _Transcript(sender, cluster, key_id, dialer_nonce, self._nonce)
        return frame(FrameType.CHALLENGE, _CHALLENGE.pack(self._nonce, self._transcript.proof(key, _NODE_LABEL)))

    def on_auth(self, ftype: FrameType, body: bytes) -> int:
        """The authenticated sender id (0: a client); raises Refusal."""
        assert self._key is not None and self._transcript is not None, "on_hello first"
        if ftype is not FrameType.AUTH or len(body) != PROOF_BYTES:
            raise Refusal("malformed", f"expected AUTH, got {ftype.name} of {len(body)} bytes")
        expected = self._transcript.proof(self._key, _DIALER_LABEL)
        if not hmac.compare_digest(expected, body):
            who = f"node {self._transcript.sender}" if self._transcript.sender else "a client"
            raise Refusal("bad_proof", f"{who} could not prove it holds the cluster secret it named")
        return self._transcript.sender

    @staticmethod
    def welcome() -> bytes:
        return frame(FrameType.WELCOME, b"")

    @staticmethod
    def refused() -> bytes:
        return frame(FrameType.REFUSED, REFUSED_TEXT)


class DialerHandshake:
    """A client's or a peer link's side: send `hello()`, answer the CHALLENGE with `on_challenge`,
    then `on_welcome` (which raises unless the node let us in)."""

    def __init__(self, key: Key, sender: int, cluster_id: int, nonce: bytes | None = None) -> None:
        self._key = key
        self._sender = sender
        self._cluster_id = cluster_id
        self._nonce = nonce if nonce is not None else os.urandom(NONCE_BYTES)

    def hello(self) -> bytes:
        return frame(FrameType.HELLO, _HELLO.pack(HELLO_MAGIC, self._sender, self._cluster_id, self._key.id, self._nonce))

    def on_challenge(self, ftype: FrameType, body: bytes) -> bytes:
        """The AUTH frame to send; raises HandshakeFailed."""
        if ftype is FrameType.REFUSED:
            raise HandshakeFailed(_refused(body), refused_by_node=True)
        if ftype is not FrameType.CHALLENGE or len(body) != _CHALLENGE.size:
            raise HandshakeFailed(f"the node answered HELLO with {ftype.name}, not a challenge", refused_by_node=False)
        node_nonce, node_proof = _CHALLENGE.unpack(body)
        transcript = _Transcript(self._sender, self._cluster_id, self._key.id, self._nonce, node_nonce)
        if not hmac.compare_digest(transcript.proof(self._key, _NODE_LABEL), node_proof):
            raise HandshakeFailed("the node could not prove it holds the cluster secret (an impostor, or a node"
                                  " with another secret)", refused_by_node=False)  # fmt: skip
        return frame(FrameType.AUTH, transcript.proof(self._key, _DIALER_LABEL))

    @staticmethod
    def on_welcome(ftype: FrameType, body: bytes) -> None:
        if ftype is FrameType.WELCOME:
            return
        if ftype is FrameType.REFUSED:
            raise HandshakeFailed(_refused(body), refused_by_node=True)
        raise HandshakeFailed(f"the node answered AUTH with {ftype.name}", refused_by_node=False)


def _refused(body: bytes) -> str:
    reason = body[:200].decode("ascii", errors="replace")
    return f"the node refused this connection ({reason}): the cluster secret is wrong or not accepted there"

