"""The real llama-server (built from the newest llama.cpp read by scripts/llamacpp_build.sh) loads our EAGLE-3 and
DFlash GGUF exports beside the embedded target (converted to GGUF by llama.cpp's own converter), runs the draft
(timings.draft_n > 0) and its greedy output equals the target's own in llama.cpp. The drafts are random: this
checks that the files load and serve losslessly, not what they accept.

Locally this skips without llama-server; with $EAGLEWIRE_LLAMACPP set (CI) it fails.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from test_llamacpp_converter import ROOT, _eagle3, convert

from eaglewire.export import llamacpp_layout as lay
from eaglewire.export.convert import export_draft
from eaglewire.export.gguf_draft import server_line

SERVER = ROOT / lay.NEWEST / "bin" / "llama-server"
if not os.environ.get("EAGLEWIRE_LLAMACPP") and not SERVER.is_file():
    pytest.skip("llama-server is not built: bash scripts/llamacpp_build.sh", allow_module_level=True)
pytestmark = pytest.mark.real_target
PROMPT = {"prompt": "The capital of France is", "n_predict": 24, "temperature": 0, "cache_prompt": False}


@pytest.fixture(scope="module")
def target():
    from eaglewire.target.weights import load_target_weights

    return load_target_weights(None)


@pytest.fixture(scope="module")
def target_gguf(tmp_path_factory, target) -> Path:
    out = tmp_path_factory.mktemp("target") / "target-f16.gguf"
    convert([str(target.path), "--outfile", str(out), "--outtype", "f16"])
    return out


def complete(line: str, log: Path) -> dict:
    """Run the llama-server command `line` on a free port, one greedy completion, then stop it."""
    assert SERVER.is_file(), f"no llama-server at {SERVER}: run bash scripts/llamacpp_build.sh"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [str(SERVER), *line.split()[1:], "-t", "2", "-c", "1024", "--port", str(port), "--no-webui"]
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                    break
            except OSError:
                assert proc.poll() is None, f"llama-server exited: {log.read_text()[-3000:]}"
                time.sleep(0.5)
        req = urllib.request.Request(
            url + "/completion", data=json.dumps(PROMPT).encode(), headers={"Content-Type": "application/json"}
        )
        return json.loads(urllib.request.urlopen(req, timeout=300).read())
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def plain(tmp_path_factory, target_gguf) -> str:
    log = tmp_path_factory.mktemp("plain") / "server.log"
    return complete(f"llama-server -m {target_gguf}", log)["content"]


def test_eagle3_gguf_serves_losslessly(tmp_path, target, target_gguf, plain):
    draft, contract = _eagle3(target, (1, 9, 20))
    out = export_draft(draft, contract, tmp_path / "e3", "llamacpp", vocab_from=target_gguf, gguf_dtype="f16")
    r = complete(server_line(contract, out, target_gguf, 3), tmp_path / "server.log")
    assert r["content"] == plain and r["timings"]["draft_n"] > 0, r["timings"]


def test_dflash_gguf_serves_losslessly(tmp_path, target, target_gguf, plain):
    from eaglewire.draft.dflash import build_dflash_draft
    from eaglewire.draft.dflash_contract import dflash_contract
    from eaglewire.families import BlockWiring

    contract = dflash_contract(target, (2, 9, 15, 21, 28), BlockWiring(8, target.vocab_size - 1))
    draft = build_dflash_draft(target, contract, 2, seed=1)
    out = export_draft(draft, contract, tmp_path / "df", "llamacpp", vocab_from=target_gguf)
    r = complete(server_line(contract, out, target_gguf), tmp_path / "server.log")
    assert r["content"] == plain and r["timings"]["draft_n"] > 0, r["timings"]
    log = (tmp_path / "server.log").read_text()
    assert f"block_size=8, mask_token_id={target.vocab_size - 1}, n_extract=5" in log
