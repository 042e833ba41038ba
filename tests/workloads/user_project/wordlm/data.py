"""A corpus of token ids from a seeded Markov chain over :data:`~wordlm.model.VOCAB` words (each word has three
likely successors, so a language model can learn it), cut into ``(ids, next ids)`` windows of ``BPTT`` tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from wordlm.model import VOCAB

BPTT = 12


class Windows(Dataset):
    """Consecutive windows of a token stream: item ``i`` is ``(tokens[i*T:(i+1)*T], tokens[i*T+1:(i+1)*T+1])``."""

    def __init__(self, tokens: torch.Tensor, bptt: int = BPTT):
        self.tokens, self.bptt = tokens, bptt

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.bptt

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        lo = i * self.bptt
        return self.tokens[lo:lo + self.bptt], self.tokens[lo + 1:lo + self.bptt + 1]


def corpus(n: int, seed: int) -> torch.Tensor:
    """``n`` int64 token ids of the chain made from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, VOCAB, (VOCAB, 3), generator=g)
    tokens = torch.empty(n, dtype=torch.int64)
    tokens[0] = 0
    picks = torch.randint(0, 3, (n,), generator=g)
    noise = torch.rand(n, generator=g) < 0.1
    random_words = torch.randint(0, VOCAB, (n,), generator=g)
    for t in range(1, n):
        tokens[t] = random_words[t] if noise[t] else successors[tokens[t - 1], picks[t]]
    return tokens


def make_sets(seed: int = 0) -> tuple[Windows, Windows]:
    """(train, test): 6,000 and 1,200 tokens of the same chain."""
    tokens = corpus(7_200, seed)
    return Windows(tokens[:6_000]), Windows(tokens[6_000:])


def nll(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The example's criterion: negative log-likelihood of the next word (the model gives log probabilities)."""
    return F.nll_loss(out, target.reshape(-1))
