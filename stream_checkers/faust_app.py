"""The Faust app of one checker worker, configured for loopback test brokers and real clusters.

Settings are chosen for detection latency and safety, not throughput: commits every
second, short sessions so a dead worker's partitions move quickly, produce batches of
one record where a broker replays multi-record batches partially (tansu), and the
transport from `faust_compat` so table recovery reads each changelog to its true end.
"""

from __future__ import annotations

from typing import Any

import faust

from .config import CheckerConfig
from .faust_compat.transport import FetchHighwaterProbe, HighwaterTransport


def build_faust_app(config: CheckerConfig) -> faust.App:
    """A Faust app configured for short-lived loopback brokers as well as real clusters."""
    security = config.security
    credentials: Any = None
    if security.protocol.startswith("SASL"):
        credentials = faust.SASLCredentials(
            username=security.username,
            password=security.password,
            ssl_context=security.ssl_context(),
            mechanism=security.sasl_mechanism or "PLAIN",
        )
    elif security.protocol == "SSL":
        credentials = faust.SSLCredentials(security.ssl_context())
    session = config.session_timeout_seconds
    app = faust.App(
        config.app_id,
        broker=[f"kafka://{server}" for server in config.bootstrap_servers],
        broker_credentials=credentials,
        store="memory://",
        datadir=config.data_dir,
        autodiscover=False,
        web_enabled=False,
        topic_partitions=config.partitions,
        topic_replication_factor=1,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=session,
        broker_heartbeat_interval=max(0.5, session / 6),
        broker_rebalance_timeout=max(session * 2, 10.0),
        broker_commit_interval=1.0,
        worker_redirect_stdouts=False,
        consumer_max_fetch_size=max(config.max_batch_bytes + 1024, 1024 * 1024),
        producer_max_request_size=max(config.max_batch_bytes + 1024, 1024 * 1024),
        # One record per produce batch: brokers such as tansu otherwise hand back only
        # part of a multi-record batch when a changelog is replayed.
        producer_max_batch_size=1 if config.single_record_batches else 16384,
    )
    # Table recovery must read each changelog to its true end; see `end_offsets`.
    app.transport = HighwaterTransport(
        app.conf.broker_consumer, app,
        highwater_probe=FetchHighwaterProbe(config.bootstrap_servers, config.security.kafka_python_kwargs()),
    )
    return app
