"""Simulated enqueuers, workers, an expiry driver and an operator, all on exactly-once lanes.

Why these actors: they produce every history testing.md asks the checker to judge. Enqueuers send
unique idempotency keys (some delayed, some of an unregistered kind that must fail) and, after
giving up on an unknown outcome, re-send the same key on a new lane (a "recovered" enqueue when
the first try had taken effect); now and then they replay a settled send, which must find its
message, or create a new one once the retention (seconds here) has ended. Workers lease batches
with short leases, call the downstream, then ack or fail (retryable, permanent, Retry-After); some
pause past their lease, so expiry and redelivery happen and their late acks and effects carry
superseded tokens. The operator sets
short retry policies (so retries and dead letters happen within simulated seconds), redrives and
discards, pauses and resumes kinds, and changes attempt budgets while messages are in flight.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from delay.policy import ErrorClassRule, RetryPolicy
from queues.core import reads
from queues.model import (
    BUILTIN_KINDS,
    Ack,
    AckMany,
    Code,
    DeadLetterFilter,
    Discard,
    Enqueue,
    EnqueueResult,
    ErrorResult,
    ExpireLeases,
    ExtendLease,
    Fail,
    Grant,
    KindResult,
    Lease,
    LeaseResult,
    Outcomes,
    PauseKind,
    Purge,
    QueueResult,
    Redrive,
    ResumeKind,
    SetPolicy,
    SetRetention,
    State,
)
from queues.simulation.downstream import Answer, AppBugs, Downstream, Effect
from queues.simulation.net import Client

if TYPE_CHECKING:
    from queues.simulation.cluster import QueueCluster

SETUP, RUN, DRAIN, STOPPED = "setup", "run", "drain", "stopped"
UNREGISTERED_KIND = "refund"
PAUSE_PROBABILITY = 0.05
REPLAY_PROBABILITY = 0.08


class Workload:
    def __init__(self, cluster: QueueCluster, bugs: AppBugs, *, enqueuers: int = 3) -> None:
        """`enqueuers`: 0 where routed producers send the keys instead (the multi-set simulation)."""
        self.cluster = cluster
        self.phase = SETUP
        self.pauses = 0
        checker = cluster.qchecker
        self.downstream = Downstream(cluster.rng, bugs, checker.on_call, cluster.true_clock)
        self.operator = Operator(self)
        self.enqueuers = [Enqueuer(self, i) for i in range(enqueuers)]
        self.workers = [Worker(self, i) for i in range(3)]

    def start(self) -> None:
        self.operator.set_policies()

    def begin(self) -> None:
        """Policies are in place: traffic starts (short tiers, or retries would wait minutes)."""
        if self.phase != SETUP:
            return
        self.phase = RUN
        rng = self.cluster.rng
        loops = [e.loop for e in self.enqueuers] + [w.loop for w in self.workers]
        for loop in loops:
            self.cluster.at(rng.uniform(0, 50), loop)
        self.cluster.at(rng.uniform(50, 150), self.expire_loop)
        self.cluster.at(rng.uniform(200, 600), self.operator.loop)
        self.expirer = Client(self.cluster.net, "expiry-driver")

    def drain(self) -> None:
        """No new keys or operator actions; pending recoveries, workers and expiry go on."""
        if self.phase == SETUP:
            self.begin()
        self.phase = DRAIN
        self.operator.drain_loop()

    def stop(self) -> None:
        self.phase = STOPPED

    def active(self) -> bool:
        return self.phase in (RUN, DRAIN)

    def drained(self) -> bool:
        if self.phase == SETUP or any(e.outstanding for e in self.enqueuers):
            return False
        return not self.unsettled()

    def unsettled(self) -> list[str]:
        """Non-settled (kind, state) counts on the leader, as an operator's dashboard shows them."""
        leader = self.cluster.leader()
        if leader is None or leader not in self.cluster.machines:
            return ["no leader"]
        conn = self.cluster.machines[leader].view
        open_states = (State.DELAYED, State.READY, State.LEASED)
        found = [
            f"{row.kind}/{row.state.value}={row.count}"
            for row in reads.counts(conn, now_ms=self.cluster.read_clock(leader))
            if row.state in open_states
        ]
        pending = sum(e.outstanding for e in self.enqueuers)
        paused = [f"paused {kind}/{holder}" for kind, holder in self.operator.pauses_in_force()]
        return found + ([f"enqueues pending={pending}"] if pending else []) + paused

    def expire_loop(self) -> None:
        if not self.active():
            return
        rng = self.cluster.rng
        self.expirer.submit(ExpireLeases(limit=rng.randint(1, 50)), lambda _: None, tries_max=rng.randint(1, 2))
        self.cluster.at(rng.uniform(80, 300), self.expire_loop)

    def pause_ms(self, lease_ms: int) -> float | None:
        """A stop-the-world pause past the lease (GC, SIGSTOP, a slow disk), or None."""
        rng = self.cluster.rng
        if rng.random() >= PAUSE_PROBABILITY:
            return None
        self.pauses += 1
        return lease_ms * rng.uniform(1.2, 3.0)

    def stats(self) -> dict[str, Any]:
        net = self.cluster.net.stats
        return {
            "acked": net.answered,
            "requests": net.requests,
            "unknown": net.unknown,
            "client_drops": net.dropped,
            "pauses": self.pauses,
            "effects": sum(1 for c in self.downstream.calls if c.applied),
            "downstream_calls": len(self.downstream.calls),
        }


