"""The baseline for bench/api.py: a hello-world FastAPI app under the API's uvicorn settings.

    python -m bench.hello_app --port 8090 --workers 1

One route, ``/hello`` (GET or POST), answers ``{"hello": "world"}`` without reading the body
(uvicorn still receives it). The server runs with the settings `compensator api` passes to uvicorn
(compensator/commands/api.py): loop uvloop, http httptools, access log off, no server header,
backlog 4096, the same worker count. bench/api.py compares the two calls before it measures.

Must never: import anything of the service (api, compensator, queues, raft_store...): it is the
ceiling of FastAPI and uvicorn alone on this machine.
"""

from __future__ import annotations

import argparse
from typing import Any, Final

from fastapi import FastAPI

APP: Final = "bench.hello_app:create_app"
UVICORN_SETTINGS: Final[dict[str, Any]] = {
    "loop": "uvloop", "http": "httptools", "access_log": False, "server_header": False,
    "timeout_graceful_shutdown": 10, "backlog": 4096, "proxy_headers": False,
}  # fmt: skip
"""The keyword arguments `compensator api` gives uvicorn.run, other than host, port, workers and
log level (bench/api.py fails if they differ)."""
PATH: Final = "/hello"


def create_app() -> FastAPI:
    app = FastAPI(title="hello")

    @app.api_route(PATH, methods=["GET", "POST"])
    async def hello() -> dict[str, str]:
        return {"hello": "world"}

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hello_app", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    if not 1 <= args.workers <= 64:
        parser.error("--workers must be in 1..64")
    import uvicorn

    uvicorn.run(
        APP, factory=True, host=args.host, port=args.port, workers=args.workers, log_level=args.log_level,
        **UVICORN_SETTINGS,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
