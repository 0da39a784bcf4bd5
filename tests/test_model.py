"""CausalLMModule: loading, validation, optimisation, logging."""

import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from study import tags
from study.attention import AttentionSpec, current_spec
from study.model import CausalLMModule, warmup_cosine

TINY = dict(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=64)


def batches(n=8, length=16, seed=0):
    ids = torch.randint(0, 64, (n, length), generator=torch.Generator().manual_seed(seed))
    return DataLoader([{"input_ids": row} for row in ids], batch_size=4)


def test_spec_reaches_every_layer():
    module = CausalLMModule(AttentionSpec(temperature=0.5, top_k=3), **TINY)
    assert set(current_spec(module.model).values()) == {AttentionSpec(temperature=0.5, top_k=3)}


def test_from_pretrained_local_directory(tmp_path):
    """The real loading path (`from_pretrained`), on a tiny model saved to a temporary folder."""
    source = CausalLMModule(**TINY)
    source.model.save_pretrained(tmp_path / "tiny")
    loaded = CausalLMModule(AttentionSpec(top_k=2), model_name_or_path=str(tmp_path / "tiny"), vocab_size=64)
    ids = torch.randint(0, 64, (1, 10))
    for m in (source, loaded):
        m.eval()
    apply = source.model(input_ids=ids).logits
    assert torch.equal(loaded.model.transformer.wte.weight, source.model.transformer.wte.weight)
    assert current_spec(loaded.model)[0].top_k == 2
    assert not torch.allclose(loaded.model(input_ids=ids).logits, apply)  # top-2 changes the output


def test_tokenizer_larger_than_pretrained_vocabulary_is_rejected(tmp_path):
    CausalLMModule(**TINY).model.save_pretrained(tmp_path / "tiny")
    with pytest.raises(ValueError, match="100 tokens"):
        CausalLMModule(model_name_or_path=str(tmp_path / "tiny"), vocab_size=100)


def test_block_size_above_context_is_rejected():
    with pytest.raises(ValueError, match="block_size=64 exceeds the model's context of 32"):
        CausalLMModule(block_size=64, **TINY)


def test_warmup_then_cosine_schedule():
    factors = [warmup_cosine(step, warmup=2, total=10, floor=0.1) for step in range(11)]
    assert factors[:2] == [0.5, 1.0]
    assert factors[2] == pytest.approx(1.0) and factors[10] == pytest.approx(0.1)
    assert factors[6] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 8)))
    assert all(a >= b for a, b in zip(factors[1:], factors[2:]))


def test_fit_logs_losses_and_hparams(tmp_path):
    from tbparse import SummaryReader

    module = CausalLMModule(AttentionSpec(temperature=0.3, top_k=4), **TINY, warmup_steps=1)
    logger = L.pytorch.loggers.TensorBoardLogger(tmp_path, name="run", version=0, default_hp_metric=False)
    trainer = L.Trainer(max_steps=4, logger=logger, log_every_n_steps=1, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, val_check_interval=2)
    trainer.fit(module, train_dataloaders=batches(), val_dataloaders=batches(seed=1))
    scalars = SummaryReader(str(tmp_path / "run" / "version_0")).scalars
    train = scalars[scalars.tag == "train/loss"]
    assert list(train.step) == [0, 1, 2, 3] and train.value.map(math.isfinite).all()
    val = scalars[scalars.tag == "val/loss"].value.tolist()
    ppl = scalars[scalars.tag == "val/ppl"].value.tolist()
    assert len(val) == 2 and ppl == pytest.approx([math.exp(v) for v in val], rel=1e-5)
    # validated after steps 2 and 4: logged at those optimizer steps, the step the monitors use for validation
    assert list(scalars[scalars.tag == "val/loss"].step) == [2, 4] and "step" not in set(scalars.tag)
    # perplexity spans decades across T: its log10 copy leads TensorBoard's Summary pages, at the same steps
    for source in (tags.VAL_PPL, tags.TRAIN_PPL):
        logged, copy = (scalars[scalars.tag == t] for t in (source, tags.LOG10[source]))
        assert list(copy.step) == list(logged.step)
        assert copy.value.tolist() == pytest.approx([math.log10(v) for v in logged.value], rel=1e-5)
    hparams = SummaryReader(str(tmp_path / "run" / "version_0")).hparams
    values = dict(zip(hparams.tag, hparams.value))
    assert values["attention/temperature"] == "0.3" and values["attention/top_k"] == "4"


