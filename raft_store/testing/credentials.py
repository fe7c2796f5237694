"""Cluster secrets for tests and benchmarks: one place that makes them, so no test copies one.

`cluster_auth(folder)` writes a fresh secret file there (mode 0600) and returns what a client
presents; `StoreThread` and `ProcessCluster` call it for the stores they start. `accept_dialer` is
a node's side of the handshake on a stream, for test doubles that play a node.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from raft_store.auth import StoreAuth, TlsFiles, write_secret_file
from raft_store.handshake import NodeHandshake
from raft_store.transport import read_frame

SECRET_NAME = "cluster.secret"


def cluster_auth(folder: Path, *, tls: TlsFiles | None = None, name: str = SECRET_NAME) -> StoreAuth:
    """The cluster secret in `folder` (made on first use) as a client presents it."""
    path = folder / name
    if not path.exists():
        write_secret_file(path)
    if tls is None:
        return StoreAuth.from_files(path)
    return StoreAuth.from_files(path, tls_ca=tls.ca, tls_cert=tls.cert, tls_key=tls.key)


async def accept_dialer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, auth: StoreAuth,
                        cluster_id: int = 1) -> int:  # fmt: skip
    """Let a dialer in as a node would (or raise handshake.Refusal); returns its sender id."""
    handshake = NodeHandshake(auth.secrets, cluster_id)
    writer.write(handshake.on_hello(*await read_frame(reader)))
    sender = handshake.on_auth(*await read_frame(reader))
    writer.write(NodeHandshake.welcome())
    return sender


def service_settings(addresses: Sequence[tuple[str, int]], auth: StoreAuth) -> dict[str, str]:
    """A store of the tests as the service's configuration names it (environment variables, for a
    command line of the service or `compensator.config.load`): its addresses and its credentials."""
    settings = {
        "COMPENSATOR_STORE__ADDRESSES": ",".join(f"{host}:{port}" for host, port in addresses),
        "COMPENSATOR_STORE__SECRET_FILE": str(auth.secrets.path),
    }
    if auth.tls is not None:
        settings.update(COMPENSATOR_STORE__TLS_CA=str(auth.tls.ca), COMPENSATOR_STORE__TLS_CERT=str(auth.tls.cert),
                        COMPENSATOR_STORE__TLS_KEY=str(auth.tls.key))  # fmt: skip
    return settings


def certificates(folder: Path, name: str = "store") -> TlsFiles:
    """A fresh CA and, signed by it, one certificate for 127.0.0.1 and localhost that serves as the
    nodes' and the clients' (the `openssl` command line makes them; keys are 0600). Another call
    with another `name` makes another CA, whose certificates the first one's holders refuse."""
    if shutil.which("openssl") is None:
        raise RuntimeError("the TLS tests need the openssl command line: Debian package openssl"
                           " (deploy/install-system-packages.sh installs it)")
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, request, cert = (folder / f"{name}-{part}" for part in
                                      ("ca.key", "ca.pem", "key.pem", "csr.pem", "cert.pem"))  # fmt: skip
    extensions = folder / f"{name}-extensions.cnf"
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    for command in (
        ["req", "-x509", *curve, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", f"/CN={name} test CA"],
        ["req", *curve, "-keyout", key, "-out", request, "-subj", f"/CN={name} node"],
        ["x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "2",
         "-extfile", extensions],
    ):
        subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True, timeout=60)
    for private in (ca_key, key):
        private.chmod(0o600)
    return TlsFiles(ca=ca, cert=cert, key=key)
