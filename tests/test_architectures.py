"""`apply_attention_spec` on the architectures of the installed transformers: stock parity at T = 1.

Each architecture is built offline from its own config class, shrunk to a tiny size (2 layers, width 32), with
sharpened attention (weights initialised with std 0.3: peaked rows, so that a dropped detail shows), and compared
with stock eager attention at T = 1 on the fast path (fused SDPA) and on the explicit path (fp32 scores, opened
by a tap), on every non-padding position. A feature `attend` does not implement must be refused with an error
naming it, never dropped.

Coverage: a representative subset, chosen to exercise each attention feature transformers passes, within about
a minute on 2 cores. Transformers 5.24 has 822 model types, most of them variants of these kinds; trying
all takes most of an hour here, too slow for the suite. The subset (see ARCHITECTURES):
- decoders: GPT-2 (learned positions, fused qkv), OPT, GPT-NeoX, GPT-J (partial rotary), Llama and Qwen2
  (rotary, grouped-query), Mistral (sliding window), Phi-3, Gemma 2 (logit soft-capping, sliding window),
  gpt-oss (attention sinks, sliding window), DeepSeek-V4 (sinks, compressed keys appended to the mask: a model
  transformers does not run with SDPA, so it gets eager-style masks);
- encoders with a padding mask: BERT, RoBERTa, DistilBERT, ELECTRA, ModernBERT (bidirectional sliding window);
- vision: ViT, DeiT, DINOv2, BEiT (relative position bias), Swin (window attention with a bias);
- encoder-decoders (cross-attention stays stock): T5 (position bias), BART, BigBird-Pegasus (no SDPA support).
Models whose attention does not go through transformers' ``AttentionInterface`` (BLOOM, Falcon, MPT in 5.24)
are refused by `apply_attention_spec` with a message that says so (tested below).

Every installed architecture: ``STUDY_ALL_ARCHITECTURES=1 pytest tests/test_architectures.py -k every`` tries all
model types of the installed transformers the same way (822 types in 5.24; most of an hour on 2 cores). A type
whose stock model cannot be built or run from its config with these generic inputs within 30 s is skipped with
the reason; the others must match stock or be refused with an error that names what is unsupported.
"""

from __future__ import annotations

import copy
import inspect
import os
import signal

import pytest
import torch
from transformers import CONFIG_MAPPING, AutoModel

from study.attention import AttentionSpec, apply_attention_spec, attention_modules, tapping

TINY = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
    head_dim=8, max_position_embeddings=64, n_layer=2, n_head=4, n_embd=32, d_model=32, num_layers=2, num_heads=4,
    encoder_layers=2, decoder_layers=2, num_decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=64, decoder_ffn_dim=64, d_kv=8, d_ff=64, dim=32, hidden_dim=64, n_layers=2, n_heads=4,
    image_size=32, patch_size=8, rotary_dim=4, initializer_range=0.3, init_std=0.3,  # sharpened attention (see tiny_model)
)

# model_type -> config overrides beyond TINY (the feature each one brings is in the module docstring).
ARCHITECTURES: dict[str, dict] = {
    "gpt2": {},
    "opt": dict(ffn_dim=64, word_embed_proj_dim=32),
    "gpt_neox": {},
    "gptj": {},
    "llama": {},
    "qwen2": {},
    "mistral": dict(sliding_window=4),
    "phi3": {},
    "gemma2": dict(sliding_window=4, attn_logit_softcapping=2.0, query_pre_attn_scalar=8),
    "gpt_oss": dict(sliding_window=4, num_local_experts=2, num_experts_per_tok=1),
    "deepseek_v4": {},
    "bert": {},
    "roberta": {},
    "distilbert": {},
    "electra": dict(embedding_size=32),
    "modernbert": dict(local_attention=4, global_attn_every_n_layers=2),
    "vit": {},
    "deit": {},
    "dinov2": {},
    "beit": dict(use_relative_position_bias=True),
    "swin": dict(embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=2),
    "t5": {},
    "bart": {},
    "bigbird_pegasus": dict(attention_type="original_full"),
}
LENGTH = 8


class _NullTap:
    """Opens the explicit path without keeping anything."""

    def observe(self, layer, weights, allowed, spec) -> None:
        pass


