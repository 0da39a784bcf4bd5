"""Gradient statistics: norms against torch, name classification on real models, fused q/k/v split."""

import math

import pytest
import torch
from torch import nn

from study.metrics.gradients import (
    block_index,
    fused_qkv_split,
    grouped_grad_norms,
    nonfinite_grad_count,
    parameter_kind,
    total_grad_norm,
)
from tests.conftest import tiny_llama_config

transformers = pytest.importorskip("transformers")


def tiny_gpt2() -> nn.Module:
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
    config.bos_token_id = config.eos_token_id = 0  # keep the tiny vocabulary consistent
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()  # eval: no dropout, deterministic gradients


def tiny_llama() -> nn.Module:
    config = tiny_llama_config(
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32, eos_token_id=0, tie_word_embeddings=False
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def backward_lm(model: nn.Module) -> None:
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()


@pytest.fixture(scope="module")
def gpt2():
    model = tiny_gpt2()
    backward_lm(model)
    return model


@pytest.fixture(scope="module")
def llama():
    model = tiny_llama()
    backward_lm(model)
    return model


# ---------------------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------------------


GPT2_KINDS = {
    "wte": "embedding",
    "wpe": "embedding",
    "ln_1": "norm",
    "ln_2": "norm",
    "ln_f": "norm",
    "attn.c_attn": "attn_qkv",
    "attn.c_proj": "attn_out",
    "mlp.c_fc": "mlp",
    "mlp.c_proj": "mlp",
    "lm_head": "head",
}
LLAMA_KINDS = {
    "embed_tokens": "embedding",
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_out",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
    "input_layernorm": "norm",
    "post_attention_layernorm": "norm",
    "model.norm": "norm",
    "lm_head": "head",
}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_parameter_kind_on_real_models(family):
    model = tiny_gpt2() if family == "gpt2" else tiny_llama()
    table = GPT2_KINDS if family == "gpt2" else LLAMA_KINDS
    # named_parameters() drops GPT-2's lm_head (tied to wte); named_modules() still lists it.
    names = [n for n, _ in model.named_parameters()] + ["lm_head.weight"]
    for name in names:
        kind = parameter_kind(name)
        assert kind != "other", name
        matches = [expected for key, expected in table.items() if f".{key}." in f".{name}"]
        assert matches and kind == matches[-1], (name, kind, matches)
    # Every kind in the table actually occurs.
    assert {parameter_kind(n) for n in names} == set(table.values())


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("blocks.0.attn.qkv.weight", "attn_qkv"),
        ("blocks.0.attn.proj.weight", "attn_out"),
        ("blocks.0.mlp.fc1.weight", "mlp"),
        ("blocks.0.ffn.0.weight", "mlp"),
        ("blocks.0.norm1.weight", "norm"),
        ("layers.0.self_attn.in_proj_weight", "attn_qkv"),
        ("layers.0.self_attn.in_proj_bias", "attn_qkv"),
        ("layers.0.self_attn.out_proj.weight", "attn_out"),
        ("layers.0.linear1.weight", "mlp"),
        ("encoder.LayerNorm.weight", "norm"),
        ("model.layers.0.self_attn.q_norm.weight", "norm"),
        ("transformer.h.3.attn.study_normalizer.scale", "normalizer"),
        ("model.layers.2.self_attn.study_normalizer.log_s", "normalizer"),
        ("cls_token", "other"),
    ],
)
def test_parameter_kind_generic_names(name, kind):
    assert parameter_kind(name) == kind


def test_block_index():
    assert block_index("transformer.h.3.attn.c_attn.weight") == 3
    assert block_index("model.layers.11.mlp.up_proj.weight") == 11
    assert block_index("blocks.0.attn.qkv.weight") == 0
    assert block_index("encoder.layer.7.attention.self.query.weight") == 7
    assert block_index("transformer.wte.weight") is None
    assert block_index("model.norm.weight") is None
    assert block_index("transformer.h.3") == 3


def test_parameter_kind_covers_torch_transformer_layer():
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32)
    kinds = {name: parameter_kind(f"layers.0.{name}") for name, _ in layer.named_parameters()}
    assert "other" not in kinds.values(), kinds


# ---------------------------------------------------------------------------------------------------------
# Norms
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_total_and_grouped_norms(family, request):
    model = request.getfixturevalue(family)
    params = list(model.parameters())
    expected = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    torch.testing.assert_close(total_grad_norm(params), expected)

    norms = grouped_grad_norms(model.named_parameters(), by=("block", "kind", "block_kind"))
    torch.testing.assert_close(norms["total"], expected)
    total_sq = expected.square()
    blocks = [v for k, v in norms.items() if k.startswith("block_") and "/" not in k]
    kinds = [v for k, v in norms.items() if not k.startswith("block_") and k != "total"]
    cross = [v for k, v in norms.items() if "/" in k]
    for group in (blocks, kinds, cross):
        torch.testing.assert_close(torch.stack(group).square().sum(), total_sq)
    assert {"block_0", "block_1", "block_none"} <= set(norms)
    assert {"attn_q", "attn_k", "attn_v", "attn_out", "mlp", "embedding", "norm"} <= set(norms)
    assert "attn_qkv" not in norms  # GPT-2's fused c_attn is split into q/k/v
    # Per-block value checked by hand.
    block1 = [p.grad for n, p in model.named_parameters() if block_index(n) == 1]
    torch.testing.assert_close(norms["block_1"], torch.nn.utils.get_total_norm(block1))


