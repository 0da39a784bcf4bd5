"""NgramBaseline: the held-out unigram and bigram losses of the run's own tokens, equal to a brute-force count, on
exactly val/loss's targets, logged at step 0 without changing training."""

from __future__ import annotations

import math
from collections import Counter

import lightning as L
import pytest
import torch

from study import tags
from study.callbacks import NgramBaseline
from study.callbacks.ngram import fit_ngrams, heldout_losses, ngram_losses
from tests.callback_helpers import make_trainer, scalars


def brute_force(train, val, V, d=0.75):
    """Loops and dicts. ``train``: [(block, mask)], ``val``: batches [[(block, mask), ...], ...] (lists of ints)."""
    uni, big = Counter(), Counter()
    for block, mask in train:
        for t, tok in enumerate(block):
            if mask[t]:
                uni[tok] += 1
        for t in range(1, len(block)):
            if mask[t - 1] and mask[t]:
                big[(block[t - 1], block[t])] += 1
    n = sum(uni.values())
    context, followers = Counter(), Counter()
    for (v, _), c in big.items():
        context[v] += c
        followers[v] += 1

    def p_uni(w):
        return (uni[w] + 1) / (n + V)

    def p_big(v, w):
        if context[v] == 0:
            return p_uni(w)
        return max(big[(v, w)] - d, 0) / context[v] + d * followers[v] / context[v] * p_uni(w)

    sums, weight = {"unigram": 0.0, "bigram": 0.0}, 0
    for batch in val:
        nll_u, nll_b = [], []
        for block, mask in batch:
            for t in range(1, len(block)):
                if mask[t - 1] and mask[t]:
                    nll_u.append(-math.log(p_uni(block[t])))
                    nll_b.append(-math.log(p_big(block[t - 1], block[t])))
        numel = len(batch) * len(batch[0][0])
        sums["unigram"] += sum(nll_u) / len(nll_u) * numel
        sums["bigram"] += sum(nll_b) / len(nll_b) * numel
        weight += numel
    return {k: s / weight for k, s in sums.items()}


def as_batch(rows):
    return {"input_ids": torch.tensor([b for b, _ in rows]), "attention_mask": torch.tensor([m for _, m in rows])}


TRAIN = [([1, 2, 3, 1, 2, 4], [1] * 6), ([2, 3, 1, 2, 3, 3], [1] * 6), ([4, 4, 1, 2, 0, 0], [1, 1, 1, 1, 0, 0])]
VAL = [[([1, 2, 3, 4, 1, 5], [1] * 6), ([3, 1, 2, 2, 0, 0], [1, 1, 1, 1, 0, 0])], [([5, 5, 2, 3, 1, 2], [1] * 6)]]


@pytest.mark.parametrize("discount", [0.75, 0.3, 1.0])
def test_losses_equal_a_brute_force_count(discount):
    got = ngram_losses([as_batch(TRAIN[:2]), as_batch(TRAIN[2:])], [as_batch(b) for b in VAL], vocab_size=7,
                       discount=discount)  # fmt: skip
    want = brute_force(TRAIN, VAL, V=7, d=discount)
    assert got["unigram"] == pytest.approx(want["unigram"], abs=1e-12)
    assert got["bigram"] == pytest.approx(want["bigram"], abs=1e-12)
    assert got["bigram"] < got["unigram"]  # this corpus repeats 1 -> 2 -> 3


def test_distributions_sum_to_one_for_seen_and_unseen_contexts():
    ngrams = fit_ngrams([as_batch(TRAIN)], vocab_size=9)  # 5..8 never occur, 0 only as padding: unseen contexts
    w = torch.arange(9)
    assert float(ngrams.unigram_prob(w).sum()) == pytest.approx(1.0, abs=1e-12)
    seen = [v for v in range(9) if ngrams.context_counts[v] > 0]
    assert seen == [1, 2, 3, 4]
    for v in range(9):
        assert float(ngrams.bigram_prob(torch.full((9,), v), w).sum()) == pytest.approx(1.0, abs=1e-12), v
    assert torch.equal(ngrams.bigram_prob(torch.full((9,), 7), w), ngrams.unigram_prob(w))  # unseen: P_uni


def test_padding_is_excluded_from_counts_and_targets():
    padded = as_batch(TRAIN)
    other = dict(padded, input_ids=padded["input_ids"].masked_fill(padded["attention_mask"] == 0, 6))
    a, b = fit_ngrams([padded], vocab_size=7), fit_ngrams([other], vocab_size=7)
    assert torch.equal(a.unigram_counts, b.unigram_counts) and torch.equal(a.bigram_keys, b.bigram_keys)
    assert int(a.unigram_counts.sum()) == 16 and float(a.unigram_counts[0]) == 0  # the pads' id 0 is not counted
    assert int(a.bigram_counts.sum()) == 5 + 5 + 3
    val = as_batch(VAL[0])
    val_other = dict(val, input_ids=val["input_ids"].masked_fill(val["attention_mask"] == 0, 6))
    assert heldout_losses(a, [val]) == heldout_losses(a, [val_other])
    # the same blocks without their padding, one batch each (weight = numel of the batch): the same losses
    trimmed = [{"input_ids": torch.tensor([[3, 1, 2, 2]])}]
    assert heldout_losses(a, [as_batch(VAL[0][1:])]) == pytest.approx(heldout_losses(a, trimmed), abs=1e-15)