def tiny_model(model_type: str, **overrides) -> torch.nn.Module:
    config = CONFIG_MAPPING[model_type]()
    for name, value in {**TINY, **ARCHITECTURES.get(model_type, {}), **overrides}.items():
        if hasattr(config, name):
            setattr(config, name, value)
    token_ids = [getattr(config, a, None) for a in ("pad_token_id", "bos_token_id", "eos_token_id")]
    token_ids = [i for i in token_ids if isinstance(i, int)]
    if hasattr(config, "vocab_size"):
        config.vocab_size = max([99] + [i + 1 for i in token_ids])
    if isinstance(getattr(config, "layer_types", None), list):  # one of each kind within the 2 layers
        kinds = list(dict.fromkeys(config.layer_types))
        config.layer_types = (kinds * 2)[:2]
    torch.manual_seed(0)
    # Sharpened attention: weights drawn with std 0.3 instead of 0.02 make rows peaked (mean max weight 0.6-0.9
    # at L = 8), so a dropped transform or a wrong mask shows; near-uniform rows would hide both.
    return AutoModel.from_config(copy.deepcopy(config), attn_implementation="eager").eval()


def model_inputs(model: torch.nn.Module) -> tuple[dict, torch.Tensor | None]:
    """Inputs for a batch of 2 (the second row padded at its last 2 positions) and the real-token mask."""
    names = set(inspect.signature(model.forward).parameters)
    torch.manual_seed(1)
    if "input_ids" in names:
        ids = torch.randint(3, 99, (2, LENGTH))
        mask = torch.ones(2, LENGTH, dtype=torch.long)
        mask[1, -2:] = 0
        kwargs = dict(input_ids=ids, attention_mask=mask)
        if "decoder_input_ids" in names:
            kwargs["decoder_input_ids"] = ids[:, :5]
            return kwargs, None  # the decoder's output is compared whole (its rows are all real)
        return kwargs, mask.bool()
    size = model.config.image_size
    return dict(pixel_values=torch.randn(2, model.config.num_channels, size, size)), None


def last_hidden(output) -> torch.Tensor:
    return output.last_hidden_state if getattr(output, "last_hidden_state", None) is not None else output[0]


def compare(model: torch.nn.Module, spec: AttentionSpec, stock: torch.nn.Module | None = None):
    """Max |study - stock| on real positions: (fast path, explicit path)."""
    inputs, real = model_inputs(model)
    stock = model if stock is None else stock
    switched = apply_attention_spec(copy.deepcopy(model), spec)
    with torch.no_grad():
        reference = last_hidden(stock(**inputs))
        fast = last_hidden(switched(**inputs))
        with tapping(_NullTap()):
            explicit = last_hidden(switched(**inputs))
    rows = (real,) if real is not None else (slice(None),)
    return (fast - reference)[rows].abs().max().item(), (explicit - reference)[rows].abs().max().item()


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_stock_parity_at_t1_on_both_paths(model_type):
    model = tiny_model(model_type)
    assert attention_modules(model), f"{model_type}: no attention module found"
    fast, explicit = compare(model, AttentionSpec())
    assert fast < 1e-5, f"{model_type}: fast path differs from stock eager by {fast}"
    assert explicit < 1e-5, f"{model_type}: explicit path differs from stock eager by {explicit}"


@pytest.mark.parametrize(
    "model_type, disable",
    [
        ("gemma2", lambda m: [setattr(a, "attn_logit_softcapping", None) for a in attention_modules(m)]),
        ("gpt_oss", lambda m: [a.sinks.data.fill_(-1e4) for a in attention_modules(m)]),
        ("mistral", lambda m: setattr(m.config, "sliding_window", None)),
    ],
    ids=["softcap", "sinks", "sliding_window"],
)
def test_the_feature_matters_so_parity_means_it_is_applied(model_type, disable):
    """Without the feature stock differs by far more than the parity tolerance: parity is not an accident."""
    model = tiny_model(model_type)
    plain = copy.deepcopy(model)
    disable(plain)
    inputs, real = model_inputs(model)
    with torch.no_grad():
        gap = (last_hidden(model(**inputs)) - last_hidden(plain(**inputs)))[real].abs().max().item()
    assert gap > 1e-2


