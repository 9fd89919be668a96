#!/usr/bin/env python3
"""Draws the panels of a Grafana dashboard from a live Prometheus, into one PNG.

Grafana is not needed: every target's `expr` of every panel is evaluated by Prometheus's
HTTP API (`/api/v1/query_range`), and the panels are drawn with matplotlib where the
dashboard's `gridPos` puts them, with their titles, legends (`legendFormat`) and units.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install matplotlib
    /tmp/venv/bin/python render.py --prometheus http://127.0.0.1:9090 \
        --last 300 --out ../docs/dashboard.png

`record.sh` beside this file does a whole run: the demo's three shop instances, a
Prometheus scraping them every second, the load generator for a few minutes, then this
script over that window (`docs/dashboard.png`).

Grafana's variables are replaced before a query is sent: `$__rate_interval` by
`--rate-interval` (15s), `$__interval` by the step, `$__range` by the window, and the
dashboard's template variables (`$name`, `${name}`, `[[name]]`) by `.*`. Missing points
are gaps, as Grafana draws them; a panel whose `custom.scaleDistribution` is `log` gets a log
axis. The legend shows each series' last and largest value. The PNG is written either way,
but the exit status is 1 when a query failed or a panel had no data, so an empty panel is
not missed.
"""

import argparse
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator  # noqa: E402

HERE = Path(__file__).resolve().parent

# Grafana's dark theme and its classic palette.
BACKGROUND = "#111217"
PANEL = "#181b1f"
BORDER = "#2a2d33"
GRID = "#2c3235"
TEXT = "#ccccdc"
MUTED = "#8e8e8e"
PALETTE = [
    "#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9",
    "#705da0", "#37872d", "#fade2a", "#447ebc", "#c15c17", "#890f02", "#0a437c",
    "#6d1f62", "#584477", "#b7dbab", "#f4d598", "#70dbed", "#f9ba8f",
]


def substitute(expr, dashboard, step, window, rate_interval):
    """The query with Grafana's variables replaced by values Prometheus takes."""
    builtin = {
        "__rate_interval": rate_interval,
        "__interval": f"{step}s",
        "__range": f"{int(window)}s",
        "__range_s": str(int(window)),
    }
    for name, value in builtin.items():
        expr = re.sub(r"\$\{%s\}|\$%s\b|\[\[%s\]\]" % (name, name, name), value, expr)
    names = [v.get("name") for v in dashboard.get("templating", {}).get("list", [])]
    for name in filter(None, names):
        expr = re.sub(
            r"\$\{%s(?::[a-z]+)?\}|\$%s\b|\[\[%s\]\]" % (name, name, name), ".*", expr
        )
    return expr


def query_range(prometheus, expr, start, end, step):
    """The matrix Prometheus answers for `expr`, or raises with its error."""
    params = urllib.parse.urlencode(
        {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}s"}
    )
    url = f"{prometheus.rstrip('/')}/api/v1/query_range?{params}"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.load(response)
    except urllib.error.HTTPError as err:
        body = json.load(err)
    if body.get("status") != "success":
        raise RuntimeError(f"{body.get('errorType')}: {body.get('error')}")
    return body["data"]["result"]


def version(prometheus):
    """The Prometheus server's version, or "" if it does not say."""
    try:
        url = f"{prometheus.rstrip('/')}/api/v1/status/buildinfo"
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)["data"]["version"]
    except Exception:  # noqa: BLE001 - only a caption
        return ""


def legend(fmt, metric):
    """`legendFormat` with `{{label}}` filled in, or the series' labels as Grafana shows them."""
    if fmt and fmt != "__auto":
        text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt)
        return " ".join(text.split())
    name = metric.get("__name__", "")
    labels = ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    return f"{name}{{{labels}}}" if labels else name or "{}"


def scaled(value, steps):
    """`value` in the largest of `steps` ((factor, suffix), ascending) it reaches."""
    factor, suffix = steps[0]
    for f, s in steps:
        if abs(value) >= f:
            factor, suffix = f, s
    return value / factor, suffix


