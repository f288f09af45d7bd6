"""A dataset that edits the samples it stores in place — MLM masking on a view of its
corpus, noise added to ``self.data[i]`` — corrupts every epoch after the first:
``keeps_stored_samples`` on ``Optimizer.step`` breaks at the first step trained on a
batch whose fetch wrote into samples served before.  Cloning first, caches filled on
first access (also over passes cut short), one-dimensional counters, DataLoader workers
and datasets without tensor storage keep it or are not judged."""

from __future__ import annotations

import os

import numpy
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

import producers
from invariants.events import OPTIMIZER_STEP
from producers.stored_samples import FetchedIndices, stored_sample_tensors
from producers.report import read_trace_dir
from tests.support.producer_traces import trace_events

SAMPLES, BATCH = 24, 8
STEPS_PER_EPOCH = SAMPLES // BATCH
MASK = 0


class MaskingCorpus(Dataset):
    """Token rows masked at random on every read; ``clone`` decides whether the storage suffers."""

    def __init__(self, clone: bool) -> None:
        self.input_ids = torch.randint(1, 16, (SAMPLES, 6))
        self.clone = clone

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index):
        tokens = self.input_ids[index].clone() if self.clone else self.input_ids[index]
        labels = tokens.clone()
        tokens[torch.rand(tokens.shape) < 0.3] = MASK
        return tokens.float(), labels.float()


class CachingDataset(Dataset):
    """Fills a preallocated cache on first access, as datasets that decode once do."""

    def __init__(self) -> None:
        self.cache = torch.zeros(SAMPLES, 6)
        self.filled = torch.zeros(SAMPLES, dtype=torch.bool)
        self.reads = torch.zeros(SAMPLES)  # a counter written on every read: one-dimensional, not samples

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index):
        self.reads[index] += 1
        if not self.filled[index]:
            self.cache[index] = torch.full((6,), float(index))
            self.filled[index] = True
        return self.cache[index], self.cache[index].sum(0, keepdim=True)


