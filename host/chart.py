"""A PNG bar chart of speed-ups from a benchmark results document (Pillow, no plotting stack).

One panel per baseline; one bar per (case, variant) that has a speed-up over
that baseline. The x axis is log2: bars grow right of the 1x line when the
variant is faster than the baseline (green), left when slower (red), so a
0.02x and a 50x are equally readable. With the phone-cache proxy (``--proxy``), one more panel per
proxy baseline shows how many times less DRAM traffic each variant needs in the simulated cache.
"""

from __future__ import annotations

import math
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

ROW_H = 22
LABEL_W = 330
PANEL_W = 620
MARGIN = 16
GREEN = (46, 139, 87)
RED = (200, 64, 64)
GREY = (200, 200, 200)
INK = (30, 30, 30)
PROXY_CLAMP = 64.0  # proxy traffic ratios are drawn within [1/64, 64] (the JSON keeps the exact ones)


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def _rows(document: dict, baseline: str) -> list[tuple[str, float, float]]:
    rows = []
    for entry in document["results"]:
        for name, res in entry["variants"].items():
            s = res.get("speedup_vs", {}).get(baseline)
            if s:
                rows.append((f"{entry['label']}  {name}", s["median"], s["p10"]))
    return rows


def _proxy_rows(document: dict, baseline: str) -> list[tuple[str, float, float]]:
    """Simulated DRAM traffic of the baseline ÷ the variant's, at the geometry's first shared-cache size."""
    rows = []
    for entry in document["results"]:
        for name, res in entry["variants"].items():
            ratio = res.get("proxy_vs", {}).get(baseline)
            value = next(iter(ratio["dram_bytes"].values()), None) if ratio else None
            if value:  # clamped: a near-zero baseline or variant would squash every other panel's axis
                shown = min(max(1.0 / value, 1 / PROXY_CLAMP), PROXY_CLAMP)
                rows.append((f"{entry['label']}  {name}", shown, shown))
    return rows


def speedup_chart(document: dict, path: Path) -> Path:
    panels = [(f"vs {b}", _rows(document, b)) for b in document["context"]["baselines"]]
    proxy = document["context"].get("proxy") or {}
    for base in proxy.get("baselines", []):
        rows = _proxy_rows(document, base)
        if rows:  # a locality panel: how many times less DRAM traffic than the baseline (simulated phone cache)
            size = next(iter(next(
                res["proxy"]["model_figures"]["dram_bytes"]
                for e in document["results"] for res in e["variants"].values()
                if res.get("proxy", {}).get("status") == "ok")))
            panels.append((f"simulated DRAM traffic ({proxy['geometry']}, LL {size}): x less than {base}", rows))
    panel_heights = [40 + max(len(rows), 1) * ROW_H + 24 for _, rows in panels]
    width = LABEL_W + PANEL_W + 2 * MARGIN
    image = Image.new("RGB", (width, 56 + sum(panel_heights)), "white")
    draw = ImageDraw.Draw(image)
    title_font, font, small = _font(16), _font(12), _font(10)
    ctx = document["context"]
    draw.text((MARGIN, 8), f"agoc bench '{document['suite']}': speed-up over baseline", fill=INK, font=title_font)
    draw.text(
        (MARGIN, 30),
        f"median of per-round ratios (tick: p10) - {ctx['machine']['cpu']}, {ctx['threads']} threads, "
        f"{document['created']}",
        fill=INK,
        font=small,
    )
    ratios = [r for _, rows in panels for _, m, p in rows for r in (m, p) if r > 0]
    span = math.ceil(max([1.0] + [abs(math.log2(r)) for r in ratios]))
    x0 = LABEL_W + MARGIN
    half = PANEL_W / 2 - 40

    def x_of(ratio: float) -> float:
        return x0 + PANEL_W / 2 + (math.log2(ratio) / span) * half

    top = 56
    for (baseline, rows), panel_h in zip(panels, panel_heights):
        draw.text((MARGIN, top + 6), baseline, fill=INK, font=title_font)
        bars_top = top + 32
        bottom = bars_top + max(len(rows), 1) * ROW_H
        for k in range(-span, span + 1):
            x = x_of(2.0**k)
            draw.line([(x, bars_top), (x, bottom)], fill=GREY if k else INK, width=1)
            draw.text((x - 10, bottom + 4), f"{2.0**k:g}x" if k >= 0 else f"1/{2**-k}x", fill=INK, font=small)
        if not rows:
            draw.text((MARGIN, bars_top + 4), "(no measurements)", fill=INK, font=font)
        for j, (label, median, p10) in enumerate(rows):
            y = bars_top + j * ROW_H
            draw.text((MARGIN, y + 4), label[:52], fill=INK, font=font)
            x1, xm = x_of(1.0), x_of(median)
            draw.rectangle([min(x1, xm), y + 4, max(x1, xm), y + ROW_H - 4], fill=GREEN if median >= 1 else RED)
            xp = x_of(p10) if p10 > 0 else xm
            draw.line([(xp, y + 2), (xp, y + ROW_H - 2)], fill=INK, width=2)
            draw.text((xm + 4 if median >= 1 else xm - 48, y + 5), f"{median:.2f}x", fill=INK, font=small)
        top += panel_h
    image.save(path)
    return path
