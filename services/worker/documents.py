"""What operators set for the workers, read from the store's settings documents: each breaker's
mode (namespace "breakers": auto, open or closed) and each downstream's classification table
(namespace "classification", validated by the API before it was stored).

Read every `refresh_s` by a task of its own (a set that does not answer delays no lease), each
namespace by its version: a read that finds the version known returns no documents, so a worker's
refresh costs two small reads a second.

Which set: these are cluster-wide documents, written to every set by the API (and repaired where a
set missed a write: queues/sets/settings.py, docs/sets.md), so any set's copy is the setting; they
are read from the lowest-numbered set that answers, the others in turn when it does not (a set
whose lane finds it down is tried last). Versions are a set's own, so a change of set reads
everything afresh.

Must never: stop the worker over a document it cannot decode (a bad mode is "auto", a bad table
keeps the default, and either is logged), or over a set that does not answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Final

import msgspec

from handlers.classification import ClassificationTable, decode_table
from handlers.registry import Registry
from queues import ClientError, QueueClient, QueueError
from services.worker.breaker import NAMESPACE as BREAKERS
from services.worker.breaker import Breaker, Mode

log = logging.getLogger("compensator.worker")
TABLES: Final = "classification"
"""The settings documents' namespace of classification tables, one per downstream."""


class OperatorDocuments:
    def __init__(
        self, sets: Mapping[int, QueueClient], registry: Registry | None, *, refresh_s: float,
        reachable: Callable[[int], bool] = lambda set_id: True,
    ) -> None:  # fmt: skip
        self._sets = sets
        self._registry = registry
        self._refresh_s = refresh_s
        self._reachable = reachable
        self._source: int | None = None
        self._modes_version = -1
        self._tables_version = -1

    async def run(self, breakers: Mapping[str, Breaker]) -> None:
        while True:
            try:
                await self.refresh(breakers)
            except (ClientError, QueueError) as error:
                log.warning("cannot read the operators' documents from any set (will retry): %s", error)
            await asyncio.sleep(self._refresh_s)

    async def refresh(self, breakers: Mapping[str, Breaker]) -> None:
        """The breakers' modes, and the registry's tables, as the first set that answers has them."""
        order = sorted(self._sets, key=lambda set_id: (not self._reachable(set_id), set_id))
        for index, set_id in enumerate(order):
            try:
                await self._refresh_from(set_id, breakers)
                return
            except (ClientError, QueueError) as error:
                if index == len(order) - 1:
                    raise
                log.warning("set %d does not answer for the operators' documents; asking set %d: %s", set_id,
                            order[index + 1], error)  # fmt: skip

    async def _refresh_from(self, set_id: int, breakers: Mapping[str, Breaker]) -> None:
        if set_id != self._source:
            self._source, self._modes_version, self._tables_version = set_id, -1, -1
        queue = self._sets[set_id]
        answer = (await queue.documents(BREAKERS, known_version=self._modes_version, stale_ok=True)).value
        if answer.changed:
            modes = {doc.name: _mode(doc.body) for doc in answer.documents}
            for downstream, breaker in breakers.items():
                breaker.mode = modes.get(downstream, Mode.AUTO)
            self._modes_version = answer.version
        if self._registry is not None:
            await self._read_tables(queue, self._registry)

    async def _read_tables(self, queue: QueueClient, registry: Registry) -> None:
        """A downstream without a table is classified by its default one."""
        answer = (await queue.documents(TABLES, known_version=self._tables_version, stale_ok=True)).value
        if not answer.changed:
            return
        tables: dict[str, ClassificationTable] = {}
        for doc in answer.documents:
            try:
                tables[doc.name] = decode_table(doc.body)
            except (ValueError, msgspec.DecodeError) as error:
                log.error("classification table %s in the store is invalid; keeping the default: %s", doc.name, error)
        registry.use_tables(tables)
        self._tables_version = answer.version
        log.info("classification tables in force: %s", ", ".join(sorted(tables)) or "the defaults")


def _mode(body: bytes) -> Mode:
    try:
        return Mode(msgspec.json.decode(body).get("mode", "auto"))
    except (ValueError, AttributeError, msgspec.DecodeError):
        log.warning('a breaker document is not {"mode": "auto|open|closed"}: %r', body[:100])
        return Mode.AUTO
