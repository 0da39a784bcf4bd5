"""`CausalLMModule`: training of any Hugging Face causal LM under an `AttentionSpec` (temperature, top-k, normaliser).

The model is loaded with `AutoModelForCausalLM.from_pretrained` (`model_name_or_path`: a hub name, a local folder,
or a short name of `study.pretrained.EMBEDDED_MODELS` such as "smollm2-135m", the offline SmolLM2-135M-Instruct,
dequantised to fp32 from its Q4_1 gguf), or, when no name is given, built from scratch as a GPT-2 of the given size.
Its attention layers are switched to the spec with `study.attention.apply_attention_spec`, which is also why
importing this module registers the attention implementation in every DDP worker.
"""

from __future__ import annotations

import dataclasses
import math
import os
from functools import partial
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.types import STEP_OUTPUT, OptimizerLRScheduler
from torchmetrics.aggregation import MeanMetric
from transformers import GPT2Config, GPT2LMHeadModel
from typing_extensions import override

from study import tags
from study.attention import AttentionSpec, apply_attention_spec, attention_modules
from study.errors import BadValue, check_choice, check_int, check_number
from study.hparams import HPARAMS_METRICS, write_session
from study.pretrained import declare_causal_lm_loss, load_causal_lm

TRAINABLE = ("all", "attention")
OPTIMIZERS = ("adamw", "sgd")
TEMPERATURE_IN = ("softmax", "init")


