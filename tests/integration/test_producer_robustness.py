"""The producer must never change or break the training it watches: it removes every
hook and wrapper on close, keeps its own errors and sink failures out of the loop, steps
aside from compiled regions and from patches layered over its own, and takes its broker
credentials from the environment rather than from the training script.
"""

from __future__ import annotations

import torch
from torch import nn

import producers
from tests.support.producer_traces import train_steps, trace_batches, trace_states


def test_close_removes_every_hook_and_wrapper(tmp_path):
    from torch.nn.modules import module as module_mod
    from torch.optim import optimizer as optimizer_mod

    def installed() -> dict:
        return {
            "zero_grad": torch.optim.Optimizer.__dict__["zero_grad"],
            "train": nn.Module.train,
            "backward": torch.Tensor.backward,
            "dropout": torch.nn.functional.dropout,
            "save": torch.save,
            "pre_hooks": len(optimizer_mod._global_optimizer_pre_hooks),
            "fwd_hooks": len(module_mod._global_forward_hooks),
        }

    before = installed()
    with producers.instrument(run_id="r-remove", trace_dir=tmp_path):
        assert torch.Tensor.backward is not before["backward"]
    assert installed() == before
    assert list(tmp_path.iterdir()) == [], "a session that saw no training writes nothing"


def test_internal_errors_never_reach_the_training_loop(tmp_path, capsys, monkeypatch):
    from producers import tracer

    def broken(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(tracer.Tracer, "_ctx", broken)
    with producers.instrument(run_id="r-broken", trace_dir=tmp_path) as session:
        train_steps(nn.Linear(3, 1), steps=3)
        assert session.tracer.internal_errors > 0
    err = capsys.readouterr().err
    assert err.count("internal error in recording torch.optim.Optimizer.zero_grad") == 1
    batches = trace_batches(tmp_path)
    assert max(b["step"] for b in batches) == 4


def test_torch_compiled_modules_are_skipped_gracefully(tmp_path, capsys):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that global hooks fire for the wrapper too
        with producers.instrument(run_id="r-compile", trace_dir=tmp_path) as session:
            model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
            compiled = torch.compile(model, backend="eager")
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                optimizer.zero_grad()
                compiled(torch.randn(2, 3)).sum().backward()
                optimizer.step()
            assert session.tracer.internal_errors == 0
    assert capsys.readouterr().err.count("torch.compile'd regions nothing is recorded") == 1
    batches = trace_batches(tmp_path)
    assert [b["step"] for b in batches] == [0, 1, 2, 3, 4]
    pre = trace_states(batches, "pre:torch.optim.Optimizer.step")
    assert all(len(pre[step]) == 4 for step in range(1, 4)), "eager optimizer steps are still snapshotted"


def test_unwritable_trace_dir_counts_drops_and_training_goes_on(tmp_path, capsys):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with producers.instrument(run_id="r-nowrite", trace_dir=blocker / "traces") as session:
        train_steps(nn.Linear(3, 1), steps=2)
    stats = session.stats()
    assert stats["sinks"]["file"]["dropped_batches"] == 4 and stats["sinks"]["file"]["sent_batches"] == 0
    assert "trace FAILED" in capsys.readouterr().err


def test_patch_handles_restore_or_step_aside():
    import types

    from producers.patching import patch_attribute

    Owner = types.SimpleNamespace(f=lambda x: x + 1)  # a module-like owner

    calls = []

    def make(original):
        def wrapper(x):
            calls.append(x)
            return original(x)

        return wrapper

    handle = patch_attribute(Owner, "f", make)
    assert Owner.f(1) == 2 and calls == [1]
    handle.remove()
    assert Owner.__dict__["f"] is handle.original and Owner.f(2) == 3 and calls == [1]
    # somebody wraps on top of ours: removing ours must not drop theirs
    handle = patch_attribute(Owner, "f", make)
    ours = Owner.f
    Owner.f = lambda x: ours(x) * 10
    handle.remove()
    assert Owner.f(1) == 20 and calls == [1], "our layer became a pass-through"


def test_kafka_security_settings_come_from_the_environment():
    from producers.sinks import kafka_settings_from_env

    env = {
        "TRAINWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "TRAINWATCH_KAFKA_SASL_MECHANISM": "PLAIN",
        "TRAINWATCH_KAFKA_SASL_USERNAME": "u",
        "TRAINWATCH_KAFKA_SASL_PASSWORD": "p",
        "TRAINWATCH_KAFKA_SSL_CAFILE": "/ca.pem",
        "TRAINWATCH_KAFKA_OTHER": "ignored",
    }
    assert kafka_settings_from_env(env) == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "u",
        "sasl_plain_password": "p",
        "ssl_cafile": "/ca.pem",
    }
    assert kafka_settings_from_env({}) == {}


def test_torch_func_calls_neither_lose_the_trace_nor_index_swapped_tensors(tmp_path, capsys):
    """``functional_call`` under ``vmap(grad(...))`` runs the model on wrappers that have
    no storage; the model's own parameters are indexed at the first forward that runs on
    them, and the session ends with its trace written and no internal error."""
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    params = {name: param.detach() for name, param in model.named_parameters()}

    def loss_of(weights, x, y):
        return ((functional_call(model, weights, (x.unsqueeze(0),)) - y) ** 2).mean()

    per_sample = vmap(grad(loss_of), in_dims=(None, 0, 0))
    with producers.instrument(run_id="r-func", trace_dir=tmp_path, quiet=True) as session:
        for _ in range(3):
            grads = per_sample(params, torch.randn(5, 4), torch.randn(5, 1))
            with torch.no_grad():
                for name, tensor in params.items():
                    tensor.sub_(0.1 * grads[name].mean(0))
        model(torch.randn(2, 4))
        names = {entry.name for entry in session.tracer.registry.all_entries()}
        errors = session.tracer.internal_errors
    assert errors == 0, capsys.readouterr().err
    assert names == {name for name, _ in model.named_parameters()}
    assert trace_batches(tmp_path)


def test_a_failing_final_snapshot_still_writes_the_last_window(tmp_path, capsys, monkeypatch):
    """A run that never stepped an optimizer is one open window until the session ends;
    an error in its final snapshot is counted, and the window goes out without it."""
    model = nn.Linear(4, 1)
    with producers.instrument(run_id="r-tail", trace_dir=tmp_path, quiet=True) as session:
        monkeypatch.setattr(type(session.tracer), "_end_states", lambda self, *a, **k: 1 / 0)
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
    kinds = [event["kind"] for batch in trace_batches(tmp_path) for event in batch["events"]]
    assert "call" in kinds and "meta" in kinds
    assert "final snapshot" in capsys.readouterr().err
