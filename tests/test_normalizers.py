"""Normalisers beyond softmax: sparsemax, entmax15, entmax, ssmax, self_adjust.

Each is checked against a reference written here (or, where `entmax` provides one, against another `entmax`
routine), for causality through `attend` and through a tiny GPT-2, for finite values and gradients at a very low
temperature, for fully masked rows, and for its learnable parameters training and being saved.
"""

from __future__ import annotations

import copy
import math

import entmax
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from study.attention import (
    NORMALIZERS,
    AttentionSpec,
    Normalizer,
    apply_attention_spec,
    attend,
    causal_allowed,
    register_normalizer,
)
from study.attention.hf import attention_modules
from study.attention.normalizers import masked_softmax

NEW = ["sparsemax", "entmax15", "entmax", "ssmax", "self_adjust"]
SPECS = {
    "sparsemax": AttentionSpec(normalizer="sparsemax"),
    "entmax15": AttentionSpec(normalizer="entmax15"),
    "entmax": AttentionSpec(normalizer="entmax", alpha=1.8, learnable=True),
    "ssmax": AttentionSpec(normalizer="ssmax"),
    "self_adjust": AttentionSpec(normalizer="self_adjust"),
    "self_adjust_plain": AttentionSpec(normalizer="self_adjust", self_adjust_variant="plain"),
}
SUMS_TO_ONE = {"sparsemax", "entmax15", "entmax", "ssmax"}
HEADS = 4


def qkv(batch=2, heads=HEADS, length=7, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, heads, length, dim, generator=gen) for _ in range(3))


def build(spec: AttentionSpec, heads: int = HEADS):
    return NORMALIZERS[spec.normalizer].from_spec(spec, heads)


def causal_weights(spec: AttentionSpec, scores: torch.Tensor):
    """Weights of a causal (Lq = Lk) row set, with the module that produced them."""
    allowed = causal_allowed(scores.shape[-2], scores.shape[-1], scores.device)[None, None]
    normalizer = build(spec, scores.shape[1])
    return normalizer(scores, allowed, visible=allowed), allowed, normalizer


# --- reference formulas, written independently of the code under test --------------------------------------


def sparsemax_reference(z: torch.Tensor) -> torch.Tensor:
    """Sort-based sparsemax of one vector (Martins & Astudillo 2016, Alg. 1)."""
    z_sorted, _ = torch.sort(z, descending=True)
    cumsum = z_sorted.cumsum(0)
    ks = torch.arange(1, len(z) + 1, dtype=z.dtype)
    support = 1 + ks * z_sorted > cumsum
    k = int(ks[support].max())
    tau = (cumsum[k - 1] - 1) / k
    return (z - tau).clamp(min=0)


def self_adjust_reference(z: torch.Tensor, variant: str) -> torch.Tensor:
    """SA-Softmax of one vector (Zheng et al. 2025)."""
    p = torch.softmax(z, dim=0)
    if variant == "plain":
        return z * p
    low, high = min(z.min().item(), 0.0), max(z.max().item(), 0.0)
    return (z - low) / (high - low) * p


def reference(name: str, z: torch.Tensor, head: int, normalizer) -> torch.Tensor:
    """Reference weights of one row's visible scores ``z`` (all visible keys allowed, no top-k)."""
    if name == "sparsemax":
        return sparsemax_reference(z)
    if name == "entmax15":
        return entmax.entmax_bisect(z.double(), alpha=1.5, n_iter=100).to(z.dtype)
    if name == "entmax":
        return entmax.entmax_bisect(z.double(), alpha=float(normalizer.alpha[head]), n_iter=100).to(z.dtype)
    if name == "ssmax":
        return torch.softmax(z * float(normalizer.s[head]) * math.log(len(z)), dim=0)
    return self_adjust_reference(z, "plain" if name == "self_adjust_plain" else "normalized")


# --- values -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SPECS))
def test_matches_reference_formula_row_by_row(name):
    torch.manual_seed(1)
    scores = torch.randn(2, HEADS, 9, 9) * 3
    weights, _, normalizer = causal_weights(SPECS[name], scores)
    for b in range(2):
        for h in range(HEADS):
            for t in range(9):
                expected = reference(name, scores[b, h, t, : t + 1], h, normalizer)
                torch.testing.assert_close(weights[b, h, t, : t + 1], expected, atol=2e-5, rtol=1e-4)
                assert (weights[b, h, t, t + 1 :] == 0).all()