def _divide_logits_by(module: torch.nn.Module, temperature: float) -> None:
    """Make a stock self-attention module compute l / T for its whole logit l (scale, bias, cap and sink)."""
    module.scaling /= temperature
    if getattr(module, "attn_logit_softcapping", None) is not None:
        module.attn_logit_softcapping /= temperature  # (c / T) tanh((l / T) / (c / T)) = c tanh(l / c) / T
    if isinstance(getattr(module, "sinks", None), torch.nn.Parameter):
        module.sinks.data /= temperature
    if getattr(module, "relative_attention_bias", None) is not None:
        module.relative_attention_bias.weight.data /= temperature


@pytest.mark.parametrize("model_type", ["gemma2", "gpt_oss", "t5", "bart"])
def test_temperature_divides_the_models_whole_logit(model_type):
    """The documented order: the model's own logit (scale, soft-cap, position bias, sink) first, then 1/T.

    The reference is stock eager with each self-attention module rewritten to compute l / T; cross-attention
    (T5, BART) keeps its own logits, since it stays stock under a spec.
    """
    temperature = 0.5
    model = tiny_model(model_type)
    reference = copy.deepcopy(model)
    for module in attention_modules(reference):
        _divide_logits_by(module, temperature)
    fast, explicit = compare(model, AttentionSpec(temperature=temperature), stock=reference)
    assert fast < 1e-5, f"fast path: {fast}"
    assert explicit < 1e-5, f"explicit path: {explicit}"


def test_unknown_attention_argument_is_refused_by_name():
    from study.attention.hf import _attention_forward

    module = torch.nn.Module()
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"\['block_indices'\]"):
        _attention_forward(module, q, q, q, None, block_indices=torch.zeros(1))
    # Bookkeeping arguments and arguments passed as None are accepted.
    out, _ = _attention_forward(module, q, q, q, None, position_ids=torch.arange(3), encoder_hidden_states=None)
    assert out.shape == (1, 3, 2, 4)


def test_model_without_attention_interface_is_refused_clearly():
    model = tiny_model("bloom")
    with pytest.raises(ValueError, match="no attention module that calls transformers' attention interface"):
        apply_attention_spec(model, AttentionSpec(temperature=0.5))


@pytest.mark.parametrize("model_type", ["bart", "t5"])
def test_cross_attention_stays_stock_and_unobserved(model_type):
    """The documented choice: self-attention (encoder, then decoder) is numbered and switched; cross-attention
    runs stock softmax at T = 1 and taps never see it (see `study.attention.hf`)."""
    model = apply_attention_spec(tiny_model(model_type), AttentionSpec(temperature=0.5))
    names = {id(m): n for n, m in model.named_modules()}
    switched = [names[id(m)] for m in attention_modules(model)]
    assert len(switched) == 4 and not any("encoder_attn" in n or "EncDecAttention" in n for n in switched)
    assert switched[0].startswith("encoder") and switched[-1].startswith("decoder")
    cross = [m for m in model.modules() if getattr(m, "study_cross_attention", False)]
    assert len(cross) == 2

    layers = []

    class Seen:
        def observe(self, layer, weights, allowed, spec):
            layers.append(layer)

    inputs, _ = model_inputs(model)
    with torch.no_grad(), tapping(Seen()):
        model(**inputs)
    assert layers == [0, 1, 2, 3]


EVERY = sorted(CONFIG_MAPPING.keys()) if os.environ.get("STUDY_ALL_ARCHITECTURES") == "1" else []


def _too_slow(signum, frame):
    raise TimeoutError("over 30 s")


@pytest.mark.parametrize("model_type", EVERY)
def test_every_installed_architecture(model_type):
    signal.signal(signal.SIGALRM, _too_slow)  # some configs' defaults survive the shrinking: a huge build
    signal.alarm(30)
    try:
        model = tiny_model(model_type)
        inputs, _ = model_inputs(model)
        with torch.no_grad():
            last_hidden(model(**inputs))
    except Exception as err:  # noqa: BLE001 - anything stock cannot do here is outside this test
        pytest.skip(f"stock {model_type} does not build or run from its config here: {type(err).__name__}: {err}")
    finally:
        signal.alarm(0)
    try:
        fast, explicit = compare(model, AttentionSpec())
    except ValueError as err:  # a refusal must say what is unsupported
        assert "attention" in str(err), f"{model_type}: unclear refusal: {err}"
        return
    assert max(fast, explicit) < 1e-4, f"{model_type}: differs from stock eager by {fast} (fast), {explicit} (explicit)"