def test_validation_loss_is_token_weighted_mean():
    module = CausalLMModule(**TINY).eval()
    loader = batches(n=6)  # batches of 4 and 2 sequences
    expected_num = expected_den = 0.0
    for batch in loader:
        with torch.no_grad():
            module.validation_step(batch, 0)
            loss = module.loss(batch)
        expected_num += loss.item() * batch["input_ids"].numel()
        expected_den += batch["input_ids"].numel()
    assert module.val_loss.compute().item() == pytest.approx(expected_num / expected_den, rel=1e-6)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_training_at_low_temperature_stays_finite(precision):
    module = CausalLMModule(AttentionSpec(temperature=0.01), **TINY)
    trainer = L.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, precision=precision, gradient_clip_val=1.0,
                        limit_val_batches=0)
    trainer.fit(module, train_dataloaders=batches())
    assert all(p.isfinite().all() for p in module.parameters())
    assert torch.isfinite(trainer.callback_metrics["train/loss"])


def test_loaded_model_trains_with_its_dropout_active(tmp_path):
    """`from_pretrained` returns eval mode; the module must fine-tune with the config's dropout on."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=64,
                        resid_pdrop=0.5, embd_pdrop=0.5, attn_pdrop=0.5)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "drop")
    module = CausalLMModule(model_name_or_path=str(tmp_path / "drop"), vocab_size=64, warmup_steps=1)
    seen = {}

    class Probe(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            dropouts = [m for m in pl_module.model.modules() if isinstance(m, torch.nn.Dropout)]
            seen["modes"] = {m.training for m in pl_module.model.modules()}
            seen["dropouts"] = len(dropouts)
            with torch.no_grad():
                a, b = (pl_module.model(input_ids=batch["input_ids"]).logits for _ in range(2))
            seen["differ"] = not torch.allclose(a, b)

    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Probe()], default_root_dir=tmp_path)
    trainer.fit(module, batches())
    assert seen["dropouts"] > 0 and seen["modes"] == {True}
    assert seen["differ"]  # two passes over the same batch differ: dropout is sampling


def test_short_model_names_are_resolved(tmp_path, monkeypatch):
    """`model_name_or_path` goes through `study.pretrained.resolve_model` (a short name -> a local folder)."""
    import study.pretrained

    CausalLMModule(**TINY).model.save_pretrained(tmp_path / "tiny")
    monkeypatch.setattr(study.pretrained, "resolve_model", lambda name: str(tmp_path / name))
    module = CausalLMModule(model_name_or_path="tiny", vocab_size=64)
    assert module.model.config.n_layer == 2 and module.hparams.model_name_or_path == "tiny"


def test_attention_only_fine_tuning_trains_exactly_the_attention_parameters():
    from study.attention import attention_modules

    module = CausalLMModule(trainable="attention", warmup_steps=1, **TINY)
    attention = {id(p) for m in attention_modules(module.model) for p in m.parameters()}
    trainable = {id(p) for p in module.parameters() if p.requires_grad}
    assert trainable == attention and len(trainable) > 0
    before = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, batches())
    changed = {n for n, p in module.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".attn." in n for n in changed)
    assert {n for n in before if ".attn." in n and n.endswith("weight")} <= changed
    with pytest.raises(ValueError, match="trainable = 'mlp': choose one of"):
        CausalLMModule(trainable="mlp", **TINY)


def test_sgd_steps_by_lr_times_the_gradient_and_adamw_by_about_its_sign(tmp_path):
    """optimizer="sgd": the first update is exactly -lr x gradient (no momentum), so a gradient 100x larger moves the
    weights 100x further; AdamW's first update is about lr x sign(gradient) whatever its size."""
    moves = {}
    for name in ("sgd", "adamw"):
        torch.manual_seed(0)
        module = CausalLMModule(**TINY, optimizer=name, learning_rate=0.1, warmup_steps=1, weight_decay=0.0)
        before = {n: p.detach().clone() for n, p in module.named_parameters()}
        grads: dict[str, torch.Tensor] = {}

        class Keep(L.Callback):
            def __init__(self, into):
                self.into = into

            def on_before_optimizer_step(self, trainer, pl_module, optimizer):
                self.into.update({n: p.grad.clone() for n, p in pl_module.named_parameters() if p.grad is not None})

        L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, callbacks=[Keep(grads)]).fit(module, batches())  # fmt: skip
        moves[name] = {n: p.detach() - before[n] for n, p in module.named_parameters()}
        if name == "sgd":
            for n, g in grads.items():
                torch.testing.assert_close(moves[name][n], -0.1 * g)
    w = "model.transformer.h.0.attn.c_attn.weight"
    assert moves["adamw"][w].abs().max().item() == pytest.approx(0.1, rel=1e-3)  # |lr x sign(g)|


def test_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match="optimizer = 'adam': choose one of"):
        CausalLMModule(**TINY, optimizer="adam")
