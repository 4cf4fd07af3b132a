#!/usr/bin/env bash
# plot.sh - loss and step-time plot (PNG) from zs-train's CSV, with gnuplot.
# Usage: deploy/plot.sh TRAIN.csv [OUT.png]   (default OUT: TRAIN.png)
# Columns used: step (1), loss (2), ms_step (6), workers (12), val_loss (13,
# zs-train --val-data; drawn when some row has it). Rows from a resumed run
# simply continue the curve.
set -euo pipefail
csv=${1:?usage: plot.sh TRAIN.csv [OUT.png]}
out=${2:-${csv%.csv}.png}
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot missing (deploy/install-deps.sh installs gnuplot-nox)" >&2; exit 1; }
val=""
if awk -F, 'NR > 1 && $13 != "" { found = 1 } END { exit !found }' "$csv"; then
  val=', "" using 1:13 skip 1 with linespoints lw 2 pt 7 title "validation loss (--val-data)"'
fi
gnuplot <<GP
set datafile separator ","
set terminal pngcairo size 1000,700 noenhanced
set output "$out"
set multiplot layout 2,1 title "zeroshard training: $(basename "$csv")"
set grid
set xlabel "step"
set ylabel "loss"
plot "$csv" using 1:2 skip 1 with lines lw 2 title "loss (mean over the global batch)"$val
set ylabel "ms per step"
plot "$csv" using 1:6 skip 1 with points pt 7 ps 0.4 title "step time"
unset multiplot
GP
echo "plot.sh: wrote $out"
