"""Move the flat tests/ into folders that mirror src/eaglewire/ (tests/<package>/test_<what>.py), mechanically,
so the move can be redone after other branches' test files are merged in. Run from the repository root:

    python scripts/mirror_tests.py            # git mv every file of MOVES still at its old path, then rewrite
    python scripts/mirror_tests.py --check    # list what would move and the flat test files MOVES does not place

What it does, and nothing else:
1. `git mv tests/OLD tests/NEW` for each row of MOVES whose old file exists (a row already done is skipped);
2. in every test file: `from test_OLD import` / `import test_OLD` name the moved module's new basename (test
   files import each other's fixtures; conftest.py puts every tests/ folder on sys.path, so basenames are
   global and must stay unique);
3. in each moved file: paths taken from its own location (`Path(__file__).parent`, `.parents[N]`) gain the
   one level it went down;
4. in every tracked text file: `tests/OLD` (commands, comments, docs, the doctor's recorded examples) names
   `tests/NEW`.
Test files left flat that no row places are listed: add a row (or keep them in ROOT_TESTS of
tests/test_tests_mirror_src.py when they test a top-level module or the project as a whole).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

# old name in tests/ -> new path under tests/ (the folder is the src package tested; the name says what in it)
MOVES = {
    "test_bench_summary.py": "serve/test_bench_summary.py",
    "test_block_formats.py": "export/test_block_formats.py",
    "test_calibration_cache.py": "fastcpu/test_calibration.py",
    "test_capture.py": "capture/test_hooks.py",
    "test_checkpoint.py": "export/test_checkpoint.py",
    "test_cli_pipeline.py": "cli/test_cli_pipeline.py",
    "test_console.py": "cli/test_console.py",
    "test_data_conversations.py": "data/test_conversations.py",
    "test_data_engine.py": "data/test_data_engine.py",
    "test_data_regenerate.py": "data/test_regenerate.py",
    "test_data_template.py": "data/test_template.py",
    "test_dflash_cli.py": "cli/test_dflash_cli.py",
    "test_dflash_model.py": "draft/test_dflash.py",
    "test_doctor.py": "doctor/test_checks.py",
    "test_doctor_block.py": "doctor/test_block_checks.py",
    "test_block_rules.py": "doctor/test_block_rules.py",
    "test_doctor_dump.py": "doctor/test_measured_wiring_dump.py",
    "test_doctor_measure.py": "doctor/test_measured_wiring.py",
    "test_draft.py": "draft/test_model.py",
    "test_dumps.py": "capture/test_dumps.py",
    "test_embedded_target.py": "target/test_embedded_target.py",
    "test_expect.py": "doctor/test_expect.py",
    "test_fastcpu_draft.py": "fastcpu/test_draft.py",
    "test_features_vocab.py": "capture/test_features_vocab.py",
    "test_formats.py": "export/test_formats.py",
    "test_live_counters.py": "doctor/test_counters.py",
    "test_live_probe.py": "doctor/test_live_probe.py",
    "test_live_verdict.py": "doctor/test_live_verdict.py",
    "test_live_vllm.py": "doctor/test_live_vllm.py",
    "test_losses.py": "train/test_losses.py",
    "test_panel_gemm.py": "fastcpu/test_panel_gemm.py",
    "test_peer.py": "serve/test_peer.py",
    "test_probe.py": "capture/test_identify.py",
    "test_prompt_sets.py": "data/test_prompt_sets.py",
    "test_real_clients.py": "export/test_real_clients.py",
    "test_report_header.py": "pipeline/test_report.py",
    "test_request_bounds.py": "serve/test_chat_requests.py",
    "test_run.py": "pipeline/test_run.py",
    "test_runtime.py": "fastcpu/test_fastcpu_runtime.py",
    "test_runtime_dtype.py": "decoding/test_runtime_dtype.py",
    "test_screened_head.py": "fastcpu/test_screened_head.py",
    "test_self_prompts.py": "data/test_self_prompts.py",
    "test_server.py": "serve/test_server.py",
    "test_sglang_rules.py": "export/test_sglang_rules.py",
    "test_spec_lossless.py": "decoding/test_spec_lossless.py",
    "test_spec_sampling.py": "decoding/test_spec_sampling.py",
    "test_static_runtime.py": "decoding/test_static_runtime.py",
    "test_target.py": "target/test_loader.py",
    "test_train.py": "train/test_train.py",
    "test_train_block.py": "train/test_block.py",
    "test_train_config.py": "train/test_config.py",
    "test_train_offline.py": "train/test_train_offline.py",
    "test_vllm_client.py": "vllm_client/test_vllm_client.py",
    "test_weight_release.py": "fastcpu/test_weight_release.py",
    # test files other branches add (placed when they are merged; a row whose file is absent is skipped)
    "test_doctor_measure_block.py": "doctor/test_measured_block.py",
    "test_live_probe_block.py": "doctor/test_live_probe_block.py",
    "test_cli_lazy.py": "cli/test_cli_lazy.py",
    "test_feature_shards.py": "capture/test_feature_shards.py",
    "test_slow_clients.py": "serve/test_slow_clients.py",
    # tests of benchmark code
    "test_roofline.py": "benchmarks/test_roofline.py",
    "test_peer_training.py": "benchmarks/test_peer_training.py",
    "test_benchmarks_layout.py": "benchmarks/test_benchmarks_layout.py",
}
TEXT = (".py", ".md", ".json", ".sh", ".txt", ".toml", ".yml", ".cpp", ".cfg", "")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def _stem(name: str) -> str:
    return Path(name).stem


def _deeper(text: str, levels: int) -> str:
    """`Path(__file__)[.resolve()].parent` / `.parents[N]` of a file moved `levels` folders down."""

    def parents(m: re.Match[str]) -> str:
        return f"{m.group(1)}.parents[{int(m.group(2)) + levels}]"

    text = re.sub(r"(Path\(__file__\)(?:\.resolve\(\))?)\.parents\[(\d+)\]", parents, text)
    return re.sub(r"(Path\(__file__\)(?:\.resolve\(\))?)\.parent\b(?!s)", rf"\1.parents[{levels}]", text)


def _rename_imports(text: str, renames: dict[str, str]) -> str:
    for old, new in renames.items():
        if old != new:
            text = re.sub(rf"^(\s*)(from|import) {re.escape(old)}\b", rf"\1\2 {new}", text, flags=re.M)
    return text


def _rename_paths(text: str, moves: dict[str, str]) -> str:
    for old, new in moves.items():
        text = re.sub(rf"(?<![\w/])tests/{re.escape(old)}", f"tests/{new}", text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only list what would move and what no row places")
    a = ap.parse_args()
    todo = {old: new for old, new in MOVES.items() if (TESTS / old).is_file() and not (TESTS / new).exists()}
    unplaced = sorted(p.name for p in TESTS.glob("test_*.py") if p.name not in MOVES)
    for old, new in todo.items():
        print(f"tests/{old} -> tests/{new}")
    if a.check:
        print("left at tests/ (top-level modules and whole-project tests, or to place): " + ", ".join(unplaced))
        return
    for old, new in todo.items():
        (TESTS / new).parent.mkdir(parents=True, exist_ok=True)
        _git("mv", f"tests/{old}", f"tests/{new}")
        path = TESTS / new
        path.write_text(_deeper(path.read_text(encoding="utf-8"), len(Path(new).parts) - 1), encoding="utf-8")
    renames = {_stem(old): _stem(new) for old, new in MOVES.items()}
    for name in _git("ls-files", "-z").split("\0"):
        path = ROOT / name
        if not name or path.suffix not in TEXT or not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new_text = _rename_paths(text, MOVES)
        if name.startswith("tests/") and path.suffix == ".py":
            new_text = _rename_imports(new_text, renames)
        if new_text != text:
            path.write_text(new_text, encoding="utf-8")
            print(f"rewrote {name}")
    stems = [p.stem for p in TESTS.rglob("test_*.py")]
    clash = sorted({s for s in stems if stems.count(s) > 1})
    if clash:
        sys.exit(f"test basenames must stay unique (conftest puts every folder on sys.path): {clash}")


if __name__ == "__main__":
    main()
