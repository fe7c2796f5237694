"""What operators set for the workers, read from the store's settings documents: each breaker's
mode (namespace "breakers": auto, open or closed) and each downstream's classification table
(namespace "classification", validated by the API before it was stored).

Read at most every `refresh_s`, each namespace by its version: a read that finds the version
known returns no documents, so a worker's refresh costs two small reads a second.

Must never: stop the worker over a document it cannot decode (a bad mode is "auto", a bad table
keeps the default, and either is logged).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Final

import msgspec

from handlers.classification import ClassificationTable, decode_table
from handlers.registry import Registry
from queues import QueueClient
from services.worker.breaker import NAMESPACE as BREAKERS
from services.worker.breaker import Breaker, Mode

log = logging.getLogger("compensator.worker")
TABLES: Final = "classification"
"""The settings documents' namespace of classification tables, one per downstream."""


class OperatorDocuments:
    def __init__(self, queue: QueueClient, registry: Registry | None, *, refresh_s: float) -> None:
        self._queue = queue
        self._registry = registry
        self._refresh_s = refresh_s
        self._modes_version = -1
        self._tables_version = -1
        self._read_s = float("-inf")

    async def refresh(self, breakers: Mapping[str, Breaker]) -> None:
        """The breakers' modes, and the registry's tables, as the store has them now (at most
        every `refresh_s`)."""
        now = time.monotonic()
        if now - self._read_s < self._refresh_s:
            return
        self._read_s = now
        answer = (await self._queue.documents(BREAKERS, known_version=self._modes_version, stale_ok=True)).value
        if answer.changed:
            modes = {doc.name: _mode(doc.body) for doc in answer.documents}
            for downstream, breaker in breakers.items():
                breaker.mode = modes.get(downstream, Mode.AUTO)
            self._modes_version = answer.version
        if self._registry is not None:
            await self._read_tables(self._registry)

    async def _read_tables(self, registry: Registry) -> None:
        """A downstream without a table is classified by its default one."""
        answer = (await self._queue.documents(TABLES, known_version=self._tables_version, stale_ok=True)).value
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