class Enqueuer:
    def __init__(self, workload: Workload, index: int) -> None:
        self.w = workload
        self.index = index
        self.client = Client(workload.cluster.net, f"enqueuer-{index}")
        self.count = 0
        self.outstanding = 0
        """Keys whose outcome is not settled yet (including scheduled re-sends)."""
        self.settled: list[Enqueue] = []
        """Sends answered OK or EXISTS: a caller may replay one long after (a new message once
        its retention has ended, else the same one)."""

    def loop(self) -> None:
        if self.w.phase != RUN:
            return
        self.send_new()
        self.w.cluster.at(self.w.cluster.rng.uniform(15, 90), self.loop)

    def send_new(self) -> None:
        cluster = self.w.cluster
        rng = cluster.rng
        if self.settled and rng.random() < REPLAY_PROBABILITY:
            self.outstanding += 1
            self.attempt(rng.choice(self.settled))
            return
        self.count += 1
        kind = UNREGISTERED_KIND if rng.random() < 0.02 else rng.choice(BUILTIN_KINDS)
        delay_ms, due_ms = 0, None
        draw = rng.random()
        if draw < 0.25:
            delay_ms = rng.randint(1, 2000)
        elif draw < 0.3:
            due_ms = cluster.true_clock() + rng.randint(-500, 2000)
        command = Enqueue(
            kind=kind, idempotency_key=f"k{self.index}-{self.count}", ref_key=f"ref{rng.randrange(40)}",
            payload=rng.randbytes(rng.randint(8, 48)), delay_ms=delay_ms, due_ms=due_ms,
        )
        cluster.qchecker.on_enqueue_sent(command)
        self.outstanding += 1
        self.attempt(command)

    def attempt(self, command: Enqueue) -> None:
        rng = self.w.cluster.rng
        # Headers are trace context: a re-send carries a new trace id and is still "the same".
        # Like QueueClient, most sends travel without a session, with a request id of their own
        # (retries of this send keep it; a later re-send draws another); some keep a lane.
        resend = Enqueue(
            kind=command.kind, idempotency_key=command.idempotency_key, ref_key=command.ref_key,
            payload=command.payload, headers={"trace": f"{rng.getrandbits(32):08x}"},
            delay_ms=command.delay_ms, due_ms=command.due_ms,
            request_id=rng.getrandbits(62) + 1 if rng.random() < 0.8 else 0,
        )
        self.client.submit(
            resend, functools.partial(self.answered, command, resend.request_id), tries_max=rng.randint(2, 5)
        )

    def answered(self, command: Enqueue, request_id: int, result: QueueResult | None) -> None:
        cluster = self.w.cluster
        cluster.qchecker.on_enqueue_answer(command.idempotency_key, result, request_id)
        if result is None and (self.w.phase == DRAIN or cluster.rng.random() < 0.85):
            # Unknown: re-send the same key later on a fresh lane (the first may have landed).
            cluster.at(cluster.rng.uniform(100, 1500), functools.partial(self.attempt, command))
            return
        self.outstanding -= 1
        if isinstance(result, EnqueueResult) and result.code in (Code.OK, Code.EXISTS):
            self.settled.append(command)
        if isinstance(result, EnqueueResult) and result.code not in (Code.OK, Code.EXISTS, Code.UNKNOWN_KIND):
            cluster.qchecker.violation(f"enqueue {command.idempotency_key} refused: {result}")


