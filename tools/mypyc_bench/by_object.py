"""Self Ir per object file (libpython, the mypyc .so, msgspec, libc...) of a callgrind out file."""
import collections
import re
import sys


def by_object(path):
    names, totals, ob = {}, collections.Counter(), None
    cur_is_call = False
    with open(path) as f:
        for line in f:
            if line.startswith(("ob=", "cob=")):
                m = re.match(r"c?ob=\((\d+)\)(?: (.*))?", line.strip())
                if m.group(2):
                    names[m.group(1)] = m.group(2)
                if line.startswith("ob="):
                    ob = names[m.group(1)]
            elif line.startswith("calls="):
                cur_is_call = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                if cur_is_call:  # the line after calls= is inclusive cost of the call
                    cur_is_call = False
                    continue
                parts = line.split()
                if len(parts) >= 2:
                    totals[ob] += int(parts[1])
    return totals

for p in sys.argv[1:]:
    t = by_object(p)
    s = sum(t.values())
    print(p, s)
    for ob, v in t.most_common(6):
        print(f"  {v/s*100:5.1f}% {v:>12,} {ob}")
