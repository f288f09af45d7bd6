"""In-process producer behaviour through the Python API (`producers.instrument`): the wire
contract of the batches and where one step ends and the next begins.

Real (tiny) CPU training in the test process, then the trace file is decoded and its
contents asserted.  Out-of-process launching is covered in test_collect.py.
"""

from __future__ import annotations

import torch
from torch import nn

import producers
from invariants.events import validate_batch
from producers.steps import OptimizerCycle
from tests.support.producer_traces import train_steps, trace_batches, trace_events, trace_states


def test_steps_batches_and_the_wire_contract(tmp_path):
    with producers.instrument(run_id="r-basic", trace_dir=tmp_path):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
        train_steps(model, steps=3)
    batches = trace_batches(tmp_path)
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
    whats = [e["what"] for _, e in trace_events(batches) if e["kind"] == "meta"]
    assert whats[0] == "run_start" and "run_end" in whats and "producer_stats" in whats
    # every optimizer step of step k is in batch k (steps end at the optimizer post hook)
    step_calls = [(s, e["phase"]) for s, e in trace_events(batches) if e.get("api") == "torch.optim.Optimizer.step"]
    assert step_calls == [(1, "pre"), (1, "post"), (2, "pre"), (2, "post"), (3, "pre"), (3, "post")]
    run_end = next(e for _, e in trace_events(batches) if e["kind"] == "meta" and e["what"] == "run_end")
    assert run_end["iterations"] == 3 and run_end["optimizer_steps"] == 3
    assert all(e["stage"] == "init" for s, e in trace_events(batches) if e.get("api") == "torch.nn.init.kaiming_uniform_")


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
    batches = trace_batches(tmp_path)
    assert [b["step"] for b in batches] == [0, 1, 2, 3, 4]
    for batch in batches[1:4]:
        steps = [e["name"] for e in batch["events"] if e.get("api") == "torch.optim.Optimizer.step" and e["phase"] == "pre"]
        assert steps == ["torch.optim.sgd.SGD.step"] * 2, batch["step"]
        assert batch["events"][0]["kind"] == "step" and batch["events"][0]["phase"] == "begin"
    names = set(trace_states(batches, "step_end")[1])
    assert names == {"weight", "bias", "r1.weight", "r1.bias"}, "second root's parameters are prefixed"


def test_long_steps_are_split_into_several_batches(tmp_path, monkeypatch):
    from producers import recorder

    original_init = recorder.StepRecorder.__init__

    def small_batches(self, *args, **kwargs):
        kwargs["max_events_per_batch"] = 16
        original_init(self, *args, **kwargs)

    monkeypatch.setattr(recorder.StepRecorder, "__init__", small_batches)
    with producers.instrument(run_id="r-split", trace_dir=tmp_path):
        train_steps(nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1)), steps=2)
    batches = trace_batches(tmp_path)
    assert [b["seq"] for b in batches] == list(range(len(batches)))
    for step in (0, 1):
        mine = [b for b in batches if b["step"] == step]
        assert len(mine) > 1
        assert all(e["kind"] != "step" or e["phase"] != "end" for b in mine[:-1] for e in b["events"])
        assert mine[-1]["events"][-1]["phase"] == "end"


def test_explicit_stage_annotation_and_checkpoint_stage(tmp_path):
    with producers.instrument(run_id="r-stage", trace_dir=tmp_path) as session:
        model = nn.Linear(3, 1)
        train_steps(model, steps=1)
        with session.stage("validation"):
            model(torch.randn(2, 3))
        torch.save(model.state_dict(), tmp_path / "ckpt.pt")
    events = [e for _, e in trace_events(trace_batches(tmp_path))]
    forwards = [e for e in events if e.get("api") == "torch.nn.Module.forward" and e["phase"] == "pre"]
    assert [f["stage"] for f in forwards] == ["train", "validation"]
    saves = [e for e in events if e.get("api") == "torch.save"]
    assert [s["stage"] for s in saves] == ["checkpoint", "checkpoint"]


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
    gan.step_ended()
    # the generator and its optimizer (3) are built again: 2 never steps again
    assert not gan.before_step(1).end_step and not gan.after_step(1, 2).end_step
    assert not gan.before_step(3).end_step and not gan.after_step(3, 6).end_step
    decision = gan.before_step(1)
    assert decision.end_step and decision.cut_at == 6 and gan.order == [1, 3]
    assert not gan.after_step(1, 2).end_step and gan.after_step(3, 5).end_step
    gan.step_ended()
    # a second optimizer that steps only every other iteration leaves the cycle to the first
    assert not gan.before_step(1).end_step and not gan.after_step(1, 4).end_step
    decision = gan.before_step(1)
    assert decision.end_step and decision.cut_at == 4 and gan.order == [1]


def test_a_loss_module_called_in_validation_does_not_flip_the_stage(tmp_path):
    with producers.instrument(run_id="r-lossroot", trace_dir=tmp_path):
        model, loss_fn = nn.Linear(3, 1), nn.MSELoss()
        train_steps(model, steps=1)
        model.eval()
        with torch.no_grad():
            validation_loss = loss_fn(model(torch.randn(2, 3)), torch.zeros(2, 1))
            validation_loss.item()
            model(torch.randn(2, 3))
    forwards = [e for _, e in trace_events(trace_batches(tmp_path)) if e.get("api") == "torch.nn.Module.forward" and e["phase"] == "pre"]
    after_eval = forwards[-3:]
    assert [(f["mtype"], f["stage"]) for f in after_eval] == [("Linear", "eval"), ("MSELoss", "eval"), ("Linear", "eval")]
    assert all(f["ctx"]["training"] is False for f in after_eval)


def test_switching_optimizers_mid_run_keeps_one_step_per_optimizer_step(tmp_path):
    with producers.instrument(run_id="r-switch", trace_dir=tmp_path):
        model = nn.Linear(3, 1)
        train_steps(model, steps=2, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        train_steps(model, steps=3, optimizer=torch.optim.Adam(model.parameters(), lr=0.1))
    batches = trace_batches(tmp_path)
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


def test_optimizer_steps_say_whether_any_backward_pass_ran_before_them(tmp_path):
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    params = dict(model.named_parameters())

    def loss_of(p, x):
        return torch.func.functional_call(model, p, (x,)).pow(2).mean()

    with producers.instrument(run_id="r-backprop", trace_dir=tmp_path, quiet=True):
        for step in range(4):
            x = torch.randn(4, 3)
            optimizer.zero_grad()
            if step < 2:  # gradients from torch.func, assigned by hand (DP-SGD style)
                grads = torch.func.grad(loss_of)({k: v.detach() for k, v in params.items()}, x)
                for name, p in params.items():
                    p.grad = grads[name]
            else:
                model(x).pow(2).mean().backward()
            optimizer.step()
    steps = [e for _, e in trace_events(trace_batches(tmp_path))
             if e.get("api") == "torch.optim.Optimizer.step" and e["phase"] == "pre"]
    assert [e["backprop"] for e in steps] == [False, False, True, True]