class Worker:
    def __init__(self, workload: Workload, index: int) -> None:
        self.w = workload
        self.name = f"w{index}"
        self.client = Client(workload.cluster.net, self.name)
        self._acks: list[Grant] | None = None

    def loop(self) -> None:
        if not self.w.active():
            return
        rng = self.w.cluster.rng
        lease_ms = rng.randint(150, 800)
        kinds: tuple[str, ...] = () if rng.random() < 0.7 else tuple(sorted(rng.sample(BUILTIN_KINDS, 2)))
        wait_ms = self.nothing_due_ms(kinds)
        if wait_ms is not None:
            self.w.cluster.at(wait_ms, self.loop)
            return
        command = Lease(worker_id=self.name, count_max=rng.randint(1, 20), lease_ms=lease_ms, kinds=kinds)
        self.client.submit(command, functools.partial(self.leased, lease_ms), tries_max=rng.randint(1, 3))

    def nothing_due_ms(self, kinds: tuple[str, ...]) -> int | None:
        """As the real worker waits: it asks the leader what is due (a stale read at the leader's
        "now") and, when nothing is ready, sleeps until the next due time (at most 150 ms)."""
        cluster = self.w.cluster
        leader = cluster.leader()
        if leader is None or leader not in cluster.machines:
            return None
        now_ms = cluster.read_clock(leader)
        due = reads.work_due(cluster.machines[leader].view, kinds, now_ms=now_ms)
        if due.ready:
            return None
        later = 150 if due.next_due_ms is None else due.next_due_ms - now_ms
        return max(5, min(150, later))

    def leased(self, lease_ms: int, result: QueueResult | None) -> None:
        cluster = self.w.cluster
        rng = cluster.rng
        if not self.w.active():
            return
        grants: tuple[Grant, ...] = ()
        if isinstance(result, LeaseResult):
            cluster.qchecker.on_grants(self.name, result)
            grants = result.grants
        start = 0.0
        for grant in grants:
            start += rng.uniform(1, 25)
            cluster.at(start, functools.partial(self.work, grant, lease_ms))
        cluster.at(rng.uniform(10, 60) if grants else rng.uniform(30, 150), self.loop)

    def work(self, grant: Grant, lease_ms: int) -> None:
        cluster = self.w.cluster
        rng = cluster.rng
        if rng.random() < 0.1:
            extend = ExtendLease(message_id=grant.message_id, token=grant.token, lease_ms=lease_ms)
            self.client.submit(extend, lambda _: None, tries_max=1)
        pause = self.w.pause_ms(lease_ms)
        if pause is not None:
            cluster.log(f"{self.name} pauses {pause:.0f} ms holding {grant.message_id}/{grant.token}")
        cluster.at(pause if pause is not None else rng.uniform(1, 30), functools.partial(self.call, grant, lease_ms))

    def call(self, grant: Grant, lease_ms: int) -> None:
        cluster = self.w.cluster
        answer = self.w.downstream.call(grant.idempotency_key, grant.message_id, grant.token, self.name)
        pause = self.w.pause_ms(lease_ms)
        cluster.at(pause if pause is not None else cluster.rng.uniform(1, 10), functools.partial(self.finish, grant, answer))

    def finish(self, grant: Grant, answer: Answer) -> None:
        outcome = answer.outcome
        if outcome in (Effect.APPLIED, Effect.DUPLICATE):
            self.ack(grant, retries=2)
        elif outcome is Effect.TIMEOUT:
            self.fail(grant, "timeout")
        elif outcome is Effect.RETRY_AFTER:
            self.fail(grant, "throttled", retry_after_ms=answer.retry_after_ms)
        elif outcome is Effect.REJECTED:
            self.fail(grant, "rejected", permanent=True)
        elif outcome is Effect.INSUFFICIENT_FUNDS:
            self.fail(grant, "insufficient_funds")
        # FENCED: a newer holder exists; walk away without touching the message.

    def ack(self, grant: Grant, retries: int) -> None:
        """Acks finishing within a few ms travel together as one AckMany (one lane, one entry)."""
        if self._acks is None:
            self._acks = []
            self.w.cluster.at(self.w.cluster.rng.uniform(0, 5), functools.partial(self.flush_acks, retries))
        self._acks.append(grant)

    def flush_acks(self, retries: int) -> None:
        grants, self._acks = self._acks or [], None
        acks = tuple(Ack(message_id=g.message_id, token=g.token, summary=f"by {self.name}") for g in grants)

        def answered(result: QueueResult | None) -> None:
            if result is None:
                for grant in grants if retries > 0 else ():
                    self.ack(grant, retries - 1)  # a fresh lane, the same token: ALREADY_ACKED if it landed
                return
            outcomes = result.outcomes if isinstance(result, Outcomes) else (result,)
            if len(outcomes) != len(grants):
                self.w.cluster.qchecker.violation(f"{len(grants)} acks answered with {result}")
            for grant, outcome in zip(grants, outcomes, strict=False):
                self.w.cluster.qchecker.on_ack_answer(grant, outcome)

        command: Ack | AckMany = acks[0] if len(acks) == 1 else AckMany(acks=acks)
        self.client.submit(command, answered, tries_max=self.w.cluster.rng.randint(2, 4))

    def fail(self, grant: Grant, error_class: str, *, permanent: bool = False, retry_after_ms: int | None = None) -> None:
        self.w.cluster.qchecker.on_fail_sent(grant.token, retry_after_ms)
        command = Fail(
            message_id=grant.message_id, token=grant.token, error_class=error_class,
            error_text=f"{error_class} from downstream", permanent=permanent, retry_after_ms=retry_after_ms,
        )
        self.client.submit(command, lambda _: None, tries_max=self.w.cluster.rng.randint(2, 4))


