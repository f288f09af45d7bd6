"""The producer marks a layer its model does not register and no optimizer trains, and
nothing else: shared layers, frozen teachers kept in lists and loops before any
optimizer exists stay unmarked."""

from __future__ import annotations

import torch
from torch import nn

import producers
from tests.support.producer_traces import trace_batches, trace_events


class Decoder(nn.Module):
    """Uses a layer it is handed (registered in another model) and layers it keeps in a list."""

    def __init__(self, listed: list[nn.Module]) -> None:
        super().__init__()
        self.out = nn.Linear(4, 2)
        self.listed = listed  # a plain list: not registered

    def forward(self, x: torch.Tensor, shared: nn.Module) -> torch.Tensor:
        x = shared(x)
        for layer in self.listed:
            x = layer(x)
        return self.out(x)


def _marked(tmp_path) -> list[tuple[int, str]]:
    return [(step, event["mtype"]) for step, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and (event.get("ctx") or {}).get("unregistered")]


def test_only_layers_outside_the_model_and_every_optimizer_are_marked(tmp_path):
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(4, 4))
    trained_in_list = nn.Tanh()  # no parameters: never judged
    forgotten = nn.Linear(4, 4)  # in the list, in no optimizer
    decoder = Decoder([trained_in_list, forgotten])
    with producers.instrument(run_id="r-reg", trace_dir=tmp_path):
        decoder(torch.randn(2, 4), encoder[0])  # no optimizer known yet: nothing is judged
        optimizer = torch.optim.SGD([*encoder.parameters(), *decoder.parameters()], lr=0.1)
        for _ in range(2):
            optimizer.zero_grad()
            decoder(torch.randn(2, 4), encoder[0]).sum().backward()
            optimizer.step()
            with torch.no_grad():
                decoder(torch.randn(2, 4), encoder[0])  # evaluation without gradients: not judged
    assert [mtype for _, mtype in _marked(tmp_path)] == ["Linear", "Linear"]


def test_a_registered_layer_added_after_the_first_forward_and_trained_is_not_marked(tmp_path):
    model = nn.Sequential(nn.Linear(3, 3))
    with producers.instrument(run_id="r-grow", trace_dir=tmp_path):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            if step == 2:
                model.append(nn.Linear(3, 3))
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            optimizer.zero_grad()
            model(torch.randn(2, 3)).sum().backward()
            optimizer.step()
    assert _marked(tmp_path) == []