def number(value):
    """A number with at most three significant digits, no trailing zeros."""
    if value == 0:
        return "0"
    digits = max(0, 2 - int(math.floor(math.log10(abs(value)))))
    text = f"{value:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def formatter(unit):
    """A function that writes a value in `unit` as Grafana does (`s`, `reqps`, `short`...)."""
    short = [(1, ""), (1e3, " K"), (1e6, " Mil"), (1e9, " Bil")]
    seconds = [(1e-9, " ns"), (1e-6, " µs"), (1e-3, " ms"), (1, " s"), (60, " min"),
               (3600, " hour")]

    def fmt(value):
        if value is None or math.isnan(value):
            return "–"
        if unit == "s":
            v, suffix = scaled(value, seconds) if value else (0, " s")
        elif unit == "ms":
            v, suffix = scaled(value / 1e3, seconds) if value else (0, " ms")
        elif unit == "percentunit":
            v, suffix = value * 100, "%"
        elif unit == "percent":
            v, suffix = value, "%"
        else:
            v, suffix = scaled(value, short)
            per = {"reqps": "req/s", "rps": "req/s", "ops": "ops/s"}.get(unit)
            if per:
                suffix = f"{suffix} {per}" if suffix else f" {per}"
        return f"{number(v)}{suffix}"

    return fmt


