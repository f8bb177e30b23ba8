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
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_docs_build_strictly_with_every_nav_page(site: Path) -> None:
    for page in (
        "guides/diagnose",
        "reference/cli",
        "reference/config",
        "reference/doctor",
        "reference/formats",
        "reference/api",
        "results/peer",
        "results/experiments",
    ):
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


def test_sglang_rule_table_is_in_the_diagnose_and_export_guides(site: Path) -> None:
    from eaglewire.export.sglang_rules import RELEASES, record

    served = {h.split(":")[0] for r in RELEASES for h, v in record()["eagle3"][r].items() if v["archs"]}
    for page in ("guides/diagnose", "guides/export"):
        html = (site / page / "index.html").read_text()
        assert all(f"SGLang {r}" in html for r in RELEASES), page
        missing = [f for f in served if f"<code>{f}</code>" not in html]
        assert not missing, f"{page} lacks the SGLang rule of {missing}"


def test_every_doctor_finding_shows_a_real_example_in_full(site: Path) -> None:
    """Each catalogue entry is a finding the doctor really printed on a broken draft of the tests (recorded in
    docs/doctor-examples.json by docs/gen_doctor_examples.sh), matching the check's current text, with why
    and fix: no computed part left as a raw expression."""
    sys.path.insert(0, str(ROOT / "docs"))
    import gen_reference

    missing = [f"{r['code']}: {r['what']}" for r in gen_reference.doctor_findings() if r["example"] is None]
    assert not missing, (
        "findings with no recorded example (rerun docs/gen_doctor_examples.sh, or add a test "
        "that builds the broken case): " + "; ".join(missing)
    )
    html = (site / "reference" / "doctor" / "index.html").read_text()
    assert "‹" not in html and "no recorded example" not in html
    rows = gen_reference.doctor_findings()
    assert (
        html.count("<strong>why:</strong>")
        == html.count("<strong>fix:</strong>")
        == sum(len(r["examples"]) for r in rows)
    )
    # task A's case: an EAGLE-3 export whose ids deliver other boundaries than it was trained on
    assert "this draft predicts best from boundaries" in html and "this block drafter predicts best" in html


def test_the_serve_guide_lists_every_server_metric_and_the_engines_acceptance() -> None:
    import re

    from eaglewire.serve.server import Metrics

    names = set(re.findall(r"^# TYPE (\S+)", Metrics().prometheus(), re.M))
    text = (ROOT / "docs" / "guides" / "serve.md").read_text()
    assert names and all(f"`{n}`" in text for n in names), names - set(re.findall(r"`(eaglewire_\w+)`", text))
    from eaglewire.doctor.expect import LOG_PATTERNS

    assert "Mean acceptance length" in text and "accept len" in text  # the lines LOG_PATTERNS read
    assert {"sglang", "vllm"} <= set(LOG_PATTERNS)


def test_every_guide_links_the_glossary() -> None:
    for page in (ROOT / "docs" / "guides").glob("*.md"):
        if page.name != "glossary.md":
            assert "glossary.md" in page.read_text(), page.name


def test_config_field_descriptions_point_at_no_source_file() -> None:
    """A field description is read in the CLI's help and the config reference: it names a page or a field,
    never a module, a source file or a README section (which move without the description noticing)."""
    import re

    from eaglewire.pipeline.config import RunConfig

    schema = RunConfig.model_json_schema()
    nodes = [("", schema)] + [(f"{k}.", v) for k, v in schema.get("$defs", {}).items()]
    bad = re.compile(r"\b[\w/]+\.py\b|README|\b(?:hw|serve|capture|decoding|pipeline|fastcpu|contract|norms)\.[a-z_]+")
    found = [
        f"{p}{k}: {v['description']}"
        for p, n in nodes
        for k, v in n.get("properties", {}).items()
        if bad.search(v.get("description", ""))
    ]
    assert not found, found


