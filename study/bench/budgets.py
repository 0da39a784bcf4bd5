"""The speed and memory budgets: ratios between variants of the same model, and their verdicts."""

from __future__ import annotations

from study.bench.shapes import Settings

BUDGETS = (
    ("temperature only / stock sdpa", 1.03),
    ("top-k / stock eager", 1.3),
    ("monitors every 50 / no monitors", 1.05),
    ("monitors every step / no monitors", 1.5),
    ("peak memory with monitors / without", 1.1),
)


def ratio_or_none(a, b):
    """a / b, or None when either is missing or b is not positive."""
    return None if a is None or b is None or b <= 0 else a / b


def budgets(rows: list[dict], settings: Settings) -> list[dict]:
    by = {r["name"]: r for r in rows}
    step = {name: r["time"].get("step_s") for name, r in by.items()}
    mem = {name: r.get("memory", {}).get("peak_bytes") for name, r in by.items()}
    temp = f"temperature T={settings.temperature}"
    out = [{"budget": BUDGETS[0][0], "variant": temp, "ratio": ratio_or_none(step.get(temp), step.get("stock sdpa")),
            "limit": BUDGETS[0][1]}]
    for k in settings.top_ks:
        name = f"top-k k={k}"
        out.append({"budget": BUDGETS[1][0], "variant": name, "ratio": ratio_or_none(step.get(name), step.get("stock eager")),
                    "limit": BUDGETS[1][1]})
    for n in settings.monitor_every:
        name = f"T={settings.temperature} + monitors every {n}"
        if name not in by:
            continue
        if n == 1:
            limit = BUDGETS[3]
        elif n == 50:
            limit = BUDGETS[2]
        else:
            limit = (f"monitors every {n} / no monitors", None)
        out.append({"budget": limit[0], "variant": name, "ratio": ratio_or_none(step.get(name), step.get(temp)),
                    "limit": limit[1]})
        out.append({"budget": BUDGETS[4][0], "variant": name, "ratio": ratio_or_none(mem.get(name), mem.get(temp)),
                    "limit": BUDGETS[4][1]})
    for b in out:
        b["verdict"] = ("n/a" if b["ratio"] is None or b["limit"] is None
                        else "PASS" if b["ratio"] <= b["limit"] else "MISS")
    # Memory rows of every-50 and every-step monitors are the same measurement (a logging step): keep one.
    seen, unique = set(), []
    for b in out:
        key = (b["budget"], b["ratio"]) if b["budget"] == BUDGETS[4][0] else id(b)
        if key not in seen:
            seen.add(key)
            unique.append(b)
    return unique

