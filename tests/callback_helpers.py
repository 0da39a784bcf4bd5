"""Shared pieces of the callback tests: tiny models, random-token data, a trainer, event-file readers."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import DataLoader

from study.attention import STOCK, AttentionSpec, active_taps, attend


def token_loader(
    n: int = 4, length: int = 16, vocab: int = 64, batch_size: int = 2, seed: int = 0
) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    samples = [{"input_ids": torch.randint(0, vocab, (length,), generator=g)} for _ in range(n)]
    return DataLoader(samples, batch_size=batch_size, shuffle=False)


class PlainAttention(L.LightningModule):
    """A plain PyTorch causal LM whose attention calls `study.attention.attend(..., layer=i)` (no transformers).

    No positional embedding: identical tokens give identical keys, hence exactly uniform attention.
    ``zero_queries`` makes every query zero, hence uniform causal attention whatever the tokens.
    ``record_taps`` collects, per training step, how many taps were open during the forward.
    """

    def __init__(
        self,
        spec: AttentionSpec = STOCK,
        n_layer: int = 2,
        n_head: int = 2,
        d: int = 16,
        vocab: int = 64,
        zero_queries: bool = False,
        lr: float = 1e-2,
        init_scale: float = 1.0,
    ) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.spec, self.n_head, self.lr = spec, n_head, lr
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(
            nn.ModuleDict(
                {
                    "q_proj": nn.Linear(d, d),
                    "k_proj": nn.Linear(d, d),
                    "v_proj": nn.Linear(d, d),
                    "o_proj": nn.Linear(d, d),
                }
            )
            for _ in range(n_layer)
        )
        for block in self.layers:
            for lin in (block["q_proj"], block["k_proj"]):
                nn.init.normal_(lin.weight, std=init_scale / d**0.5)
            if zero_queries:
                nn.init.zeros_(block["q_proj"].weight)
                nn.init.zeros_(block["q_proj"].bias)
        self.head = nn.Linear(d, vocab)
        self.taps_seen: list[tuple[int, int]] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        B, L_, D = x.shape

        def heads(t):
            return t.view(B, L_, self.n_head, D // self.n_head).transpose(1, 2)

        for i, block in enumerate(self.layers):
            out = attend(
                heads(block["q_proj"](x)),
                heads(block["k_proj"](x)),
                heads(block["v_proj"](x)),
                self.spec,
                layer=i,
            )
            x = x + block["o_proj"](out.transpose(1, 2).reshape(B, L_, D))
        return self.head(x)

    def _loss(self, batch):
        ids = batch["input_ids"]
        logits = self(ids)
        return nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
        )

    def training_step(self, batch, batch_idx):
        self.taps_seen.append((self.trainer.global_step, len(active_taps())))
        return self._loss(batch)

    def validation_step(self, batch, batch_idx):
        return self._loss(batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class LlamaModule(L.LightningModule):
    """A tiny `LlamaForCausalLM` under an `AttentionSpec` (grouped-query attention, rotary positions)."""

    def __init__(self, spec: AttentionSpec = STOCK) -> None:
        super().__init__()
        import transformers

        from study.attention import apply_attention_spec
        from tests.conftest import tiny_llama_config

        torch.manual_seed(0)
        config = tiny_llama_config(num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32, eos_token_id=0)
        self.model = apply_attention_spec(transformers.LlamaForCausalLM(config), spec)

    def training_step(self, batch, batch_idx):
        return self.model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss

    def validation_step(self, batch, batch_idx):
        return self.model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def make_trainer(root: Path, callbacks: list, max_steps: int = 2, **kwargs) -> L.Trainer:
    options = dict(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        logger=TensorBoardLogger(str(root), name="", version=0),  # explicit version: see offline.md
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        num_sanity_val_steps=0,
        limit_val_batches=2,
    )
    options.update(kwargs)
    return L.Trainer(**options)


def events(root: Path) -> EventAccumulator:
    acc = EventAccumulator(
        str(Path(root) / "version_0"),
        size_guidance={"scalars": 0, "images": 0, "histograms": 0, "tensors": 0},
    )
    acc.Reload()
    return acc


def scalars(root: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag -> [(step, value), ...] in write order."""
    acc = events(root)
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def uniform_attention_gpt2():
    """A 2-layer GPT-2 module (width 32, 2 heads, learning rate 0) whose queries are zero: every causal row is
    uniform over its visible keys, so row t's weights are 1/(t + 1), in every layer and head."""
    from study.model import CausalLMModule

    module = CausalLMModule(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=64, learning_rate=0.0)
    with torch.no_grad():
        for block in module.model.transformer.h:
            block.attn.c_attn.weight[:, :32] = 0  # Conv1D (in, 3d): columns [q | k | v]
            block.attn.c_attn.bias[:32] = 0
    return module
