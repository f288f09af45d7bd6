"""Modelled on pytorch/examples time_sequence_prediction (generate_sine_wave.py + train.py).

Two stacked nn.LSTMCell's unrolled by hand over noisy sine waves in float64; trained with
torch.optim.LBFGS and a closure (optimizer.step(closure) re-evaluates the loss several times
per step); after every step the model predicts 'future' values autoregressively under
torch.no_grad() on held-out sequences and reports the test loss.  The data generation is
inlined (no traindata.pt); the final state_dict is saved."""
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

# ---------------------------------------------------------------- generate_sine_wave.py
np.random.seed(2)
T, L, N = 20, 120, 40
x = np.empty((N, L), "int64")
x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
data = np.sin(x / 1.0 / T).astype("float64")

class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 51)
        self.lstm2 = nn.LSTMCell(51, 51)
        self.linear = nn.Linear(51, 1)

    def forward(self, input, future=0):
        outputs = []
        h_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        c_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), 51, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), 51, dtype=torch.double)
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
        return torch.cat(outputs, dim=1)

if __name__ == "__main__":
    np.random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)   # thousands of tiny LSTMCell ops: intra-op threads only add overhead
    input = torch.from_numpy(data[3:, :-1])
    target = torch.from_numpy(data[3:, 1:])
    test_input = torch.from_numpy(data[:3, :-1])
    test_target = torch.from_numpy(data[:3, 1:])
    seq = Sequence()
    seq.double()
    criterion = nn.MSELoss()
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8, max_iter=3)
    n_closure_calls = 0
    for i in range(20):
        print("STEP: ", i)

        def closure():
            global n_closure_calls
            n_closure_calls += 1
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            print("loss:", loss.item())
            loss.backward()
            return loss

        optimizer.step(closure)
        # begin to predict, no need to track gradient here
        with torch.no_grad():
            future = 50
            pred = seq(test_input, future=future)
            loss = criterion(pred[:, :-future], test_target)
            print("test loss:", loss.item())
            y = pred.detach().numpy()
    print("closure evaluations:", n_closure_calls, "future prediction range:", y[:, -future:].min(), y[:, -future:].max())
    torch.save(seq.state_dict(), "time_sequence_lbfgs.pt")
