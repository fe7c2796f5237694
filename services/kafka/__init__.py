"""Kafka in and out: the store's events published to a topic (`compensator events-publish`) and
failed requests ingested from a topic (`compensator kafka-ingest`). docs/kafka.md has the record
formats, the delivery guarantees and how to run them.
"""
