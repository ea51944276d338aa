"""Static SASS opcode counts per kernel, from `cuobjdump -sass` output (a quick look at what a change did to a
kernel's code without ncu; the K loop is unrolled, so the counts scale with the stage count).

    cuobjdump -sass BINARY | python dev/ncu/sass_opcode_counts.py [--match REGEX] [--ops FSEL,P2R,...]

Prints one line per kernel whose (mangled) name matches: total instructions and the count of each opcode named
(an opcode's base name, before the first '.', e.g. ISETP for ISETP.GE.AND).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

DEFAULT_OPS = "FFMA,FMUL,FSEL,ISETP,P2R,R2P,LDS,LD,BRA,BSSY,WARPSYNC,QGMMA,STL,LDL"  # QGMMA: the FP8 wgmma
INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def counts(lines) -> dict[str, Counter]:
    out: dict[str, Counter] = {}
    current = None
    for line in lines:
        if "Function :" in line:
            current = out.setdefault(line.split("Function :", 1)[1].strip(), Counter())
        elif current is not None and (m := INSTRUCTION.match(line)):
            current[m.group(1)] += 1
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--match", default="", help="regex on the mangled kernel name")
    parser.add_argument("--ops", default=DEFAULT_OPS)
    args = parser.parse_args(argv)
    ops = args.ops.split(",")
    print(f"{'kernel':<60} {'total':>6} " + " ".join(f"{o:>8}" for o in ops))
    for name, c in sorted(counts(sys.stdin).items()):
        if m := re.search(args.match, name):
            shown = name[m.start():][:60]  # from the match on: the template arguments, not the namespaces
            print(f"{shown:<60} {sum(c.values()):>6} " + " ".join(f"{c[o]:>8}" for o in ops))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
