"""``compensator events-publish`` and ``compensator kafka-ingest``: the two Kafka processes
(docs/kafka.md).

Both are built by the composition root (compensator/wiring/kafka.py) from the ``[kafka]`` section
and run by the process shell (compensator/shell.py); this module owns the flags.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from compensator.config_file import add_config_argument, load_for


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    publish = subparsers.add_parser("events-publish", help="publish the store's events to the Kafka events topic")
    add_config_argument(publish)
    publish.add_argument("--holder", default="", help="this publisher's name in its lease (default host:pid)")
    publish.add_argument(
        "--accept-gap",
        action="store_true",
        help="go on past events purged before they were published (logged), instead of stopping",
    )
    publish.set_defaults(handler=publish_events)
    ingest = subparsers.add_parser("kafka-ingest", help="ingest failed requests from a Kafka topic into the store")
    add_config_argument(ingest)
    ingest.set_defaults(handler=ingest_requests)


def publish_events(args: argparse.Namespace) -> int:
    from compensator import shell
    from compensator.wiring import kafka

    config = load_for(args)
    build = functools.partial(kafka.publisher_process, config, holder=args.holder, accept_gap=args.accept_gap)
    return shell.run(kafka.shell(config, "events-publish"), build)


def ingest_requests(args: argparse.Namespace) -> int:
    from compensator import shell
    from compensator.wiring import kafka

    config = load_for(args)
    return shell.run(kafka.shell(config, "kafka-ingest"), functools.partial(kafka.ingest_process, config))