def test_results_tables_come_from_the_indexed_files(site: Path) -> None:
    import json

    index = json.loads((ROOT / "benchmarks" / "results" / "index.json").read_text())["runs"]
    folders = {
        p.relative_to(ROOT / "benchmarks" / "results").as_posix()
        for p in (ROOT / "benchmarks" / "results").glob("*/*")
        if p.is_dir()
    }
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


# Run in the page after load; the offenders are written into the DOM for --dump-dom. A table wider than the column
# may scroll in the theme's frame, except those a reader must see whole (MUST_FIT: the findings and budget tables);
# no cell is narrower than its longest word (a word split across lines); no name in a table breaks; a command of
# up to RECIPE_CHARS characters fits its code block without scrolling.
RECIPE_CHARS = 125
_FIT_JS = """<script>addEventListener('load', () => {
  const bad = [], page = document.querySelector('.md-content').getBoundingClientRect();
  const mustFit = %s;
  document.querySelectorAll('.md-content table').forEach((t, i) => {
    const head = (t.rows[0] ? t.rows[0].innerText : '').replace(/\\s+/g, ' ').slice(0, 50);
    if (mustFit.some(h => head.startsWith(h)) && t.getBoundingClientRect().right > page.right + 1)
      bad.push('table ' + i + ' (' + head + ') must be seen whole and is wider than the page');
    t.querySelectorAll('code').forEach(c => {
      if (c.getClientRects().length > 1) bad.push('`' + c.innerText + '` breaks across lines');
    });
    const walk = document.createTreeWalker(t, NodeFilter.SHOW_TEXT);
    for (let n = walk.nextNode(); n; n = walk.nextNode()) {
      const re = /[^\\s\\-\\u2013\\u2014\\/]{2,}/g;  // a break at a hyphen or slash is a line break, not a split word
      for (let m = re.exec(n.data); m; m = re.exec(n.data)) {
        const r = document.createRange();
        r.setStart(n, m.index); r.setEnd(n, m.index + m[0].length);
        const tops = new Set([...r.getClientRects()].filter(x => x.width > 0).map(x => Math.round(x.top)));
        if (tops.size > 1) bad.push('"' + m[0] + '" is broken inside a cell of table ' + i + ' (' + head + ')');
      }
    }
  });
  document.querySelectorAll('.md-content pre > code').forEach(c => {
    const longest = Math.max(...c.innerText.split('\\n').map(l => l.length));
    const pre = c.closest('pre');
    if (longest <= %d && c.scrollWidth > c.clientWidth + 1)
      bad.push('a command of ' + longest + ' characters scrolls: ' + c.innerText.slice(0, 60));
  });
  document.body.setAttribute('data-overflow', JSON.stringify(bad));
});</script>"""
MUST_FIT = ["code findings levels", "budget"]  # the findings catalogue's index, the train guide's budget table
WIDE_PAGES = (
    "reference/cli",
    "reference/config",
    "reference/doctor",
    "reference/formats",
    "guides/diagnose",
    "guides/glossary",
    "guides/gpu",
    "guides/train",
    "results",
    "",
)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_pages_read_at_1280_px_whole_words_whole_names_whole_commands(site: Path, tmp_path: Path) -> None:
    import json
    import re

    flags = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1280,1000",
        "--virtual-time-budget=5000",
        "--dump-dom",
    ]
    probe_js = _FIT_JS % (json.dumps(MUST_FIT), RECIPE_CHARS)
    problems, shots = {}, tmp_path / "shots"
    shots.mkdir()
    for page in WIDE_PAGES:
        src = site / page / "index.html"
        probe = src.with_name("fit-probe.html")  # beside the page: its relative CSS and script paths hold
        probe.write_text(src.read_text().replace("</body>", probe_js + "</body>"))
        # one browser start per page gives its DOM and a screenshot of it at 1280 px (the probe script only sets an
        # attribute on <body>: the page renders as without it)
        shot = shots / f"{(page or 'home').replace('/', '-')}.png"
        dom = subprocess.run(
            flags + [f"--screenshot={shot}", probe.resolve().as_uri()], capture_output=True, text=True, timeout=120
        ).stdout
        found = re.search(r'data-overflow="([^"]*)"', dom)
        assert found, f"{page}: the probe did not run"
        bad = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
        if bad:
            problems[page or "home"] = bad
        assert shot.is_file() and shot.stat().st_size > 10_000, page
    assert not problems, problems


