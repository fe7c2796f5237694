"""What a downstream is declared to guarantee, against the kinds' retry policies.

The guarantees are configuration (`handlers.<name>.guarantee`, checked with the rest of it); the
retry policies are replicated documents an operator sets at runtime. This is where the two meet:
a worker refuses to start, and the API refuses to set a policy, when a kind's policy would break
what its downstream's declaration relies on (docs/worker.md, "Startup checks"):
- `dedup` with a window: a re-send later than the window would be a new payment
  (delay/policy.py `horizon_ms`, with two calls' deadlines per attempt: a lookup and a send);
- `none`: a Retry-After cap under the in-flight horizon would bring the second lookup early, and
  fewer than three attempts would end an unknown outcome as a timeout rather than unknown_outcome.

Must never: read the configuration or the store itself (the caller hands both in).
"""

from __future__ import annotations

from typing import Final

from delay.policy import RetryPolicy, horizon_ms
from handlers.settings import DownstreamSettings, Guarantee, HandlersSettings

ATTEMPTS_NONE_MIN: Final = 3


def downstream_of(handlers: HandlersSettings, kind: str) -> tuple[str, DownstreamSettings] | None:
    """The downstream a kind's handler calls, when it is one with a declared guarantee."""
    return {"transfer": ("payment", handlers.payment), "list_update": ("red_packet", handlers.red_packet)}.get(kind)


def policy_problems(handlers: HandlersSettings, kind: str, policy: RetryPolicy) -> list[str]:
    """What a retry policy of `kind` would break of its downstream's declared guarantee."""
    found = downstream_of(handlers, kind)
    if found is None:
        return []
    name, downstream = found
    where = f"the {kind} retry policy"
    problems: list[str] = []
    if downstream.guarantee == Guarantee.DEDUP and downstream.dedup_window_s is not None:
        attempt_ms = int(2 * downstream.gateway.attempt_timeout_s * 1000)
        longest_s = horizon_ms(policy, attempt_ms=attempt_ms) / 1000
        if longest_s > downstream.dedup_window_s:
            problems.append(
                f"{where} can re-send up to {longest_s:.0f} s after the first attempt (each delay at its"
                f" longest, a Retry-After up to retry_after_max_ms included), beyond handlers.{name}.dedup_window_s"
                f" ({downstream.dedup_window_s} s): lower attempts_max or retry_after_max_ms, or set age_max_ms"
            )  # fmt: skip
    if downstream.guarantee == Guarantee.NONE and policy.attempts_max < ATTEMPTS_NONE_MIN:
        problems.append(
            f"{where} allows {policy.attempts_max} attempts: handlers.{name}.guarantee none needs {ATTEMPTS_NONE_MIN} (a"
            " send, a lookup, a lookup after the horizon) for an unknown outcome to end as unknown_outcome"
        )  # fmt: skip
    if downstream.guarantee == Guarantee.NONE and policy.retry_after_max_ms < downstream.in_flight_horizon_s * 1000:
        problems.append(
            f"{where} caps a Retry-After at {policy.retry_after_max_ms} ms, under handlers.{name}.in_flight_horizon_s"
            f" ({downstream.in_flight_horizon_s:g} s): the second lookup after an unknown outcome would come early"
        )  # fmt: skip
    return problems