class Operator:
    def __init__(self, workload: Workload) -> None:
        self.w = workload
        self.client = Client(workload.cluster.net, "operator")
        self.policies_pending = set(BUILTIN_KINDS)
        self.held: set[str] = set()  # "kind/holder" pauses that may be in force
        self.actions = 0

    def random_policy(self) -> RetryPolicy:
        rng = self.w.cluster.rng
        tiers = tuple(sorted(rng.sample((30, 60, 100, 200, 400, 700), rng.randint(1, 4))))
        exponential = rng.random() < 0.3
        return RetryPolicy(
            tiers_ms=() if exponential else tiers, tier_jitter_ratio=rng.choice((0.0, 0.2, 0.5)),
            backoff_min_ms=20, backoff_max_ms=600, attempts_max=rng.randint(2, 6),
            age_max_ms=rng.choice((None, None, 4000)), retry_after_max_ms=rng.choice((300, 1000)),
            overrides=(ErrorClassRule(error_class="insufficient_funds", permanent=True),),
        )

    def set_policies(self) -> None:
        for kind in BUILTIN_KINDS:
            self.set_policy(kind, self.random_policy())

    def set_policy(self, kind: str, policy: RetryPolicy) -> None:
        def answered(result: QueueResult | None) -> None:
            if not isinstance(result, KindResult) or result.code is not Code.OK:
                self.set_policy(kind, policy)  # unknown: set it again (idempotent)
                return
            self.policies_pending.discard(kind)
            if not self.policies_pending:
                self.w.begin()

        self.client.submit(SetPolicy(kind=kind, policy=policy), answered, tries_max=3)

    def loop(self) -> None:
        if self.w.phase != RUN:
            return
        cluster = self.w.cluster
        rng = cluster.rng
        known = sorted(cluster.qchecker.model.messages)
        dead = self.dead_letter_page()
        draw = rng.random()
        self.actions += 1
        if draw < 0.25:
            self.submit(Redrive(actor="op", reason="sim", filter=DeadLetterFilter(kind=rng.choice(BUILTIN_KINDS)),
                                limit=rng.randint(1, 10)))
        elif draw < 0.4 and (dead or known):
            self.submit(Redrive(actor="op", reason="edited", ids=(rng.choice(dead or known),), payload=b"edited"))
        elif draw < 0.55 and (dead or known):
            self.submit(Discard(message_id=rng.choice(dead if dead and rng.random() < 0.5 else known or dead),
                                actor="op", reason="sim"))
        elif draw < 0.75:
            self.toggle_pause(rng.choice(BUILTIN_KINDS), f"op{rng.randrange(2)}")
        elif draw < 0.86:
            self.set_policy(rng.choice(BUILTIN_KINDS), self.random_policy())
        elif draw < 0.92:
            self.set_retention()
        else:
            self.submit(Purge(limit=100))
        cluster.at(rng.uniform(100, 500), self.loop)

    def dead_letter_page(self) -> list[int]:
        """What the operator's dead-letter page shows (a read on the leader, possibly stale)."""
        leader = self.w.cluster.leader()
        if leader is None or leader not in self.w.cluster.machines:
            return []
        conn = self.w.cluster.machines[leader].view
        page = reads.dead_letters(conn, DeadLetterFilter(), now_ms=self.w.cluster.read_clock(leader), limit=20)
        return [view.message_id for view in page.items]

    def set_retention(self) -> None:
        """Change one retention or both, now and then below the floor (which must be refused)."""
        draw = self.w.cluster.retention_rng
        retention_ms = draw.choice((None, draw.randint(1_500, 6_000)))
        event_retention_ms = draw.choice((None, draw.randint(2_000, 8_000))) if retention_ms else draw.randint(2_000, 8_000)
        below = draw.random() < 0.2
        if below:
            retention_ms = draw.randint(1, self.w.cluster.queue_config.retention_floor_ms - 1)
        command = SetRetention(actor="op", reason="sim", retention_ms=retention_ms, event_retention_ms=event_retention_ms)

        def answered(result: QueueResult | None) -> None:
            if result is None:
                return  # unknown: it may or may not have taken effect; the event log says which
            refused = isinstance(result, ErrorResult) and result.code is Code.INVALID
            if below != refused:
                self.w.cluster.qchecker.violation(f"SetRetention {command} answered {result}")
            self.w.cluster.qchecker.retention_refusals += refused

        self.client.submit(command, answered, tries_max=2)

    def submit(self, command: Redrive | Discard | Purge) -> None:
        self.client.submit(command, lambda _: None, tries_max=2)

    def toggle_pause(self, kind: str, holder: str) -> None:
        name = f"{kind}/{holder}"
        if name in self.held:
            self.resume(kind, holder)
            return
        self.held.add(name)  # from the moment it is sent: it may take effect even if unanswered
        self.client.submit(PauseKind(kind=kind, holder=holder, reason="sim"), lambda _: None, tries_max=2)

    def resume(self, kind: str, holder: str) -> None:
        def answered(result: QueueResult | None) -> None:
            if result is not None:
                self.held.discard(f"{kind}/{holder}")

        self.client.submit(ResumeKind(kind=kind, holder=holder), answered, tries_max=3)

    def drain_loop(self) -> None:
        """Resume every pause the leader shows: an unanswered PauseKind may land at any time."""
        cluster = self.w.cluster
        if self.w.phase != DRAIN:
            return
        for kind, holder in self.pauses_in_force():
            self.resume(kind, holder)
        cluster.at(cluster.rng.uniform(200, 500), self.drain_loop)

    def pauses_in_force(self) -> list[tuple[str, str]]:
        leader = self.w.cluster.leader()
        if leader is None or leader not in self.w.cluster.machines:
            return []
        conn = self.w.cluster.machines[leader].view
        return [(view.kind, pause.holder) for view in reads.kinds(conn) for pause in view.pauses]