def test_the_glossary_explains_every_kind_of_tau() -> None:
    """Every kind a printed τ names (eaglewire.tau.TAU_KINDS) is a row of the glossary's "why the τ differ"."""
    from eaglewire.tau import TAU_KINDS

    text = (ROOT / "docs" / "guides" / "glossary.md").read_text()
    section = text[text.index("{ #tau-kinds }") :]
    missing = [k for k in TAU_KINDS if f"\n| {k} |" not in section]
    assert not missing, f"tau kinds the glossary does not explain: {missing}"


def test_dflash_status_is_stated_where_a_user_chooses_it() -> None:
    """Every page that offers DFlash beside EAGLE-3 gives its measured status (the results pages' figures),
    and the export guide's vLLM launch drafts B - 1 tokens for the block the train guide's recipe trains."""
    import re

    pages = [ROOT / "README.md"] + [
        ROOT / "docs" / p for p in ("guides/train.md", "guides/export.md", "concepts/block-drafters.md")
    ]
    results = (ROOT / "docs" / "results" / "index.md").read_text()
    assert "0.98× vanilla" in results and "0.77× EAGLE-3's best" in results  # the figures the pages repeat
    for page in pages:
        text = page.read_text()
        assert "0.98× vanilla" in text and "0.77× EAGLE-3's best" in text and "not shipped" in text, page.name
    block = int(
        re.search(
            r"eaglewire train --family dflash[^`]*?--block-size (\d+)",
            (ROOT / "docs" / "guides" / "train.md").read_text(),
            re.S,
        ).group(1)
    )
    ks = re.findall(
        r'"method": "dflash"[^}]*"num_speculative_tokens": (\d+)', (ROOT / "docs" / "guides" / "export.md").read_text()
    )
    assert ks and all(int(k) == block - 1 for k in ks), (block, ks)


def test_the_sglang_rule_table_link_lands_on_the_table_and_names_engines_the_cli_takes(site: Path) -> None:
    """The diagnose page's `#sglang-rule-table` heading is followed by the table itself (not a pointer), and every
    `--engine NAME` the table names is an engine `--engine` accepts; no cell reads like an engine name."""
    import re

    from eaglewire.export.engines import ENGINE_FORMATS

    html = (site / "guides" / "diagnose" / "index.html").read_text()
    start = html.index('id="sglang-rule-table"')
    section = html[start : html.index("<h2", start)]
    assert "<table>" in section and "llama.py" in section
    named = set(re.findall(r"--engine (\S+?)<", section)) | set(re.findall(r"--engine ([a-z][\w-]*) ", section))
    assert named and named <= set(ENGINE_FORMATS), named
    cells = re.findall(r"<td>(.*?)</td>", section)
    assert not [c for c in cells if re.fullmatch(r"(<code>)?sglang-\w+(</code>)?", c)], (
        "a cell names a rule as an engine"
    )


def test_home_names_both_families_and_installs_exactly_as_the_readme() -> None:
    """The site's first page says what the README says: both families trained, and one install command (the
    README's own lines, so the two never drift apart)."""
    import re

    home, readme = (ROOT / "docs" / "index.md").read_text(), (ROOT / "README.md").read_text()
    assert "trains EAGLE-3 and DFlash draft models" in home
    install = lambda t: [
        ln
        for ln in re.search(r"```bash\n(.*?)```", t, re.S).group(1).splitlines()  # noqa: E731
        if "install" in ln or "venv" in ln
    ]
    assert install(home) == install(readme) and len([ln for ln in install(home) if ln.startswith("pip ")]) == 1
