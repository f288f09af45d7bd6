"""expRNN on the copying memory task: orthogonal recurrent kernel via torch.nn.utils.parametrizations.

Modelled on: Lezcano/expRNN (Lezcano-Casado & Martinez-Rubio, "Cheap Orthogonal Constraints in
Neural Networks", ICML 2019): ``exprnn.py`` (``ExpRNN`` cell: ``input_kernel`` Linear without bias,
Kaiming init, orthogonal ``recurrent_kernel`` = exp(skew-symmetric A), ``modrelu`` with a learned
bias), ``initialization.py`` (``henaff_init_``: 2x2 skew blocks with angles U(-pi, pi)), and
``1_copying.py`` (``copying_data``: K symbols, L blanks, a marker, K blanks; two RMSprop optimizers,
one for the orthogonal parameter with ``lr_orth`` = lr / 10 and one for everything else; the
"dynamic trivialization" that changes the base point every K steps). The orthogonal map is the
one upstreamed into PyTorch (``parametrizations.orthogonal(..., orthogonal_map="matrix_exp")``).

Unusual but correct: the trained tensor (``parametrizations.weight.original``) is not the weight
the network uses: the weight is recomputed from it (once per unrolled sequence, inside
``parametrize.cached()``); every 20 steps the weight is re-assigned to itself, which moves the base
point of the trivialization into the buffer and resets the unconstrained parameter to -I in place
(a jump in that parameter while the effective weight, and the loss, do not change); two optimizers
with a 10x different learning rate step on disjoint parameter sets.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrizations, parametrize

torch.set_num_threads(1)

N_SYMBOLS, K, L = 8, 6, 15          # symbols 1..8, 0 = blank, 9 = marker


class modrelu(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.b = nn.Parameter(torch.empty(features).uniform_(-0.01, 0.01))

    def forward(self, inputs):
        magnitude = F.relu(torch.abs(inputs) + self.b)
        return torch.sign(inputs) * magnitude


def henaff_skew(n, generator):
    diag = torch.empty(n // 2).uniform_(-math.pi, math.pi, generator=generator)
    A = torch.zeros(n, n)
    idx = torch.arange(0, n - 1, 2)
    A[idx, idx + 1] = diag
    A[idx + 1, idx] = -diag
    return A


class ExpRNN(nn.Module):
    def __init__(self, input_size, hidden_size, generator):
        super().__init__()
        self.hidden_size = hidden_size
        self.input_kernel = nn.Linear(input_size, hidden_size, bias=False)
        self.recurrent_kernel = nn.Linear(hidden_size, hidden_size, bias=False)
        self.nonlinearity = modrelu(hidden_size)
        nn.init.kaiming_normal_(self.input_kernel.weight.data, nonlinearity="relu")
        parametrizations.orthogonal(self.recurrent_kernel, orthogonal_map="matrix_exp")
        with torch.no_grad():        # Henaff initialisation: W = exp(A), A block-skew
            self.recurrent_kernel.weight = torch.matrix_exp(henaff_skew(hidden_size, generator))

    def default_hidden(self, x):
        return x.new_zeros(x.size(0), self.hidden_size)

    def forward(self, x, hidden):
        out = self.nonlinearity(self.input_kernel(x) + self.recurrent_kernel(hidden))
        return out, out

    @torch.no_grad()
    def change_base(self):
        """Dynamic trivialization: re-base at the current point (weight unchanged)."""
        self.recurrent_kernel.weight = self.recurrent_kernel.weight


class Model(nn.Module):
    def __init__(self, hidden_size, generator):
        super().__init__()
        self.rnn = ExpRNN(N_SYMBOLS + 2, hidden_size, generator)
        self.lin = nn.Linear(hidden_size, N_SYMBOLS + 1)

    def forward(self, inputs):
        state = self.rnn.default_hidden(inputs[:, 0])
        outputs = []
        with parametrize.cached():   # compute exp(A) once for the whole unrolled sequence
            for x in torch.unbind(inputs, dim=1):
                out_rnn, state = self.rnn(x, state)
                outputs.append(self.lin(out_rnn))
        return torch.stack(outputs, dim=1)


def copying_data(batch_size, generator):
    seq = torch.randint(1, N_SYMBOLS + 1, (batch_size, K), generator=generator)
    zeros1 = torch.zeros(batch_size, L, dtype=torch.long)
    zeros2 = torch.zeros(batch_size, K - 1, dtype=torch.long)
    zeros3 = torch.zeros(batch_size, K + L, dtype=torch.long)
    marker = torch.full((batch_size, 1), N_SYMBOLS + 1, dtype=torch.long)
    x = torch.cat([seq, zeros1, marker, zeros2], 1)
    y = torch.cat([zeros3, seq], 1)
    return F.one_hot(x, N_SYMBOLS + 2).float(), y


def main():
    torch.manual_seed(5544)
    g = torch.Generator().manual_seed(0)
    model = Model(hidden_size=64, generator=g)
    orth = model.rnn.recurrent_kernel.parametrizations.weight.original
    lr, lr_orth = 2e-3, 2e-4
    optim = torch.optim.RMSprop((p for p in model.parameters() if p is not orth), lr=lr)
    optim_orth = torch.optim.RMSprop([orth], lr=lr_orth)
    baseline = K * math.log(N_SYMBOLS) / (L + 2 * K)
    print(f"memoryless baseline loss {baseline:.3f}")

    val_x, val_y = copying_data(256, torch.Generator().manual_seed(123))
    for step in range(1, 71):
        x, y = copying_data(64, g)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, N_SYMBOLS + 1), y.reshape(-1))
        optim.zero_grad()
        optim_orth.zero_grad()
        loss.backward()
        optim.step()
        optim_orth.step()
        if step % 20 == 0:
            before = model.rnn.recurrent_kernel.weight.detach().clone()
            model.rnn.change_base()
            W = model.rnn.recurrent_kernel.weight.detach()
            assert torch.allclose(before, W, atol=1e-5)
            err = (W @ W.T - torch.eye(W.shape[0])).abs().max().item()
            print(f"step {step}: base changed, original reset to -I; |W W^T - I|max = {err:.1e}")
        if step % 10 == 0:
            with torch.no_grad():
                vl = model(val_x)
                val_loss = F.cross_entropy(vl.reshape(-1, N_SYMBOLS + 1), val_y.reshape(-1)).item()
                acc = (vl[:, -K:].argmax(-1) == val_y[:, -K:]).float().mean().item()
            print(f"step {step}: train loss {loss.item():.4f}  val loss {val_loss:.4f}  recall acc {acc:.3f}")


if __name__ == "__main__":
    main()