class CausalLMModule(L.LightningModule):
    """Fine-tune a pretrained causal LM (or train a GPT-2 from scratch) with a chosen attention normalisation.

    Args:
        attention: normaliser, temperature T, top-k selection and layers (`study.attention.AttentionSpec`); its
            `output_gate` only on a model built from scratch (a new gate would change a pretrained one).
        model_name_or_path: what `from_pretrained` loads: a hub name ("gpt2"), a local folder, or an embedded
            short name ("smollm2-135m", materialised offline by `study.pretrained.resolve_model`); None builds a
            fresh GPT-2 from the size arguments below.
        n_layer, n_head, n_embd, n_positions: size of a GPT-2 built from scratch (ignored when loading).
        vocab_size: token ids to embed; the CLI links it to the data's tokenizer. A loaded model whose
            vocabulary is smaller than the tokenizer's is an error.
        block_size: sequence length the data produces; checked against the model's context.
        dropout: residual, embedding and attention dropout of a model built from scratch. A loaded model keeps
            the dropout of its own config (GPT-2: 0.1; SmolLM2: 0), active in training.
        trainable: "all" parameters, or only the "attention" modules' (query, key, value, output projections);
            the rest is not trained (``requires_grad`` off). Attention-only fine-tuning lets attention adapt to a
            new T / top-k at a fraction of a full step's cost (no weight gradients for the LM head, MLPs and norms,
            and AdamW over the attention projections only; measured in docs/realmodel.md).
        optimizer: "adamw", or "sgd" (plain SGD, no momentum: its step is lr x the gradient, so a gradient that
            grows at low T moves the weights more; AdamW's first steps are about lr x sign(gradient) whatever its
            size, which can hide that). Weight decay and the schedule are the same for both.
        learning_rate: peak learning rate.
        weight_decay: AdamW weight decay, applied to matrices only (not to biases, norms).
        betas: AdamW betas.
        warmup_steps: linear warm-up steps before the cosine decay.
        min_lr_ratio: final learning rate as a fraction of the peak at the end of cosine decay.
        adam_epsilon: AdamW's epsilon (PyTorch's default, 1e-8, is also Wortsman et al. 2023's).
        independent_weight_decay: False: PyTorch's AdamW decay, ``lr_t * weight_decay`` per step (coupled to the
            learning rate). True: the decay Wortsman et al. 2023 use, ``s_t * weight_decay`` per step with s_t the
            schedule's factor, independent of the peak learning rate (so an LR sweep does not also sweep the
            decay); built as PyTorch's with ``weight_decay / learning_rate``.
        z_loss: coefficient of the auxiliary z-loss, ``z_loss * mean(log Z)^2`` over the output softmax's
            normalisers (PaLM; Wortsman et al. 2023 use 1e-4), added to the training loss only (validation reports
            the plain cross-entropy); logged as ``train/z_loss``. 0 (the default): none.
        temperature_in: where the spec's temperature T acts. "softmax" (the default): scores are l / T.
            "init": the init-scale control of a model built from scratch: W_q and W_k (and their biases) start
            scaled by T^-1/2 each and the softmax runs at T = 1, the same function at step 0 (q.k / T) whose
            later steps differ only through the optimiser (under AdamW a weight's step does not scale with it).
            The HParams still show T, with ``temperature_in`` beside it.
        hparams_experiment: declare a one-run TensorBoard HParams experiment (temperature, top-k and normaliser
            first); False: none; a path: the sweep's declaration of one experiment for all its runs
            (`<sweep>/hparams.json`, `study.hparams`), which `study sweep` passes.
        hparams_session: write this run's HParams session (its settings and metrics as a row of the HParams table).
            A sweep's pretraining run sets False: it is the base of the sweep's runs, not one of its settings.
        gradient_checkpointing: activation checkpointing by transformers' own mechanism
            (``activation_checkpointing_enable``, non-reentrant): each decoder layer's activations are recomputed in
            the backward pass instead of kept, for long contexts (more time, much less memory; docs/performance.md).
            Losses and gradients are unchanged, and the monitors see each attention call once per step
            (`study.attention.tap`). A model without transformers' support for it is an error.

    Example:
        >>> from study.attention import AttentionSpec
        >>> module = CausalLMModule(AttentionSpec(temperature=0.5, top_k=4), n_layer=2, n_embd=64, n_head=2,
        ...                     n_positions=64, vocab_size=256)
        >>> module.model.transformer.h[0].attn.study_spec.temperature
        0.5
    """

    def __init__(
        self,
        attention: AttentionSpec | None = None,
        model_name_or_path: str | None = None,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        n_positions: int = 256,
        vocab_size: int = 50257,
        block_size: int | None = None,
        dropout: float = 0.0,
        trainable: str = "all",
        optimizer: str = "adamw",
        learning_rate: float = 3e-4,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_steps: int = 100,
        min_lr_ratio: float = 0.1,
        adam_epsilon: float = 1e-8,
        independent_weight_decay: bool = False,
        z_loss: float = 0.0,
        temperature_in: str = "softmax",
        hparams_experiment: bool | str = True,
        hparams_session: bool = True,
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        check_arguments(dict(
            model_name_or_path=model_name_or_path, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
            n_positions=n_positions, vocab_size=vocab_size, block_size=block_size, dropout=dropout,
            trainable=trainable, optimizer=optimizer, learning_rate=learning_rate, weight_decay=weight_decay,
            betas=betas, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio, adam_epsilon=adam_epsilon,
            z_loss=z_loss, temperature_in=temperature_in,
        ))
        attention = attention or AttentionSpec()
        if temperature_in == "init":
            if model_name_or_path:
                raise ValueError(f"temperature_in='init' scales a model's initial W_q and W_k; {model_name_or_path!r} "
                                 "is loaded, not initialised (build it from scratch: model_name_or_path null)")
            if attention.qk_norm:
                raise ValueError("temperature_in='init' with qk_norm=True: QK-norm divides out the initial scale of "
                                 "q and k, so the fold would do nothing")
        if attention.output_gate and model_name_or_path:
            raise ValueError(f"output_gate=True adds a new gate to every attention layer, which would change what "
                             f"the pretrained {model_name_or_path!r} computes; it is for models built from scratch "
                             "(model_name_or_path null)")
        # `logger=False`: hyperparameters go to TensorBoard from `on_fit_start`, flattened and declared together
        # with the metrics that HParams compares runs by.
        self.save_hyperparameters(logger=False)
        if model_name_or_path:
            self.model = load_causal_lm(model_name_or_path)
            # `from_pretrained` returns the model in eval mode, and Lightning keeps submodules' modes as they are:
            # without this, dropout would be silently off during fine-tuning.
            self.model.train()
            if self.model.get_input_embeddings().num_embeddings < vocab_size:
                raise ValueError(
                    f"the tokenizer has {vocab_size} tokens but {model_name_or_path!r} embeds only "
                    f"{self.model.get_input_embeddings().num_embeddings}"
                )
        else:
            config = GPT2Config(
                n_layer=n_layer,
                n_head=n_head,
                n_embd=n_embd,
                n_positions=n_positions,
                vocab_size=vocab_size,
                resid_pdrop=dropout,
                embd_pdrop=dropout,
                attn_pdrop=dropout,
                bos_token_id=vocab_size - 1,
                eos_token_id=vocab_size - 1,
            )
            self.model = declare_causal_lm_loss(GPT2LMHeadModel(config))
        config = self.model.config
        context = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
        if block_size is not None and context is not None and block_size > context:
            raise ValueError(f"block_size={block_size} exceeds the model's context of {context} positions")
        if temperature_in == "init":
            fold_temperature_into_init(self.model, attention.temperature)
            apply_attention_spec(self.model, dataclasses.replace(attention, temperature=1.0))
        else:
            apply_attention_spec(self.model, attention)
        if trainable == "attention":
            train_attention_only(self.model)
        if gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        self.attention = attention
        self.val_loss = MeanMetric()

    @override
    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        return self.model(input_ids=input_ids, **kwargs)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The language-model loss of a batch (what training and validation average; `FixedBatchLoss` calls it)."""
        ids = batch["input_ids"]
        return self.model(input_ids=ids, attention_mask=batch.get("attention_mask"), labels=ids).loss

    @override
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> STEP_OUTPUT:
        if self.hparams.get("z_loss", 0.0):
            ids = batch["input_ids"]
            out = self.model(input_ids=ids, attention_mask=batch.get("attention_mask"))
            loss, z_loss = lm_loss_and_z_loss(out.logits, ids, batch.get("attention_mask"))
            self.log(tags.TRAIN_Z_LOSS, z_loss)
            total = loss + self.hparams.z_loss * z_loss
        else:
            loss = total = self.loss(batch)
        ppl = torch.exp(loss.detach().float().clamp(max=50))
        self.log(tags.TRAIN_LOSS, loss, prog_bar=True)
        self.log(tags.TRAIN_PPL, ppl)
        # the same values under the names that lead TensorBoard's pages (`tags.LEADING`), perplexity also as log10
        self.log_dict({tags.LEADING[tags.TRAIN_LOSS]: loss.detach(), tags.LEADING[tags.TRAIN_PPL]: ppl,
                       tags.LOG10[tags.TRAIN_PPL]: torch.log10(ppl)})  # fmt: skip
        return total

    @override
    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> STEP_OUTPUT:
        loss = self.loss(batch)
        # Token-weighted mean, synchronised across processes by torchmetrics.
        self.val_loss.update(loss, weight=batch["input_ids"].numel())

    @override
    def on_validation_epoch_end(self) -> None:
        loss = self.val_loss.compute()
        self.val_loss.reset()
        ppl = torch.exp(loss.float().clamp(max=50))
        self.log(tags.VAL_LOSS, loss, prog_bar=True)
        self.log(tags.VAL_PPL, ppl)
        self.log_dict({tags.LEADING[tags.VAL_LOSS]: loss, tags.LEADING[tags.VAL_PPL]: ppl,
                       tags.LOG10[tags.VAL_PPL]: torch.log10(ppl)})  # fmt: skip
        # Lightning logs epoch-end metrics at its count of batches that stepped, one less than the optimizer steps
        # done when validation runs inside the training loop; the monitors log validation at `global_step`, the
        # optimizer steps the validated weights have had. A logged "step" is Lightning's x axis for these metrics
        # (`_LoggerConnector.log_metrics`): every validation tag at one step.
        self.log("step", float(self.global_step))

    @override
    def configure_optimizers(self) -> OptimizerLRScheduler:
        hp = self.hparams
        decay = [p for p in self.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.requires_grad and p.dim() < 2]
        groups = [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        if hp.get("independent_weight_decay", False):
            # PyTorch decays by lr_t * wd = lr * s_t * wd; wd / lr makes that s_t * wd, whatever the peak lr.
            groups[0]["weight_decay"] = hp.weight_decay / hp.learning_rate
        if hp.get("optimizer", "adamw") == "sgd":
            optimizer = torch.optim.SGD(groups, lr=hp.learning_rate)
        else:
            optimizer = torch.optim.AdamW(groups, lr=hp.learning_rate, betas=tuple(hp.betas),
                                          eps=hp.get("adam_epsilon", 1e-8))
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, partial(warmup_cosine, warmup=min(hp.warmup_steps, total), total=total, floor=hp.min_lr_ratio)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    @override
    def on_fit_start(self) -> None:
        if self.trainer.is_global_zero and self.hparams.hparams_session:
            for logger in self.loggers:
                if isinstance(logger, TensorBoardLogger):
                    write_session(logger, self.hparam_summary(), HPARAMS_METRICS, experiment=self.hparams.hparams_experiment)

    def hparam_summary(self) -> dict[str, float | int | str]:
        """Scalar hyperparameters for TensorBoard's HParams view: the attention spec first."""
        hp = self.hparams
        summary = {tags.attention_hparam(k): v for k, v in self.attention.as_hparams().items()}
        summary.update(
            model=hp.model_name_or_path or f"gpt2-scratch-{hp.n_layer}x{hp.n_embd}",
            optimizer=hp.get("optimizer", "adamw"),
            learning_rate=hp.learning_rate,
            weight_decay=hp.weight_decay,
            warmup_steps=hp.warmup_steps,
            block_size=hp.block_size or 0,
            attention_layers=len(attention_modules(self.model)),
            trainable=hp.get("trainable", "all"),
            temperature_in=hp.get("temperature_in", "softmax"),
            z_loss=hp.get("z_loss", 0.0),
        )
        if os.environ.get("PL_GLOBAL_SEED"):  # set by `seed_everything` (the CLI's `seed_everything` option)
            summary["seed"] = int(os.environ["PL_GLOBAL_SEED"])
        return summary


def check_arguments(values: dict[str, Any], prefix: str = "") -> None:
    """`CausalLMModule`'s own rules for its arguments (``values``: name -> value, any subset), each broken one raised
    as `BadValue` naming ``prefix + name`` and the value; nothing is loaded or built. `study fit` runs it on the
    parsed config (``prefix="model."``) before anything is built, the module on its arguments."""
    def key(name: str) -> str:
        return prefix + name

    ints = {"n_layer": 1, "n_head": 1, "n_embd": 1, "n_positions": 1, "vocab_size": 1, "warmup_steps": 0}
    for name, minimum in ints.items():
        if name in values:
            check_int(key(name), values[name], minimum=minimum)
    if "block_size" in values:
        check_int(key("block_size"), values["block_size"], minimum=1, none=True)
    if "dropout" in values:
        check_number(key("dropout"), values["dropout"], 0, 1, high_open=True)
    for name in ("learning_rate", "weight_decay", "adam_epsilon", "z_loss"):
        if name in values:
            check_number(key(name), values[name], minimum=0)
    if "min_lr_ratio" in values:
        check_number(key("min_lr_ratio"), values["min_lr_ratio"], 0, 1)
    if "betas" in values:
        betas = values["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise BadValue(key("betas"), betas, "must be two numbers in [0, 1)")
        for i, beta in enumerate(betas):
            check_number(f"{key('betas')}[{i}]", beta, 0, 1, high_open=True)
    for name, choices in (("trainable", TRAINABLE), ("optimizer", OPTIMIZERS), ("temperature_in", TEMPERATURE_IN)):
        if name in values:
            check_choice(key(name), values[name], choices)
    if not values.get("model_name_or_path") and {"n_embd", "n_head"} <= set(values):
        if values["n_embd"] % values["n_head"]:
            raise BadValue(key("n_head"), values["n_head"],
                           f"must divide {key('n_embd')} = {values['n_embd']} (each head gets n_embd / n_head)")
    if values.get("model_name_or_path"):
        model_path_problem(key("model_name_or_path"), str(values["model_name_or_path"]))


def model_path_problem(key: str, name: str) -> None:
    """A model path that names a file: only a .gguf file is a model; any other file is refused by name (a pickle
    says so: the study never unpickles a model file)."""
    from pathlib import Path

    from study.checkpoints import is_pickle

    path = Path(name).expanduser()
    if not path.is_file() or name.endswith(".gguf"):
        return
    if is_pickle(path):
        raise BadValue(key, name, "a pickle file (torch.save), refused: pickles are never loaded, they can run "
                                  "code; give a Hugging Face model folder (save_pretrained), a .gguf or a hub name")
    raise BadValue(key, name, "a file, not a model: give a Hugging Face model folder, a .gguf file, a hub name or an "
                              "embedded name")


def train_attention_only(model: torch.nn.Module) -> None:
    """Only the parameters of the self-attention modules keep ``requires_grad`` (the optimizer gets only those)."""
    keep = {id(p) for module in attention_modules(model) for p in module.parameters()}
    if not keep:
        raise ValueError(f"{type(model).__name__} has no attention modules to train")
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Transformers' activation checkpointing, non-reentrant: it needs no input that requires a gradient (the
    embeddings are not trained under ``trainable="attention"``), keeps each layer's RNG state for dropout, and nests with the
    blockwise attention path's own checkpoints."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"gradient_checkpointing=True: {type(model).__name__} does not support transformers' "
                         "gradient checkpointing")
    from study.attention.recompute import same_path_context

    # the recomputation takes the attention path its forward took, whatever is open during the backward pass
    # transformers' current name (the pinned 5.24 has it); `gradient_checkpointing_enable` warns and goes in v6
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs={"use_reentrant": False, "context_fn": same_path_context})
    model.config.use_cache = False  # a key/value cache is incompatible with it (transformers warns and turns it off)