@pytest.mark.parametrize("name", list(SPECS))
def test_rows_sum_to_one_where_the_method_does(name):
    torch.manual_seed(2)
    weights, _, normalizer = causal_weights(SPECS[name], torch.randn(2, HEADS, 16, 16) * 2)
    sums = weights.sum(-1)
    assert normalizer.sums_to_one == (SPECS[name].normalizer in SUMS_TO_ONE)
    if normalizer.sums_to_one:
        torch.testing.assert_close(sums, torch.ones_like(sums))
    else:
        # SA-Softmax does not normalise rows: check the flag tells the truth.
        assert not torch.allclose(sums, torch.ones_like(sums), atol=1e-3)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax"])
def test_thresholding_maps_give_exact_zeros_on_allowed_keys(name):
    scores = torch.zeros(1, HEADS, 1, 6)
    scores[..., 0] = 10.0  # one key far above the others takes the whole row
    allowed = torch.ones(1, 1, 1, 6, dtype=torch.bool)
    weights = build(SPECS[name])(scores, allowed)
    assert (weights[..., 0] == 1).all() and (weights[..., 1:] == 0).all()
    torch.manual_seed(3)
    weights, allowed, _ = causal_weights(SPECS[name], torch.randn(1, HEADS, 32, 32) * 4)
    assert ((weights == 0) & allowed).any(), "random rows should have exact zeros among allowed keys"


def test_entmax15_equals_entmax_with_alpha_1_5():
    torch.manual_seed(4)
    scores = torch.randn(2, HEADS, 10, 10) * 2
    exact, allowed, _ = causal_weights(SPECS["entmax15"], scores)
    bisect = build(AttentionSpec(normalizer="entmax", alpha=1.5))(scores, allowed)
    torch.testing.assert_close(exact, bisect, atol=1e-5, rtol=1e-4)


def test_ssmax_uses_the_visible_count_of_each_causal_row():
    scores = torch.full((1, 1, 4, 4), 1.0)
    scores[..., 0] = 2.0  # key 0 beats the others by 1, so its weight is n^s / (n^s + n - 1) on row n - 1
    spec = AttentionSpec(normalizer="ssmax", ssmax_scale=0.5)
    weights, _, _ = causal_weights(spec, scores)
    for t in range(4):
        n = t + 1
        assert weights[0, 0, t, 0].item() == pytest.approx(n**0.5 / (n**0.5 + n - 1), rel=1e-6)
    assert weights[0, 0, 0, 0].item() == 1.0  # log 1 = 0: the first row is still one key of weight 1


def test_ssmax_with_top_k_keeps_the_visible_count():
    """top_k selects keys; n stays the number of visible keys (documented choice)."""
    torch.manual_seed(5)
    q, k, v = qkv(length=12)
    spec = AttentionSpec(normalizer="ssmax", top_k=3)
    out = attend(q, k, v, spec)
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    expected = torch.zeros_like(scores)
    for t in range(12):
        row = scores[..., t, : t + 1]
        top = row.topk(min(3, t + 1), dim=-1).indices
        chosen = row.gather(-1, top) * 0.43 * math.log(t + 1)
        expected[..., t, :].scatter_(-1, top, chosen.softmax(-1))
    torch.testing.assert_close(out, expected @ v, atol=1e-5, rtol=1e-4)


def test_self_adjust_single_key_rows():
    allowed = torch.ones(1, 1, 1, 1, dtype=torch.bool)
    normalizer = build(SPECS["self_adjust"], 1)
    assert normalizer(torch.full((1, 1, 1, 1), 2.0), allowed).item() == 1.0
    assert normalizer(torch.full((1, 1, 1, 1), -2.0), allowed).item() == 0.0
    assert normalizer(torch.zeros(1, 1, 1, 1), allowed).item() == 0.0  # 0 / 0 row: zero, not NaN


