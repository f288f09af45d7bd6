"""First-forward facts on module-forward events: real torch modules, tiny CPU training."""

from __future__ import annotations

import gc
import warnings

import torch
from torch import nn

import producers
from invariants.events import validate_batch
from producers.module_facts import FirstForwards, first_forward_context, spectral_estimate_refined, spectral_norm_kind
from producers.report import read_trace_dir

warnings.filterwarnings("ignore", category=FutureWarning)  # the legacy spectral_norm API is the subject


def _forward_pres(trace_dir) -> list[tuple[int, dict]]:
    files = read_trace_dir(trace_dir)
    assert len(files) == 1, files.keys()
    found = []
    for batch in next(iter(files.values())):
        validate_batch(batch)
        for event in batch["events"]:
            if event["kind"] == "call" and event.get("api") == "torch.nn.Module.forward" and event["phase"] == "pre":
                found.append((batch["step"], event))
    return found


def test_spectral_norm_is_recognised_in_both_implementations():
    assert spectral_norm_kind(nn.utils.spectral_norm(nn.Linear(3, 4))) == "hook"
    assert spectral_norm_kind(nn.utils.parametrizations.spectral_norm(nn.Conv2d(1, 2, 3))) == "parametrization"
    assert spectral_norm_kind(nn.utils.parametrizations.orthogonal(nn.Linear(3, 3))) is None
    assert spectral_norm_kind(nn.Linear(3, 4)) is None
    removed = nn.utils.spectral_norm(nn.Linear(3, 4))
    nn.utils.remove_spectral_norm(removed)
    assert spectral_norm_kind(removed) is None
    assert first_forward_context(nn.ReLU()) == {"first_forward": True}


def test_a_spectral_norm_estimate_counts_as_refined_once_it_fits_the_weight():
    torch.manual_seed(0)
    for rows, cols in ((32, 32), (1, 16), (16, 1), (8, 64)):
        fresh = nn.utils.spectral_norm(nn.Linear(cols, rows))
        assert spectral_estimate_refined(fresh) is False, (rows, cols)
        fresh(torch.randn(2, cols))  # one training-mode power iteration
        assert spectral_estimate_refined(fresh) is True, (rows, cols)
    conv = nn.utils.spectral_norm(nn.Conv2d(4, 8, 3))
    assert spectral_estimate_refined(conv) is False
    conv(torch.randn(1, 4, 5, 5))
    assert spectral_estimate_refined(conv) is True
    # a resumed run: u/v come from the checkpoint
    trained = nn.utils.spectral_norm(nn.Linear(16, 16))
    for _ in range(20):
        trained(torch.randn(2, 16))
    resumed = nn.utils.spectral_norm(nn.Linear(16, 16))
    resumed.load_state_dict(trained.state_dict())
    assert first_forward_context(resumed) == {"first_forward": True, "spectral_norm": "hook",
                                              "spectral_norm_refined": True}
    assert spectral_estimate_refined(nn.Linear(3, 3)) is None
    assert spectral_estimate_refined(nn.utils.spectral_norm(nn.Linear(3, 3, device="meta"))) is None


def test_first_forward_is_reported_once_per_live_instance():
    firsts = FirstForwards()
    layer = nn.Linear(2, 2)
    assert firsts.is_first(layer) and not firsts.is_first(layer) and not firsts.is_first(layer)
    other = nn.Linear(2, 2)
    assert firsts.is_first(other)
    del layer, other
    gc.collect()
    assert len(firsts) == 0  # dead modules leave; a new one reusing an id is new
    assert firsts.is_first(nn.Linear(2, 2))


def test_first_forward_events_carry_the_facts_and_later_ones_do_not(tmp_path):
    with producers.instrument(run_id="r-first", trace_dir=tmp_path):
        torch.manual_seed(0)
        model = nn.Sequential(nn.utils.spectral_norm(nn.Linear(3, 4)), nn.ReLU(), nn.Linear(4, 1))
        late = nn.utils.spectral_norm(nn.Linear(4, 3))  # joins at the second step, in eval mode
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            if step == 1:
                late.eval()
                with torch.no_grad():
                    late(torch.randn(2, 4))
            optimizer.zero_grad()
            model(torch.randn(4, 3)).pow(2).mean().backward()
            optimizer.step()
    pres = _forward_pres(tmp_path)
    firsts = [(step, e["module"], e["mtype"], e["training"], e["ctx"].get("spectral_norm"),
               e["ctx"].get("spectral_norm_refined")) for step, e in pres if e["ctx"].get("first_forward")]
    assert firsts == [(1, "", "Sequential", True, None, None), (1, "0", "Linear", True, "hook", False),
                      (1, "1", "ReLU", True, None, None), (1, "2", "Linear", True, None, None),
                      (2, "", "Linear", False, "hook", False)]
    # the check's own torch calls are not recorded as the user's
    assert not [e for _, e in pres if e["ctx"].get("first_forward") and e["mtype"] not in ("Sequential", "Linear", "ReLU")]
    assert all(e["ctx"]["first_forward"] is True for _, e in pres if "first_forward" in e["ctx"])
    # steady state: later forwards carry the plain context only
    later = [e for step, e in pres if step == 3]
    assert later and all(set(e["ctx"]) - {"no_params"} == {"grad", "autocast", "training"} for e in later)


def test_forwards_of_modules_without_parameters_say_so_and_models_do_not(tmp_path):
    """The type-free batch rule judges only parameter-free modules (preprocessing); a
    model may regroup samples (a graph readout, time merged into the batch)."""

    class Normalise(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x - x.mean()) / (x.std() + 1e-5)

    with producers.instrument(run_id="r-noparams", trace_dir=tmp_path, quiet=True):
        normalise, model = Normalise(), nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            optimizer.zero_grad()
            model(normalise(torch.randn(3, 4))).sum().backward()
            optimizer.step()
    flags = {event["mtype"]: event["ctx"].get("no_params") for _, event in _forward_pres(tmp_path)}
    assert flags == {"Normalise": True, "Sequential": None, "Linear": None, "ReLU": True}


def test_a_parametrization_is_not_taken_for_a_parameter_free_batch_transform(tmp_path):
    """``weight_norm`` as a parametrization runs a parameter-free module on the weight's
    originals (``g`` of shape ``(1, 1, k)`` in, the ``(c, 1, k)`` weight out): it reshapes a
    weight, not a batch (Wav2Vec2's positional convolution)."""
    from torch.nn.utils.parametrizations import weight_norm

    with producers.instrument(run_id="r-param", trace_dir=tmp_path, quiet=True):
        conv = weight_norm(nn.Conv1d(4, 4, 3, padding=1, groups=2), dim=2)
        optimizer = torch.optim.SGD(conv.parameters(), lr=0.1)
        for _ in range(2):
            optimizer.zero_grad()
            conv(torch.randn(3, 4, 5)).sum().backward()
            optimizer.step()
    flags = {event["mtype"]: event["ctx"].get("no_params") for _, event in _forward_pres(tmp_path)}
    assert "_WeightNorm" in flags and flags["_WeightNorm"] is None
