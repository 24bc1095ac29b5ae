#!/usr/bin/env python3
"""Renders a Grafana dashboard JSON as a static HTML page from a live
Prometheus, for a screenshot where Grafana itself cannot be installed.

usage: dashboard_render.py DASHBOARD.json PROMETHEUS_URL START END OUT.html

Every panel's queries run as written (query_range, Grafana's variables
substituted: $job and $instance as "All", $__rate_interval as four scrape
intervals), laid out on the dashboard's own 24-column grid, one line per
series named by the target's legendFormat. What is drawn is what Prometheus
answered: a panel whose query returns nothing says "No data", as Grafana
would. Standard library only.
"""

import html
import json
import re
import sys
import urllib.parse
import urllib.request

STEP = 2  # seconds, the scrape interval scripts/dashboard-screenshot.sh sets
RATE_INTERVAL = f"{4 * STEP}s"
COLUMN = 62  # px per grid column (24 columns)
ROW = 34  # px per grid row
COLORS = ["#73bf69", "#f2cc0c", "#f2495c", "#5794f2", "#b877d9", "#ff9830",
          "#8ab8ff", "#96d98d", "#ffb357", "#ca95e5"]


def substitute(expr):
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    expr = re.sub(r"\$\{?job\}?", ".*", expr)
    return re.sub(r"\$\{?instance\}?", ".*", expr)


def query_range(prometheus, expr, start, end):
    params = urllib.parse.urlencode(
        {"query": expr, "start": start, "end": end, "step": STEP})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise SystemExit(f"Prometheus refused {expr}: {body}")
    return body["data"]["result"]


def legend(fmt, labels):
    if not fmt:
        return ", ".join(f"{k}={v}" for k, v in labels.items()) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def fmt_value(v, unit):
    if unit == "s":
        if v == 0:
            return "0"
        if abs(v) < 1e-3:
            return f"{v * 1e6:.0f} µs"
        if abs(v) < 1:
            return f"{v * 1e3:.1f} ms"
        return f"{v:.1f} s"
    if unit == "percentunit":
        return f"{v * 100:.0f}%"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f}M"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:.3g}" if v else "0"


def chart(series, width, height, start, end, unit):
    """An SVG line chart of [(name, [(t, v)])]."""
    pad_l, pad_r, pad_t, pad_b = 58, 8, 8, 20
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    values = [v for _, points in series for _, v in points]
    top = max(values) if values else 1
    top = top * 1.1 if top > 0 else 1
    x = lambda t: pad_l + (t - start) / (end - start) * w
    y = lambda v: pad_t + h - (v / top) * h
    out = [f'<svg width="{width}" height="{height}">']
    for i in range(5):
        v = top * i / 4
        out.append(f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>')
        out.append(f'<text x="{pad_l - 6}" y="{y(v) + 4:.1f}" class="axis" text-anchor="end">{fmt_value(v, unit)}</text>')
    for i in range(6):
        t = start + (end - start) * i / 5
        label = f"{int((t - start) // 60)}:{int((t - start) % 60):02d}"
        out.append(f'<text x="{x(t):.1f}" y="{height - 4}" class="axis" text-anchor="middle">{label}</text>')
    for i, (_, points) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{'M' if j == 0 else 'L'}{x(t):.1f},{y(v):.1f}" for j, (t, v) in enumerate(points))
        out.append(f'<path d="{path}" stroke="{color}" fill="none" stroke-width="1.6"/>')
    out.append("</svg>")
    return "".join(out)


def main():
    dashboard_path, prometheus, start, end, out = sys.argv[1:6]
    start, end = float(start), float(end)
    dashboard = json.load(open(dashboard_path))
    cells = []
    empty = []
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        left, top = g["x"] * COLUMN, g["y"] * ROW
        width, height = g["w"] * COLUMN - 8, g["h"] * ROW - 8
        title = html.escape(panel.get("title", ""))
        if panel["type"] == "row":
            cells.append(f'<div class="row" style="left:{left}px;top:{top}px;width:{width}px">{title}</div>')
            continue
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        series = []
        for target in panel.get("targets", []):
            for result in query_range(prometheus, substitute(target["expr"]), start, end):
                points = [(float(t), float(v)) for t, v in result["values"]
                          if v not in ("NaN", "+Inf", "-Inf")]
                if points:
                    series.append((legend(target.get("legendFormat"), result["metric"]), points))
        body_h = height - 30 - 22
        if series:
            drawn = chart(series, width - 8, body_h, start, end, unit)
            keys = "".join(
                f'<span><i style="background:{COLORS[i % len(COLORS)]}"></i>{html.escape(name)}</span>'
                for i, (name, _) in enumerate(series[:8]))
        else:
            empty.append(panel.get("title", ""))
            drawn = f'<div class="nodata" style="height:{body_h}px">No data</div>'
            keys = ""
        cells.append(
            f'<div class="panel" style="left:{left}px;top:{top}px;width:{width}px;height:{height}px">'
            f'<div class="title">{title}</div>{drawn}<div class="legend">{keys}</div></div>')
    total_h = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"]) * ROW
    page = f"""<!doctype html><meta charset="utf-8"><title>{html.escape(dashboard['title'])}</title>
<style>
body {{ background:#111217; color:#ccccdc; font:12px Inter, Helvetica, Arial, sans-serif; margin:0; }}
header {{ padding:10px 14px; font-size:17px; }} header small {{ color:#8e8e9e; font-size:12px; margin-left:12px; }}
main {{ position:relative; margin:0 10px; height:{total_h}px; }}
.panel {{ position:absolute; background:#181b1f; border:1px solid #2c3235; border-radius:3px; padding:4px; box-sizing:border-box; overflow:hidden; }}
.title {{ font-weight:500; font-size:13px; padding:4px 6px 6px; color:#d8d9da; }}
.row {{ position:absolute; font-size:15px; font-weight:500; padding-top:8px; }}
.grid {{ stroke:#2c3235; }} .axis {{ fill:#8e8e9e; font-size:10px; }}
.legend {{ padding:2px 6px; white-space:nowrap; overflow:hidden; color:#b6b6c6; font-size:11px; }}
.legend span {{ margin-right:12px; }} .legend i {{ display:inline-block; width:12px; height:3px; margin-right:4px; vertical-align:middle; }}
.nodata {{ display:flex; align-items:center; justify-content:center; color:#8e8e9e; }}
</style>
<header>{html.escape(dashboard['title'])}<small>job=All · instance=All · last {int((end - start) // 60)} min · rendered from Prometheus by scripts/dashboard_render.py</small></header>
<main>{''.join(cells)}</main>"""
    open(out, "w").write(page)
    print(f"{len(dashboard['panels'])} panels; no data: {', '.join(empty) or 'none'}")


if __name__ == "__main__":
    main()