# --- masks, causality, numerics ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SPECS))
def test_fully_masked_rows_give_zeros_not_nan(name):
    torch.manual_seed(6)
    scores = (torch.randn(2, HEADS, 3, 5) * 3).requires_grad_()
    allowed = torch.ones(2, 1, 3, 5, dtype=torch.bool)
    allowed[0, :, 1] = False  # a padded query
    allowed[1, :, :, 3:] = False
    normalizer = build(SPECS[name])
    weights = normalizer(scores, allowed)
    assert torch.isfinite(weights).all()
    assert (weights[0, :, 1] == 0).all() and (weights[1, ..., 3:] == 0).all()
    weights.square().sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert (scores.grad[0, :, 1] == 0).all()


@pytest.mark.parametrize("name", list(SPECS))
def test_attend_causal_puts_no_weight_on_future_keys(name):
    q, k, v = qkv(length=8)
    base = attend(q, k, v, SPECS[name], causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[..., 5:, :] += 3 * torch.randn_like(k2[..., 5:, :])
    v2[..., 5:, :] += 3 * torch.randn_like(v2[..., 5:, :])
    moved = attend(q, k2, v2, SPECS[name], causal=True)
    torch.testing.assert_close(moved[..., :5, :], base[..., :5, :], atol=0, rtol=0)


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_finite_outputs_and_gradients_at_low_temperature(name, bf16):
    spec = AttentionSpec(**{**SPECS[name].__dict__, "temperature": 0.01})
    q, k, v = (t.requires_grad_() for t in qkv(length=10, seed=7))
    normalizer = build(spec)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = attend(q, k, v, spec, normalizer=normalizer)
    assert torch.isfinite(out).all()
    out.float().square().mean().backward()
    for tensor in (q, k, v, *normalizer.parameters()):
        assert torch.isfinite(tensor.grad).all()


# --- a tiny GPT-2 -----------------------------------------------------------------------------------------

CONFIG = GPT2Config(n_layer=2, n_embd=32, n_head=HEADS, vocab_size=64, n_positions=32)


def tiny_gpt2(spec: AttentionSpec, seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    # One config object per model: models built from one share `_attn_implementation`.
    model = GPT2LMHeadModel(copy.deepcopy(CONFIG)).eval()
    return apply_attention_spec(model, spec)


@pytest.mark.parametrize("name", list(SPECS))
def test_gpt2_future_tokens_never_change_past_logits(name):
    model = tiny_gpt2(SPECS[name])
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(8))
    changed = ids.clone()
    changed[:, 7:] = (changed[:, 7:] + 1 + torch.randint(0, 62, (2, 5))) % 64
    with torch.no_grad():
        base, moved = model(ids).logits, model(changed).logits
    torch.testing.assert_close(moved[:, :7], base[:, :7], atol=1e-6, rtol=0)
    assert not torch.allclose(moved[:, 7:], base[:, 7:])


@pytest.mark.parametrize(
    ("spec", "param"),
    [
        (AttentionSpec(normalizer="ssmax"), "s"),
        (AttentionSpec(normalizer="entmax", alpha=1.5, learnable=True), "alpha"),
    ],
    ids=["ssmax-s", "entmax-alpha"],
)
def test_learnable_parameters_train_and_are_saved(spec, param):
    model = tiny_gpt2(spec).train()
    keys = [f"transformer.h.{i}.attn.study_normalizer.{param}" for i in range(2)]
    state = model.state_dict()
    assert all(key in state and state[key].shape == (HEADS,) for key in keys)
    before = [state[key].clone() for key in keys]
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(9))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model(ids, labels=ids).loss.backward()
    for module in attention_modules(model):
        grad = getattr(module.study_normalizer, param).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    optimizer.step()
    after = model.state_dict()
    assert all(not torch.equal(after[key], old) for key, old in zip(keys, before))


def test_fixed_parameters_are_buffers_in_the_state_dict():
    model = tiny_gpt2(AttentionSpec(normalizer="ssmax", learnable=False, ssmax_scale=0.7))
    normalizer = attention_modules(model)[0].study_normalizer
    assert list(normalizer.parameters()) == []
    assert torch.equal(
        model.state_dict()["transformer.h.0.attn.study_normalizer.s"], torch.full((HEADS,), 0.7)
    )


