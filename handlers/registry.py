"""The handlers a worker runs, one per kind, built from the settings: ``kind -> Handler``.

Owns: building one gateway per downstream (its pooled client), the three handlers over them with
their classification tables (the defaults, or tables an operator set), and closing the gateways.
Checks everything before it opens a connection: the settings, the tables, and that every
configured callback target has a secret (an error names the target, never a value).

Must never: read the environment or a file (the composition root hands in settings and secrets).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

from opentelemetry import trace

from handlers.callback import CallbackHandler, CallbackTarget
from handlers.classification import ClassificationTable
from handlers.contract import Handler
from handlers.gateway import Gateway
from handlers.list_update import ListUpdateHandler
from handlers.settings import DownstreamSettings, Guarantee, HandlersSettings
from handlers.signing import Secret
from handlers.tables import CALLBACK, DEFAULT_TABLES, PAYMENT, RED_PACKET
from handlers.transfer import TransferGuarantee, TransferHandler
from ledger.kinds import Kind


class RegistryError(ValueError):
    """Settings, tables or secrets that cannot make handlers; one problem per line."""


class Registry:
    def __init__(self, handlers: Mapping[Kind, Handler], gateways: tuple[Gateway, ...]) -> None:
        self.handlers: Mapping[Kind, Handler] = MappingProxyType(dict(handlers))
        self._gateways = gateways

    def __repr__(self) -> str:
        return f"Registry(kinds={sorted(self.handlers)})"

    def handler(self, kind: Kind) -> Handler:
        return self.handlers[kind]

    def use_tables(self, tables: Mapping[str, ClassificationTable]) -> None:
        """Classify each downstream's answers with these tables from now on (the defaults where
        none is given)."""
        for handler in self.handlers.values():
            table = tables.get(handler.downstream, DEFAULT_TABLES[handler.downstream])
            handler.use(table)  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        for gateway in self._gateways:
            await gateway.aclose()

    async def __aenter__(self) -> Registry:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _problems(
    settings: HandlersSettings, secrets: Mapping[str, Secret], tables: Mapping[str, ClassificationTable]
) -> list[str]:
    found = settings.problems()
    for downstream in (PAYMENT, RED_PACKET, CALLBACK):
        table = tables.get(downstream)
        if table is None:
            found.append(f"no classification table for {downstream}")
        else:
            found += [f"table {downstream}: {problem}" for problem in table.problems()]
    found += [f"callback target {t.name!r} has no secret" for t in settings.callback.targets if t.name not in secrets]
    return found


def build_registry(
    settings: HandlersSettings, *, secrets: Mapping[str, Secret],
    tables: Mapping[str, ClassificationTable] = DEFAULT_TABLES,
    clock: Callable[[], float] = time.time, rng: random.Random | None = None, tracer: trace.Tracer | None = None,
    events: Callable[[str, str], None] | None = None,
) -> Registry:  # fmt: skip
    """`events(downstream, name)`: what a handler saw (a lookup, a wait, a refusal for expiry, a
    transfer parked as unknown_outcome), for the worker's metrics."""
    problems = _problems(settings, secrets, tables)
    if problems:
        raise RegistryError("\n".join(problems))
    rng = rng if rng is not None else random.Random()
    payment = Gateway(downstream=PAYMENT, settings=settings.payment.gateway, base_url=settings.payment.base_url,
                      rng=rng, clock=clock, tracer=tracer)  # fmt: skip
    red_packet = Gateway(downstream=RED_PACKET, settings=settings.red_packet.gateway,
                         base_url=settings.red_packet.base_url, rng=rng, clock=clock, tracer=tracer)  # fmt: skip
    callback = Gateway(downstream=CALLBACK, settings=settings.callback.gateway, rng=rng, clock=clock, tracer=tracer)
    targets = {
        t.name: CallbackTarget(name=t.name, url=t.url, secret=secrets[t.name]) for t in settings.callback.targets
    }
    handlers: dict[Kind, Handler] = {
        Kind.TRANSFER: TransferHandler(
            sender=payment, table=tables[PAYMENT], guarantee=transfer_guarantee(settings.payment),
            events=(lambda name: events(PAYMENT, name)) if events is not None else None,
        ),
        Kind.LIST_UPDATE: ListUpdateHandler(sender=red_packet, table=tables[RED_PACKET]),
        Kind.CALLBACK: CallbackHandler(sender=callback, table=tables[CALLBACK], targets=targets, clock=clock),
    }
    return Registry(handlers, (payment, red_packet, callback))


def transfer_guarantee(settings: DownstreamSettings) -> TransferGuarantee:
    return TransferGuarantee(
        guarantee=Guarantee(settings.guarantee), clock_skew_s=settings.clock_skew_ms / 1000, horizon_s=settings.in_flight_horizon_s,
        request_ttl_s=settings.gateway.attempt_timeout_s,
    )  # fmt: skip
