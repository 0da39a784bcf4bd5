"""`bench.md` and `bench.json`: the result as tables, the same numbers as the JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

from study.atomic import write_text_atomically
from study.bench.budgets import ratio_or_none


def _fmt(value, spec=".3f"):
    return "-" if value is None else format(value, spec)


def to_markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores ({m['torch_threads']} torch threads), torch {m['torch']}"
             + (f", {m['gpu']}" if "gpu" in m else "")]
    s = result["settings"]
    lines.append("Protocol: real Lightning training steps (forward + backward + grad clipping + AdamW + callbacks), "
                 f"variants round-robin in one process, median step time after warm-up. Precision {s['precision']}.")
    for note in result["notes"]:
        lines.append(f"Note: {note}")
    gpu = str(s["device"]).startswith("cuda")
    for model in result["models"]:
        sh = model["shape"]
        arch = "Llama" if sh.get("arch") == "llama" else "GPT-2"
        heads = f"{sh['n_head']} heads" + (f" ({sh['n_kv_head']} key-value)" if sh.get("n_kv_head") else "")
        lines += ["", f"### {sh['name']}: {arch} {sh['n_layer']} layers x {sh['n_embd']}, {heads}, "
                  f"vocab {sh['vocab_size']}, batch {sh['batch_size']} x {sh['seq_len']} ({model['params'] / 1e6:.1f} M params); "
                  f"{model['steps']['warmup']} warm-up + {model['steps']['rounds']} x {model['steps']['chunk']} steps",
                  ""]
        header = "| variant | path | step ms | x sdpa | x eager | tokens/s | peak MB | x mem | max RSS MB | x RSS |"
        rule = "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        if gpu:
            header, rule = header + " MFU |", rule + "---:|"
        lines += [header, rule]
        mem0 = next((r.get("memory", {}).get("peak_bytes") for r in model["rows"] if r["name"] == "stock sdpa"), None)
        rss0 = next((r.get("memory", {}).get("max_rss_bytes") for r in model["rows"] if r["name"] == "stock sdpa"), None)
        for r in model["rows"]:
            step = r["time"].get("step_s")
            peak = r.get("memory", {}).get("peak_bytes")
            path = r["implementation"] if r["implementation"] != "study" else (
                "study fast (SDPA)" if r["group"] in ("temperature", "monitors") else "study explicit fp32")
            if r["group"] == "monitors":
                path += ", taps on logging steps"
            cells = [r["name"] + (" (FAILED)" if "error" in r else ""), path, _fmt(step and step * 1e3, ".1f"),
                     _fmt(r["ratio_vs_sdpa"]), _fmt(r["ratio_vs_eager"]), _fmt(r["tokens_per_s"], ".0f"),
                     _fmt(peak and peak / 2**20, ".1f"), _fmt(ratio_or_none(peak, mem0))]
            rss = r.get("memory", {}).get("max_rss_bytes")
            cells += [_fmt(rss and rss / 2**20, ".0f"), _fmt(ratio_or_none(rss, rss0))]
            if gpu:
                cells.append(_fmt(r.get("mfu"), ".1%"))
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "| budget | variant | ratio | limit | verdict |", "|---|---|---:|---:|---|"]
        for b in model["budgets"]:
            lines.append(f"| {b['budget']} | {b['variant']} | {_fmt(b['ratio'])} | {_fmt(b['limit'], '.2f')} | "
                         f"{b['verdict']} |")
        if model.get("parity"):
            lines += parity_table(model["parity"])
    if result["analysis"]:
        lines += ["", "### Analysis (Theorem 1 statistics, one causal head) vs the loop oracle", "",
                  "| L | vectorised s | loop s | speed-up | oracle rows |", "|---:|---:|---:|---:|---:|"]
        for a in result["analysis"]:
            lines.append(f"| {a['L']} | {a['vectorised_s']:.4f} | {a['loop_s']:.3f} | {a['speedup']:.0f}x | "
                         f"{a['oracle_rows']} |")
    return "\n".join(lines) + "\n"


def parity_table(rows: list[dict]) -> list[str]:
    lines = ["", f"Parity ({rows[0]['precision']}): loss differences vs the path's own fp32 and vs stock eager fp32; fp32 max logit difference vs the path it equals in exact arithmetic:", "",
             "| path | loss fp32 | loss | vs own fp32 | vs stock fp32 | fp32 max logit vs reference | max logit err | "
             "verdict |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        exact = [v for k, v in r.items() if k.startswith("fp32_vs_")]
        lines.append(f"| {r['path']} | {r['loss_fp32']:.5f} | {r['loss']:.5f} | {r['loss_error_vs_own_fp32']:.2e} | "
                     f"{_fmt(r.get('loss_error_vs_stock_fp32'), '.2e')} | {_fmt(exact[0] if exact else None, '.2e')} "
                     f"| {r['max_logit_error_vs_own_fp32']:.2e} | {r['verdict']} |")
    return lines


def write(result: dict, out_dir: str | Path) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "bench.json", out / "bench.md"
    write_text_atomically(json_path, json.dumps(result, indent=2, default=lambda o: None if isinstance(o, float)
                                                and not math.isfinite(o) else str(o)) + "\n")
    write_text_atomically(md_path, to_markdown(result))
    return json_path, md_path

