"""`NgramBaseline`: the held-out loss of a unigram and of a smoothed bigram model fitted on the run's own training
tokens, logged at step 0 beside ``val/loss``, so that a model trained from scratch shows it uses its context (it
beats the bigram) and not only the token frequencies (the unigram).

The computation is a pure function of token batches (`ngram_losses`, `fit_ngrams`, `heldout_losses`), which the
report can call on any blocks; the callback only finds the run's data and logs the two numbers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, IterableDataset
from typing_extensions import override

from study import tags
from study.callbacks.base import write_scalars

DISCOUNT = 0.75  # the absolute discount of Kneser and Ney's and Chen and Goodman's experiments
_COUNT_BATCH = 256  # blocks per batch when the training set is read for counting (the order does not matter)


def _ids_and_mask(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids (B, L) int64, keep (B, L) bool) of a batch: a dict with ``input_ids`` and optionally
    ``attention_mask`` (0 marks padding), or a tensor of ids."""
    if isinstance(batch, Mapping):
        ids, mask = batch["input_ids"], batch.get("attention_mask")
    elif isinstance(batch, torch.Tensor):
        ids, mask = batch, None
    else:
        raise TypeError(f"a batch must be a dict with 'input_ids' or a tensor of token ids, got {type(batch).__name__}")
    ids = torch.as_tensor(ids).detach().cpu().long()
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, length), got shape {tuple(ids.shape)}")
    keep = torch.ones_like(ids, dtype=torch.bool) if mask is None else torch.as_tensor(mask).detach().cpu().reshape(ids.shape) != 0
    return ids, keep