def test_grouped_norms_skip_missing_grads_and_accumulate_in_fp32():
    lin = nn.Linear(4, 4)
    frozen = nn.Linear(4, 4)
    lin.weight.grad = torch.full((4, 4), 2.0)
    norms = grouped_grad_norms(
        [("blocks.0.mlp.fc1.weight", lin.weight), ("blocks.0.norm1.weight", frozen.weight)]
    )
    assert set(norms) == {"block_0", "mlp", "total"}
    assert norms["total"].item() == pytest.approx(8.0)
    # fp16 gradients whose squares (1e6) overflow fp16 (max 65504): fp32 accumulation keeps the norm finite.
    half = nn.Parameter(torch.zeros(4, 4, dtype=torch.float16))
    half.grad = torch.full((4, 4), 1e3, dtype=torch.float16)
    norms = grouped_grad_norms([("blocks.0.mlp.fc1.weight", half)])
    assert norms["total"].dtype == torch.float32
    assert norms["total"].item() == pytest.approx(4e3)
    assert norms["block_0"].item() == pytest.approx(4e3)
    with pytest.raises(ValueError):
        grouped_grad_norms([], by=("layer",))
    assert grouped_grad_norms([])["total"].item() == 0.0


def test_fused_split_reproduces_separate_projection_grads(gpt2):
    """Rebuild block 0's c_attn as three separate projections with the same weights: their gradients must
    equal the split of the fused gradient (this pins the [q | k | v] column layout of Conv1D)."""
    attn = gpt2.transformer.h[0].attn
    d = attn.embed_dim
    w, b = attn.c_attn.weight.detach(), attn.c_attn.bias.detach()

    class SplitQKV(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.ParameterList([nn.Parameter(w[:, i * d : (i + 1) * d].clone()) for i in range(3)])
            self.b = nn.ParameterList([nn.Parameter(b[i * d : (i + 1) * d].clone()) for i in range(3)])

        def forward(self, x):
            return torch.cat([x @ self.w[i] + self.b[i] for i in range(3)], dim=-1)

    model = tiny_gpt2()  # same seed, same weights as the fixture
    split = SplitQKV()
    fused = model.transformer.h[0].attn.c_attn
    model.transformer.h[0].attn.c_attn = split
    backward_lm(model)
    model.transformer.h[0].attn.c_attn = fused

    gq, gk, gv = fused_qkv_split("transformer.h.0.attn.c_attn.weight", attn.c_attn.weight.grad)
    bq, bk, bv = fused_qkv_split("transformer.h.0.attn.c_attn.bias", attn.c_attn.bias.grad)
    for i, (gw, gb) in enumerate([(gq, bq), (gk, bk), (gv, bv)]):
        torch.testing.assert_close(gw, split.w[i].grad)
        torch.testing.assert_close(gb, split.b[i].grad)
    # The q slice is not the k slice: a wrong dimension would not pass the loop above, but be explicit.
    assert not torch.allclose(gq, gk)


def test_fused_split_multihead_attention_layout():
    mha = nn.MultiheadAttention(8, 2)
    q, k, v = fused_qkv_split("attn.in_proj_weight", mha.in_proj_weight)
    # nn.MultiheadAttention uses rows [0:E] for q, [E:2E] for k, [2E:3E] for v.
    torch.testing.assert_close(q, mha.in_proj_weight[:8])
    torch.testing.assert_close(v, mha.in_proj_weight[16:])
    with pytest.raises(ValueError):
        fused_qkv_split("model.layers.0.self_attn.q_proj.weight", torch.zeros(6, 6))
    with pytest.raises(ValueError):
        fused_qkv_split("h.0.attn.c_attn.weight", torch.zeros(4, 10))


def test_nonfinite_grad_count():
    a, b, c = nn.Parameter(torch.zeros(3, 4)), nn.Parameter(torch.zeros(5)), nn.Parameter(torch.zeros(2))
    a.grad = torch.zeros(3, 4)
    a.grad[0, 1] = math.nan
    a.grad[2, 3] = math.inf
    b.grad = torch.zeros(5)
    b.grad[4] = -math.inf
    count = nonfinite_grad_count([a, b, c])  # c has no grad
    assert count.dtype == torch.int64 and count.item() == 3
    b.grad.zero_()
    assert nonfinite_grad_count([b]).item() == 0
    assert nonfinite_grad_count([]).item() == 0
