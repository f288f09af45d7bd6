"""Synthetic event batches shaped like an instrumented data-parallel training run.

Used by tests and benchmarks to exercise every template without torch: a small model
(linear layers, a dropout, a tied pair), per step a ``zero_grad``, a root forward with
module children, a backward with gradient all-reduces, an optimizer step with
snapshots before/after it, and step-end snapshots; optional eval steps and DataLoader
worker starts.  ``faults`` inject the silent bugs the templates exist to catch, at a
chosen step (and rank), so tests can assert *where* a violation is reported.

Fault names: ``drift`` (rank's weights differ after the step), ``frozen`` (the step
leaves one trainable parameter unchanged), ``step_noop`` (the step updates no parameter at
all), ``no_zero_grad``, ``dropout_in_eval``,
``reinit`` (``nn.init.normal_`` mid-training), ``missing_rank`` (a rank never ends the
step), ``same_worker_seed``, ``allreduce_shape`` (one rank reduces a different shape),
``autocast_lost`` (linear outputs float32 instead of bfloat16), ``untie``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterator

from .events import (
    MODULE_EVAL,
    MODULE_FORWARD,
    MODULE_TRAIN,
    OPTIMIZER_STEP,
    OPTIMIZER_ZERO_GRAD,
    PARAMETER_VTYPE,
    TENSOR_BACKWARD,
    WORKER_INIT_API,
    make_batch,
)

PARAMS = (
    # name, mtype, requires_grad, shape
    ("module.embed.weight", "Embedding", True, [32, 8]),
    ("module.fc1.weight", "Linear", True, [16, 8]),
    ("module.fc1.bias", "Linear", True, [16]),
    ("module.fc2.weight", "Linear", True, [4, 16]),
    ("module.fc2.bias", "Linear", True, [4]),
    ("module.frozen.weight", "Linear", False, [8, 8]),
    ("module.head.weight", "Linear", True, [32, 8]),
)
TIED = ("module.embed.weight", "module.head.weight")
ONE_SHOT_FAULTS = frozenset({"missing_rank", "reinit", "dropout_in_eval", "same_worker_seed", "allreduce_shape"})
MODULES = (("fc1", "Linear"), ("drop", "Dropout"), ("fc2", "Linear"))


def _digest(*parts: Any) -> str:
    return hashlib.blake2b(repr(parts).encode(), digest_size=8).hexdigest()


@dataclass
class Fault:
    name: str
    step: int
    rank: int = 0


@dataclass
class SyntheticRun:
    run: str = "run-a"
    world: int = 2
    steps: int = 6
    eval_every: int = 3
    workers: int = 2
    autocast: bool = True
    faults: list[Fault] = field(default_factory=list)
    seed: int = 0
    #: Extra trainable ``Linear`` weights (and their forwards), to shape a bigger model's steps.
    extra_layers: int = 0
    #: Split each rank's step into two batches (as a producer does for a long step);
    #: False ships one batch per rank and step, the common case.
    split_steps: bool = True

    @property
    def params(self) -> tuple[tuple[str, str, bool, list[int]], ...]:
        extra = tuple((f"module.blocks.{i}.weight", "Linear", True, [8, 8]) for i in range(self.extra_layers))
        return PARAMS + extra

    @property
    def modules(self) -> tuple[tuple[str, str], ...]:
        return MODULES + tuple((f"blocks.{i}", "Linear") for i in range(self.extra_layers))

    def _fault(self, name: str, step: int, rank: int) -> bool:
        """One-shot faults fire at their step only; the others persist from it on."""
        for fault in self.faults:
            if fault.name != name or fault.rank != rank:
                continue
            if step == fault.step or (name not in ONE_SHOT_FAULTS and step > fault.step):
                return True
        return False

    def batches(self) -> Iterator[dict[str, Any]]:
        """Batches in step order, ranks round-robin (callers shuffle if they like)."""
        seqs = [0] * self.world
        for step in range(self.steps):
            for rank in range(self.world):
                events = list(self._step_events(step, rank))
                half = len(events) // 2
                for part in ((events[:half], events[half:]) if self.split_steps else (events,)):
                    yield make_batch(run=self.run, rank=rank, world=self.world, step=step, seq=seqs[rank], events=part)
                    seqs[rank] += 1

    # ------------------------------------------------------------------ one rank, one step
    def _step_events(self, step: int, rank: int) -> Iterator[dict[str, Any]]:
        pid = 1000 + rank
        self._cid = step * 10_000
        self._t = step * 1_000_000
        yield self._ev("step", "train", pid, phase="begin")
        if step == 0:
            yield from self._call(pid, "init", "torch.manual_seed", args={"seed": 1234 + self.seed})
            yield from self._call(pid, "init", "torch.nn.init.normal_", args={"std": 0.02})
        if self._fault("reinit", step, rank):
            yield from self._call(pid, "train", "torch.nn.init.normal_", args={"std": 0.02})
        if self.eval_every and step % self.eval_every == 0 and step > 0:
            yield from self._eval(pid, step, rank)
        if step == 0 or (self.eval_every and step % self.eval_every == 0):
            for worker in range(self.workers):
                seed_digest = _digest("wseed", self.seed, step, worker if not self._fault("same_worker_seed", step, rank) else 0, rank)
                yield from self._call(pid + 100 + worker, "train", WORKER_INIT_API,
                                      args={"worker_id": worker, "torch_seed": int(seed_digest[:6], 16),
                                            "numpy_state_digest": seed_digest})
        if not self._fault("no_zero_grad", step, rank):
            yield from self._zero_grad(pid, step, rank)
        yield from self._forward(pid, "train", step, rank, training=True)
        yield from self._backward(pid, step, rank)
        yield from self._opt_step(pid, step, rank)
        for name, mtype, req, shape in self.params:
            yield self._state(pid, "train", name, "step_end", None, self._attrs(name, mtype, req, shape, step + 1, rank, grad=req))
        if not (self._fault("missing_rank", step, rank)):
            yield self._ev("step", "train", pid, phase="end")

    def _ev(self, kind: str, stage: str, pid: int, **fields: Any) -> dict[str, Any]:
        self._t += 1000
        event = {"kind": kind, "t": self._t, "pid": pid, "tid": 1, "stage": stage}
        event.update(fields)
        return event

    def _call(self, pid: int, stage: str, api: str, *, args: dict | None = None, ret: Any = None, parent: int | None = None,
              extra: dict | None = None, ctx: dict | None = None, children: Any = None) -> Iterator[dict[str, Any]]:
        self._cid += 1
        cid = self._cid
        common = {"name": api, "api": api, "cid": cid, "parent": parent, "ctx": ctx or {"grad": True, "autocast": None, "training": True}}
        if extra:
            common.update(extra)
        yield self._ev("call", stage, pid, phase="pre", args=args or {}, **common)
        if children is not None:
            yield from children(cid)
        post = dict(common)
        yield self._ev("call", stage, pid, phase="post", ret=ret, **post)

    def _attrs(self, name: str, mtype: str, req: bool, shape: list[int], version: int, rank: int, *, grad: bool) -> dict[str, Any]:
        data_key: Any = name if name not in TIED else "tied"
        if any(f.name == "untie" and version > f.step and name == TIED[1] for f in self.faults):
            data_key = name
        drifted = any(f.name == "drift" and version > f.step and f.rank == rank for f in self.faults)
        numel = 1
        for d in shape:
            numel *= d
        attrs = {
            "shape": shape, "dtype": "torch.float32", "device": "cpu", "requires_grad": req, "is_leaf": True,
            "data_digest": _digest("data", data_key, version if req else 0, rank if drifted else -1, self.seed),
            "grad_digest": _digest("grad", name, version) if grad else None,
            "data_norm": 1.0 + version, "grad_norm": 0.5 if grad else None, "numel": numel,
            "module": name.rsplit(".", 1)[0], "mtype": mtype,
        }
        if data_key == "tied" and name == TIED[1]:
            attrs["alias_of"] = TIED[0]  # the producer names the first registration of a shared tensor
        return attrs

    def _state(self, pid: int, stage: str, name: str, at: str, cid: int | None, attrs: dict) -> dict[str, Any]:
        return self._ev("state", stage, pid, name=name, vtype=PARAMETER_VTYPE, at=at, cid=cid, attrs=attrs)

    def _zero_grad(self, pid: int, step: int, rank: int) -> Iterator[dict[str, Any]]:
        api = OPTIMIZER_ZERO_GRAD

        def inner(cid: int) -> Iterator[dict[str, Any]]:
            for name, mtype, req, shape in self.params:
                yield self._state(pid, "train", name, f"pre:{api}", cid, self._attrs(name, mtype, req, shape, step, rank, grad=req and step > 0))
            for name, mtype, req, shape in self.params:
                yield self._state(pid, "train", name, f"post:{api}", cid, self._attrs(name, mtype, req, shape, step, rank, grad=False))

        yield from self._call(pid, "train", api, args={"set_to_none": True}, children=inner)

    def _forward(self, pid: int, stage: str, step: int, rank: int, *, training: bool) -> Iterator[dict[str, Any]]:
        autocast = "torch.bfloat16" if (self.autocast and stage == "train") else None
        ctx = {"grad": stage == "train", "autocast": autocast, "training": training}
        out_dtype = "torch.bfloat16" if autocast else "torch.float32"
        if autocast and self._fault("autocast_lost", step, rank):
            out_dtype = "torch.float32"
        tensor = {"T": "tensor", "shape": [4, 16], "dtype": "torch.float32"}

        def modules(root: int) -> Iterator[dict[str, Any]]:
            for mod, mtype in self.modules:
                flag = training
                if mtype == "Dropout":
                    # the fault: a functional dropout that ignores its module's mode
                    # (``F.dropout(x, p)`` defaults to training=True) stays on in eval
                    active = training or self._fault("dropout_in_eval", step, rank)

                    def drop(cid: int, active: bool = active) -> Iterator[dict[str, Any]]:
                        yield from self._call(pid, stage, "torch.nn.functional.dropout", parent=cid, ctx=ctx,
                                              args={"input": tensor, "p": 0.1, "training": active},
                                              ret=dict(tensor, dtype=out_dtype))
                    yield from self._call(pid, stage, MODULE_FORWARD, parent=root, ctx=ctx,
                                          extra={"module": mod, "mtype": mtype, "training": flag}, children=drop,
                                          args={"input": tensor}, ret=dict(tensor, dtype=out_dtype))
                else:
                    def lin(cid: int) -> Iterator[dict[str, Any]]:
                        yield from self._call(pid, stage, "torch.nn.functional.linear", parent=cid, ctx=ctx,
                                              args={"input": tensor}, ret=dict(tensor, dtype=out_dtype))
                    yield from self._call(pid, stage, MODULE_FORWARD, parent=root, ctx=ctx,
                                          extra={"module": mod, "mtype": mtype, "training": training}, children=lin,
                                          args={"input": tensor}, ret=dict(tensor, dtype=out_dtype))

        yield from self._call(pid, stage, MODULE_FORWARD, ctx=ctx,
                              extra={"module": "", "mtype": "Net", "training": training}, children=modules,
                              args={"input": tensor}, ret={"T": "tensor", "shape": [4, 4], "dtype": out_dtype})

    def _backward(self, pid: int, step: int, rank: int) -> Iterator[dict[str, Any]]:
        def reduces(cid: int) -> Iterator[dict[str, Any]]:
            if self.world > 1:
                numel = 512 + (7 if self._fault("allreduce_shape", step, rank) else 0)
                yield from self._call(pid, "train", "torch.distributed.all_reduce", parent=cid,
                                      args={"tensor": {"T": "tensor", "shape": [numel], "dtype": "torch.float32"}, "op": "SUM"})

        yield from self._call(pid, "train", TENSOR_BACKWARD, children=reduces)

    def _opt_step(self, pid: int, step: int, rank: int) -> Iterator[dict[str, Any]]:
        api = OPTIMIZER_STEP

        def inner(cid: int) -> Iterator[dict[str, Any]]:
            for name, mtype, req, shape in self.params:
                yield self._state(pid, "train", name, f"pre:{api}", cid, self._attrs(name, mtype, req, shape, step, rank, grad=req))
            for name, mtype, req, shape in self.params:
                frozen = (name == "module.fc1.weight" and self._fault("frozen", step, rank)) or self._fault("step_noop", step, rank)
                version = step if frozen else step + 1
                yield self._state(pid, "train", name, f"post:{api}", cid, self._attrs(name, mtype, req, shape, version, rank, grad=req))

        yield from self._call(pid, "train", api, args={"lr": 0.01}, children=inner)

    def _eval(self, pid: int, step: int, rank: int) -> Iterator[dict[str, Any]]:
        yield from self._call(pid, "eval", MODULE_EVAL, extra={"module": "", "mtype": "Net"})
        yield from self._forward(pid, "eval", step, rank, training=False)
        yield from self._call(pid, "eval", MODULE_TRAIN, extra={"module": "", "mtype": "Net"})