def series_of(panel, dashboard, args, start, end):
    """Every series of the panel's targets: (legend, times, values), and the errors."""
    out, errors = [], []
    grid = [start + i * args.step for i in range(int((end - start) // args.step) + 1)]
    for target in panel.get("targets", []):
        if target.get("hide") or not target.get("expr"):
            continue
        expr = substitute(target["expr"], dashboard, args.step, end - start, args.rate_interval)
        try:
            result = query_range(args.prometheus, expr, start, end, args.step)
        except Exception as err:  # noqa: BLE001 - shown in the panel
            errors.append(f"{target.get('refId', '?')}: {err}")
            continue
        for item in result:
            points = {round(float(t), 3): float(v) for t, v in item["values"]}
            values = [points.get(round(t, 3), math.nan) for t in grid]
            times = [datetime.fromtimestamp(t) for t in grid]
            out.append((legend(target.get("legendFormat"), item["metric"]), times, values))
    out.sort(key=lambda s: s[0])
    return out, errors


def draw_panel(fig, panel, box, series, errors, start, end):
    """One panel in `box` (left, bottom, width, height in figure fractions)."""
    left, bottom, width, height = box
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    unit = defaults.get("unit", "short")
    scale = defaults.get("custom", {}).get("scaleDistribution", {})
    log_base = scale.get("log", 2) if scale.get("type") == "log" else None
    fmt = formatter(unit)
    fig.patches.append(
        plt.Rectangle((left, bottom), width, height, transform=fig.transFigure,
                      facecolor=PANEL, edgecolor=BORDER, linewidth=1, zorder=-1)
    )
    px_w, px_h = fig.get_size_inches() * fig.dpi
    pad_x, pad_top = 14 / px_w, 34 / px_h
    fig.text(left + pad_x, bottom + height - 12 / px_h, panel.get("title", ""),
             color=TEXT, fontsize=11, fontweight="bold", va="top")
    # The legend is a table under the graph (name, last, max): in as many columns as it
    # takes to keep it under 40% of the panel.
    line = 17 / px_h
    fits = max(1, int((0.4 * height - 20 / px_h) / line))
    columns = max(1, min(3, math.ceil(len(series) / fits)))
    per_column = max(1, math.ceil(len(series) / columns))
    legend_h = (20 + 17 * per_column) / px_h
    axis_pad = 56 / px_w
    ax = fig.add_axes([left + pad_x + axis_pad, bottom + legend_h + 22 / px_h,
                       width - 2 * pad_x - axis_pad, height - pad_top - legend_h - 30 / px_h])
    ax.set_facecolor(PANEL)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.grid(True, color=GRID, linewidth=0.8)
    ax.tick_params(colors=MUTED, labelsize=8, length=0)
    ax.tick_params(axis="x", pad=7)
    ax.set_xlim(datetime.fromtimestamp(start), datetime.fromtimestamp(end))
    ax.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=4, maxticks=8))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    if log_base:
        ax.set_yscale("log", base=log_base)
        ax.yaxis.set_major_locator(LogLocator(base=log_base))
        ax.yaxis.set_minor_locator(NullLocator())
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))

    rows_text = []
    finite_all = []
    for i, (name, times, values) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        ax.plot(times, values, color=color, linewidth=1.3)
        finite = [v for v in values if not math.isnan(v)]
        finite_all.extend(finite)
        last = finite[-1] if finite else math.nan
        peak = max(finite) if finite else math.nan
        rows_text.append((color, name, fmt(last), fmt(peak)))
    positive = [v for v in finite_all if v > 0]
    if log_base and positive:
        ax.set_ylim(min(positive) / 1.5, max(positive) * 1.5)
    elif finite_all:
        low, high = min(finite_all), max(finite_all)
        low = min(low, 0)
        if high <= low:
            high = low + 1
        ax.set_ylim(low, high * 1.08 if high > 0 else high)
    else:
        ax.set_ylim(0, 1)
        ax.text(0.5, 0.5, "No data", transform=ax.transAxes, color=MUTED,
                ha="center", va="center", fontsize=12)
    for k, error in enumerate(errors):
        ax.text(0.01, 0.97 - 0.08 * k, error[:140], transform=ax.transAxes,
                color="#f2495c", fontsize=8, va="top")

    column_w = (width - 2 * pad_x) / columns
    top = bottom + legend_h
    for c in range(columns):
        x = left + pad_x + c * column_w
        col_last, col_max = x + column_w - 160 / px_w, x + column_w - 80 / px_w
        fig.text(col_last, top - 4 / px_h, "Last", color=MUTED, fontsize=8, va="top")
        fig.text(col_max, top - 4 / px_h, "Max", color=MUTED, fontsize=8, va="top")
        for k, (color, name, last, peak) in enumerate(
            rows_text[c * per_column:(c + 1) * per_column]
        ):
            y = top - 20 / px_h - k * line
            fig.patches.append(plt.Rectangle((x, y - 9 / px_h), 14 / px_w, 3 / px_h,
                                             transform=fig.transFigure, facecolor=color))
            fig.text(x + 20 / px_w, y, name, color=TEXT, fontsize=8, va="top")
            fig.text(col_last, y, last, color=TEXT, fontsize=8, va="top")
            fig.text(col_max, y, peak, color=TEXT, fontsize=8, va="top")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dashboard", type=Path, default=HERE / "flash-sale.json")
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090")
    parser.add_argument("--start", type=float, help="window start, Unix seconds")
    parser.add_argument("--end", type=float, help="window end, Unix seconds (default: now)")
    parser.add_argument("--last", type=float, default=900,
                        help="window length in seconds, when --start is not given (900)")
    parser.add_argument("--step", type=int, default=2, help="query step, seconds (2)")
    parser.add_argument("--rate-interval", default="15s",
                        help="what $__rate_interval stands for (15s)")
    parser.add_argument("--unit-height", type=int, default=40,
                        help="pixels per gridPos row (40)")
    parser.add_argument("--width", type=int, default=1800, help="image width, pixels (1800)")
    parser.add_argument("--out", type=Path, default=HERE.parent / "docs" / "dashboard.png")
    args = parser.parse_args()

    dashboard = json.loads(args.dashboard.read_text())
    end = args.end if args.end is not None else time.time()
    start = args.start if args.start is not None else end - args.last
    start = math.floor(start / args.step) * args.step
    panels = [p for p in dashboard.get("panels", []) if p.get("type") != "row"]

    header = 60
    gap = 8
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    height = header + rows * args.unit_height + gap
    dpi = 100
    fig = plt.figure(figsize=(args.width / dpi, height / dpi), dpi=dpi, facecolor=BACKGROUND)
    col = (args.width - gap) / 24
    span = (f"{datetime.fromtimestamp(start):%Y-%m-%d %H:%M:%S} to "
            f"{datetime.fromtimestamp(end):%H:%M:%S}")
    fig.text(gap / args.width, 1 - 14 / height, dashboard.get("title", "dashboard"),
             color=TEXT, fontsize=15, fontweight="bold", va="top")
    server = " ".join(filter(None, ["Prometheus", version(args.prometheus)]))
    fig.text(1 - gap / args.width, 1 - 16 / height,
             f"{span}  ·  step {args.step}s  ·  every query evaluated by {server} at "
             f"{args.prometheus}", color=MUTED, fontsize=9, va="top", ha="right")

    empty = []
    for panel in sorted(panels, key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"])):
        pos = panel["gridPos"]
        x0 = gap + pos["x"] * col
        y0 = header + pos["y"] * args.unit_height
        w = pos["w"] * col - gap
        h = pos["h"] * args.unit_height - gap
        box = (x0 / args.width, 1 - (y0 + h) / height, w / args.width, h / height)
        series, errors = series_of(panel, dashboard, args, start, end)
        if errors or not any(any(not math.isnan(v) for v in s[2]) for s in series):
            empty.append(panel.get("title", "?"))
        draw_panel(fig, panel, box, series, errors, start, end)
        print(f"{panel.get('title')}: {len(series)} series"
              + (f"; errors: {errors}" if errors else ""), file=sys.stderr)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=dpi, facecolor=BACKGROUND)
    print(f"wrote {args.out}", file=sys.stderr)
    if empty:
        print(f"panels without data: {', '.join(empty)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
