"""Failed logins throttled by client address, before they reach the account's lock.

An account locks after `web.lockout_failures` failures in a row (api/web/sessions.py): that stops
a guesser, but by itself it lets anyone lock anyone out by failing five times. So the failures of
one client address are throttled first, in this process, before a login is even tried:

- against one account, a client may fail `lockout_failures - 1` times; then it is refused (429,
  `Retry-After`) until `lockout_s` after its last failure, when its count starts again. An
  account's own count also starts again after `lockout_s` without a failure, so a client alone can
  never reach the lock: the lock needs failures from several addresses (a distributed guess), and
  an admin lifts it (`compensator user unlock`);
- across accounts, a client may fail `client_failures_max` times per `lockout_s` (password
  spraying: a few guesses at many accounts).

A refused attempt costs nothing: no password verification, no store write, no audit entry (a
flood of them must not fill the chain). It says nothing about the account either: whether the
name exists, it is answered the same. A success clears the client's count for that account only
(the attacker's own valid account must not reset a spraying count).

The counts are per API process, in memory, like the quotas (api/quotas.py): behind a balancer that
spreads one client over N processes, the client gets N times the budget; the account's lock, in
the store, is shared. At most ENTRIES_MAX (address, account) counts are kept; expired ones go first.

Must never: keep a password, or make a refused attempt cost a verification or a write.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

ENTRIES_MAX: Final = 100_000
ANY_ACCOUNT: Final = ""
"""The key of a client's count across every account."""


@dataclass(slots=True)
class _Strikes:
    count: int
    last_ms: int


class LoginThrottle:
    def __init__(self, *, per_account: int, per_client: int, window_ms: int, clock_ms: Callable[[], int]) -> None:
        self._limits = {False: max(1, per_account), True: max(1, per_client)}
        self._window_ms = window_ms
        self._clock_ms = clock_ms
        self._strikes: dict[tuple[str, str], _Strikes] = {}

    def _current(self, key: tuple[str, str], now_ms: int) -> _Strikes | None:
        found = self._strikes.get(key)
        if found is not None and now_ms - found.last_ms >= self._window_ms:
            del self._strikes[key]
            return None
        return found

    def retry_after_s(self, client: str, account: str) -> int | None:
        """Seconds until this client may try this account again, or None: it may now."""
        now_ms = self._clock_ms()
        waits = []
        for key in ((client, account), (client, ANY_ACCOUNT)):
            found = self._current(key, now_ms)
            if found is not None and found.count >= self._limits[key[1] == ANY_ACCOUNT]:
                waits.append(found.last_ms + self._window_ms - now_ms)
        return None if not waits else max(1, -(-max(waits) // 1000))

    def failed(self, client: str, account: str) -> None:
        now_ms = self._clock_ms()
        if len(self._strikes) >= ENTRIES_MAX:
            self._forget(now_ms)
        for key in ((client, account), (client, ANY_ACCOUNT)):
            found = self._current(key, now_ms)
            self._strikes[key] = _Strikes(1 if found is None else found.count + 1, now_ms)

    def succeeded(self, client: str, account: str) -> None:
        self._strikes.pop((client, account), None)

    def _forget(self, now_ms: int) -> None:
        """Room for new counts: the expired ones, else the oldest half."""
        for key in [k for k, s in self._strikes.items() if now_ms - s.last_ms >= self._window_ms]:
            del self._strikes[key]
        if len(self._strikes) >= ENTRIES_MAX:
            for key in sorted(self._strikes, key=lambda k: self._strikes[k].last_ms)[: ENTRIES_MAX // 2]:
                del self._strikes[key]
