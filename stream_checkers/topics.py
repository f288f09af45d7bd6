"""Create the checker's topics before Faust starts.

Faust only declares its own internal topics (table changelogs).  Source topics must
exist with the *same* partition count as the tables, otherwise partitions are not
co-located and a window's batches would be split between workers; brokers that
auto-create topics pick their own count (tansu: 4).  So the worker creates every
topic of the wire contract (docs/design.md, "Topics") up front, and refuses to run
against an events topic whose partition count does not match.
"""

from __future__ import annotations

import time

from .config import CheckerConfig


class TopicMismatch(RuntimeError):
    """An existing topic has a partition count the tables cannot co-partition with."""


def _partition_counts(config: CheckerConfig, names: tuple[str, ...]) -> dict[str, int]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        bootstrap_servers=config.bootstrap_servers,
        request_timeout_ms=10000,
        **config.security.kafka_python_kwargs(),
    )
    try:
        counts: dict[str, int] = {}
        existing = consumer.topics()
        for name in names:
            if name in existing:
                counts[name] = len(consumer.partitions_for_topic(name) or ())
        return counts
    finally:
        consumer.close()


def ensure_topics(config: CheckerConfig, timeout_s: float = 30.0) -> dict[str, int]:
    """Create missing topics; return each topic's partition count."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    names = config.topics
    wanted = {name: config.partitions for name in names.partitioned()}
    wanted.update({names.violations: config.partitions, names.dead_letter: 1})
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin = KafkaAdminClient(
                bootstrap_servers=config.bootstrap_servers,
                request_timeout_ms=int(min(10.0, timeout_s) * 1000),
                bootstrap_timeout_ms=int(timeout_s * 1000),
                **config.security.kafka_python_kwargs(),
            )
            break
        except KafkaError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    try:
        present = _partition_counts(config, tuple(wanted))
        missing = [NewTopic(name, count, 1) for name, count in wanted.items() if name not in present]
        if missing:
            try:
                admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another worker created it between our check and our request
    finally:
        admin.close()
    while True:
        counts = _partition_counts(config, tuple(wanted))
        if set(counts) >= set(wanted) and all(counts.values()):
            break
        if time.monotonic() > deadline:
            raise TopicMismatch(f"topics not visible after creation: {sorted(set(wanted) - set(counts))}")
        time.sleep(0.2)
    for name in names.partitioned():
        if counts[name] != config.partitions:
            raise TopicMismatch(
                f"topic {name} has {counts[name]} partitions but the checker runs with "
                f"--partitions {config.partitions}; use --partitions {counts[name]} "
                "(every checker of a deployment must agree)"
            )
    return counts
