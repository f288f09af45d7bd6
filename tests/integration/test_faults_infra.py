"""Dead infrastructure, injected for real: a broker killed with SIGKILL under training.

A training process outlives a dead broker without a traceback or a long exit, and the
batches it could not deliver are counted (`watch`'s exit 2 for the same fault is in
tests/integration/test_watch.py).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from stream_checkers.console.supervisor import wait_until

ROOT = Path(__file__).resolve().parents[2]

#: Trains a small MLP, waits for ``go`` (created once the broker is dead), then its loss
#: turns NaN: a bug whose onset comes after the broker died.
TRAIN_THEN_NAN = textwrap.dedent("""
    import os, sys, time
    import torch
    from torch import nn
    go = sys.argv[1]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
    deadline = time.monotonic() + 120
    for step in range(400):
        waiting = step >= 5 and not os.path.exists(go)
        while waiting and time.monotonic() < deadline:
            time.sleep(0.05)
            waiting = not os.path.exists(go)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        if step >= 20:
            loss = loss * float("nan")
        loss.backward()
        opt.step()
    print(f"training ended at {time.time()}", file=sys.stderr, flush=True)
""")


def test_training_outlives_a_dead_broker_quietly_and_promptly(kafka_broker, clean_env, tmp_path):
    """The producer's shutdown path is bounded by the flush timeout and silent: no
    ``Exception ignored in atexit callback`` from the Kafka client, and the batches it
    could not deliver are counted in collect's summary."""
    from tests.support.kafka import read_topic

    script, go = tmp_path / "train.py", tmp_path / "go"
    script.write_text(TRAIN_THEN_NAN)
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainwatch.cli", "collect", "--bootstrap", kafka_broker.bootstrap,
         "--run-id", "quiet", "--flush-timeout", "2", "--", sys.executable, str(script), str(go)],
        env=clean_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: read_topic(kafka_broker.bootstrap, "trainwatch.events", timeout_s=2),
                   timeout_s=120, what="the producer's first batches on the broker")
        kafka_broker.kill()
        go.touch()
        started = time.monotonic()
        _, stderr = proc.communicate(timeout=120)
        after_kill_s = time.monotonic() - started
        exited_at = time.time()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    assert "Exception ignored" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert "batches dropped" in stderr and "no batches dropped" not in stderr, stderr[-3000:]
    # the shutdown is bounded by the flush timeout (2 s) whatever the machine's load; the
    # training before it (380 steps with a dead broker) must not stall either
    ended = float(stderr.split("training ended at ", 1)[1].split()[0])
    assert exited_at - ended < 4.0, f"exit took {exited_at - ended:.1f}s after training ended"
    assert after_kill_s < 30.0, f"training and exit took {after_kill_s:.1f}s after the broker died"


def test_the_kafka_client_private_exit_hook_the_sink_unregisters_exists(kafka_broker):
    """The sink drops kafka-python's own atexit hook (``KafkaProducer._cleanup``), which
    would wait on a dead broker and print a traceback: that private member must exist."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    try:
        assert callable(producer._cleanup)
    finally:
        producer.close(timeout=1)
