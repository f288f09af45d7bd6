"""The run model on real (tiny, CPU) training loops written the many ways people write them.

Step 0 is the setup window; iterations are steps 1..N whether an optimizer steps or
not; closures run before their step; receivers and parameter overwrites are named.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from torch import nn

import producers
from producers.report import read_trace_dir

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _batches(trace_dir):
    (batches,) = read_trace_dir(trace_dir).values()
    return batches


def _ends(batches):
    return [b["events"][-1] for b in batches]


def _calls(batches, api, phase="pre"):
    return [(b["step"], e) for b in batches for e in b["events"]
            if e["kind"] == "call" and e["api"] == api and e["phase"] == phase]


def _run_end(batches):
    return next(e for b in batches for e in b["events"] if e["kind"] == "meta" and e["what"] == "run_end")


def _states(batches, at):
    found: dict[int, dict[str, dict]] = defaultdict(dict)
    for b in batches:
        for e in b["events"]:
            if e["kind"] == "state" and e["at"] == at:
                found[b["step"]][e["name"]] = e["attrs"]
    return found


def test_hand_written_sgd_loop_has_iterations_and_checked_updates(tmp_path):
    with producers.instrument(run_id="sgd", trace_dir=tmp_path):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
        x, y = torch.randn(8, 3), torch.randn(8, 1)
        for _ in range(3):
            model.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(-0.1 * p.grad)
    batches = _batches(tmp_path)
    ends = _ends(batches)
    assert [b["step"] for b in batches] == [0, 1, 2, 3]
    assert ends[0].get("setup") is True
    assert [(e.get("trained"), e.get("boundary")) for e in ends[1:]] == [(True, "loop")] * 2 + [(True, "close")]
    assert ends[-1].get("final") is True
    assert (_run_end(batches)["iterations"], _run_end(batches)["optimizer_steps"]) == (3, 0)
    # the initialisers ran at build: they are in the setup window, not in an iteration
    assert {s for s, _ in _calls(batches, "torch.nn.init.kaiming_uniform_")} == {0}
    # parameters are snapshotted at every boundary, so a hand-written update is visible
    ends_at = _states(batches, "step_end")
    assert set(ends_at) == {0, 1, 2, 3}
    assert ends_at[1]["0.weight"]["data_digest"] != ends_at[2]["0.weight"]["data_digest"]


def test_process_that_never_trains_is_one_setup_window(tmp_path):
    with producers.instrument(run_id="eval", trace_dir=tmp_path):
        model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5)).eval()
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(2, 3))
    batches = _batches(tmp_path)
    assert [b["step"] for b in batches] == [0]
    end = _ends(batches)[0]
    assert end.get("setup") is True and end.get("final") is True and "trained" not in end
    assert _run_end(batches)["iterations"] == 0
    assert {e["stage"] for _, e in _calls(batches, "torch.nn.Module.forward")} == {"eval"}


def test_lbfgs_closure_runs_before_the_step_and_its_snapshot_sees_gradients(tmp_path):
    with producers.instrument(run_id="lbfgs", trace_dir=tmp_path):
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
        x, y = torch.randn(8, 3), torch.randn(8, 1)

        def closure():
            optimizer.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            return loss

        for _ in range(2):
            optimizer.step(closure)
    batches = _batches(tmp_path)
    assert [b["step"] for b in batches] == [0, 1, 2, 3]
    for batch in batches[1:3]:
        order = [e["api"].rsplit(".", 1)[1] for e in batch["events"]
                 if e["kind"] == "call" and e["phase"] == "pre" and e["api"] != "torch.nn.Module.forward"]
        assert order[:3] == ["zero_grad", "backward", "step"], order
        assert order.count("step") == 1, "one step per step() call, however often the closure runs"
    first_backward = next(e for e in batches[1]["events"] if e.get("api") == "torch.Tensor.backward")
    assert first_backward["parent"] is None
    pre = _states(batches, "pre:torch.optim.Optimizer.step")
    assert all(a["grad_digest"] is not None for a in pre[1].values()), "the closure's gradients exist"


def test_module_zero_grad_says_which_optimizer_it_clears(tmp_path):
    with producers.instrument(run_id="gan", trace_dir=tmp_path):
        generator, critic = nn.Linear(2, 3), nn.Linear(3, 1)
        opt_g = torch.optim.Adam(generator.parameters())
        opt_c = torch.optim.Adam(critic.parameters())
        for _ in range(2):
            critic.zero_grad()
            critic(generator(torch.randn(4, 2)).detach()).mean().backward()
            opt_c.step()
            generator.zero_grad()
            (-critic(generator(torch.randn(4, 2))).mean()).backward()
            opt_g.step()
    batches = _batches(tmp_path)
    assert [b["step"] for b in batches] == [0, 1, 2, 3]
    clears = [(e["mtype"], e["clears"]) for _, e in _calls(batches, "torch.nn.Module.zero_grad")]
    assert clears == [("Linear", ["opt1"]), ("Linear", ["opt0"])] * 2
    steps = [e["obj"] for _, e in _calls(batches, "torch.optim.Optimizer.step")]
    assert steps == ["opt1", "opt0"] * 2
    holders = {name: attrs["holder"] for name, attrs in _states(batches, "step_end")[2].items()}
    assert holders == {"weight": "opt0.g0", "bias": "opt0.g0", "r1.weight": "opt1.g0", "r1.bias": "opt1.g0"}


def test_clearing_gradients_without_a_step_ends_an_iteration(tmp_path):
    """A forgotten (or skipped) ``optimizer.step()``: iterations still exist, none steps."""
    with producers.instrument(run_id="nostep", trace_dir=tmp_path):
        model = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
    batches = _batches(tmp_path)
    assert [b["step"] for b in batches] == [0, 1, 2, 3]
    assert [e.get("boundary") for e in _ends(batches)] == [None, "loop", "loop", "close"]
    assert (_run_end(batches)["iterations"], _run_end(batches)["optimizer_steps"]) == (3, 0)


def test_clearing_some_gradients_between_backward_and_step_freezes_them_and_ends_nothing(tmp_path):
    """DINO freezes its last layer in the first epoch with ``p.grad = None`` between the
    backward and the step; a clear of every gradient there is a skipped step."""
    with producers.instrument(run_id="partial-clear", trace_dir=tmp_path):
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for iteration in range(6):
            optimizer.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            if iteration < 3:
                for p in model[2].parameters():
                    p.grad = None  # the last layer is frozen for this step
            if iteration == 4:  # a skipped step: every gradient cleared, no step
                for p in model.parameters():
                    p.grad = None
                continue
            optimizer.step()
    batches = _batches(tmp_path)
    assert (_run_end(batches)["iterations"], _run_end(batches)["optimizer_steps"]) == (6, 5)
    steps = [step for step, _ in _calls(batches, "torch.optim.Optimizer.step")]
    assert steps == [1, 2, 3, 4, 6]  # window 5 is the skipped step


def test_a_partial_clear_does_not_empty_an_optimizer_whose_backward_comes_later(tmp_path):
    """A GAN-like iteration: the generator's last layer is frozen between its backward
    and its step while the discriminator's optimizer holds no gradient yet."""
    with producers.instrument(run_id="partial-clear-two", trace_dir=tmp_path):
        gen = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 3))
        disc = nn.Linear(3, 1)
        opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
        opt_d = torch.optim.SGD(disc.parameters(), lr=0.1)
        for _ in range(4):
            opt_g.zero_grad()
            gen(torch.randn(4, 3)).pow(2).mean().backward()
            for p in gen[2].parameters():
                p.grad = None
            opt_g.step()
            opt_d.zero_grad()
            disc(torch.randn(4, 3)).mean().backward()
            opt_d.step()
    batches = _batches(tmp_path)
    assert (_run_end(batches)["iterations"], _run_end(batches)["optimizer_steps"]) == (4, 8)


