"""Classifying names by language with a hand-written character-level RNN, one name at a time.

Modelled on: the PyTorch tutorial "NLP From Scratch: Classifying Names with a Character-Level RNN"
(https://pytorch.org/tutorials/intermediate/char_rnn_classification_tutorial.html,
pytorch/tutorials intermediate_source/char_rnn_classification_tutorial.py).
Habits reproduced: an RNN module written by hand (i2h/i2o Linear layers over the
concatenated input and hidden, LogSoftmax), one-hot lineToTensor, randomTrainingExample(),
rnn.zero_grad() then a Python loop over characters, NLLLoss, and the manual update
`p.data.add_(p.grad.data, alpha=-learning_rate)`; running loss printed every few iterations,
then a confusion matrix and predict() under torch.no_grad(). The fake "languages" are
letter distributions drawn from the seed instead of the downloaded name files.
"""
import argparse
import math
import random
import string
import time

import torch
import torch.nn as nn

all_letters = string.ascii_letters + " .,;'"
n_letters = len(all_letters)

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1000, help="n_iters: training names seen (one SGD update each)")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--n_hidden", type=int, default=128)
parser.add_argument("--learning_rate", type=float, default=0.005)
parser.add_argument("--print_every", type=int, default=3)
args = parser.parse_args()

random.seed(args.seed)
torch.manual_seed(args.seed)

# Build some fake languages: each one favours its own handful of letters and name length.
all_categories = ["Arnish", "Belvian", "Corrin", "Dovak", "Esmeri"]
n_categories = len(all_categories)
category_lines = {}
for category in all_categories:
    favourite = random.sample(string.ascii_lowercase, 6)
    length = random.randint(4, 8)
    names = []
    for _ in range(40):
        letters = [random.choice(favourite) if random.random() < 0.7 else random.choice(string.ascii_lowercase)
                   for _ in range(length + random.randint(-1, 2))]
        names.append("".join(letters).capitalize())
    category_lines[category] = names


# Find letter index from all_letters, e.g. "a" = 0
def letterToIndex(letter):
    return all_letters.find(letter)


# Turn a line into a <line_length x 1 x n_letters>,
# or an array of one-hot letter vectors
def lineToTensor(line):
    tensor = torch.zeros(len(line), 1, n_letters)
    for li, letter in enumerate(line):
        tensor[li][0][letterToIndex(letter)] = 1
    return tensor


class RNN(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super(RNN, self).__init__()

        self.hidden_size = hidden_size

        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
        self.i2o = nn.Linear(input_size + hidden_size, output_size)
        self.softmax = nn.LogSoftmax(dim=1)

    def forward(self, input, hidden):
        combined = torch.cat((input, hidden), 1)
        hidden = self.i2h(combined)
        output = self.i2o(combined)
        output = self.softmax(output)
        return output, hidden

    def initHidden(self):
        return torch.zeros(1, self.hidden_size)


rnn = RNN(n_letters, args.n_hidden, n_categories)


def categoryFromOutput(output):
    top_n, top_i = output.topk(1)
    category_i = top_i[0].item()
    return all_categories[category_i], category_i


def randomChoice(l):
    return l[random.randint(0, len(l) - 1)]


def randomTrainingExample():
    category = randomChoice(all_categories)
    line = randomChoice(category_lines[category])
    category_tensor = torch.tensor([all_categories.index(category)], dtype=torch.long)
    line_tensor = lineToTensor(line)
    return category, line, category_tensor, line_tensor


criterion = nn.NLLLoss()
learning_rate = args.learning_rate  # If you set this too high, it might explode. If too low, it might not learn


def train(category_tensor, line_tensor):
    hidden = rnn.initHidden()

    rnn.zero_grad()

    for i in range(line_tensor.size()[0]):
        output, hidden = rnn(line_tensor[i], hidden)

    loss = criterion(output, category_tensor)
    loss.backward()

    # Add parameters' gradients to their values, multiplied by learning rate
    for p in rnn.parameters():
        p.data.add_(p.grad.data, alpha=-learning_rate)

    return output, loss.item()


n_iters = args.steps
print_every = args.print_every
plot_every = max(1, args.print_every)

# Keep track of losses for plotting
current_loss = 0
all_losses = []


def timeSince(since):
    now = time.time()
    s = now - since
    m = math.floor(s / 60)
    s -= m * 60
    return "%dm %ds" % (m, s)


start = time.time()

for iter in range(1, n_iters + 1):
    category, line, category_tensor, line_tensor = randomTrainingExample()
    output, loss = train(category_tensor, line_tensor)
    current_loss += loss

    # Print ``iter`` number, loss, name and guess
    if iter % print_every == 0:
        guess, guess_i = categoryFromOutput(output)
        correct = "✓" if guess == category else "✗ (%s)" % category
        print("%d %d%% (%s) %.4f %s / %s %s" % (iter, iter / n_iters * 100, timeSince(start), loss, line, guess, correct))

    # Add current loss avg to list of losses
    if iter % plot_every == 0:
        all_losses.append(current_loss / plot_every)
        current_loss = 0

# Keep track of correct guesses in a confusion matrix
confusion = torch.zeros(n_categories, n_categories)
n_confusion = 50


# Just return an output given a line
def evaluate(line_tensor):
    hidden = rnn.initHidden()

    for i in range(line_tensor.size()[0]):
        output, hidden = rnn(line_tensor[i], hidden)

    return output


# Go through a bunch of examples and record which are correctly guessed
with torch.no_grad():
    for i in range(n_confusion):
        category, line, category_tensor, line_tensor = randomTrainingExample()
        output = evaluate(line_tensor)
        guess, guess_i = categoryFromOutput(output)
        category_i = all_categories.index(category)
        confusion[category_i][guess_i] += 1

# Normalize by dividing every row by its sum
for i in range(n_categories):
    confusion[i] = confusion[i] / confusion[i].sum().clamp(min=1)
print("confusion diagonal:", [round(v, 2) for v in confusion.diag().tolist()])


def predict(input_line, n_predictions=3):
    print("\n> %s" % input_line)
    with torch.no_grad():
        output = evaluate(lineToTensor(input_line))

        # Get top N categories
        topv, topi = output.topk(n_predictions, 1, True)
        predictions = []

        for i in range(n_predictions):
            value = topv[0][i].item()
            category_index = topi[0][i].item()
            print("(%.2f) %s" % (value, all_categories[category_index]))
            predictions.append([value, all_categories[category_index]])
    return predictions


predict(category_lines["Arnish"][0])
predict(category_lines["Dovak"][1])
