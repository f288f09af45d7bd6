"""In-process producer behaviour through the Python API (`producers.instrument`).

Real (tiny) CPU training in the test process, then the trace file is decoded and its
contents asserted.  Out-of-process launching is covered in test_collect.py.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from torch import nn

import producers
from invariants.events import validate_batch
from producers.report import read_trace_dir
from producers.selection import SelectionError, load_selection
from producers.steps import OptimizerCycle


def _batches(trace_dir: Path) -> list[dict]:
    files = read_trace_dir(trace_dir)
    assert len(files) == 1, files.keys()
    return next(iter(files.values()))


def _events(batches):
    for batch in batches:
        for event in batch["events"]:
            yield batch["step"], event


def _states(batches, at):
    """step -> name -> attrs of snapshots taken at ``at``."""
    found: dict[int, dict[str, dict]] = defaultdict(dict)
    for step, event in _events(batches):
        if event["kind"] == "state" and event["at"] == at:
            found[step][event["name"]] = event["attrs"]
    return found


def _train(model: nn.Module, steps: int, optimizer=None, lr: float = 0.1) -> None:
    optimizer = optimizer or torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 3)).pow(2).mean().backward()
        optimizer.step()


def test_steps_batches_and_the_wire_contract(tmp_path):
    with producers.instrument(run_id="r-basic", trace_dir=tmp_path):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
        _train(model, steps=3)
    batches = _batches(tmp_path)
    for batch in batches:
        validate_batch(batch)
        assert batch["run"] == "r-basic" and batch["rank"] == 0 and batch["world"] == 1
        ends = [e for e in batch["events"] if e["kind"] == "step" and e["phase"] == "end"]
        assert len(ends) == 1 and batch["events"][-1] is ends[0], "the step end closes the batch"
    assert [b["step"] for b in batches] == [0, 1, 2, 3, 4]
    assert [b["seq"] for b in batches] == [0, 1, 2, 3, 4]
    ends = [b["events"][-1] for b in batches]
    assert ends[0].get("setup") is True and "trained" not in ends[0], "step 0 is the setup window"
    assert all(e.get("trained") is True and e["boundary"] == "optimizer" for e in ends[1:4])
    assert ends[-1].get("final") is True and "trained" not in ends[-1], "the tail after the last optimizer step"
    whats = [e["what"] for _, e in _events(batches) if e["kind"] == "meta"]
    assert whats[0] == "run_start" and "run_end" in whats and "producer_stats" in whats
    # every optimizer step of step k is in batch k (steps end at the optimizer post hook)
    step_calls = [(s, e["phase"]) for s, e in _events(batches) if e.get("api") == "torch.optim.Optimizer.step"]
    assert step_calls == [(1, "pre"), (1, "post"), (2, "pre"), (2, "post"), (3, "pre"), (3, "post")]
    run_end = next(e for _, e in _events(batches) if e["kind"] == "meta" and e["what"] == "run_end")
    assert run_end["iterations"] == 3 and run_end["optimizer_steps"] == 3
    assert all(e["stage"] == "init" for s, e in _events(batches) if e.get("api") == "torch.nn.init.kaiming_uniform_")


def test_call_events_name_family_args_and_parent_links(tmp_path):
    with producers.instrument(run_id="r-calls", trace_dir=tmp_path):
        model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        _train(model, steps=1, optimizer=optimizer)
        model.eval()
        with torch.no_grad():
            model(torch.randn(2, 3))
    events = [e for _, e in _events(_batches(tmp_path)) if e["kind"] == "call"]
    by_api = defaultdict(list)
    for event in events:
        by_api[event.get("api")].append(event)
    step_pre = by_api["torch.optim.Optimizer.step"][0]
    assert step_pre["name"] == "torch.optim.adam.Adam.step"
    assert step_pre["args"]["self"] == {"T": "optimizer", "type": "Adam", "groups": 1, "lr": [0.001]}
    backward = by_api["torch.Tensor.backward"][0]
    assert backward["args"]["self"]["T"] == "tensor" and isinstance(backward["args"]["self"]["value"], float)
    # module forward events carry the module path, class and training flag
    forwards = [e for e in by_api["torch.nn.Module.forward"] if e["phase"] == "pre"]
    assert {(e["module"], e["mtype"]) for e in forwards} == {("", "Sequential"), ("0", "Linear"), ("1", "Dropout")}
    root_cids = {e["cid"] for e in forwards if e["module"] == ""}
    assert all(e["parent"] in root_cids for e in forwards if e["module"] != "")
    # dropout in the eval pass: the functional call is recorded with training=False, in stage eval
    dropouts = [e for e in by_api["torch.nn.functional.dropout"] if e["phase"] == "pre"]
    assert [d["args"]["training"] for d in dropouts] == [True, False]
    assert dropouts[-1]["stage"] == "eval" and dropouts[-1]["ctx"] == {"grad": False, "autocast": None, "training": False}
    # eval() is recorded once (its nested train(False) calls are not)
    assert len([e for e in by_api["torch.nn.Module.eval"] if e["phase"] == "pre"]) == 1
    assert [e for e in by_api["torch.nn.Module.train"] if e["phase"] == "pre"] == []
    # every pre has a matching post with the same cid
    pres = {e["cid"] for e in events if e["phase"] == "pre"}
    posts = {e["cid"] for e in events if e["phase"] == "post"}
    assert pres == posts


def test_snapshots_see_updates_and_frozen_parameters(tmp_path):
    with producers.instrument(run_id="r-snap", trace_dir=tmp_path):
        model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
        for param in model[0].parameters():
            param.requires_grad_(False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # frozen params included on purpose
        _train(model, steps=2, optimizer=optimizer)
    batches = _batches(tmp_path)
    pre, post = _states(batches, "pre:torch.optim.Optimizer.step"), _states(batches, "post:torch.optim.Optimizer.step")
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
    cleared = _states(batches, "post:torch.optim.Optimizer.zero_grad")
    assert all(a["grad_digest"] is None for a in cleared[2].values())
    assert set(_states(batches, "step_end")) == {0, 1, 2}, "setup and every iteration end with a snapshot"
    # the snapshot points at the call it brackets
    step_cids = {e["cid"] for _, e in _events(batches) if e.get("api") == "torch.optim.Optimizer.step"}
    assert {e["cid"] for _, e in _events(batches) if e["kind"] == "state" and e["at"].endswith("Optimizer.step")} <= step_cids


def test_sampling_every_n_steps(tmp_path):
    with producers.instrument(run_id="r-sample", trace_dir=tmp_path, sample_every=2):
        _train(nn.Linear(3, 1), steps=4)
    pre = _states(_batches(tmp_path), "pre:torch.optim.Optimizer.step")
    assert set(pre) == {2, 4}, "iterations are steps 1..4; every second one is sampled"


def test_two_optimizers_per_iteration_end_one_step_per_iteration(tmp_path):
    with producers.instrument(run_id="r-gan", trace_dir=tmp_path):
        generator, critic = nn.Linear(2, 3), nn.Linear(3, 1)
        opt_g = torch.optim.SGD(generator.parameters(), lr=0.1)
        opt_c = torch.optim.SGD(critic.parameters(), lr=0.1)
        for _ in range(3):
            opt_c.zero_grad()
            critic(generator(torch.randn(4, 2)).detach()).mean().backward()
            opt_c.step()
            opt_g.zero_grad()
            critic(generator(torch.randn(4, 2))).mean().backward()
            opt_g.step()
    batches = _batches(tmp_path)
    assert [b["step"] for b in batches] == [0, 1, 2, 3, 4]
    for batch in batches[1:4]:
        steps = [e["name"] for e in batch["events"] if e.get("api") == "torch.optim.Optimizer.step" and e["phase"] == "pre"]
        assert steps == ["torch.optim.sgd.SGD.step"] * 2, batch["step"]
        assert batch["events"][0]["kind"] == "step" and batch["events"][0]["phase"] == "begin"
    names = set(_states(batches, "step_end")[1])
    assert names == {"weight", "bias", "r1.weight", "r1.bias"}, "second root's parameters are prefixed"


def test_long_steps_are_split_into_several_batches(tmp_path, monkeypatch):
    from producers import recorder

    original_init = recorder.StepRecorder.__init__

    def small_batches(self, *args, **kwargs):
        kwargs["max_events_per_batch"] = 16
        original_init(self, *args, **kwargs)

    monkeypatch.setattr(recorder.StepRecorder, "__init__", small_batches)
    with producers.instrument(run_id="r-split", trace_dir=tmp_path):
        _train(nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1)), steps=2)
    batches = _batches(tmp_path)
    assert [b["seq"] for b in batches] == list(range(len(batches)))
    for step in (0, 1):
        mine = [b for b in batches if b["step"] == step]
        assert len(mine) > 1
        assert all(e["kind"] != "step" or e["phase"] != "end" for b in mine[:-1] for e in b["events"])
        assert mine[-1]["events"][-1]["phase"] == "end"


def test_explicit_stage_annotation_and_checkpoint_stage(tmp_path):
    with producers.instrument(run_id="r-stage", trace_dir=tmp_path) as session:
        model = nn.Linear(3, 1)
        _train(model, steps=1)
        with session.stage("validation"):
            model(torch.randn(2, 3))
        torch.save(model.state_dict(), tmp_path / "ckpt.pt")
    events = [e for _, e in _events(_batches(tmp_path))]
    forwards = [e for e in events if e.get("api") == "torch.nn.Module.forward" and e["phase"] == "pre"]
    assert [f["stage"] for f in forwards] == ["train", "validation"]
    saves = [e for e in events if e.get("api") == "torch.save"]
    assert [s["stage"] for s in saves] == ["checkpoint", "checkpoint"]


def test_close_removes_every_hook_and_wrapper(tmp_path):
    from torch.nn.modules import module as module_mod
    from torch.optim import optimizer as optimizer_mod

    before = {
        "zero_grad": torch.optim.Optimizer.__dict__["zero_grad"],
        "train": nn.Module.train,
        "backward": torch.Tensor.backward,
        "dropout": torch.nn.functional.dropout,
        "save": torch.save,
        "pre_hooks": len(optimizer_mod._global_optimizer_pre_hooks),
        "fwd_hooks": len(module_mod._global_forward_hooks),
    }
    with producers.instrument(run_id="r-remove", trace_dir=tmp_path):
        assert torch.Tensor.backward is not before["backward"]
    after = {
        "zero_grad": torch.optim.Optimizer.__dict__["zero_grad"],
        "train": nn.Module.train,
        "backward": torch.Tensor.backward,
        "dropout": torch.nn.functional.dropout,
        "save": torch.save,
        "pre_hooks": len(optimizer_mod._global_optimizer_pre_hooks),
        "fwd_hooks": len(module_mod._global_forward_hooks),
    }
    assert after == before
    assert list(tmp_path.iterdir()) == [], "a session that saw no training writes nothing"


def test_internal_errors_never_reach_the_training_loop(tmp_path, capsys, monkeypatch):
    from producers import tracer

    def broken(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(tracer.Tracer, "_ctx", broken)
    with producers.instrument(run_id="r-broken", trace_dir=tmp_path) as session:
        _train(nn.Linear(3, 1), steps=3)
        assert session.tracer.internal_errors > 0
    err = capsys.readouterr().err
    assert err.count("internal error in recording torch.optim.Optimizer.zero_grad") == 1
    batches = _batches(tmp_path)
    assert max(b["step"] for b in batches) == 4


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


def test_optimizer_cycle_state_machine():
    single = OptimizerCycle()
    assert not single.before_step(1).end_step
    assert not single.after_step(1, buffer_position=10).end_step
    decision = single.before_step(1)
    assert decision.end_step and decision.cut_at == 10 and single.learnt
    assert single.after_step(1, 20).end_step
    gan = OptimizerCycle()
    gan.before_step(1), gan.after_step(1, 5), gan.before_step(2), gan.after_step(2, 9)
    decision = gan.before_step(1)
    assert decision.end_step and decision.cut_at == 9 and gan.order == [1, 2]
    assert not gan.after_step(1, 3).end_step and gan.after_step(2, 7).end_step


def test_selection_files(tmp_path):
    listing = tmp_path / "apis.txt"
    listing.write_text("# wanted\ntorch.nn.Module.eval\n\ntorch.save  # checkpoints\n")
    selection = load_selection(listing)
    assert selection.apis == {"torch.nn.Module.eval", "torch.save", "torch.optim.Optimizer.step"}
    from invariants.invariant_file import default_text, load_default_set
    from invariants.selection import needed_apis

    invariants = tmp_path / "inv.json"
    invariants.write_text(default_text())
    assert load_selection(invariants).apis == needed_apis(load_default_set()) | {"torch.optim.Optimizer.step"}
    not_invariants = tmp_path / "other.json"
    not_invariants.write_text(json.dumps({"invariants": [{"relation": "X"}]}))
    with pytest.raises(SelectionError, match="other.json"):
        load_selection(not_invariants)
    for bad, message in [("{not json", "not valid JSON"), ("# only a comment\n", "names no API")]:
        path = tmp_path / "bad"
        path.write_text(bad)
        with pytest.raises(SelectionError, match=message):
            load_selection(path)
    with pytest.raises(SelectionError, match="cannot read"):
        load_selection(tmp_path / "missing.txt")


def test_selected_torch_function_without_wrapper_uses_function_mode(tmp_path):
    selection = ["torch.matmul", "torch.optim.Optimizer.step"]
    with producers.instrument(run_id="r-mode", trace_dir=tmp_path, selection=selection):
        model = nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.matmul(torch.ones(2, 2), torch.ones(2, 2))
        torch.add(torch.ones(1), 1)  # not selected: not recorded
        model(torch.randn(1, 2)).sum().backward()
        optimizer.step()
    apis = {e.get("api") for _, e in _events(_batches(tmp_path)) if e["kind"] == "call"}
    assert apis == {"torch.matmul", "torch.optim.Optimizer.step"}


def test_invariants_file_limits_snapshots_to_the_points_they_read(tmp_path):
    from invariants.invariant_file import default_text

    invariants = tmp_path / "inv.json"
    invariants.write_text(default_text())
    selection = load_selection(invariants)
    assert selection.state_points is not None and "pre:torch.optim.Optimizer.step" in selection.state_points
    traces = tmp_path / "t"
    with producers.instrument(run_id="r-points", trace_dir=traces, selection=invariants):
        _train(nn.Linear(3, 1), steps=2)
    points = {e["at"] for _, e in _events(_batches(traces)) if e["kind"] == "state"}
    assert points == set(selection.state_points)
    apis = {e.get("api") for _, e in _events(_batches(traces)) if e["kind"] == "call"}
    assert apis <= selection.apis and "torch.nn.Module.forward" in apis


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
    batches = _batches(tmp_path)
    assert [b["step"] for b in batches] == [0, 1, 2, 3, 4]
    pre = _states(batches, "pre:torch.optim.Optimizer.step")
    assert all(len(pre[step]) == 4 for step in range(1, 4)), "eager optimizer steps are still snapshotted"


def test_full_mode_records_every_torch_function(tmp_path):
    from producers.selection import default_selection

    with producers.instrument(run_id="r-full", trace_dir=tmp_path, selection=default_selection(full=True)):
        model = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 3)).relu().sum().backward()
        optimizer.step()
    apis = {e.get("api") for _, e in _events(_batches(tmp_path)) if e["kind"] == "call"}
    assert {"torch.Tensor.relu", "torch.Tensor.sum", "torch.nn.functional.linear"} <= apis
    assert "torch.optim.Optimizer.step" in apis
    assert not any(a and a.startswith("torch._foreach") for a in apis), "the producer's own snapshot ops are not recorded"


def test_unwritable_trace_dir_counts_drops_and_training_goes_on(tmp_path, capsys):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with producers.instrument(run_id="r-nowrite", trace_dir=blocker / "traces") as session:
        _train(nn.Linear(3, 1), steps=2)
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


def test_a_loss_module_called_in_validation_does_not_flip_the_stage(tmp_path):
    with producers.instrument(run_id="r-lossroot", trace_dir=tmp_path):
        model, loss_fn = nn.Linear(3, 1), nn.MSELoss()
        _train(model, steps=1)
        model.eval()
        with torch.no_grad():
            validation_loss = loss_fn(model(torch.randn(2, 3)), torch.zeros(2, 1))
            validation_loss.item()
            model(torch.randn(2, 3))
    forwards = [e for _, e in _events(_batches(tmp_path)) if e.get("api") == "torch.nn.Module.forward" and e["phase"] == "pre"]
    after_eval = forwards[-3:]
    assert [(f["mtype"], f["stage"]) for f in after_eval] == [("Linear", "eval"), ("MSELoss", "eval"), ("Linear", "eval")]
    assert all(f["ctx"]["training"] is False for f in after_eval)


def test_autocast_regions_are_visible_in_args_and_context(tmp_path):
    with producers.instrument(run_id="r-amp", trace_dir=tmp_path):
        model = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(2, 3)).float().sum()
        loss.backward()
        optimizer.step()
    events = [e for _, e in _events(_batches(tmp_path)) if e["kind"] == "call" and e["phase"] == "pre"]
    enter = next(e for e in events if e.get("api") == "torch.autocast.__enter__")
    assert enter["args"]["device_type"] == "cpu" and enter["args"]["dtype"] == "bfloat16" and enter["args"]["enabled"]
    forward = next(e for e in events if e.get("api") == "torch.nn.Module.forward")
    assert forward["ctx"]["autocast"] == "bfloat16"
    backward = next(e for e in events if e.get("api") == "torch.Tensor.backward")
    assert backward["ctx"]["autocast"] is None


def test_exceptions_are_recorded_and_reraised_unchanged(tmp_path):
    with producers.instrument(run_id="r-exc", trace_dir=tmp_path / "t") as outer:
        with producers.instrument(run_id="ignored") as inner:
            assert inner is outer, "a second instrument() joins the active session"
        _train(nn.Linear(3, 1), steps=1)
        with pytest.raises(RuntimeError) as caught:
            torch.save({"w": 1}, tmp_path / "missing-dir" / "ckpt.pt")
    assert "missing-dir" in str(caught.value)
    saves = [e for _, e in _events(_batches(tmp_path / "t")) if e.get("api") == "torch.save"]
    assert [s["phase"] for s in saves] == ["pre", "exc"]
    assert saves[1]["exc"] == "RuntimeError" and "missing-dir" in saves[1]["msg"] and saves[1]["stage"] == "checkpoint"
    after = [e for _, e in _events(_batches(tmp_path / "t")) if e["kind"] == "meta" and e["what"] == "run_end"]
    assert after and after[0]["stage"] == "train", "the checkpoint stage ends with the failed call"


def test_module_zero_grad_is_its_own_family(tmp_path):
    with producers.instrument(run_id="r-mzg", trace_dir=tmp_path):
        model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.zero_grad()
        model(torch.randn(2, 3)).sum().backward()
        optimizer.step()
    calls = [e for _, e in _events(_batches(tmp_path)) if e["kind"] == "call" and e["phase"] == "pre"]
    zero = [e for e in calls if e["api"] == "torch.nn.Module.zero_grad"]
    assert len(zero) == 1 and zero[0]["name"] == "torch.nn.modules.container.Sequential.zero_grad"
    assert zero[0]["mtype"] == "Sequential"


def test_switching_optimizers_mid_run_keeps_one_step_per_optimizer_step(tmp_path):
    with producers.instrument(run_id="r-switch", trace_dir=tmp_path):
        model = nn.Linear(3, 1)
        _train(model, steps=2, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        _train(model, steps=3, optimizer=torch.optim.Adam(model.parameters(), lr=0.1))
    batches = _batches(tmp_path)
    assert [b["step"] for b in batches] == [0, 1, 2, 3, 4, 5, 6]
    names = [
        [e["name"].rsplit(".", 2)[-2] for e in b["events"] if e.get("api") == "torch.optim.Optimizer.step" and e["phase"] == "pre"]
        for b in batches
    ]
    assert names == [[], ["SGD"], ["SGD"], ["Adam"], ["Adam"], ["Adam"], []]


def test_an_auxiliary_optimizer_next_to_the_cycle_does_not_split_steps():
    cycle = OptimizerCycle()
    for position, (opt, aux) in enumerate([(1, False), (1, True), (1, False), (1, True)]):
        cycle.before_step(1)
        decision = cycle.after_step(1, position * 10)
        if cycle.learnt:
            assert decision.end_step
            cycle.step_ended()
        if aux:
            assert not cycle.before_step(9).end_step
            assert not cycle.after_step(9, position * 10 + 5).end_step
    assert cycle.order == [1]


def test_enum_arguments_carry_their_member_name():
    import torch.distributed as dist

    from producers.summaries import summarize

    assert summarize(dist.ReduceOp.MAX) == {"T": "obj", "type": "ReduceOp.RedOpType", "value": "MAX"}
    assert summarize(dist.ReduceOp.SUM)["value"] == "SUM"


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
    pre = _states(_batches(tmp_path), "post:torch.optim.Optimizer.step")
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


def test_module_keyword_arguments_arrive_with_the_post_event(tmp_path):
    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(2, 2)

        def forward(self, prompt, max_new_tokens=4, temperature=1.0):
            return self.proj(prompt)[:, :max_new_tokens]

    with producers.instrument(run_id="r-kwargs", trace_dir=tmp_path):
        model = Generator()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(1, 2), max_new_tokens=1).sum().backward()
        optimizer.step()
    posts = [e for _, e in _events(_batches(tmp_path)) if e.get("mtype") == "Generator" and e["phase"] == "post"]
    assert posts[0]["kwargs"] == {"max_new_tokens": 1}
    inner = [e for _, e in _events(_batches(tmp_path)) if e.get("mtype") == "Linear" and e["phase"] == "post"]
    assert "kwargs" not in inner[0]


def test_a_mode_flag_left_to_its_default_is_recorded_as_the_mode_the_call_ran_in(tmp_path):
    """``F.dropout(x, p)`` drops even in evaluation (``training`` defaults to True): the
    call must say so, or a head that forgets ``training=self.training`` looks unknown."""
    with producers.instrument(run_id="r-flag", trace_dir=tmp_path):
        x = torch.randn(4, 3)
        torch.nn.functional.dropout(x, 0.5)
        torch.nn.functional.dropout(x, 0.5, False)
        torch.nn.functional.dropout(x, p=0.5, training=False)
    calls = [e for _, e in _events(_batches(tmp_path))
             if e["kind"] == "call" and e["phase"] == "pre" and e["api"] == "torch.nn.functional.dropout"]
    assert [c["args"]["training"] for c in calls] == [True, False, False]
    assert all("inplace" not in c["args"] for c in calls)  # other defaults are configuration, not recorded