def test_gradient_accumulation_is_one_iteration_per_step(tmp_path):
    with producers.instrument(run_id="accum", trace_dir=tmp_path):
        model = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for index in range(8):
            model(torch.randn(4, 3)).sum().backward()
            if index % 4 == 3:
                optimizer.step()
                optimizer.zero_grad()
    batches = _batches(tmp_path)
    assert [b["step"] for b in batches] == [0, 1, 2, 3]
    assert [len(_calls([b], "torch.Tensor.backward")) for b in batches] == [0, 4, 4, 0]


def test_stage_switches_at_train_and_eval_and_follows_the_wrapped_model(tmp_path):
    with producers.instrument(run_id="stages", trace_dir=tmp_path):
        model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.1), nn.Linear(4, 1))
        wrapper = nn.DataParallel(model)  # on CPU it just calls the model
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            model.train()
            optimizer.zero_grad()
            wrapper(torch.randn(4, 3)).sum().backward()
            optimizer.step()
            torch.manual_seed(epoch)  # a test function re-seeds before it calls eval()
            wrapper.eval()
            with torch.no_grad():
                wrapper(torch.randn(4, 3))
            wrapper.module.train()  # the inner model trains on; the wrapper's flag stays stale
    batches = _batches(tmp_path)
    zero_grads = [e["stage"] for _, e in _calls(batches, "torch.optim.Optimizer.zero_grad")]
    assert zero_grads[1:] == ["train"], "zero_grad right after train() is a training call"
    seeds = [e["stage"] for _, e in _calls(batches, "torch.manual_seed")]
    assert seeds == ["eval", "eval"], "the re-seed belongs to the evaluation that follows it"
    roots = [(e["training"], e["stage"]) for _, e in _calls(batches, "torch.nn.Module.forward") if e["module"] == ""]
    assert roots[2] == (False, "train"), "a stale wrapper flag does not decide the stage"


