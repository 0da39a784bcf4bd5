"""`study.tags` is the one place TensorBoard tag names are spelled: the logs' public API has one owner."""

from __future__ import annotations

import ast
from pathlib import Path

from study import tags

PACKAGE = Path(__file__).resolve().parents[1] / "study"
NAMESPACES = ("train/", "val/", "attention/", "attention_map/", "grad_norm/", "guard/", "probe/", "normalizer/",
              "analysis/", "pretrain-")  # fmt: skip


def spelled_tags(source: str) -> list[str]:
    """String literals (f-strings by their leading text) that start like a tag name."""
    found = []
    tree = ast.parse(source)
    inside_f_strings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            text = str(node.values[0].value)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside_f_strings:
            text = node.value
        else:
            continue
        if text.startswith(NAMESPACES):
            found.append(text)
    return found


def test_no_tag_is_spelled_outside_study_tags():
    spelled = {
        str(path.relative_to(PACKAGE.parent)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "tags.py" or path.parent != PACKAGE
        if (hits := spelled_tags(path.read_text()))
    }
    assert not spelled, f"tag names spelled outside study/tags.py: {spelled}"


def test_the_check_sees_literals_and_f_strings():
    source = 'a = "val/loss"\nb = f"attention/{s}/mean"\nc = "a docstring about val/loss"\n'
    assert spelled_tags(source) == ["val/loss", "attention/"]


def test_tag_builders():
    assert tags.attention("entropy") == "attention/entropy/mean"
    assert tags.attention("entropy", layer=3, head=1) == "attention/entropy/layer_3/head_1"
    assert tags.val(tags.attention("kl_uniform", layer=0)) == "val/attention/kl_uniform/layer_0"
    assert tags.by_visible("max_weight", 16) == "attention/by_visible/max_weight/n16"
    assert tags.analysis("gradient", "T", "0.1") == "analysis/gradient/T_0.1"
    assert tags.attention_hparam("top_k") == "attention/top_k"


def test_log10_copies_of_quantities_that_span_decades():
    """Gradient norms and perplexities get a log10 copy in a leading group (TensorBoard cannot set a log axis
    from the logs); a non-positive or NaN value has none, an infinite norm stays infinite."""
    import math

    from study import tags

    copies = tags.leading_copies({tags.GRAD_NORM: 1e10, tags.TRAIN_PPL: 45.0, tags.GRAD_Q: 0.0, tags.GRAD_K: math.nan})
    assert copies["Summary_train/Log10_grad_norm"] == 10.0 and copies["Summary_train/grad_norm_total"] == 1e10
    assert copies["Summary_train/Log10_perplexity"] == math.log10(45.0)
    assert tags.LOG10[tags.GRAD_Q] not in copies and tags.LOG10[tags.GRAD_K] not in copies
    assert tags.LOG10_GRAD_QK not in copies  # the norm of (0, NaN) is NaN: no log10
    assert tags.leading_copies({tags.GRAD_NORM: math.inf})[tags.LOG10[tags.GRAD_NORM]] == math.inf
    assert tags.LOG10[tags.VAL_PPL] == "Summary/Log10_perplexity_val"


def test_the_whole_networks_wq_wk_norm_is_the_root_of_the_sum_of_squares():
    """The first page's gradient card: sqrt(|g_Wq|^2 + |g_Wk|^2) on log10, without overflow at 1e200; none unless
    both parts are logged at that step."""
    import math

    from study import tags

    copies = tags.leading_copies({tags.GRAD_Q: 3e4, tags.GRAD_K: 4e4})
    assert copies[tags.LOG10_GRAD_QK] == math.log10(5e4)
    assert tags.leading_copies({tags.GRAD_Q: 1e200, tags.GRAD_K: 1e200})[tags.LOG10_GRAD_QK] == math.log10(
        math.sqrt(2)) + 200
    assert tags.LOG10_GRAD_QK not in tags.leading_copies({tags.GRAD_Q: 3.0})


def test_the_first_page_answers_the_question_in_at_most_six_cards():
    """The first group TensorBoard shows (groups sort by name, capitals first) holds the gradient, the validation
    perplexity, H/log n, the largest logit and the loss, at most six cards, log10 charts first and no linear copy
    of a quantity that has a log10 card there."""
    from study import tags

    names = {*tags.LEADING.values(), *tags.LOG10.values(), tags.LOG10_GRAD_QK}
    groups = sorted({name.split("/", 1)[0] for name in names})
    assert groups[0] == tags.SUMMARY_GROUP  # sorted as TensorBoard sorts them: upper case first
    first = sorted(name for name in names if name.split("/", 1)[0] == tags.SUMMARY_GROUP)
    assert len(first) <= tags.FIRST_PAGE_CARDS and first == list(tags.FIRST_PAGE)
    assert first[:2] == [tags.LOG10_GRAD_QK, tags.LOG10[tags.VAL_PPL]]
    logged_on_log10 = {source for source, copy in tags.LOG10.items() if copy in first} | set(tags.GRAD_QK_PARTS)
    assert not any(tags.LEADING.get(source) in first for source in logged_on_log10)  # no linear duplicate there
    # the validation copies are named as such, wherever their group: the shared step-0 baseline copies them
    assert tags.is_validation(tags.LOG10[tags.VAL_PPL]) and tags.is_validation(tags.LEADING[tags.VAL_LOSS])
    assert not tags.is_validation(tags.LEADING[tags.TRAIN_LOSS]) and not tags.is_validation(tags.LOG10_GRAD_QK)
