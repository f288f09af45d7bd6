"""Gradient accumulation that sums its micro-batch losses instead of averaging them breaks
``averages_accumulated_losses`` at the optimizer step, from the second such cycle: each
loss came from a DataLoader batch of its own, or the same optimizer took one loss per
step before accumulation was switched on.  The healthy loops a blunter rule would flag
keep it: losses divided by the accumulation count (by hand, under ``GradScaler``, or as
a sum of rescaled terms), a GAN discriminator's real and fake losses of one batch, two
different losses of one step, a single step skipped without a clear, an overflow, and
LBFGS closures."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset, dataloader

import producers
from invariants.events import OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events

CONTRACT = "averages_accumulated_losses"


def _verdicts(tmp_path, obj: str | None = None) -> list:
    """Each optimizer step's verdict (None: not judged), of one optimizer's steps if ``obj``."""
    contracts = [(event.get("ctx") or {}).get("contract") or {} for _, event in trace_events(trace_batches(tmp_path))
                 if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP
                 and obj in (None, event.get("obj"))]
    return [contract.get(CONTRACT, "absent") for contract in contracts]


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(96, 4), torch.randn(96, 1)), batch_size=8)


def _accumulate_from_loader(tmp_path, divide: bool) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with producers.instrument(run_id="r-avg", trace_dir=tmp_path, quiet=True):
        for index, (x, y) in enumerate(_loader()):
            loss = F.mse_loss(model(x), y)
            (loss / 3 if divide else loss).backward()
            if index % 3 == 2:
                optimizer.step()
                optimizer.zero_grad()


def test_summed_micro_batches_of_a_dataloader_break_the_contract_from_the_second_cycle(tmp_path):
    _accumulate_from_loader(tmp_path, divide=False)
    assert _verdicts(tmp_path) == [None, False, False, False]


def test_averaged_micro_batches_keep_it(tmp_path):
    _accumulate_from_loader(tmp_path, divide=True)
    assert _verdicts(tmp_path) == [True, True, True, True]


@pytest.mark.parametrize("divide", [False, True])
def test_accumulation_switched_on_mid_run_without_a_loader(tmp_path, divide):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    with producers.instrument(run_id="r-avg", trace_dir=tmp_path, quiet=True):
        for step in range(8):
            accumulation = 1 if step < 4 else 4
            for _ in range(accumulation):
                loss = F.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1))
                (loss / accumulation if divide else loss).backward()
            optimizer.step()
            optimizer.zero_grad()
    assert _verdicts(tmp_path) == [True] * 8 if divide else [True] * 4 + [None, False, False, False]


def test_gradscaler_multiplication_is_not_a_rescaling(tmp_path):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    with producers.instrument(run_id="r-avg", trace_dir=tmp_path, quiet=True):
        for index, (x, y) in enumerate(_loader()):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(model(x).float(), y)
            scaler.scale(loss).backward()
            if index % 3 == 2:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
    assert _verdicts(tmp_path) == [None, False, False, False]


def test_a_sum_of_rescaled_terms_is_rescaled(tmp_path):
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    with producers.instrument(run_id="r-avg", trace_dir=tmp_path, quiet=True):
        for index, (x, y) in enumerate(_loader()):
            out = model(x)
            (F.mse_loss(out, y) / 3 + out.abs().mean() / 3).backward()
            if index % 3 == 2:
                optimizer.step()
                optimizer.zero_grad()
    assert _verdicts(tmp_path) == [True] * 4


def test_two_losses_of_one_batch_are_a_sum_by_design(tmp_path):
    """DCGAN's discriminator: ``errD_real.backward(); errD_fake.backward(); optD.step()``."""
    netD, netG = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid()), nn.Linear(2, 4)
    optD = torch.optim.Adam(netD.parameters(), lr=1e-3)
    optG = torch.optim.Adam(netG.parameters(), lr=1e-3)
    with producers.instrument(run_id="r-avg", trace_dir=tmp_path, quiet=True):
        for real, _ in _loader():
            netD.zero_grad()
            F.binary_cross_entropy(netD(real), torch.ones(len(real), 1)).backward()
            fake = netG(torch.randn(len(real), 2))
            F.binary_cross_entropy(netD(fake.detach()), torch.zeros(len(real), 1)).backward()
            optD.step()
            netG.zero_grad()
            F.binary_cross_entropy(netD(fake), torch.ones(len(real), 1)).backward()
            optG.step()
    assert None not in _verdicts(tmp_path) and False not in _verdicts(tmp_path)


