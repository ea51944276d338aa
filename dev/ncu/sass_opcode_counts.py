"""Static SASS opcode counts per kernel, from `cuobjdump -sass` output (a quick look at what a change did to a
kernel's code without ncu; the K loop is unrolled, so the counts scale with the stage count).

    cuobjdump -sass BINARY | python dev/ncu/sass_opcode_counts.py [--match REGEX] [--ops FSEL,P2R,...] [--loop]

Prints one line per kernel whose (mangled) name matches: total instructions and the count of each opcode named
(an opcode's base name, before the first '.', e.g. ISETP for ISETP.GE.AND). With --loop, only the main loop's
body: of the loops a backward branch closes (branch target .. branch), the one with the most MMA instructions
(HMMA, HGMMA, QGMMA), the shortest on a tie: what one iteration issues per warp, prologue and epilogue left out.
cuobjdump ships in the nvidia-cuda-cuobjdump wheel where the toolkit lacks it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

DEFAULT_OPS = "FFMA,FMUL,FSEL,ISETP,P2R,R2P,LDS,LD,BRA,BSSY,WARPSYNC,QGMMA,STL,LDL"  # QGMMA: the FP8 wgmma
INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)([^;]*)")
BRANCH_TARGET = re.compile(r"\s(0x[0-9a-f]+)\s*$")
MMA_OPS = ("HMMA", "HGMMA", "QGMMA")


def instructions(lines) -> dict[str, list[tuple[int, str, str]]]:
    """{kernel: [(address, opcode base name, operands)]} in program order."""
    out: dict[str, list] = {}
    current = None
    for line in lines:
        if "Function :" in line:
            current = out.setdefault(line.split("Function :", 1)[1].strip(), [])
        elif current is not None and (m := INSTRUCTION.match(line)):
            current.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return out


def main_loop(code: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The body of the loop with the most MMA instructions (the shortest on a tie); [] without a backward branch."""
    best, best_key = [], None
    for i, (address, op, rest) in enumerate(code):
        target = BRANCH_TARGET.search(rest) if op == "BRA" else None
        if target is None or int(target.group(1), 16) > address:
            continue
        body = [ins for ins in code[:i + 1] if ins[0] >= int(target.group(1), 16)]
        key = (sum(ins[1] in MMA_OPS for ins in body), -len(body))
        if best_key is None or key > best_key:
            best, best_key = body, key
    return best


def counts(lines, loop: bool = False) -> dict[str, Counter]:
    return {name: Counter(op for _, op, _ in (main_loop(code) if loop else code))
            for name, code in instructions(lines).items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--match", default="", help="regex on the mangled kernel name")
    parser.add_argument("--ops", default=DEFAULT_OPS)
    parser.add_argument("--loop", action="store_true", help="count the main loop's body only")
    args = parser.parse_args(argv)
    ops = args.ops.split(",")
    print(f"{'kernel':<60} {'total':>6} " + " ".join(f"{o:>8}" for o in ops))
    for name, c in sorted(counts(sys.stdin, args.loop).items()):
        if m := re.search(args.match, name):
            shown = name[m.start():][:60]  # from the match on: the template arguments, not the namespaces
            print(f"{shown:<60} {sum(c.values()):>6} " + " ".join(f"{c[o]:>8}" for o in ops))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