def _pairs(ids: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(previous, next) token of every position 1..L-1 of every block where both tokens are kept: the targets of the
    shifted language-model loss, within blocks (no pair crosses a block boundary)."""
    both = keep[:, :-1] & keep[:, 1:]
    return ids[:, :-1][both], ids[:, 1:][both]


@dataclass(frozen=True)
class Ngrams:
    """Unigram and bigram counts of training tokens, and the two smoothed models they define (float64).

    Unigram: add-one (Laplace) over the V ids, P_uni(w) = (c(w) + 1) / (N + V).
    Bigram: absolute discounting interpolated with P_uni,
    P(w|v) = max(c(v,w) - d, 0) / c(v) + d N1+(v .) / c(v) P_uni(w), where c(v) = sum_w c(v,w) counts v as a
    context and N1+(v .) the distinct w seen after v; a context never seen in training gets P_uni(w). For
    0 < d <= 1 both sum to 1 over w.
    """

    vocab_size: int
    discount: float
    unigram_counts: torch.Tensor  # (V,) float64
    bigram_keys: torch.Tensor  # sorted int64 v * V + w of the bigrams seen (sparse: V^2 can be billions)
    bigram_counts: torch.Tensor  # float64, one per key
    context_counts: torch.Tensor  # (V,) float64 c(v)
    followers: torch.Tensor  # (V,) float64 N1+(v .)

    @property
    def tokens(self) -> int:
        return int(self.unigram_counts.sum())

    def unigram_prob(self, w: torch.Tensor) -> torch.Tensor:
        return (self.unigram_counts[w] + 1.0) / (self.unigram_counts.sum() + self.vocab_size)

    def bigram_count(self, v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        key = v.long() * self.vocab_size + w.long()
        if len(self.bigram_keys) == 0:
            return torch.zeros(key.shape, dtype=torch.float64)
        at = torch.searchsorted(self.bigram_keys, key).clamp(max=len(self.bigram_keys) - 1)
        return torch.where(self.bigram_keys[at] == key, self.bigram_counts[at], 0.0)

    def bigram_prob(self, v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        v, w = torch.as_tensor(v).long(), torch.as_tensor(w).long()
        d, c_v, p_uni = self.discount, self.context_counts[v], self.unigram_prob(w)
        seen = (self.bigram_count(v, w) - d).clamp(min=0.0) + d * self.followers[v] * p_uni
        return torch.where(c_v > 0, seen / c_v.clamp(min=1.0), p_uni)


def _check_ids(ids: torch.Tensor, vocab_size: int, what: str) -> None:
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"{what} token ids span [{int(ids.min())}, {int(ids.max())}], outside a vocabulary of "
                         f"{vocab_size}")  # fmt: skip


def _capped(batches: Iterable[Any], max_tokens: int | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches' (ids, keep), the kept tokens cut after the first ``max_tokens`` of them in reading order (row
    by row), and no batch read past that point."""
    left = math.inf if max_tokens is None else max_tokens
    for batch in batches:
        if left <= 0:
            return
        ids, keep = _ids_and_mask(batch)
        if keep.sum() > left:
            keep = keep & (keep.reshape(-1).cumsum(0) <= left).reshape(keep.shape)
        left -= int(keep.sum())
        yield ids, keep


def fit_ngrams(
    train_batches: Iterable[Any],
    vocab_size: int | None = None,
    discount: float = DISCOUNT,
    max_train_tokens: int | None = None,
) -> Ngrams:
    """Count unigrams and within-block bigrams of ``train_batches`` (dicts with ``input_ids`` (B, L) and optional
    ``attention_mask``, or id tensors; masked tokens are not counted, nor bigrams touching them) into `Ngrams`.

    Args:
        train_batches: the training token blocks, in any batching (counts do not depend on it).
        vocab_size: V; None: the largest id seen + 1.
        discount: the bigram's absolute discount d, 0 < d <= 1.
        max_train_tokens: count only the first this many (unmasked) tokens (None: all).
    """
    if not 0.0 < discount <= 1.0:
        raise ValueError(f"discount must be in (0, 1], got {discount!r}")
    if max_train_tokens is not None and (isinstance(max_train_tokens, bool) or not isinstance(max_train_tokens, int)
                                         or max_train_tokens < 1):  # fmt: skip
        raise ValueError(f"max_train_tokens must be None or a positive integer, got {max_train_tokens!r}")
    tokens, prev, nxt = [], [], []
    for ids, keep in _capped(train_batches, max_train_tokens):
        tokens.append(ids[keep])
        p, n = _pairs(ids, keep)
        prev.append(p)
        nxt.append(n)
    tokens_all = torch.cat(tokens) if tokens else torch.zeros(0, dtype=torch.long)
    if tokens_all.numel() == 0:
        raise ValueError("no training tokens to count")
    V = int(tokens_all.max()) + 1 if vocab_size is None else int(vocab_size)
    _check_ids(tokens_all, V, "training")
    prev_all, next_all = torch.cat(prev), torch.cat(nxt)
    keys, counts = torch.unique(prev_all * V + next_all, sorted=True, return_counts=True)
    contexts = keys // V
    return Ngrams(
        vocab_size=V,
        discount=float(discount),
        unigram_counts=torch.bincount(tokens_all, minlength=V).double(),
        bigram_keys=keys,
        bigram_counts=counts.double(),
        context_counts=torch.bincount(contexts, weights=counts.double(), minlength=V).double(),
        followers=torch.bincount(contexts, minlength=V).double(),
    )


def heldout_losses(ngrams: Ngrams, val_batches: Iterable[Any]) -> dict[str, float]:
    """Mean negative log-likelihood (nats, float64) of the held-out targets under the unigram and the bigram model:
    ``{"unigram": ..., "bigram": ...}``.

    The targets are those of `CausalLMModule`'s validation loss: positions 1..L-1 of each block, each predicted
    from the token before it (pairs with a masked token left out). It averages as ``val/loss`` does: each batch's
    mean over its targets, weighted by the batch's ``input_ids.numel()`` (`CausalLMModule.validation_step`); for
    unpadded blocks of one length that is the mean over every held-out target.
    """
    totals = {"unigram": 0.0, "bigram": 0.0}
    weight = 0.0
    for batch in val_batches:
        ids, keep = _ids_and_mask(batch)
        v, w = _pairs(ids, keep)
        if w.numel() == 0:
            continue
        _check_ids(ids[keep], ngrams.vocab_size, "held-out")
        totals["unigram"] += -torch.log(ngrams.unigram_prob(w)).mean().item() * ids.numel()
        totals["bigram"] += -torch.log(ngrams.bigram_prob(v, w)).mean().item() * ids.numel()
        weight += ids.numel()
    if weight == 0:
        raise ValueError("no held-out targets (every block shorter than 2 unmasked tokens?)")
    return {name: total / weight for name, total in totals.items()}


def ngram_losses(
    train_batches: Iterable[Any],
    val_batches: Iterable[Any],
    vocab_size: int | None = None,
    discount: float = DISCOUNT,
    max_train_tokens: int | None = None,
) -> dict[str, float]:
    """The held-out unigram and bigram losses, ``{"unigram": ..., "bigram": ...}`` in nats: `fit_ngrams` on
    ``train_batches``, `heldout_losses` on ``val_batches`` (with ``vocab_size`` None, V is the largest id in
    either + 1)."""
    val_batches = list(val_batches)
    if vocab_size is None:
        train_batches = [{"input_ids": ids, "attention_mask": keep} for ids, keep in _capped(train_batches, max_train_tokens)]
        vocab_size = 1 + max(int(ids[keep].max()) for ids, keep in map(_ids_and_mask, [*train_batches, *val_batches])
                             if keep.any())  # fmt: skip
    return heldout_losses(fit_ngrams(train_batches, vocab_size, discount, max_train_tokens), val_batches)


# ---- the run's data ---------------------------------------------------------------------------------------------
def _loaders(loaders: Any) -> list[Any]:
    if loaders is None:
        return []
    if isinstance(loaders, Mapping):
        return list(loaders.values())
    if isinstance(loaders, Sequence) and not isinstance(loaders, (str, bytes)):
        return list(loaders)
    return [loaders]


def _train_batches(trainer: L.Trainer) -> Iterator[Any]:
    """The training set, read in order from the datasets under the run's training loaders (the datamodule's, else
    the trainer's): a new DataLoader over each dataset, so the run's own loader (its sampler, its resume position)
    is never iterated, and the counts do not depend on the shuffle."""
    datamodule = getattr(trainer, "datamodule", None)
    loaders = _loaders(datamodule.train_dataloader() if datamodule is not None else trainer.train_dataloader)
    for loader in loaders:
        if not isinstance(loader, DataLoader):
            yield from loader  # a plain iterable of batches: a fresh iterator of it
            continue
        dataset = loader.dataset
        if isinstance(dataset, IterableDataset):
            yield from DataLoader(dataset, batch_size=loader.batch_size, collate_fn=loader.collate_fn)
        else:
            yield from DataLoader(dataset, batch_size=max(loader.batch_size or 1, _COUNT_BATCH), shuffle=False,
                                  collate_fn=loader.collate_fn)  # fmt: skip


def _val_batches(trainer: L.Trainer) -> Iterator[Any]:
    """The batches validation averages over: the validation loaders (the datamodule's, else the trainer's), each
    cut at the number of batches the trainer validates (``limit_val_batches``)."""
    datamodule = getattr(trainer, "datamodule", None)
    loaders = _loaders(datamodule.val_dataloader() if datamodule is not None else trainer.val_dataloaders)
    limits = list(trainer.num_val_batches)
    if len(limits) != len(loaders):  # scoring other batches than validation's would compare two held-out sets
        raise RuntimeError(f"NgramBaseline: the trainer validates {len(limits)} loader(s) but {len(loaders)} were found; "
                           "the baselines would not be scored on validation's batches")
    for loader, limit in zip(loaders, limits):
        yield from itertools.islice(loader, None if math.isinf(limit) else int(limit))


def _vocab_size(pl_module: L.LightningModule) -> int | None:
    """V from the model: its config's ``vocab_size``, else its output embedding's rows; None if it has neither."""
    model = getattr(pl_module, "model", pl_module)
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(size, int) and size > 0:
        return size
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None else None


class NgramBaseline(Callback):
    """Log, at step 0, the held-out loss of a unigram and a bigram model fitted on the run's training tokens
    (`tags.VAL_UNIGRAM_LOSS`, `tags.VAL_BIGRAM_LOSS`): what a model that ignores its context, and one that looks
    only at the previous token, reach on exactly the targets of ``val/loss``. A model that uses attention must
    end below the bigram; one that only learned token frequencies ends near the unigram.

    Unigram: add-one smoothed over the model's V ids. Bigram: absolute discounting (``discount`` d), interpolated
    with that unigram: P(w|v) = max(c(v,w) - d, 0)/c(v) + d N1+(v .)/c(v) P_uni(w), P_uni(w) for a context never
    seen (`Ngrams`); nothing is tuned on held-out data. Counts are of the unmasked training tokens and of the
    bigrams within blocks (no pair crosses a block boundary nor touches padding). The held-out loss is the mean
    negative log-likelihood in nats (float64) of positions 1..L-1 of each validation block given the previous
    token, averaged as ``val/loss`` is (each batch's mean weighted by its ``input_ids.numel()``: for unpadded
    blocks of one length, the mean over every target), over the batches validation runs (``limit_val_batches``).

    The data: the datamodule's loaders if there is one, else the trainer's; batches are dicts with ``input_ids``
    and optional ``attention_mask`` (0 = padding). The training set is read in order from the loader's dataset
    through a new DataLoader, so the run's own training loader (its shuffle, its resume position) is never
    iterated, and the global random state is restored afterwards: a run trains identically with and without this
    callback. It runs once, on global rank 0 (under DDP over the unsharded validation loader, cut at rank 0's
    number of batches); a resumed run (global step > 0) has its values already; no validation, no values. On the
    from-scratch sweep (vocabulary 2048, the Shakespeare training split) it costs a fraction of a second.

    Args:
        discount: the bigram's absolute discount d, 0 < d <= 1.
        max_train_tokens: count only the first this many training tokens (None: all). A huge hub dataset needs it
            (and an endless streaming one must have it): the counts are read in one pass at fit start.

    Attributes:
        losses: ``{"unigram": ..., "bigram": ...}`` once computed (None before).

    Example::

        trainer = L.Trainer(callbacks=[BaselineValidation(), NgramBaseline()])  # val/loss at step 0 beside both
    """

    def __init__(self, discount: float = DISCOUNT, max_train_tokens: int | None = None) -> None:
        if isinstance(discount, bool) or not isinstance(discount, (int, float)) or not 0.0 < discount <= 1.0:
            raise ValueError(f"discount must be in (0, 1], got {discount!r}")
        if max_train_tokens is not None and (isinstance(max_train_tokens, bool) or not isinstance(max_train_tokens, int)
                                             or max_train_tokens < 1):  # fmt: skip
            raise ValueError(f"max_train_tokens must be None or a positive integer, got {max_train_tokens!r}")
        self.discount, self.max_train_tokens = float(discount), max_train_tokens
        self.losses: dict[str, float] | None = None

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step != 0 or trainer.limit_val_batches == 0 or trainer.val_dataloaders is None:
            return
        if not trainer.is_global_zero:
            return
        with torch.random.fork_rng(devices=[]):  # a DataLoader's iterator draws its base seed from the global RNG
            self.losses = ngram_losses(_train_batches(trainer), _val_batches(trainer), _vocab_size(pl_module),
                                       self.discount, self.max_train_tokens)  # fmt: skip
        write_scalars(trainer, {tags.VAL_UNIGRAM_LOSS: self.losses["unigram"],
                                tags.VAL_BIGRAM_LOSS: self.losses["bigram"]}, step=0)  # fmt: skip


__all__ = ["DISCOUNT", "NgramBaseline", "Ngrams", "fit_ngrams", "heldout_losses", "ngram_losses"]
