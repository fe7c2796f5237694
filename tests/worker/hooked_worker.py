"""`compensator` with test hooks that production never has, for the exactly-once process tests:
started as ``python tests/worker/hooked_worker.py worker --id ...``. Each hook is switched on by
an environment variable the test sets for the process it starts; without them this is `compensator`.

- ``EXACTLY_ONCE_STOP_FILE=<path>``: when a POST is about to enter the gateway while that file
  exists, the file is removed (of several workers given the same file, the one whose removal
  succeeds), ``hook: stopping before POST`` is printed, and the process stops
  itself (SIGSTOP). A worker paused right before its send, deterministically: the test waits until
  the lease has passed, then sends SIGCONT.
- ``EXACTLY_ONCE_PLANTED_BUG=resend_without_wait``: the transfer handler neither waits for earlier
  requests to expire nor reports how long its own stay in doubt (so the store does not hold the
  retry back either): it re-sends after an unknown outcome as soon as a lookup finds nothing. The
  test that plants it must see a transfer paid twice, or the checker is blind.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def install() -> None:
    stop_file = os.environ.get("EXACTLY_ONCE_STOP_FILE")
    if stop_file:
        from handlers import gateway

        original = gateway.Gateway.send

        async def send(self: gateway.Gateway, request: gateway.Outbound) -> Any:
            if request.method == "POST" and os.path.exists(stop_file):
                try:
                    os.remove(stop_file)  # of workers sharing the file, the one that removes it stops
                except FileNotFoundError:
                    pass
                else:
                    print(f"hook: stopping before POST {request.url}", flush=True)
                    os.kill(os.getpid(), signal.SIGSTOP)
            return await original(self, request)

        gateway.Gateway.send = send  # type: ignore[method-assign]
    bug = os.environ.get("EXACTLY_ONCE_PLANTED_BUG")
    if bug == "resend_without_wait":
        from handlers import transfer
        from handlers.lease_time import LeaseTime

        async def no_wait(self: Any, attempt: Any, lease: Any, *, in_doubt: bool) -> None:
            return None

        transfer.TransferHandler._wait_out = no_wait  # type: ignore[method-assign]
        LeaseTime.report = lambda self: None  # type: ignore[method-assign]
    elif bug:
        raise SystemExit(f"hooked_worker: unknown planted bug {bug!r}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    install()
    from compensator.cli import main

    sys.exit(main(sys.argv[1:]))
