"""A real HTTP server on 127.0.0.1 standing in for the compensation API (``POST /v1/requests``).

It holds the API's contract: ``Authorization: Bearer <token>`` or 401; the key in the
``Idempotency-Key`` header or 400; a body of exactly ``kind``, ``ref_key`` and ``payload``, whose
payload the kind's :mod:`ledger.kinds` model accepts, or 422; then 201 for a new key, 200 for a
replay of a key with the same body, 409 for a key it holds with another body. ``fail_next`` makes it
answer 503 to exercise the retry-on-rerun path. It records every request it accepted.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import ValidationError

from ledger.kinds import Kind, decode_payload

BODY_FIELDS = {"kind", "ref_key", "payload"}


@dataclasses.dataclass
class RecordedApi:
    url: str = ""
    token: str = "test-token-not-a-secret"
    received: list[tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=list)
    fail_next: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.received]


def _refusal(body: Any) -> int | None:
    """422 unless the body is a request the API would store."""
    if not isinstance(body, dict) or set(body) != BODY_FIELDS or body["kind"] not in set(Kind):
        return 422
    try:
        decode_payload(Kind(body["kind"]), json.dumps(body["payload"]).encode())
    except ValidationError:
        return 422
    return None


@contextmanager
def recording_api() -> Iterator[RecordedApi]:
    api = RecordedApi()
    seen: dict[str, dict[str, Any]] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            key = self.headers["Idempotency-Key"]
            with api.lock:
                if self.headers["Authorization"] != f"Bearer {api.token}":
                    status = 401
                elif self.path != "/v1/requests" or not key:
                    status = 400
                elif (refused := _refusal(body)) is not None:
                    status = refused
                elif api.fail_next > 0:
                    api.fail_next -= 1
                    status = 503
                elif key in seen:
                    status = 200 if seen[key] == body else 409
                else:
                    status = 201
                    seen[key] = body
                if status in {200, 201}:
                    api.received.append((key, body))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
