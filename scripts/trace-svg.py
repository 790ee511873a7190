#!/usr/bin/env python3
"""Draw a zinf trace file (train.trace_file, `zinf bench step --trace`) as an SVG timeline.

One row per track (device streams, host threads, disks), each span a box coloured by its name and
labelled where it is wide enough, a time axis in milliseconds and a line at each step's start.
Python 3 standard library only.

    scripts/trace-svg.py TRACE.json -o timeline.svg [--steps 2-3] [--zoom 1900-2100] [--width 1400]
"""
import argparse
import html
import json
import sys

PALETTE = {
    "forward": "#4e79a7", "backward": "#2f4b7c", "Fetch": "#59a14f", "Upload": "#8cd17d",
    "Gather": "#b6992d", "GradOut": "#f28e2b", "Reduce": "#e15759", "Norm part": "#ff9d9a",
    "Norm": "#d37295", "Update": "#b07aa1", "Backup": "#9d7660", "read": "#76b7b2",
    "write": "#499894", "read+write": "#86bcb6", "checkpoint out": "#f1ce63", "checkpoint in": "#edc948",
}
EXTRA = ["#bab0ac", "#79706e", "#d4a6c8", "#fabfd2", "#a0cbe8", "#ffbe7d"]


def colour(name, seen):
    if name in PALETTE:
        return PALETTE[name]
    if name not in seen:
        seen[name] = EXTRA[len(seen) % len(EXTRA)]
    return seen[name]


def parse_steps(text):
    if not text:
        return None
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--steps", help="only these steps: N or A-B (default: every step in the file)")
    ap.add_argument("--zoom", help="only A-B milliseconds after the first span shown (spans cut at the edges)")
    ap.add_argument("--width", type=int, default=1400, help="pixels of the timeline (default 1400)")
    a = ap.parse_args()
    try:
        with open(a.trace) as f:
            t = json.load(f)
        events = t["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"trace-svg: {a.trace}: not a readable trace file ({e})")
    steps = parse_steps(a.steps)

    processes, threads, order = {}, {}, {}
    for e in events:
        if e.get("ph") != "M":
            continue
        if e["name"] == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e["name"] == "thread_sort_index":
            order[(e["pid"], e["tid"])] = e["args"]["sort_index"]
    spans = [e for e in events if e.get("ph") == "X"
             and (steps is None or steps[0] <= e["args"].get("step", 0) <= steps[1])]
    if not spans:
        sys.exit(f"trace-svg: {a.trace}: no spans" + (f" in steps {a.steps}" if a.steps else ""))

    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    if a.zoom:
        lo, _, hi = a.zoom.partition("-")
        t0, t1 = t0 + 1e3 * float(lo), t0 + 1e3 * float(hi)
        cut = []
        for e in spans:
            b, c = max(e["ts"], t0), min(e["ts"] + e["dur"], t1)
            if c > b or (c == b and t0 <= e["ts"] <= t1):
                cut.append(dict(e, ts=b, dur=c - b, whole=e["dur"]))
        spans = cut
        if not spans:
            sys.exit(f"trace-svg: {a.trace}: no spans in --zoom {a.zoom}")
    rows = sorted({(e["pid"], e["tid"]) for e in spans}, key=lambda k: (k[0], order.get(k, k[1])))
    label_w, row_h, top, axis_h = 190, 26, 34, 30
    width = label_w + a.width + 20
    height = top + len(rows) * row_h + axis_h + 34
    scale = a.width / max(t1 - t0, 1e-9)  # pixels per microsecond

    def x(us):
        return label_w + (us - t0) * scale

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    zinf = t.get("zinf", {})
    shown = f"steps {steps[0]}-{steps[1]}" if steps else "steps " + ", ".join(str(s) for s in zinf.get("steps", []))
    if a.zoom:
        shown += f", {a.zoom} ms"
    title = f"zinf trace: {zinf.get('config', a.trace)}, {shown} ({(t1 - t0) / 1e3:.1f} ms)"
    out.append(f'<text x="10" y="20" font-size="13">{html.escape(title)}</text>')
    # the steps' starts
    starts = {}
    for e in spans:
        s = e["args"].get("step")
        starts[s] = min(starts.get(s, e["ts"]), e["ts"])
    for s, us in sorted(starts.items()):
        if a.zoom and us <= t0:
            continue
        out.append(f'<line x1="{x(us):.1f}" y1="{top - 4}" x2="{x(us):.1f}" y2="{top + len(rows) * row_h}" '
                   f'stroke="#999" stroke-dasharray="3,3"/>')
        out.append(f'<text x="{x(us) + 3:.1f}" y="{top - 6}" fill="#555">step {s}</text>')
    seen = {}
    for i, key in enumerate(rows):
        y = top + i * row_h
        if i % 2:
            out.append(f'<rect x="0" y="{y}" width="{width}" height="{row_h}" fill="#f5f5f5"/>')
        name = f"{processes.get(key[0], key[0])}: {threads.get(key, key[1])}"
        out.append(f'<text x="8" y="{y + row_h / 2 + 4}">{html.escape(name)}</text>')
    for e in spans:
        y = top + rows.index((e["pid"], e["tid"])) * row_h + 3
        w = max(e["dur"] * scale, 0.5)
        unit = e["args"].get("unit")
        tip = f"{e['name']}" + (f" unit {unit}" if unit is not None else "") + \
            f", step {e['args'].get('step')}: {e.get('whole', e['dur']) / 1e3:.3f} ms"
        out.append(f'<rect x="{x(e["ts"]):.2f}" y="{y}" width="{w:.2f}" height="{row_h - 6}" '
                   f'fill="{colour(e["name"], seen)}" stroke="white" stroke-width="0.5">'
                   f'<title>{html.escape(tip)}</title></rect>')
        text = e["name"] + (f" {unit}" if unit is not None else "")
        if w > 7 * len(text):
            out.append(f'<text x="{x(e["ts"]) + 3:.2f}" y="{y + row_h / 2 + 1}" fill="white">'
                       f'{html.escape(text)}</text>')
    # the time axis, from the first span shown (the zoom's start with --zoom)
    ya = top + len(rows) * row_h + 14
    span_ms = (t1 - t0) / 1e3
    base_ms = float(a.zoom.partition("-")[0]) if a.zoom else 0.0
    step_ms = next(s for s in [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 1e9]
                   if span_ms / s <= 12)
    k = 0
    while k * step_ms <= span_ms + 1e-9:
        xx = x(t0 + k * step_ms * 1e3)
        out.append(f'<line x1="{xx:.1f}" y1="{ya - 10}" x2="{xx:.1f}" y2="{ya - 5}" stroke="black"/>')
        out.append(f'<text x="{xx:.1f}" y="{ya + 6}" text-anchor="middle">{base_ms + k * step_ms:g} ms</text>')
        k += 1
    # the legend
    names = sorted({e["name"] for e in spans})
    xl, yl = 10, ya + 24
    for n in names:
        out.append(f'<rect x="{xl}" y="{yl - 9}" width="10" height="10" fill="{colour(n, seen)}"/>')
        out.append(f'<text x="{xl + 14}" y="{yl}">{html.escape(n)}</text>')
        xl += 24 + 7 * len(n)
    out.append("</svg>")
    try:
        with open(a.output, "w") as f:
            f.write("\n".join(out) + "\n")
    except OSError as e:
        sys.exit(f"trace-svg: {a.output}: cannot write ({e})")


if __name__ == "__main__":
    main()