def test_max_train_tokens_counts_the_first_tokens_only():
    ids = torch.tensor([[1, 2, 3, 1, 2, 4], [2, 3, 1, 2, 3, 3]])
    capped = fit_ngrams([{"input_ids": ids}], vocab_size=7, max_train_tokens=8)
    cut = fit_ngrams([{"input_ids": ids[:1]}, {"input_ids": ids[1:, :2]}], vocab_size=7)
    assert torch.equal(capped.unigram_counts, cut.unigram_counts)
    assert torch.equal(capped.bigram_keys, cut.bigram_keys) and torch.equal(capped.bigram_counts, cut.bigram_counts)
    with pytest.raises(ValueError, match="max_train_tokens"):
        NgramBaseline(max_train_tokens=0)
    with pytest.raises(ValueError, match="discount"):
        NgramBaseline(discount=0.0)


def deterministic_corpus(n_blocks, V=16, L_=32, seed=0):
    """Blocks where the next token is (7 * previous + 3) mod V: a permutation, so every token is a context."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, V, (n_blocks,), generator=g)
    rows = [start]
    for _ in range(L_ - 1):
        rows.append((7 * rows[-1] + 3) % V)
    return torch.stack(rows, dim=1)


def test_a_deterministic_successor_gives_a_bigram_loss_near_zero_and_shuffled_tokens_do_not():
    V = 16
    train, val = deterministic_corpus(600, V), deterministic_corpus(100, V, seed=1)
    losses = ngram_losses([{"input_ids": train}], [{"input_ids": val}], vocab_size=V)
    assert losses["unigram"] == pytest.approx(math.log(V), abs=0.03)  # successors of uniform starts: near uniform
    assert 0 < losses["bigram"] < 0.01  # only the discounted mass d/c(v) ~ 0.75/1160 is lost
    g = torch.Generator().manual_seed(2)
    shuffled = [t.reshape(-1)[torch.randperm(t.numel(), generator=g)].reshape(t.shape) for t in (train, val)]
    losses = ngram_losses([{"input_ids": shuffled[0]}], [{"input_ids": shuffled[1]}], vocab_size=V)
    # no structure left: the bigram pays only its estimation noise, about V / (2 N / V) nats over the unigram
    assert losses["bigram"] == pytest.approx(losses["unigram"], abs=0.02)
    assert losses["unigram"] == pytest.approx(math.log(V), abs=0.03)


def _fit(tmp_path, name, datamodule, callbacks):
    from study.model import CausalLMModule

    L.seed_everything(0)
    module = CausalLMModule(n_layer=1, n_embd=16, n_head=2, n_positions=16, vocab_size=datamodule.vocab_size,
                            learning_rate=1e-2, warmup_steps=1, dropout=0.1)  # fmt: skip  dropout: uses the RNG
    make_trainer(tmp_path / name, callbacks, max_steps=4, val_check_interval=4, log_every_n_steps=1).fit(
        module, datamodule=datamodule
    )
    return scalars(tmp_path / name)


def test_end_to_end_logged_at_step_0_and_training_unchanged(text_files, tmp_path):
    from study.data import TextDataModule

    train, val = text_files
    dm = TextDataModule("files", train_files=[train], val_files=[val], vocab_size=300, block_size=16, batch_size=4,
                        cache_dir=str(tmp_path / "cache"))  # fmt: skip
    dm.prepare_data()
    callback = NgramBaseline()
    with_it = _fit(tmp_path, "with", dm, [callback])
    without = _fit(tmp_path, "without", dm, [])
    assert with_it[tags.TRAIN_LOSS] == without[tags.TRAIN_LOSS] and len(with_it[tags.TRAIN_LOSS]) == 4
    assert with_it[tags.VAL_LOSS] == without[tags.VAL_LOSS]
    assert tags.VAL_UNIGRAM_LOSS not in without
    # the values a direct call computes: every training block, the first 2 validation batches (limit_val_batches)
    val_batches = [{"input_ids": dm.val_data[i : i + 4]["input_ids"]} for i in (0, 4)]
    want = ngram_losses([{"input_ids": dm.train_data[:]["input_ids"]}], val_batches, vocab_size=dm.vocab_size)
    assert callback.losses == pytest.approx(want, abs=1e-12)
    assert with_it[tags.VAL_UNIGRAM_LOSS] == [(0, pytest.approx(want["unigram"], rel=1e-6))]
    assert with_it[tags.VAL_BIGRAM_LOSS] == [(0, pytest.approx(want["bigram"], rel=1e-6))]
    assert want["bigram"] < want["unigram"] < math.log(dm.vocab_size)
