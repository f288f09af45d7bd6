"""What the producer records about calls: names, families, arguments, context and
exceptions, and which calls a selection file lets through.

Real (tiny) CPU training in the test process, then the trace file is decoded and its
contents asserted.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
import torch
from torch import nn

import producers
from producers.selection import SelectionError, load_selection
from tests.support.producer_traces import train_steps, trace_batches, trace_events


def test_call_events_name_family_args_and_parent_links(tmp_path):
    with producers.instrument(run_id="r-calls", trace_dir=tmp_path):
        model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        train_steps(model, steps=1, optimizer=optimizer)
        model.eval()
        with torch.no_grad():
            model(torch.randn(2, 3))
    events = [e for _, e in trace_events(trace_batches(tmp_path)) if e["kind"] == "call"]
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
    apis = {e.get("api") for _, e in trace_events(trace_batches(tmp_path)) if e["kind"] == "call"}
    assert apis == {"torch.matmul", "torch.optim.Optimizer.step"}


def test_invariants_file_limits_snapshots_to_the_points_they_read(tmp_path):
    from invariants.invariant_file import default_text

    invariants = tmp_path / "inv.json"
    invariants.write_text(default_text())
    selection = load_selection(invariants)
    assert selection.state_points is not None and "pre:torch.optim.Optimizer.step" in selection.state_points
    traces = tmp_path / "t"
    with producers.instrument(run_id="r-points", trace_dir=traces, selection=invariants):
        train_steps(nn.Linear(3, 1), steps=2)
    points = {e["at"] for _, e in trace_events(trace_batches(traces)) if e["kind"] == "state"}
    assert points == set(selection.state_points)
    apis = {e.get("api") for _, e in trace_events(trace_batches(traces)) if e["kind"] == "call"}
    assert apis <= selection.apis and "torch.nn.Module.forward" in apis


def test_full_mode_records_every_torch_function(tmp_path):
    from producers.selection import default_selection

    with producers.instrument(run_id="r-full", trace_dir=tmp_path, selection=default_selection(full=True)):
        model = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 3)).relu().sum().backward()
        optimizer.step()
    apis = {e.get("api") for _, e in trace_events(trace_batches(tmp_path)) if e["kind"] == "call"}
    assert {"torch.Tensor.relu", "torch.Tensor.sum", "torch.nn.functional.linear"} <= apis
    assert "torch.optim.Optimizer.step" in apis
    assert not any(a and a.startswith("torch._foreach") for a in apis), "the producer's own snapshot ops are not recorded"


def test_autocast_regions_are_visible_in_args_and_context(tmp_path):
    with producers.instrument(run_id="r-amp", trace_dir=tmp_path):
        model = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(2, 3)).float().sum()
        loss.backward()
        optimizer.step()
    events = [e for _, e in trace_events(trace_batches(tmp_path)) if e["kind"] == "call" and e["phase"] == "pre"]
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
        train_steps(nn.Linear(3, 1), steps=1)
        with pytest.raises(RuntimeError) as caught:
            torch.save({"w": 1}, tmp_path / "missing-dir" / "ckpt.pt")
    assert "missing-dir" in str(caught.value)
    saves = [e for _, e in trace_events(trace_batches(tmp_path / "t")) if e.get("api") == "torch.save"]
    assert [s["phase"] for s in saves] == ["pre", "exc"]
    assert saves[1]["exc"] == "RuntimeError" and "missing-dir" in saves[1]["msg"] and saves[1]["stage"] == "checkpoint"
    after = [e for _, e in trace_events(trace_batches(tmp_path / "t")) if e["kind"] == "meta" and e["what"] == "run_end"]
    assert after and after[0]["stage"] == "train", "the checkpoint stage ends with the failed call"


def test_module_zero_grad_is_its_own_family(tmp_path):
    with producers.instrument(run_id="r-mzg", trace_dir=tmp_path):
        model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.zero_grad()
        model(torch.randn(2, 3)).sum().backward()
        optimizer.step()
    calls = [e for _, e in trace_events(trace_batches(tmp_path)) if e["kind"] == "call" and e["phase"] == "pre"]
    zero = [e for e in calls if e["api"] == "torch.nn.Module.zero_grad"]
    assert len(zero) == 1 and zero[0]["name"] == "torch.nn.modules.container.Sequential.zero_grad"
    assert zero[0]["mtype"] == "Sequential"


def test_module_zero_grad_clears_an_optimizer_whose_other_parameters_hold_no_gradient(tmp_path):
    """``model.zero_grad()`` clears an optimizer that also holds a loss-weighting module's
    parameters while they have no gradient, and a second module's clear completes one that
    a first module's clear began; it stops clearing once those parameters take gradients."""
    with producers.instrument(run_id="r-mzg-partial", trace_dir=tmp_path):
        encoder, decoder = nn.Linear(3, 2), nn.Linear(2, 1)
        task_weights = nn.Parameter(torch.ones(2))
        optimizer = torch.optim.SGD([*encoder.parameters(), *decoder.parameters(), task_weights], lr=0.1)
        for weighted in (False, True):
            for module in (encoder, decoder):
                module.zero_grad()
            loss = decoder(encoder(torch.randn(2, 3))).sum()
            (loss * task_weights.sum() if weighted else loss).backward()
            optimizer.step()
        encoder.zero_grad(), decoder.zero_grad()  # task_weights now hold a gradient
    clears = [e["clears"] for _, e in trace_events(trace_batches(tmp_path))
              if e["kind"] == "call" and e["phase"] == "pre" and e["api"] == "torch.nn.Module.zero_grad"]
    # before any backward nothing holds a gradient: each clear leaves opt0 empty
    assert clears == [["opt0"], ["opt0"], [], ["opt0"], [], []]


def test_enum_arguments_carry_their_member_name():
    import torch.distributed as dist

    from producers.summaries import summarize

    assert summarize(dist.ReduceOp.MAX) == {"T": "obj", "type": "ReduceOp.RedOpType", "value": "MAX"}
    assert summarize(dist.ReduceOp.SUM)["value"] == "SUM"


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
    posts = [e for _, e in trace_events(trace_batches(tmp_path)) if e.get("mtype") == "Generator" and e["phase"] == "post"]
    assert posts[0]["kwargs"] == {"max_new_tokens": 1}
    inner = [e for _, e in trace_events(trace_batches(tmp_path)) if e.get("mtype") == "Linear" and e["phase"] == "post"]
    assert "kwargs" not in inner[0]


def test_a_mode_flag_left_to_its_default_is_recorded_as_the_mode_the_call_ran_in(tmp_path):
    """``F.dropout(x, p)`` drops even in evaluation (``training`` defaults to True): the
    call must say so, or a head that forgets ``training=self.training`` looks unknown."""
    with producers.instrument(run_id="r-flag", trace_dir=tmp_path):
        x = torch.randn(4, 3)
        torch.nn.functional.dropout(x, 0.5)
        torch.nn.functional.dropout(x, 0.5, False)
        torch.nn.functional.dropout(x, p=0.5, training=False)
    calls = [e for _, e in trace_events(trace_batches(tmp_path))
             if e["kind"] == "call" and e["phase"] == "pre" and e["api"] == "torch.nn.functional.dropout"]
    assert [c["args"]["training"] for c in calls] == [True, False, False]
    assert all("inplace" not in c["args"] for c in calls)  # other defaults are configuration, not recorded
