"""`eaglewire doctor live` against real vLLM (its CPU build): the released draft's vLLM export served healthy
and broken, the probe's output kept as an example.

    python -m benchmarks.doctor.live_probe_vllm --limit 4 --max-tokens 64

Per case: the export (ids edited in config.json for the broken ones, the contract side file dropped so vLLM
and the doctor read only what a hand-edited config says) served by `python -m vllm.entrypoints.openai.api_server`
(EAGLE-3 chain k, fp32, one sequence at a time, eager); then what `eaglewire doctor live --url ... --draft
HEALTHY` runs (doctor.live: probe_engine, reference, compare; the CLI's printer for the text form), the user's
draft being the healthy one (the draft is right, the engine's wiring is not). In-process rather than through the
CLI so that our engine's reference decode runs once for all cases and after the server is stopped (an idle vLLM
engine core spins a core, which on 2 cores halves the reference's speed). Writes OUT/<case>.json, OUT/<case>.txt,
OUT/vllm_metrics.txt (the healthy server's /metrics after the probe) and OUT/README.md with the commands. Needs scripts/vllm_venv.sh.
"""

from __future__ import annotations

import argparse
import json
import shutil
import urllib.request
from pathlib import Path

from benchmarks.results_dir import run_dir  # benchmarks/results/<topic>/<date>-<cpu>/

CASES = {  # name -> vLLM layer ids written into the export's config.json (None: the export as written)
    "healthy": None,
    "embedding-shifted-in": [0, 2, 15],  # the tap list shifted by one slot: the embedding first, 27 dropped
    "ids-plus-one": [3, 16, 28],  # every id shifted by one layer
}


def _export(root: Path) -> tuple[Path, Path]:
    from eaglewire.export.checkpoint import load_checkpoint, resolve_draft
    from eaglewire.export.convert import export_draft
    from eaglewire.target.loader import load_target, resolve_target

    target = load_target()
    draft = load_checkpoint(resolve_draft(None), target=target)
    return export_draft(draft, draft.contract, root / "healthy", "vllm"), resolve_target(None)[1]


def _broken(healthy: Path, root: Path, name: str, ids: list[int]) -> Path:
    out = root / name
    shutil.copytree(healthy, out, dirs_exist_ok=True)
    (out / "eaglewire_contract.json").unlink(missing_ok=True)
    cfg = json.loads((out / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = ids
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def _text(json_out: str) -> str:
    """The CLI's text form of a --json report (the same printer), without running the probe twice."""
    import contextlib
    import io

    from eaglewire.cli.doctor_live import _print_live
    from eaglewire.doctor.live import LiveReport

    buf = io.StringIO()
    try:
        rep = LiveReport(**json.loads(json_out))
    except (ValueError, TypeError):
        return json_out
    with contextlib.redirect_stdout(buf):
        _print_live(rep, as_json=False)
    return buf.getvalue()


def _reference(healthy: Path, chats: list, k: int, max_tokens: int):
    from eaglewire.decoding.tree import TreeShape
    from eaglewire.compose import load_draft
    from eaglewire.doctor.live import reference
    from eaglewire import load_target

    target = load_target()
    draft = load_draft(healthy, target)
    contract = draft.contract
    return reference(target, draft, contract, TreeShape.chain(k), chats, max_tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=Path("/tmp/eaglewire-live-probe"))
    args = ap.parse_args()
    from eaglewire.cli.doctor_live import _chats
    from eaglewire.doctor.live import compare, probe_engine
    from eaglewire.vllm_client.server import VllmServer

    out = args.out or run_dir("live_probe", "fp32")
    out.mkdir(parents=True, exist_ok=True)
    healthy, target_dir = _export(args.work)
    ref, chats = None, None
    commands = []
    for name in args.cases.split(","):
        served = healthy if CASES[name] is None else _broken(healthy, args.work, name, CASES[name])
        spec = {"method": "eagle3", "model": str(served), "num_speculative_tokens": args.k}
        with VllmServer(
            target_dir, dtype="float32", speculative_config=spec, max_num_seqs=1, enforce_eager=True
        ) as srv:
            chats = chats or _chats("mtbench", args.limit)
            window = probe_engine(srv.base_url, chats, args.max_tokens)
            if name == "healthy":
                with urllib.request.urlopen(srv.base_url.removesuffix("/v1") + "/metrics", timeout=30) as r:
                    (out / "vllm_metrics.txt").write_text(r.read().decode())
        ref = ref or _reference(healthy, chats, args.k, args.max_tokens)  # the server is down: no core spinning
        rep = compare(window, ref, args.k, str(healthy), None)
        rep.timing = {"probe_s": round(window.seconds, 2), "prompts": len(chats), "max_tokens": args.max_tokens}
        (out / f"{name}.json").write_text(json.dumps(rep.to_dict(), indent=2) + "\n")
        (out / f"{name}.txt").write_text(
            f"vLLM serving {name} (ids {CASES[name] or 'as exported'}), probed with the "
            f"healthy export as the draft\n" + _text(json.dumps(rep.to_dict()))
        )
        print(name, rep.verdict, flush=True)
        commands.append(f"- {name}: vLLM ids {CASES[name] or 'as exported'}; verdict {rep.verdict}")
    readme = out / "README.md"
    if readme.exists():  # a curated README (several runs in one folder) is kept; this run's summary beside it
        readme = out / f"run-{'-'.join(args.cases.split(','))}.md"
    readme.write_text(
        "# `eaglewire doctor live` against real vLLM (CPU build 0.32.0)\n\n"
        f"    python -m benchmarks.doctor.live_probe_vllm --limit {args.limit} --max-tokens {args.max_tokens} --k {args.k}\n\n"
        "The released draft's vLLM export served by `python -m vllm.entrypoints.openai.api_server` (EAGLE-3 chain "
        f"k={args.k}, fp32, max-num-seqs 1, eager), probed with the healthy export as `--draft` "
        "(`<case>.json` the --json report, `<case>.txt` the same report as the CLI prints it).\n\n"
        + "\n".join(commands)
        + "\n"
    )


if __name__ == "__main__":
    main()
