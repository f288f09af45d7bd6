"""DataLoader workers started again each epoch from a dataset-owned RNG the parent never
advances replay the previous epoch's random stream (MONAI issue 1068): their seed
reports break the contract ``fresh_dataset_rng``.  Reseeding in ``worker_init_fn``,
persistent workers, validation passes and datasets without an RNG of their own keep
it or are not judged.  Real forked workers, run under ``trainwatch collect``."""

from __future__ import annotations

import sys

from invariants.events import WORKER_INIT_API
from producers.report import read_trace_dir
from tests.integration.test_collect import calls, collect

SCRIPT = """
import sys
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Patches(Dataset):
    def __init__(self, own_rng):
        self.R = np.random.RandomState(7) if own_rng else None

    def __len__(self):
        return 8

    def __getitem__(self, i):
        noise = self.R.normal(size=2) if self.R is not None else np.random.normal(size=2)
        return torch.tensor(noise, dtype=torch.float32)


def reseed(worker_id):
    torch.utils.data.get_worker_info().dataset.R = np.random.RandomState(torch.initial_seed() % 2**32)


variant = sys.argv[1]
dataset = Patches(own_rng=variant != "no_rng")
loader = DataLoader(dataset, batch_size=4, num_workers=1, persistent_workers=variant == "persistent",
                    worker_init_fn=reseed if variant == "reseeded" else None)
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(3):
    model.train()
    for x in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():  # a validation pass over the same data: not judged
        for x in loader:
            model(x)
"""


def _worker_contracts(tmp_path, clean_env, variant: str) -> list[tuple[int, object]]:
    script = tmp_path / "patches.py"
    script.write_text(SCRIPT)
    traces = tmp_path / variant
    result = collect(["-o", str(traces), "--run-id", variant, "--", sys.executable, str(script), variant],
                     clean_env, cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [(batch["step"], (event.get("ctx") or {}).get("contract"))
               for batches in read_trace_dir(traces).values()
               for batch, event in calls(batches, WORKER_INIT_API, phase="post")]
    return sorted(reports, key=lambda report: report[0])


def test_workers_restarted_from_the_unchanged_dataset_rng_break_the_contract_from_the_second_epoch(
        tmp_path, clean_env):
    reports = _worker_contracts(tmp_path, clean_env, "replayed")
    training = [contract for _, contract in reports if contract is not None]
    assert training == [{"fresh_dataset_rng": True}, {"fresh_dataset_rng": False}, {"fresh_dataset_rng": False}]
    assert len(reports) == 6  # three validation passes start workers too, unjudged


def test_reseeded_persistent_and_rng_free_workers_keep_or_skip_the_contract(tmp_path, clean_env):
    reseeded = [c for _, c in _worker_contracts(tmp_path, clean_env, "reseeded") if c is not None]
    assert reseeded == [{"fresh_dataset_rng": True}] * 3
    persistent = [c for _, c in _worker_contracts(tmp_path, clean_env, "persistent")]
    assert persistent == [{"fresh_dataset_rng": True}]  # started once, and never by the validation pass
    assert [c for _, c in _worker_contracts(tmp_path, clean_env, "no_rng")] == [None] * 6
