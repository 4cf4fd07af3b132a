#!/usr/bin/env python3
"""ncu_summary.py - sum an Nsight Compute CSV (tests/gpu.sh --only prof: one
metric, gpu__time_duration.sum, per kernel launch) per kernel for ONE
training step, and print the table the notes quote.

A step is the launches between two consecutive AdamW launches (k_adamw is
the last kernel of a model-row step in bench_gpt); the middle complete
step is taken, so warm-up effects at either end stay out. Kernel names
lose their argument lists and are cut at 90 characters.

usage: bench/ncu_summary.py FILE.csv [--top N]
Does not: run anything on a GPU, or read other metrics.
"""
import csv
import re
import sys


def short(name):
    name = re.sub(r"^void ", "", name)
    depth, cut = 0, len(name)  # drop the argument list (after any template's)
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            cut = i
            break
    name = name[:cut].strip()
    return (name[:90] + "...") if len(name) > 93 else (name or "?")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    rows = []
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own messages start with ==
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        ns = v * {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1)
        rows.append((short(r["Kernel Name"]), ns))
    if not rows:
        sys.exit("no gpu__time_duration rows in " + sys.argv[1])
    ends = [i for i, (k, _) in enumerate(rows) if k == "k_adamw"]
    # consecutive AdamW launches of one step (one per parameter tensor or
    # segment) count as one boundary: keep the last of each run
    bounds = [e for j, e in enumerate(ends) if j + 1 == len(ends) or ends[j + 1] != e + 1]
    if len(bounds) >= 2:
        m = len(bounds) // 2
        a, b = bounds[m - 1] + 1, bounds[m] + 1
        what = f"one step: launches {a}..{b - 1} of {len(rows)} profiled"
    else:
        a, b = 0, len(rows)
        what = f"all {len(rows)} profiled launches (no two AdamW boundaries found)"
    per = {}
    for k, ns in rows[a:b]:
        n, t = per.get(k, (0, 0.0))
        per[k] = (n + 1, t + ns)
    total = sum(t for _, t in per.values())
    print(f"{what}: {b - a} kernels, {total / 1e6:.2f} ms of kernel time")
    print("| kernel | launches | ms | share |")
    print("|---|---|---|---|")
    for k, (n, t) in sorted(per.items(), key=lambda x: -x[1][1])[:top]:
        print(f"| {k} | {n} | {t / 1e6:.2f} | {100 * t / total:.1f}% |")


if __name__ == "__main__":
    main()
