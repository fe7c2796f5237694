"""A real HTTP server on 127.0.0.1 standing in for the compensation API (``POST /v1/requests``).

It records every request and answers like the future API will: 201 for a new idempotency key, 409
for a key it has seen. ``fail_next`` makes it answer 503 to exercise the retry-on-rerun path.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclasses.dataclass
class RecordedApi:
    url: str = ""
    received: list[tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=list)
    fail_next: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.received]


@contextmanager
def recording_api() -> Iterator[RecordedApi]:
    api = RecordedApi()
    seen: set[str] = set()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            key = self.headers["Idempotency-Key"]
            with api.lock:
                if self.path != "/v1/requests" or not key:
                    status = 400
                elif api.fail_next > 0:
                    api.fail_next -= 1
                    status = 503
                else:
                    api.received.append((key, body))
                    status = 409 if key in seen else 201
                    seen.add(key)
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