def test_parameter_overwrites_are_recorded_and_know_trained_parameters(tmp_path):
    with producers.instrument(run_id="reinit", trace_dir=tmp_path):
        model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
        model[0].weight.data.normal_(0, 0.02)  # how many model libraries initialise
        optimizer = torch.optim.Adam(model.parameters())
        for index in range(3):
            optimizer.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()
            if index == 1:
                model[1].weight.data.normal_()  # re-initialising a trained layer
                nn.init.zeros_(model[1].bias)
        fresh = nn.Linear(4, 2)  # a new head built mid-run: not a re-initialisation
    batches = _batches(tmp_path)
    writes = [(s, e["name"], e["args"]["tensor"].get("name"), e["trained"])
              for s, e in _calls(batches, "torch.Tensor.param_overwrite")]
    assert writes[0] == (0, "torch.Tensor.normal_", None, False), "at build the model has no names yet"
    assert (3, "torch.Tensor.normal_", "1.weight", True) in writes  # after the 2nd step: window 3
    assert not [w for w in writes if w[0] != 0 and w[1] != "torch.Tensor.normal_"], "optimizer writes are not overwrites"
    inits = [(s, e["trained"]) for s, e in _calls(batches, "torch.nn.init.zeros_")]
    assert inits == [(3, True)]
    fresh_inits = [e["trained"] for s, e in _calls(batches, "torch.nn.init.kaiming_uniform_") if s == 4]
    assert fresh_inits == [False]
    assert fresh.weight.shape == (2, 4)


def test_a_step_at_learning_rate_zero_is_not_bracketed_by_update_snapshots(tmp_path):
    """A warm-up from 0 updates nothing at its first step, by design."""
    with producers.instrument(run_id="warmup", trace_dir=tmp_path):
        model = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(step / 2, 1.0))
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()
            schedule.step()
    batches = _batches(tmp_path)
    assert [s for s, _ in _calls(batches, "torch.optim.Optimizer.step")] == [1, 2, 3]
    assert set(_states(batches, "pre:torch.optim.Optimizer.step")) == {2, 3}


