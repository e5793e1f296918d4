#!/bin/sh
# usage: cg_run.sh LABEL N [N...]: callgrind Ir of the consume window at each N, into /tmp/cg/LABEL.N.out
# Run from the tree to measure (PYTHONPATH=$PWD). Prints "LABEL N Ir".
label=$1; shift
mkdir -p /tmp/cg
for n in "$@"; do
  valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=/tmp/cg/$label.$n.out \
    ${PY:-/work/main/.venv/bin/python} "$(dirname "$0")/consume_cost.py" -n "$n" > /tmp/cg/$label.$n.log 2>/tmp/cg/$label.$n.err || { echo "$label $n FAILED"; tail -5 /tmp/cg/$label.$n.err; continue; }
  echo "$label $n $(sed -n 's/^totals: //p' /tmp/cg/$label.$n.out) $(cat /tmp/cg/$label.$n.log)"
done