def _train(tmp_path, dataset, *, epochs: int = 3, steps_per_epoch: int | None = None, workers: int = 0) -> list:
    torch.manual_seed(0)
    model = nn.Linear(6, 6 if isinstance(dataset, MaskingCorpus) else 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with producers.instrument(run_id="r-stored", trace_dir=tmp_path, quiet=True):
        loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers)
        for _ in range(epochs):
            for taken, (x, y) in enumerate(loader):
                if steps_per_epoch is not None and taken == steps_per_epoch:
                    break
                optimizer.zero_grad()
                F.mse_loss(model(x), y).backward()
                optimizer.step()
    main = [batches for name, batches in read_trace_dir(tmp_path).items() if f"pid{os.getpid()}" in name]
    return [((event.get("ctx") or {}).get("contract") or {}).get("keeps_stored_samples")
            for _, event in trace_events(main[0])
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def test_in_place_masking_of_stored_samples_breaks_the_contract_from_the_second_epoch(tmp_path):
    verdicts = _train(tmp_path, MaskingCorpus(clone=False))
    # the first epoch's writes are indistinguishable from a cache fill; every later fetch edits served samples
    assert verdicts == [True] * STEPS_PER_EPOCH + [False] * (2 * STEPS_PER_EPOCH)


def test_a_dataset_built_anew_each_epoch_over_the_same_corpus_is_caught_too(tmp_path):
    corpus = MaskingCorpus(clone=False).input_ids
    torch.manual_seed(0)
    model = nn.Linear(6, 6)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with producers.instrument(run_id="r-anew", trace_dir=tmp_path, quiet=True):
        for _ in range(2):
            dataset = MaskingCorpus(clone=False)
            dataset.input_ids = corpus  # the tokenised corpus is kept; the dataset object is not
            for x, y in DataLoader(dataset, batch_size=BATCH, shuffle=True):
                optimizer.zero_grad()
                F.mse_loss(model(x), y).backward()
                optimizer.step()
    verdicts = [((event.get("ctx") or {}).get("contract") or {}).get("keeps_stored_samples")
                for _, event in trace_events(read_trace_dir(tmp_path).popitem()[1])
                if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]
    assert verdicts == [True] * STEPS_PER_EPOCH + [False] * STEPS_PER_EPOCH


def test_masking_a_clone_keeps_it(tmp_path):
    assert _train(tmp_path, MaskingCorpus(clone=True)) == [True] * (3 * STEPS_PER_EPOCH)


def test_noise_added_in_place_by_a_wrapper_over_a_subset_of_a_tensor_dataset_breaks_it(tmp_path):
    class Noisy(Dataset):
        def __init__(self, base: Subset) -> None:
            self.base = base

        def __len__(self) -> int:
            return len(self.base)

        def __getitem__(self, index):
            x, y = self.base[index]
            return x.add_(0.01 * torch.randn_like(x)), y  # x is a view of the TensorDataset's storage

    tensors = TensorDataset(torch.randn(SAMPLES + 8, 6), torch.randn(SAMPLES + 8, 1))
    subset = Subset(tensors, range(SAMPLES))
    noisy = Noisy(subset)
    assert [id(t) for t in stored_sample_tensors(noisy)] == [id(t) for t in tensors.tensors]  # found through both
    verdicts = _train(tmp_path / "wrapper", noisy, epochs=2)
    assert verdicts == [True] * STEPS_PER_EPOCH + [False] * STEPS_PER_EPOCH


def test_a_cache_filled_on_first_access_keeps_it_also_over_passes_cut_short(tmp_path):
    dataset = CachingDataset()
    # two of three batches fetched per pass: the cache fills over several passes, and a batch
    # that fills it holds an index never fetched before
    verdicts = _train(tmp_path, dataset, epochs=4, steps_per_epoch=1)
    assert verdicts == [True] * 4
    assert float(dataset.reads.sum()) == 4 * 2 * BATCH and bool(dataset.filled.all())


def test_a_scratch_buffer_rewritten_on_every_read_is_not_storage(tmp_path):
    class Noised(Dataset):
        def __init__(self) -> None:
            self.images = torch.randn(SAMPLES, 2, 3)
            self.noise = torch.empty(2, 3)  # shaped like one sample, refilled on every read

        def __len__(self) -> int:
            return SAMPLES

        def __getitem__(self, index):
            return (self.images[index] + self.noise.normal_()).flatten(), torch.zeros(1)

    dataset = Noised()
    assert [id(t) for t in stored_sample_tensors(dataset)] == [id(dataset.images)]
    assert _train(tmp_path, dataset, epochs=2) == [True] * (2 * STEPS_PER_EPOCH)


def test_fetches_in_dataloader_workers_are_not_judged(tmp_path):
    assert _train(tmp_path, MaskingCorpus(clone=False), epochs=2, workers=1) == [None] * (2 * STEPS_PER_EPOCH)


def test_a_dataset_without_tensor_storage_is_not_judged(tmp_path):
    class Generated(Dataset):
        def __len__(self) -> int:
            return SAMPLES

        def __getitem__(self, index):
            return torch.randn(6), torch.randn(1)

    assert _train(tmp_path, Generated(), epochs=1) == [None] * STEPS_PER_EPOCH


@pytest.mark.parametrize("size", [2, 9, 16])
def test_fetched_indices_say_whether_every_index_was_fetched_before(size):
    seen = FetchedIndices(size)
    assert not seen.all_seen_then_mark([0])
    assert seen.all_seen_then_mark([0])
    assert not seen.all_seen_then_mark(range(size))  # all but 0 are new
    assert seen.all_seen_then_mark(range(size)) and seen.all_seen_then_mark([size - 1])
    assert not FetchedIndices(size).all_seen_then_mark(["a key"])
    typed = FetchedIndices(size)
    assert not typed.all_seen_then_mark([numpy.int64(1), torch.tensor(0)])
    assert typed.all_seen_then_mark([1, 0])


def test_the_private_fetcher_this_relies_on_is_what_a_single_process_dataloader_calls():
    """torch's ``_MapDatasetFetcher.fetch(possibly_batched_index)``, with ``dataset`` and
    ``auto_collation``, is the one private name `producers.stored_samples` patches."""
    from torch.utils.data._utils.fetch import _MapDatasetFetcher

    dataset = TensorDataset(torch.arange(12.0).reshape(6, 2))
    iterator = iter(DataLoader(dataset, batch_size=3))
    fetcher = iterator._dataset_fetcher
    assert type(fetcher) is _MapDatasetFetcher and fetcher.dataset is dataset and fetcher.auto_collation
    assert torch.equal(fetcher.fetch([0, 1])[0], dataset.tensors[0][:2])
    unbatched = iter(DataLoader(dataset, batch_size=None))._dataset_fetcher
    assert not unbatched.auto_collation and torch.equal(unbatched.fetch(4)[0], dataset.tensors[0][4])