# --- spec validation --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        (dict(normalizer="softermax"), "'softermax'"),
        (dict(normalizer="entmax", alpha=1.0), "1.0"),
        (dict(normalizer="entmax", alpha=0.5), "0.5"),
        (dict(normalizer="entmax", alpha=float("nan")), "nan"),
        (dict(normalizer="entmax15", alpha=2.0), "alpha=2.0"),
        (dict(normalizer="sparsemax", alpha=1.2), "alpha=1.2"),
        (dict(normalizer="softmax", ssmax_scale=1.0), "ssmax_scale=1.0"),
        (dict(normalizer="ssmax", ssmax_scale=0.0), "0.0"),
        (dict(normalizer="ssmax", self_adjust_variant="plain"), "self_adjust_variant='plain'"),
        (dict(normalizer="self_adjust", self_adjust_variant="scaled"), "'scaled'"),
        (dict(normalizer="sparsemax", learnable=True), "'sparsemax'"),
        (dict(normalizer="self_adjust", learnable=True), "'self_adjust'"),
        (dict(normalizer="entmax", learnable="yes"), "'yes'"),
    ],
)
def test_bad_options_raise_value_error_naming_the_value(kwargs, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(".", r"\.")):
        AttentionSpec(**kwargs)


def test_learnable_resolves_per_normalizer_and_hparams_stay_scalar():
    assert AttentionSpec(normalizer="ssmax").is_learnable is True
    assert AttentionSpec(normalizer="entmax").is_learnable is False
    assert AttentionSpec(normalizer="sparsemax", learnable=False).is_learnable is False
    for spec in SPECS.values():
        assert all(isinstance(v, (int, float, str, bool)) for v in spec.as_hparams().values())


# ---------------------------------------------------------------------------------------------------------------
# Your own normaliser: the registration API


class DoubledSoftmax(Normalizer):
    """softmax(2 z): the same weights as softmax at half the temperature, so every use has a closed form."""

    name = "doubled_softmax"

    def forward(self, scores, allowed, visible=None):
        return masked_softmax(2.0 * scores, allowed)


def test_registered_normaliser_works_in_spec_attend_model_and_analysis():
    from study.frozen.analysis import analyze, capture_attention

    register_normalizer(DoubledSoftmax)
    register_normalizer(DoubledSoftmax)  # the same class again: a no-op
    spec = AttentionSpec(normalizer="doubled_softmax", temperature=0.8)
    assert NORMALIZERS["doubled_softmax"] is DoubledSoftmax
    q, k, v = qkv()
    torch.testing.assert_close(attend(q, k, v, spec), attend(q, k, v, AttentionSpec(temperature=0.4, top_k=7)))

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32)).eval()
    reference = apply_attention_spec(copy.deepcopy(model), AttentionSpec(temperature=0.4, top_k=32))
    apply_attention_spec(model, spec)
    ids = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits)
    cap = capture_attention(model, ids)  # the analyses see the user's normaliser
    torch.testing.assert_close(cap.weights(0), capture_attention(reference, ids).weights(0))
    res = analyze(model, ids[:1], lengths=[16], ns=[1, 5], temperatures=[1.0], mc_samples=0, spectral_rows=2,
                  critical_ns=[1, 2])
    assert res["model"]["normalizers"] == ["doubled_softmax"]


def test_registration_errors_name_the_problem():
    class Other(DoubledSoftmax):
        pass

    register_normalizer(DoubledSoftmax)
    with pytest.raises(ValueError, match="'doubled_softmax' is already registered"):
        register_normalizer(Other)
    with pytest.raises(TypeError, match="Normalizer subclass"):
        register_normalizer(int)

    class NoForward(Normalizer):
        name = "no_forward"

    with pytest.raises(TypeError, match="does not implement forward"):
        register_normalizer(NoForward)
    with pytest.raises(ValueError, match="unknown normalizer 'nope'.*register_normalizer"):
        AttentionSpec(normalizer="nope")
    with pytest.raises(ValueError, match="cannot import normalizer 'tests.test_normalizers:Missing'"):
        AttentionSpec(normalizer="tests.test_normalizers:Missing")


def test_normaliser_named_by_import_path_registers_itself():
    """What a CLI, a YAML config or a freshly loaded checkpoint uses: no registering code runs first."""
    spec = AttentionSpec(normalizer="tests.test_normalizers:DoubledSoftmax")
    assert NORMALIZERS["tests.test_normalizers:DoubledSoftmax"] is DoubledSoftmax
    assert not spec.is_learnable