def test_backwards_that_fed_other_optimizers_steps_are_not_this_ones_micro_batches(tmp_path):
    """Three optimizers over parts of one model, each stepping after its own loss, clear
    only after their steps: a decoder's gradients hold the encoder's and the
    discriminator's backwards too (wiseodd/controlled-text-generation), which fed those
    optimizers' steps and are no summed accumulation of the decoder's."""
    encoder, decoder, critic = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 1)
    loader = iter(_loader())
    optimizers = {name: torch.optim.SGD(module.parameters(), lr=0.01)
                  for name, module in (("enc", encoder), ("dec", decoder), ("crit", critic))}
    with producers.instrument(run_id="r-avg-three", trace_dir=tmp_path, quiet=True):
        for _ in range(4):
            x, _ = next(loader)
            F.softplus(critic(decoder(encoder(x)).detach())).mean().backward()  # the critic's loss
            optimizers["crit"].step(); optimizers["crit"].zero_grad()
            x, _ = next(loader)
            decoder(encoder(x).detach()).pow(2).mean().backward()  # the decoder's loss
            optimizers["dec"].step(); optimizers["dec"].zero_grad()
            x, _ = next(loader)
            decoder(encoder(x)).pow(2).mean().backward()  # the encoder's loss, reaching the decoder too
            optimizers["enc"].step(); optimizers["enc"].zero_grad()
    assert False not in _verdicts(tmp_path)


def test_a_step_skipped_without_a_clear_is_not_judged(tmp_path):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with producers.instrument(run_id="r-avg", trace_dir=tmp_path, quiet=True):
        for index, (x, y) in enumerate(_loader()):
            F.mse_loss(model(x), y).backward()
            if index == 2:
                continue  # a guard skips this step and keeps its gradients
            optimizer.step()
            optimizer.zero_grad()
    assert _verdicts(tmp_path) == [True, True, None] + [True] * 8


def test_accumulation_that_overflowed_is_not_judged(tmp_path):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with producers.instrument(run_id="r-avg", trace_dir=tmp_path, quiet=True):
        for index, (x, y) in enumerate(_loader()):
            F.mse_loss(model(x), y * float("inf") if index == 4 else y).backward()
            if index % 3 == 2:
                for parameter in model.parameters():
                    parameter.grad.nan_to_num_(0.0, 0.0, 0.0)
                optimizer.step()
                optimizer.zero_grad()
    assert _verdicts(tmp_path) == [None, None, False, False]


def test_backwards_from_outputs_with_given_gradients_are_not_judged(tmp_path):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with producers.instrument(run_id="r-avg", trace_dir=tmp_path, quiet=True):
        for index, (x, _) in enumerate(_loader()):
            out = model(x)
            out.backward(torch.ones_like(out) / len(out))
            if index % 3 == 2:
                optimizer.step()
                optimizer.zero_grad()
    assert _verdicts(tmp_path) == [True] * 4


def test_lbfgs_closures_are_the_steps_own(tmp_path):
    model = _model()
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=4)
    x, y = torch.randn(32, 4), torch.randn(32, 1)

    def closure():
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    with producers.instrument(run_id="r-avg", trace_dir=tmp_path, quiet=True):
        for _ in range(4):
            optimizer.step(closure)
    assert _verdicts(tmp_path) == [True] * 4


def test_dataloader_iterators_yield_through_the_counted_private_next():
    """`producers.replica_batches.patch_batch_yields` relies on every DataLoader iterator being a
    ``_BaseDataLoaderIter`` whose ``__next__`` yields each batch."""
    iterator = iter(_loader())
    assert isinstance(iterator, dataloader._BaseDataLoaderIter)
    assert type(iterator).__next__ is dataloader._BaseDataLoaderIter.__next__
