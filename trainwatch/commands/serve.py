"""`trainwatch serve`: a streaming checker worker on a Kafka cluster.

Every flag has a ``TRAINWATCH_*`` environment variable (flags win), so a container
image can be configured without a command line; Kafka SASL/SSL settings are taken
from the same variables the producers read.
"""

from __future__ import annotations

import argparse
import os
import sys

from invariants.events import DEFAULT_TOPIC_PREFIX
from stream_checkers.config import DEFAULT_GRACE_SECONDS

EXIT_USAGE = 2


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"TRAINWATCH_{name}", default)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # --help shows each effective default (%(default)s): built in, or the environment's value.
    # Defaults from the environment stay strings: argparse converts them with `type`
    # when serve's own arguments are parsed, so a bad value is a usage error of serve
    # rather than a crash of every trainwatch command.
    parser.add_argument("-i", "--invariants", default=_env("INVARIANTS"),
                        help="invariant file (default: the shipped set; env TRAINWATCH_INVARIANTS)")
    parser.add_argument("--bootstrap", default=_env("BOOTSTRAP"),
                        help="Kafka bootstrap HOST:PORT[,HOST:PORT] (env TRAINWATCH_BOOTSTRAP)")
    parser.add_argument("--metrics-port", type=int, default=_env("METRICS_PORT", "9464"),
                        help="Prometheus /metrics port, 0 = any free port (default: %(default)s; env TRAINWATCH_METRICS_PORT)")
    parser.add_argument("--metrics-host", default=_env("METRICS_HOST", "127.0.0.1"),
                        help="address /metrics binds to (default: %(default)s; env TRAINWATCH_METRICS_HOST)")
    parser.add_argument("--partitions", type=int, default=_env("PARTITIONS", "4"),
                        help="partitions of the events topic and tables (default: %(default)s; env TRAINWATCH_PARTITIONS)")
    parser.add_argument("--grace-seconds", type=float, default=_env("GRACE_SECONDS", f"{DEFAULT_GRACE_SECONDS:g}"),
                        help="close a window this long after its last batch (default: %(default)s s; env TRAINWATCH_GRACE_SECONDS)")
    parser.add_argument("--topic-prefix", default=_env("TOPIC_PREFIX", DEFAULT_TOPIC_PREFIX),
                        help="topic name prefix (default: %(default)s; env TRAINWATCH_TOPIC_PREFIX)")
    parser.add_argument("--app-id", default=_env("APP_ID", "trainwatch-checker"),
                        help="consumer group / Faust app id shared by cooperating workers (default: %(default)s; env TRAINWATCH_APP_ID)")
    parser.add_argument("--data-dir", default=_env("DATA_DIR", ".trainwatch-checker"),
                        help="worker scratch directory (default: %(default)s; env TRAINWATCH_DATA_DIR)")
    parser.add_argument("--max-batch-bytes", type=int,
                        default=_env("MAX_BATCH_BYTES", str(16 * 1024 * 1024)),
                        help="larger messages are dead-lettered as oversized (default: %(default)s; env TRAINWATCH_MAX_BATCH_BYTES)")
    parser.add_argument("--connect-timeout", type=float, default=_env("CONNECT_TIMEOUT", "30"),
                        help="give up if Kafka cannot be reached for this long at start (default: %(default)s s; env TRAINWATCH_CONNECT_TIMEOUT)")
    parser.add_argument("--multi-record-batches", action="store_true",
                        default=(_env("MULTI_RECORD_BATCHES", "") or "").lower() in ("1", "true", "yes", "on"),
                        help="let the producer pack several records per Kafka batch: faster, but only for "
                             "brokers that replay such batches completely (Apache Kafka; not tansu) "
                             "(env TRAINWATCH_MULTI_RECORD_BATCHES)")
    parser.add_argument("--log-level", default=_env("LOG_LEVEL", "WARNING"),
                        help="Faust/Kafka client log level (default: %(default)s; env TRAINWATCH_LOG_LEVEL)")


def config_from_args(args: argparse.Namespace):
    from stream_checkers.config import CheckerConfig, KafkaSecurity

    return CheckerConfig(
        bootstrap=args.bootstrap or "",
        invariants_path=args.invariants,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        partitions=args.partitions,
        grace_seconds=args.grace_seconds,
        topic_prefix=args.topic_prefix,
        app_id=args.app_id,
        data_dir=args.data_dir,
        max_batch_bytes=args.max_batch_bytes,
        log_level=args.log_level.upper(),
        connect_timeout_seconds=args.connect_timeout,
        single_record_batches=not args.multi_record_batches,
        security=KafkaSecurity.from_env(),
    )


def run(args: argparse.Namespace) -> int:
    from stream_checkers.engine_port import EnginePort, InvariantsUnavailable

    config = config_from_args(args)
    try:
        config.validate()
    except ValueError as exc:
        print(f"trainwatch serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        engine = EnginePort.load(config.invariants_path)
    except InvariantsUnavailable as exc:
        print(f"trainwatch serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from kafka.errors import KafkaError

    from stream_checkers.tls_preflight import KafkaTlsError, check_tls, tls_listener_hint
    from stream_checkers.topics import TopicMismatch
    from stream_checkers.worker import run_worker

    handshake_timeout_s = min(config.connect_timeout_seconds, 10.0)
    try:
        check_tls(config.bootstrap_servers, config.security, handshake_timeout_s)
        return run_worker(config, engine)
    except KafkaTlsError as exc:
        print(f"trainwatch serve: Kafka at {config.bootstrap}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (KafkaError, TopicMismatch) as exc:
        hint = tls_listener_hint(config.bootstrap_servers, config.security) if isinstance(exc, KafkaError) else None
        print(f"trainwatch serve: Kafka at {config.bootstrap}: {exc}" + (f"; {hint}" if hint else ""),
              file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"trainwatch serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