# ---------------------------------------------------------------------------------------------------------------
# A normaliser's own options: declared on the class, carried by the spec, checked by the normaliser


class CappedSoftmax(Normalizer):
    """softmax(min(z, cap)): its option `cap` bounds every score, so small caps have a closed form."""

    name = "capped_softmax"
    options = {"cap": 5.0}

    def __init__(self, cap: float) -> None:
        super().__init__()
        self.cap = cap

    @classmethod
    def check_spec(cls, spec) -> None:
        super().check_spec(spec)
        if spec.options["cap"] <= 0:
            raise ValueError(f"cap must be > 0, got {spec.options['cap']!r}")

    @classmethod
    def from_spec(cls, spec, num_heads):
        return cls(spec.options["cap"])

    def forward(self, scores, allowed, visible=None):
        return masked_softmax(scores.clamp(max=self.cap), allowed)


def test_a_users_normaliser_takes_its_own_option_from_python():
    register_normalizer(CappedSoftmax)
    spec = AttentionSpec(normalizer="capped_softmax", options={"cap": 0.5})
    assert spec.options == {"cap": 0.5} and spec.as_hparams()["cap"] == 0.5
    assert AttentionSpec(normalizer="capped_softmax").options == {"cap": 5.0}  # the declared default
    assert spec == AttentionSpec(normalizer="capped_softmax", options={"cap": 0.5}) and hash(spec) == hash(
        AttentionSpec(normalizer="capped_softmax", options={"cap": 0.5}))
    # A cap below every score makes each causal row uniform over its visible keys: row t is 1 / (t + 1).
    q, k, _ = qkv()
    scores = (q.abs() + 1) @ (k.abs() + 1).transpose(-1, -2)  # every score >= 8 > cap
    weights, _, _ = causal_weights(spec, scores)
    length = q.shape[-2]
    expected = torch.tril(torch.ones(length, length)) / torch.arange(1, length + 1).unsqueeze(-1)
    torch.testing.assert_close(weights, expected.expand_as(weights))
    # ... and the option reaches a transformers model's layers.
    model = apply_attention_spec(tiny_gpt2(AttentionSpec()), spec)
    assert {m.study_normalizer.cap for m in attention_modules(model)} == {0.5}


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        (dict(normalizer="capped_softmax", options={"cap": 0.0}), "cap must be > 0, got 0.0"),
        (dict(normalizer="capped_softmax", options={"cap": "big"}), "cap of normalizer 'capped_softmax' must be a "
         "finite number, got 'big'"),
        (dict(normalizer="capped_softmax", options={"kap": 1.0}), r"kap=1.0 has no effect with normalizer "
         r"'capped_softmax'; its options are \['cap'\]"),
        (dict(normalizer="softmax", options={"cap": 1.0}), "cap=1.0 has no effect with normalizer 'softmax'; it "
         "takes no options"),
        (dict(normalizer="entmax", alpha=2.0, options={"alpha": 3.0}), r"alpha is given twice, alpha=2.0 and "
         r"options\['alpha'\]=3.0"),
        (dict(normalizer="capped_softmax", options=[("cap", 1.0)]), "options must map option names to values"),
    ],
)
def test_bad_normaliser_options_are_refused_naming_the_value(kwargs, named):
    register_normalizer(CappedSoftmax)
    with pytest.raises(ValueError, match=named):
        AttentionSpec(**kwargs)


def test_built_in_options_by_their_own_keys_are_the_same_as_options():
    """Configs write `alpha: 2`; that is `options: {alpha: 2}`, and the key mirrors the resolved value."""
    by_key, by_options = AttentionSpec(normalizer="entmax", alpha=2.0), AttentionSpec(normalizer="entmax",
                                                                                        options={"alpha": 2.0})
    assert by_key == by_options and by_key.options == {"alpha": 2.0} and by_options.alpha == 2.0
    assert AttentionSpec(normalizer="ssmax").ssmax_scale == 0.43 and AttentionSpec().alpha is None
    # a spec rebuilt from its own fields (a saved config, a checkpoint's hyperparameters) is the same spec
    spec = AttentionSpec(normalizer="self_adjust", self_adjust_variant="plain", temperature=0.5)
    assert AttentionSpec(**{f: getattr(spec, f) for f in spec.__dataclass_fields__}) == spec
    assert copy.deepcopy(spec) == spec


