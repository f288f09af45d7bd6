"""What the producer records about parameters and other state: snapshots around the
optimizer, their sampling, odd tensors, tied and sharded parameters, dataset RNGs.

The state-based rules (updates, ties, replicas) are only as good as these snapshots.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import producers
from tests.support.producer_traces import train_steps, trace_batches, trace_events, trace_states


def test_snapshots_see_updates_and_frozen_parameters(tmp_path):
    with producers.instrument(run_id="r-snap", trace_dir=tmp_path):
        model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
        for param in model[0].parameters():
            param.requires_grad_(False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # frozen params included on purpose
        train_steps(model, steps=2, optimizer=optimizer)
    batches = trace_batches(tmp_path)
    pre, post = trace_states(batches, "pre:torch.optim.Optimizer.step"), trace_states(batches, "post:torch.optim.Optimizer.step")
    assert set(pre) == set(post) == {1, 2}
    for step in (1, 2):
        assert set(pre[step]) == {"0.weight", "0.bias", "1.weight", "1.bias"}
        for name in ("1.weight", "1.bias"):
            assert pre[step][name]["data_digest"] != post[step][name]["data_digest"], name
            assert pre[step][name]["grad_digest"] is not None
        for name in ("0.weight", "0.bias"):
            assert pre[step][name]["data_digest"] == post[step][name]["data_digest"], name
            assert pre[step][name]["grad_digest"] is None and pre[step][name]["grad_norm"] is None
            assert pre[step][name]["requires_grad"] is False
    attrs = pre[1]["1.weight"]
    assert attrs["shape"] == [1, 4] and attrs["dtype"] == "float32" and attrs["module"] == "1"
    assert attrs["mtype"] == "Linear" and attrs["numel"] == 4 and attrs["is_leaf"] is True
    assert attrs["data_norm"] == pytest.approx(float(torch.linalg.vector_norm(model[1].weight.detach())), rel=0.5)
    # zero_grad clears grads; the step-end snapshot exists for every step
    cleared = trace_states(batches, "post:torch.optim.Optimizer.zero_grad")
    assert all(a["grad_digest"] is None for a in cleared[2].values())
    assert set(trace_states(batches, "step_end")) == {0, 1, 2}, "setup and every iteration end with a snapshot"
    # the snapshot points at the call it brackets
    step_cids = {e["cid"] for _, e in trace_events(batches) if e.get("api") == "torch.optim.Optimizer.step"}
    assert {e["cid"] for _, e in trace_events(batches) if e["kind"] == "state" and e["at"].endswith("Optimizer.step")} <= step_cids


def test_sampling_every_n_steps(tmp_path):
    with producers.instrument(run_id="r-sample", trace_dir=tmp_path, sample_every=2):
        train_steps(nn.Linear(3, 1), steps=4)
    pre = trace_states(trace_batches(tmp_path), "pre:torch.optim.Optimizer.step")
    assert set(pre) == {2, 4}, "iterations are steps 1..4; every second one is sampled"


def test_odd_parameters_degrade_gracefully(tmp_path):
    from producers.param_snapshots import snapshot_attrs
    from producers.params import ParamEntry

    counter = nn.Parameter(torch.arange(3), requires_grad=False)
    empty = nn.Parameter(torch.zeros(0))
    meta = nn.Parameter(torch.empty(2, 2, device="meta"))
    half = nn.Parameter(torch.randn(3, dtype=torch.float16))
    entries = [ParamEntry(n, p, "m", "M") for n, p in [("counter", counter), ("empty", empty), ("meta", meta), ("half", half)]]
    attrs = dict((e.name, a) for e, a in snapshot_attrs(entries))
    assert attrs["counter"]["data_norm"] is None and attrs["counter"]["data_digest"].startswith("x3:")
    assert attrs["empty"]["data_digest"] is not None and attrs["empty"]["data_norm"] is None
    assert attrs["meta"]["data_digest"] is None and attrs["meta"]["digest_skipped"] == "meta"
    assert attrs["half"]["dtype"] == "float16" and attrs["half"]["data_norm"] > 0


def test_dataset_owned_rngs_are_digested():
    import random

    import numpy as np

    from producers.workers import dataset_rng_digest

    class Augmenting(torch.utils.data.Dataset):
        def __init__(self, seed):
            self.rng = np.random.default_rng(seed)
            self.py = random.Random(seed)
            self.gen = torch.Generator().manual_seed(seed)
            self.size = 4

    a, b, c = Augmenting(1), Augmenting(1), Augmenting(2)
    assert dataset_rng_digest(a) == dataset_rng_digest(b) is not None
    assert dataset_rng_digest(a) != dataset_rng_digest(c)
    a.rng.random()  # drawing advances the state
    assert dataset_rng_digest(a) != dataset_rng_digest(b)
    assert dataset_rng_digest(torch.utils.data.TensorDataset(torch.zeros(2))) is None


def test_tied_parameters_are_snapshotted_under_every_name(tmp_path):
    class TiedLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(5, 3)
            self.head = nn.Linear(3, 5, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, tokens):
            return self.head(self.embed(tokens))

    with producers.instrument(run_id="r-tied", trace_dir=tmp_path):
        model = TiedLM()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            if step == 2:  # the tie is lost (e.g. a resize that copies the head)
                model.head.weight = nn.Parameter(model.embed.weight.detach().clone())
                optimizer.add_param_group({"params": [model.head.weight]})
            optimizer.zero_grad()
            model(torch.tensor([[1, 2]])).sum().backward()
            optimizer.step()
    pre = trace_states(trace_batches(tmp_path), "post:torch.optim.Optimizer.step")
    tied = pre[1]
    assert set(tied) == {"embed.weight", "head.weight"}
    assert tied["head.weight"]["alias_of"] == "embed.weight" and tied["head.weight"]["mtype"] == "Linear"
    assert tied["head.weight"]["data_digest"] == tied["embed.weight"]["data_digest"]
    untied = pre[4]  # names are re-read at the end of the step that saw the new parameter
    assert set(untied) == {"embed.weight", "head.weight"} and "alias_of" not in untied["head.weight"]
    assert untied["head.weight"]["data_digest"] != untied["embed.weight"]["data_digest"]


def test_framework_parallel_attributes_are_captured():
    from producers.param_snapshots import snapshot_attrs
    from producers.params import ParamEntry

    shard = nn.Parameter(torch.ones(4))
    shard.tensor_model_parallel = True
    shard.partition_dim = 0
    shard.unrelated = object()
    ((_, attrs),) = snapshot_attrs([ParamEntry("w", shard, "m", "M")])
    assert attrs["parallel"] == {"tensor_model_parallel": True, "partition_dim": 0}