def test_initialisers_say_whether_their_target_holds_loaded_or_trained_values(tmp_path):
    def build() -> nn.Sequential:
        return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))

    with producers.instrument(run_id="learned", trace_dir=tmp_path):
        source = build()
        checkpoint = {k: v.clone() for k, v in source.state_dict().items()}
        model = build()
        model.load_state_dict(checkpoint)
        model[0].weight.data.normal_(0, 0.02)  # an init_weights() run after the load
        target = build()
        target.load_state_dict(model.state_dict())
        with torch.no_grad():  # a target network's soft update: syncing, not initialising
            for kept, live in zip(target.parameters(), model.parameters()):
                kept.data.copy_(0.9 * kept + 0.1 * live)
        partial = build()
        partial.load_state_dict({k: v for k, v in checkpoint.items() if k.startswith("0.")}, strict=False)
        partial[1].weight.data.normal_()  # a key the checkpoint lacked: still a new parameter
        nn.init.zeros_(partial[0].bias)  # a loaded one
        optimizer = torch.optim.SGD(source.parameters(), lr=0.1)
        source(torch.randn(2, 3)).sum().backward()
        optimizer.step()
        source[1].weight.data.uniform_()  # trained in this run
    batches = _batches(tmp_path)
    writes = [(e["name"], e["trained"], e.get("learned")) for _, e in _calls(batches, "torch.Tensor.param_overwrite")]
    # copy_ (loads, soft updates) synchronises: not an initialiser, not recorded
    assert writes == [
        ("torch.Tensor.normal_", False, True),  # loaded, not trained: learned values all the same
        ("torch.Tensor.normal_", False, False),
        ("torch.Tensor.uniform_", True, True),
    ]
    zeros = [(e["trained"], e["learned"]) for _, e in _calls(batches, "torch.nn.init.zeros_")]
    assert zeros == [(False, True)]
    builds = [e["learned"] for _, e in _calls(batches, "torch.nn.init.kaiming_uniform_")]
    assert builds == [False] * 8, "parameters being built hold nothing learned"


def test_a_meta_device_model_materialised_by_loading_holds_no_learned_values(tmp_path):
    # how libraries build big models: on the meta device, then a load per parameter,
    # placeholders for the keys the checkpoint lacks included, which they initialise next
    with producers.instrument(run_id="meta", trace_dir=tmp_path):
        with torch.device("meta"):
            head = nn.Linear(4, 2)
        head.load_state_dict({"weight": torch.empty(2, 4), "bias": torch.empty(2)}, assign=True)
        head.weight.data.normal_()
    writes = [(e["name"], e.get("learned")) for _, e in _calls(_batches(tmp_path), "torch.Tensor.param_overwrite")]
    assert writes == [("torch.Tensor.normal_", False)]


def test_a_deliberate_reset_parameters_of_a_loaded_head_initialises_a_new_head(tmp_path):
    """``head.reset_parameters()`` after loading a checkpoint is the documented way to
    start a new task head; a model's own init walk over loaded weights is not."""
    with producers.instrument(run_id="reset", trace_dir=tmp_path):
        model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
        model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
        model[1].reset_parameters()  # a new head, by intent
        model[0].weight.data.normal_(0, 0.02)  # init_weights() run after the load
    batches = _batches(tmp_path)
    inits = [(e["name"], e["learned"]) for _, e in _calls(batches, "torch.nn.init.kaiming_uniform_")]
    assert inits and not any(learned for _, learned in inits)
    writes = [e["learned"] for _, e in _calls(batches, "torch.Tensor.param_overwrite")]
    assert writes == [True]


def test_a_frozen_teacher_in_eval_mode_does_not_make_distillation_an_evaluation(tmp_path):
    with producers.instrument(run_id="distil", trace_dir=tmp_path):
        teacher, student = nn.Linear(3, 2), nn.Linear(3, 2)
        teacher.requires_grad_(False)
        optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
        student.train()
        for _ in range(3):
            teacher.eval()
            optimizer.zero_grad()
            x = torch.randn(4, 3)
            with torch.no_grad():
                target = teacher(x).softmax(-1)
            loss = -(target * student(x).log_softmax(-1)).sum(-1).mean()
            loss.backward()
            optimizer.step()
        student.eval()
        with torch.no_grad():
            student(torch.randn(4, 3))
    batches = _batches(tmp_path)
    stages = {(e["api"].rsplit(".", 1)[1], e["stage"]) for b in batches if b["step"] > 0 for e in b["events"]
              if e["kind"] == "call" and e["phase"] == "pre" and e["api"].startswith("torch.optim")}
    assert ("step", "train") in stages and not {stage for _, stage in stages} & {"eval"}
    forwards = [e["stage"] for _, e in _calls(batches, "torch.nn.Module.forward")]
    assert forwards[-1] == "eval"  # the student's own evaluation is one
