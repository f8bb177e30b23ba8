"""The documentation site builds strictly (a broken link, a missing page or a stale anchor fails), its
generated reference covers the code, and a built page renders in a real headless browser."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_docs_build_strictly_with_every_nav_page(site: Path) -> None:
    for page in ("guides/diagnose", "reference/cli", "reference/config", "reference/doctor", "reference/formats",
                 "reference/api", "results/peer", "results/experiments"):
        assert (site / page / "index.html").exists(), page


def test_cli_reference_lists_every_command_and_option(site: Path) -> None:
    import typer

    from eaglewire.cli.app import app

    html = (site / "reference" / "cli" / "index.html").read_text()
    stack = [("eaglewire", typer.main.get_command(app))]
    while stack:
        path, cmd = stack.pop()
        assert path in html, f"{path} missing from the CLI reference"
        for p in cmd.params:
            for opt in getattr(p, "opts", []):
                if opt.startswith("--") and opt != "--help":
                    assert opt in html, f"{path} {opt} missing from the CLI reference"
        stack += [(f"{path} {n}", c) for n, c in getattr(cmd, "commands", {}).items()]


def test_api_reference_documents_every_name_of_the_front_door(site: Path) -> None:
    import eaglewire

    html = (site / "reference" / "api" / "index.html").read_text()
    for name in eaglewire.__all__:
        assert f'id="{name.lower()}"' in html, f"eaglewire.{name} missing from the API reference"
        assert getattr(eaglewire, name).__doc__, f"eaglewire.{name} has no docstring"


def test_doctor_catalogue_has_every_finding_code(site: Path) -> None:
    sys.path.insert(0, str(ROOT / "docs"))
    import gen_reference

    rows = gen_reference.doctor_findings()
    codes = {r["code"] for r in rows}
    assert {"layer_ids", "d2t", "fc", "key_naming", "norm_flags", "measured_wiring"} <= codes
    levels = {r["level"] for r in rows}  # a computed level reads "error / warn" (both branches of its if)
    assert levels <= {"error", "warn", "info", "warn / error", "error / warn"}, levels
    html = (site / "reference" / "doctor" / "index.html").read_text()
    assert all(f"<code>{c}</code>" in html for c in codes)


def test_results_tables_come_from_the_indexed_files(site: Path) -> None:
    import json

    index = json.loads((ROOT / "benchmarks" / "results" / "index.json").read_text())["runs"]
    folders = {p.relative_to(ROOT / "benchmarks" / "results").as_posix()
               for p in (ROOT / "benchmarks" / "results").glob("*/*") if p.is_dir()}
    assert {r["path"] for r in index} == folders  # every run is indexed, every index entry exists
    html = (site / "results" / "peer" / "index.html").read_text()
    bench = json.loads((ROOT / "benchmarks/results/peer/2026-12-05-epyc-avx2-fp32/bench.json").read_text())
    assert f"{bench['methods']['eagle_chain']['median_tok_s']:.2f}" in html


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_a_built_page_renders_in_headless_chromium(site: Path, tmp_path: Path) -> None:
    url = (site / "guides" / "diagnose" / "index.html").resolve().as_uri()
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    assert "Symptom table" in dom and "<table>" in dom
    shot = tmp_path / "shot.png"
    subprocess.run(flags + [f"--screenshot={shot}", "--window-size=1200,1600", url], capture_output=True, timeout=120)
    from PIL import Image

    img = Image.open(shot).convert("L")
    colours = img.getcolors(maxcolors=1 << 16)
    assert img.size == (1200, 1600) and colours is not None and len(colours) > 50  # text, tables, theme drawn
    keep = ROOT / "site-screenshot.png"  # for a person to look at after a local run (ignored by git)
    shutil.copyfile(shot, keep) if keep.parent.joinpath(".git").exists() else None