def test_a_spec_pickled_before_normalisers_owned_their_options_still_loads():
    """Checkpoints hold the spec pickled: an old one has no `options` and every built-in option at its default."""
    old_state = {"normalizer": "softmax", "temperature": 0.5, "top_k": None, "layers": None, "alpha": 1.5,
                 "learnable": None, "ssmax_scale": 0.43, "self_adjust_variant": "normalized"}
    spec = AttentionSpec.__new__(AttentionSpec)
    spec.__setstate__(old_state)
    assert spec == AttentionSpec(temperature=0.5) and spec.options == {}
    entmax_spec = AttentionSpec.__new__(AttentionSpec)
    entmax_spec.__setstate__({**old_state, "normalizer": "entmax", "alpha": 2.0})
    assert entmax_spec == AttentionSpec(normalizer="entmax", temperature=0.5, alpha=2.0)


def test_every_built_in_registers_with_the_decorator_and_declares_its_options():
    import inspect

    import study.attention.normalizers as builtins

    source = inspect.getsource(builtins)
    for name in ("softmax", "sparsemax", "entmax15", "entmax", "ssmax", "self_adjust"):
        cls = NORMALIZERS[name]
        assert f"@register_normalizer\nclass {cls.__name__}(Normalizer)" in source
    assert dict(NORMALIZERS["entmax"].options) == {"alpha": 1.5}
    assert dict(NORMALIZERS["ssmax"].options) == {"ssmax_scale": 0.43}
    assert dict(NORMALIZERS["self_adjust"].options) == {"self_adjust_variant": "normalized"}


# --- uniform: the control that reads no query or key ---------------------------------------------------------


def test_uniform_attention_is_the_running_mean_of_the_values_and_reads_no_query_or_key():
    q, k, v = (t.requires_grad_() for t in qkv(length=6))
    out = attend(q, k, v, AttentionSpec(normalizer="uniform"))
    running_mean = v.cumsum(dim=2) / torch.arange(1, 7, dtype=v.dtype).view(1, 1, -1, 1)  # causal: keys 0..t
    torch.testing.assert_close(out, running_mean, atol=1e-6, rtol=1e-5)
    out.square().sum().backward()
    assert v.grad is not None and all(g is None or (g == 0).all() for g in (q.grad, k.grad))


def test_uniform_attention_with_top_k_averages_the_selected_keys():
    scores = torch.tensor([[[[3.0, 1.0, 2.0, 0.0]]]])
    allowed = torch.tensor([[[[True, False, True, False]]]])  # the two highest-scoring keys, as top-2 selects
    weights = build(AttentionSpec(normalizer="uniform"))(scores, allowed)
    assert weights.tolist() == [[[[0.5, 0.0, 0.5, 0.0]]]]
    empty = build(AttentionSpec(normalizer="uniform"))(scores, torch.zeros_like(allowed))
    assert (empty == 0).all()  # a row with no allowed key: zeros, not NaN


def test_uniform_attention_refuses_a_temperature_it_would_ignore():
    with pytest.raises(ValueError, match=r"temperature=0\.1 has no effect with normalizer 'uniform'"):
        AttentionSpec(normalizer="uniform", temperature=0.1)


def test_uniform_attention_in_gpt2_changes_the_logits_and_keeps_causality():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=50, n_positions=16)).eval()
    with torch.no_grad():  # peaked softmax rows: at GPT-2's initial scale they are nearly uniform already
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(50.0)
    ids = torch.randint(0, 50, (1, 8))
    stock = model(ids).logits
    uniform = copy.deepcopy(model)
    apply_attention_spec(uniform, AttentionSpec(normalizer="uniform"))
    logits = uniform(ids).logits
    assert not torch.allclose(logits, stock, atol=1e-3)  # the stock model's weights are not uniform
    changed = ids.clone()
    changed[0, 5:] = (changed[0, 5:] + 1) % 50
    torch.testing.assert_close(uniform(changed).logits[:, :5], logits[:, :5])
