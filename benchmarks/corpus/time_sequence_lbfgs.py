"""Sine-wave sequence prediction with two stacked LSTMCells in double precision, trained by LBFGS.

Modelled on: pytorch/examples time_sequence_prediction, generate_sine_wave.py + train.py
(https://github.com/pytorch/examples/tree/main/time_sequence_prediction).
Habits reproduced: data generated with numpy and handed over through torch.save/torch.load,
model cast with .double(), a Python loop over input.chunk(...) feeding LSTMCells with
zero-initialised double hidden states, optim.LBFGS with a closure that zeroes grads, prints
loss.item() and backprops, then a "future" prediction under torch.no_grad() after every step.
"""
from __future__ import print_function

import argparse
import os
import shutil
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim


def generate_sine_wave(path, seed, T=20, L=80, N=12):
    np.random.seed(seed)
    x = np.empty((N, L), "int64")
    x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
    data = np.sin(x / 1.0 / T).astype("float64")
    torch.save(data, open(path, "wb"))


class Sequence(nn.Module):
    def __init__(self, hidden=24):
        super(Sequence, self).__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, input, future=0):
        outputs = []
        h_t = torch.zeros(input.size(0), self.hidden, dtype=torch.double)
        c_t = torch.zeros(input.size(0), self.hidden, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), self.hidden, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), self.hidden, dtype=torch.double)

        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for i in range(future):  # if we should predict the future
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        outputs = torch.cat(outputs, dim=1)
        return outputs


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=15, help="steps to run (LBFGS steps)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max_iter", type=int, default=4, help="LBFGS function evaluations per step")
    parser.add_argument("--future", type=int, default=40)
    opt = parser.parse_args()

    workdir = tempfile.mkdtemp(prefix="sine_")
    generate_sine_wave(os.path.join(workdir, "traindata.pt"), opt.seed)

    # set random seed to 0
    np.random.seed(opt.seed)
    torch.manual_seed(opt.seed)
    # load data and make training set
    data = torch.load(os.path.join(workdir, "traindata.pt"), weights_only=False)
    input = torch.from_numpy(data[3:, :-1])
    target = torch.from_numpy(data[3:, 1:])
    test_input = torch.from_numpy(data[:3, :-1])
    test_target = torch.from_numpy(data[:3, 1:])
    # build the model
    seq = Sequence()
    seq.double()
    criterion = nn.MSELoss()
    # use LBFGS as optimizer since we can load the whole data to train
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8, max_iter=opt.max_iter)
    # begin to train
    for i in range(opt.steps):
        print("STEP: ", i)

        def closure():
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            print("loss:", loss.item())
            loss.backward()
            return loss
        optimizer.step(closure)
        # begin to predict, no need to track gradient here
        with torch.no_grad():
            future = opt.future
            pred = seq(test_input, future=future)
            loss = criterion(pred[:, :-future], test_target)
            print("test loss:", loss.item())
            y = pred.detach().numpy()
        # the original draws y into predict%d.pdf; keep the array instead
        np.save(os.path.join(workdir, "predict%d.npy" % i), y)
    shutil.rmtree(workdir)
