"""Generate the project's own multiple-choice task for lm-eval, deterministically, offline.

Three kinds of item, each a question ending in "Answer:" and four short choices:

* ``arith``: small additions, subtractions and multiplications; distractors are near misses
  (off by one, off by ten), so a quantization error that blurs digits shows up.
* ``copy``: repeat a pair of words; distractors are the swapped pair and pairs with one word
  replaced (an induction-head task that small models solve, so a drop in accuracy is a numerics
  signal, not model weakness).
* ``fact``: capitals, weekday/month successors, opposites, plurals (64 in all); distractors from
  the same table.

The output is ``tasks/blockfp8_mc.jsonl`` (one item per line: id, category, question, choices,
answer index) next to the task YAML that lm-eval loads with ``include_path=evals/tasks``. The same
seed gives the same bytes, so the committed file can be checked with ``--check``.

usage: python evals/make_task.py [--n 200] [--seed 0] [--check]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
DATA_FILE = TASKS_DIR / "blockfp8_mc.jsonl"

WORDS = (
    "apple river window garden silver candle pocket marble thunder violet basket mirror "
    "jacket lemon harbor pencil rocket saddle tiger velvet wagon yellow anchor bottle "
    "castle dragon engine forest ginger hammer island jungle kettle ladder meadow needle "
    "orange parrot quartz rabbit shadow tunnel umbrella valley walnut zipper"
).split()

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Japan": "Tokyo", "China": "Beijing", "Russia": "Moscow", "Egypt": "Cairo",
    "Greece": "Athens", "Portugal": "Lisbon", "Austria": "Vienna", "Norway": "Oslo",
    "Sweden": "Stockholm", "Poland": "Warsaw", "Ireland": "Dublin", "Canada": "Ottawa",
    "Kenya": "Nairobi", "Peru": "Lima", "Thailand": "Bangkok", "Finland": "Helsinki",
}
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
OPPOSITES = {
    "hot": "cold", "big": "small", "up": "down", "fast": "slow", "happy": "sad",
    "light": "dark", "open": "closed", "early": "late", "old": "young", "hard": "soft",
    "wet": "dry", "full": "empty", "rich": "poor", "high": "low", "left": "right",
}
PLURALS = {
    "child": "children", "mouse": "mice", "foot": "feet", "tooth": "teeth", "man": "men",
    "woman": "women", "goose": "geese", "person": "people", "cat": "cats", "box": "boxes",
}


def _choices(rng: random.Random, answer: str, pool: list[str]) -> tuple[list[str], int]:
    """Answer plus three distinct distractors from pool, shuffled; returns (choices, index)."""
    distractors = rng.sample([p for p in dict.fromkeys(pool) if p != answer], 3)
    options = [answer, *distractors]
    rng.shuffle(options)
    return options, options.index(answer)


def arith_item(rng: random.Random) -> tuple[str, str, list[str]]:
    op = rng.choice("+-*")
    if op == "*":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        value = a * b
    else:
        a = rng.randint(10, 99)
        b = rng.randint(1, min(49, a))
        value = a + b if op == "+" else a - b
    near = [value + 1, value - 1, value + 10, value - 10, value + 2]
    return f"Question: What is {a} {op} {b}?\nAnswer:", str(value), [str(v) for v in near]


def copy_item(rng: random.Random) -> tuple[str, str, list[str]]:
    first, second, other = rng.sample(WORDS, 3)
    # The swapped pair is the hardest distractor: same tokens, wrong order.
    distractors = [f"{second} {first}", f"{first} {other}", f"{other} {second}"]
    return (f"Repeat the words exactly.\nWords: {first} {second}\nAnswer:", f"{first} {second}",
            distractors)


def all_facts() -> list[tuple[str, str, list[str]]]:
    """Every fact question (64 of them), each with its answer and its category's pool."""
    facts = [(f"Question: What is the capital of {c}?\nAnswer:", a, list(CAPITALS.values()))
             for c, a in CAPITALS.items()]
    facts += [(f"Question: Which day comes after {d}?\nAnswer:", DAYS[(i + 1) % 7], DAYS)
              for i, d in enumerate(DAYS)]
    facts += [(f"Question: Which month comes after {m}?\nAnswer:", MONTHS[(i + 1) % 12], MONTHS)
              for i, m in enumerate(MONTHS)]
    facts += [(f"Question: What is the opposite of {w}?\nAnswer:", a, list(OPPOSITES.values()))
              for w, a in OPPOSITES.items()]
    facts += [(f"Question: What is the plural of {w}?\nAnswer:", a, list(PLURALS.values()))
              for w, a in PLURALS.items()]
    return facts


# Share of each category in the task: arithmetic is the most sensitive to numerics.
MIX = (("arith", 0.4), ("copy", 0.3), ("fact", 0.3))


def make_items(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    counts = {cat: int(n * share) for cat, share in MIX}
    counts["arith"] += n - sum(counts.values())
    facts = all_facts()
    rng.shuffle(facts)
    if counts["fact"] > len(facts):
        raise ValueError(f"at most {len(facts)} fact items, asked for {counts['fact']}")
    items, seen = [], set()
    for cat, count in counts.items():
        made = 0
        while made < count:
            if cat == "fact":
                question, answer, pool = facts[made]
            else:
                question, answer, pool = (arith_item if cat == "arith" else copy_item)(rng)
                if question in seen:
                    continue
            seen.add(question)
            choices, index = _choices(rng, answer, pool)
            items.append({"id": f"{cat}-{made:03d}", "category": cat, "question": question,
                          "choices": choices, "answer": index})
            made += 1
    return items


def render(items: list[dict]) -> str:
    return "".join(json.dumps(item, sort_keys=True) + "\n" for item in items)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="number of items")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DATA_FILE)
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if the file on disk differs from what this seed generates")
    args = ap.parse_args()
    text = render(make_items(args.n, args.seed))
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'STALE (rerun make_task.py)'}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    counts = {}
    for line in text.splitlines():
        cat = json.loads(line)["category"]
        counts[cat] = counts.get(cat, 0) + 1
    print(f"wrote {args.out}: {sum(counts.values())} items {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