def fold_temperature_into_init(model: torch.nn.Module, temperature: float) -> None:
    """Scale every layer's W_q and W_k (and biases) by T^-1/2, so q.k at T = 1 is the model's q.k / T.

    GPT-2's fused ``c_attn`` (Conv1D: q, k, v side by side in its output columns) and modules with separate
    ``q_proj`` / ``k_proj`` (Llama family) are known; any other attention module is refused by name.
    """
    factor = temperature**-0.5
    with torch.no_grad():
        for module in attention_modules(model):
            c_attn = getattr(module, "c_attn", None)
            if c_attn is not None and hasattr(module, "split_size"):
                width = module.split_size
                c_attn.weight[:, : 2 * width].mul_(factor)
                if c_attn.bias is not None:
                    c_attn.bias[: 2 * width].mul_(factor)
            elif hasattr(module, "q_proj") and hasattr(module, "k_proj"):
                for proj in (module.q_proj, module.k_proj):
                    proj.weight.mul_(factor)
                    if getattr(proj, "bias", None) is not None:
                        proj.bias.mul_(factor)
            else:
                raise ValueError(f"temperature_in='init': cannot find W_q and W_k in {type(module).__name__} "
                                 "(known: GPT-2's c_attn, q_proj/k_proj)")


def lm_loss_and_z_loss(
    logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal-LM cross-entropy (as Hugging Face's ``labels=input_ids`` loss: every shifted position) and the
    z-loss mean(log Z)^2 over the positions that predict a next token (padded targets left out), from one fp32
    log-softmax over the output logits. The targets are the ids themselves (no ignored label: Hugging Face's -100
    cannot occur), as in `CausalLMModule.loss`.

    log Z is read back from the log-softmax at each row's largest logit (log Z = max - log p(argmax), where
    log p(argmax) lies in [-log V, 0], so no precision is lost); a separate logsumexp pass over the logits and its
    backward would cost as much as the cross-entropy itself on a small model with a large vocabulary.
    """
    shifted = logits[:, :-1].float()
    log_probs = shifted.log_softmax(dim=-1)
    targets = input_ids[:, 1:].unsqueeze(-1)
    loss = -log_probs.gather(-1, targets).mean()
    top = shifted.detach().argmax(dim=-1, keepdim=True)
    log_z = (shifted.gather(-1, top) - log_probs.gather(-1, top)).squeeze(-1)
    return loss, _masked_mean(log_z.pow(2), attention_mask)


def _masked_mean(values: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of per-position values (B, L - 1) over the positions whose target is not padding."""
    if attention_mask is None:
        return values.mean()
    keep = attention_mask[:, 1:].to(values.dtype)
    return (values * keep).sum() / keep.sum().clamp(min=1)


def warmup_cosine(step: int, warmup: int, total: int, floor: float) -> float:
    """Learning-rate factor: linear warm-up over ``warmup`` steps, then cosine decay to ``floor`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
