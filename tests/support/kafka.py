"""Helpers to drive a real checker from tests and benchmarks (no mocks).

`CheckerProcess` runs ``trainwatch serve`` as a child process (so it can be killed
with SIGKILL like a crashed pod), `read_topic` reads a topic from the beginning with
a plain kafka-python consumer (manual assignment: no consumer group, which tansu's
group admin cannot describe), `scrape`/`metric` read a ``/metrics`` page, and
`synthetic_step_batch` builds one rank's well-formed batch of a DDP-like step, with
an optional diverging parameter digest, loss value or missing step end.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Iterator

from invariants.codec import encode_batch
from invariants.events import batch_key, make_batch

from stream_checkers.console.supervisor import CheckerProcess, TopicReader, metric, scrape, wait_until

__all__ = ["CheckerProcess", "metric", "scrape", "wait_until", "read_topic", "produce", "produce_raw",
           "synthetic_step_batch", "iter_violations"]


def read_topic(bootstrap: str, topic: str, *, timeout_s: float = 10.0,
               security_kwargs: dict[str, Any] | None = None) -> list[Any]:
    """Every record currently in ``topic`` (all partitions, from the beginning)."""
    reader = TopicReader(bootstrap, topic, security_kwargs)
    try:
        return reader.read_all(timeout_s)
    finally:
        reader.close()


def _event(kind: str, t: int, stage: str = "train", **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "t": t, "pid": 1000, "tid": 1, "stage": stage, **fields}


def synthetic_step_batch(run: str, rank: int, world: int, step: int, *, seq: int | None = None,
                         digest: str | None = None, end: bool = True, loss: float | None = None,
                         extra: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """One rank's batch of one step of a tiny DDP-like run: backward, optimizer step with
    pre/post parameter snapshots (digest equal on all ranks unless ``digest`` is given),
    and the step end marker."""
    t = time.time_ns()
    data = digest or f"x3:{step:016x}"
    before = f"x3:{step - 1:016x}" if step else "x3:init"
    param = {"shape": [4, 4], "dtype": "torch.float32", "device": "cpu", "requires_grad": True,
             "is_leaf": True, "grad_norm": 0.5, "numel": 16, "module": "fc", "mtype": "Linear"}
    events = [
        _event("step", t, phase="begin"),
        _event("call", t, name="torch.optim.sgd.SGD.zero_grad", api="torch.optim.Optimizer.zero_grad", phase="pre",
               cid=3, parent=None, args={}),
        _event("call", t, name="torch.optim.sgd.SGD.zero_grad", api="torch.optim.Optimizer.zero_grad", phase="post",
               cid=3, parent=None),
        _event("call", t, name="torch.Tensor.backward", api="torch.Tensor.backward", phase="pre", cid=1,
               parent=None, args={"self": {"T": "tensor", "shape": [], "dtype": "torch.float32",
                                           "value": loss if loss is not None else 1.0 / (step + 1)}}),
        _event("call", t, name="torch.Tensor.backward", api="torch.Tensor.backward", phase="post", cid=1, parent=None),
        _event("call", t, name="torch.optim.sgd.SGD.step", api="torch.optim.Optimizer.step", phase="pre", cid=2,
               parent=None, args={}),
        _event("state", t, name="fc.weight", vtype="torch.nn.Parameter", at="pre:torch.optim.Optimizer.step", cid=2,
               attrs={**param, "data_digest": before, "grad_digest": "x3:g", "data_norm": 1.0}),
        _event("state", t, name="fc.weight", vtype="torch.nn.Parameter", at="post:torch.optim.Optimizer.step", cid=2,
               attrs={**param, "data_digest": data, "grad_digest": "x3:g", "data_norm": 1.001}),
        _event("call", t, name="torch.optim.sgd.SGD.step", api="torch.optim.Optimizer.step", phase="post", cid=2,
               parent=None),
        *extra,
    ]
    if end:
        events.append(_event("step", t, phase="end"))
    return make_batch(run=run, rank=rank, world=world, step=step, seq=step if seq is None else seq, events=events)


def produce(bootstrap: str, topic: str, batches: Iterable[dict[str, Any]]) -> int:
    """Send encoded batches keyed ``run:step``; returns how many were sent."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    count = 0
    try:
        for batch in batches:
            producer.send(topic, key=batch_key(batch["run"], batch["step"]), value=encode_batch(batch))
            count += 1
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)
    return count


def produce_raw(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes]]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=8 * 1024 * 1024)
    try:
        for key, value in records:
            producer.send(topic, key=key, value=value)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)


def iter_violations(records: Iterable[Any]) -> Iterator[dict[str, Any]]:
    from stream_checkers.report import decode_violation

    for record in records:
        yield decode_violation(record.value)
