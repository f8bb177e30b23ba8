"""`eaglewire generate|bench|serve`: speculative decoding on the local target with an EAGLE-3 or DFlash draft
(the draft's contract names its family; its proposer and default shape are its family record's decoding,
eaglewire.compose)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from eaglewire.cli.common import add_command, decide_device, err_console, load_target, out_console, parse_dtype
from eaglewire.cli.options import DeviceOpt, JsonOpt, MaxNewTokensOpt, TargetOpt
from eaglewire.hw import DEVICE_DEFAULT
from eaglewire.serve import bench as B
from eaglewire.serve.llamacpp_peer import DRAFT_PRECISIONS, LLAMACPP_METHODS, TARGET_PRECISIONS
from eaglewire.serve.peer import PEER_METHODS
from eaglewire.decoding.tree import DEFAULT_TREE as SHAPE
from eaglewire.decoding.tree import TreeShape

DRAFT_HELP = (
    "Draft directory: a native checkpoint or any engine export (default: the draft shipped for the "
    "embedded SmolLM2 target)."
)
TREE_HELP = (
    "Tree knobs use SGLang's meaning: --num-steps S (draft depth), --topk K (branching), "
    "--num-draft-tokens N (verified tokens per round INCLUDING the root/last accepted token). "
    "vLLM's chain spelling: --num-speculative-tokens k  ==  S=k, K=1, N=k+1."
)
DTYPE_HELP = (
    "float32 | bfloat16 | auto: the target runs in it (default: float32 on the CPU, bfloat16 on a GPU). "
    "auto = bfloat16 on a GPU or where the CPU has native bf16 (AVX512-BF16/AMX), else float32; bfloat16 "
    "on a CPU without it is refused (emulated, slower)."
)
DRAFT_DTYPE_HELP = (
    "auto | target | float32 | bfloat16: the draft runs in it. auto = bfloat16 where the CPU has native "
    "bf16, else the target's dtype. Output stays the target's (it verifies every token); a bf16 "
    "draft only proposes slightly differently, at half the bytes read per weight."
)
COMPILE_HELP = (
    "The compiled layouts of the target's forward (inductor): "
    "'cached' uses them once a start on this machine has built them for this cache "
    "size (a power of two above prompt + --max-new-tokens), else the eager layouts, "
    "so that a start takes seconds; 'always' builds them now (one to a few minutes, "
    "once per cache size); 'never'."
)
CALIBRATE_HELP = (
    "The GEMM layouts of the target's forward: "
    "'cached' uses the ones a start on this machine measured before, else the "
    "default layouts (the same tokens; the first token comes in seconds); 'always' "
    "measures them now where none are cached (seconds to minutes, once per "
    "machine); 'never'."
)
QUESTIONS_HELP = "'mtbench', a named prompt set ('humaneval', 'mtbench-math') or a FastChat/any conversation file."
BENCH_DTYPE_HELP = DTYPE_HELP + " Every row runs in it (HF generate, vanilla, EAGLE, vLLM's); bench.json records it."
TURNS_HELP = "1: first turns. 2: also second turns, after the target's own regenerated first answer (from --answers)."
METHODS_HELP = (
    "Comma list of "
    + ", ".join(B.METHODS)
    + ", "
    + ", ".join(B.BLOCK_METHODS + PEER_METHODS + LLAMACPP_METHODS)
    + " (vanilla is always needed: "
    "the lossless reference and the speedup base; dflash needs --dflash-draft)."
)
VLLM_ROWS_HELP = (
    "Add the peer rows " + " and ".join(PEER_METHODS) + ": the "
    "real vLLM CPU build on the same prompts, draft, k and dtype (scripts/vllm_venv.sh)."
)
LLAMACPP_ROWS_HELP = (
    "Add the rows " + " and ".join(LLAMACPP_METHODS) + ": "
    "llama.cpp's llama-server alone and with the draft as a GGUF, same prompts and k "
    "(scripts/llamacpp_build.sh or EAGLEWIRE_LLAMA_SERVER)."
)
LLAMACPP_TARGET_HELP = (
    "The llama.cpp rows' target GGUF: " + " or ".join(TARGET_PRECISIONS) + " (q4_1: the file the embedded target "
    "ships; f32: llama.cpp's conversion of the float target)."
)
REPEATS_HELP = (
    "Run every prompt this many times (every row, the "
    "vLLM ones included, interleaved prompt by prompt); bench.md gives each "
    "repetition's ours / vLLM ratios."
)

# the options generate, bench and serve share: the draft, and the dtypes target and draft run in (bench's
# --dtype help says more than DTYPE_HELP, so bench declares its own)
DraftOpt = Annotated[Optional[Path], typer.Option("--draft", "-d", help=DRAFT_HELP)]
DtypeOpt = Annotated[Optional[str], typer.Option("--dtype", help=DTYPE_HELP)]
DraftDtypeOpt = Annotated[str, typer.Option("--draft-dtype", help=DRAFT_DTYPE_HELP)]


def _say(message: str) -> None:
    """A start-up / progress line on stderr (stdout stays the command's output)."""
    err_console.print(message, highlight=False, markup=False, soft_wrap=True)  # one line per message, for logs


def _shape(contract, knobs: tuple) -> TreeShape:
    """The tree a round verifies: the knobs' shape, or the draft family's default when none is given (a block
    drafter: its whole block; eaglewire.compose.proposal_shape)."""
    from eaglewire.compose import proposal_shape

    return proposal_shape(contract, TreeShape.from_knobs(*knobs) if any(k is not None for k in knobs) else None)


def _load(target: Optional[str], draft: Optional[Path], dtype: Optional[str], draft_dtype: str, device: str) -> tuple:
    """(target in --dtype on --device, draft in --draft-dtype), with a line on stderr for each."""
    from eaglewire import hw
    from eaglewire.compose import load_draft
    from eaglewire.export.checkpoint import resolve_draft
    from eaglewire.target.embedded import DEFAULT_TARGET

    where = decide_device(device)
    dtype = dtype or hw.default_dtype_name(where)
    dt = hw.runtime_dtype(parse_dtype(dtype, {n: n for n in hw.RUNTIME_DTYPES}, "--dtype"), where)
    ddt = hw.draft_dtype(parse_dtype(draft_dtype, {n: n for n in hw.DRAFT_DTYPES}, "--draft-dtype"), dt, where)
    name, dname = (str(t).removeprefix("torch.") for t in (dt, ddt))
    _say(f"loading target {target or DEFAULT_TARGET} ({name}{', from --dtype auto' if dtype == 'auto' else ''})")
    tgt = load_target(target, device=where, dtype=dt)
    path = resolve_draft(draft)
    _say(f"loading draft {path} ({dname}{', from --draft-dtype auto' if draft_dtype == 'auto' else ''})")
    return tgt, load_draft(path, tgt, dtype=ddt)


def generate_cmd(
    prompt: str = typer.Option(..., "--prompt", "-p", help="User message (rendered with the chat template)."),
    draft: DraftOpt = None,
    target: TargetOpt = None,
    max_new_tokens: MaxNewTokensOpt = 256,
    num_steps: Optional[int] = typer.Option(None, "--num-steps", help=f"S (default {SHAPE.num_steps}). " + TREE_HELP),
    topk: Optional[int] = typer.Option(None, "--topk", help=f"K (default {SHAPE.topk})."),
    num_draft_tokens: Optional[int] = typer.Option(
        None, "--num-draft-tokens", help=f"N incl. the root (default {SHAPE.num_draft_tokens})."
    ),
    num_speculative_tokens: Optional[int] = typer.Option(None, "--num-speculative-tokens", help="vLLM chain k."),
    as_json: JsonOpt = False,
    dtype: DtypeOpt = None,
    draft_dtype: DraftDtypeOpt = "auto",
    device: DeviceOpt = DEVICE_DEFAULT,
    compile: str = typer.Option("cached", "--compile", help=COMPILE_HELP),
    calibrate: str = typer.Option("cached", "--calibrate", help=CALIBRATE_HELP),
) -> None:
    """Greedy speculative decoding (lossless: in float32 the text equals plain greedy decoding; in bfloat16
    every token is a greedy choice up to bf16 rounding, so the texts may part where two tokens tie)."""
    from eaglewire.compose import CALIBRATE_MODES, COMPILE_MODES
    from eaglewire.generation import generate_text

    knobs = (num_steps, topk, num_draft_tokens, num_speculative_tokens)
    shape = TreeShape.from_knobs(*knobs)  # bad knobs fail before loading
    for flag, value, modes in (("--compile", compile, COMPILE_MODES), ("--calibrate", calibrate, CALIBRATE_MODES)):
        if value not in modes:
            raise typer.BadParameter(f"expected one of {', '.join(modes)}, got {value!r}", param_hint=flag)
    tgt, d = _load(target, draft, dtype, draft_dtype, device)
    # the text `ew.generate` returns: the same function renders the chat prompt, decodes and stops at EOS
    g = generate_text(
        tgt,
        d,
        prompt,
        max_new_tokens,
        shape=shape if any(k is not None for k in knobs) else None,
        log=_say,
        compile=compile,
        calibrate=calibrate,
    )
    if as_json:
        print(json.dumps({"text": g.text, "tokens": list(g.tokens), "stats": g.stats()}, indent=2))
        return
    out_console.print(g.text, markup=False, highlight=False)
    err_console.print(
        f"tau {g.tau:.2f}  per-position {[round(p, 2) for p in g.per_position]}  "
        f"{g.tokens_per_s:.1f} tok/s  ({g.verify_steps} verify steps, prefill {g.prefill_s:.1f}s, "
        f"draft {g.draft_s:.1f}s / verify {g.verify_s:.1f}s)"
    )


def bench_cmd(
    draft: DraftOpt = None,
    out: Path = typer.Option(Path("out/bench"), "--out", "-o", help="Writes bench.json, bench.md, bench.png."),
    target: TargetOpt = None,
    questions: str = typer.Option(B.QUESTIONS, "--questions", help=QUESTIONS_HELP),
    limit: int = typer.Option(B.PROMPTS, "--limit", help="Number of questions."),
    turns: int = typer.Option(1, "--turns", help=TURNS_HELP),
    answers: str = typer.Option(
        "smollm2-mtbench-regen",
        "--answers",
        help="Regenerated answers for --turns 2 (`data regenerate --source mtbench` output).",
    ),
    max_new_tokens: MaxNewTokensOpt = B.MAX_NEW_TOKENS,
    chain_k: int = typer.Option(
        B.CHAIN_K, "--num-speculative-tokens", help="Chain length for the chain run (vLLM's k)."
    ),
    num_steps: int = typer.Option(SHAPE.num_steps, "--num-steps", help="Tree run: S. " + TREE_HELP),
    topk: int = typer.Option(SHAPE.topk, "--topk", help="Tree run: K."),
    num_draft_tokens: int = typer.Option(
        SHAPE.num_draft_tokens, "--num-draft-tokens", help="Tree run: N including the root."
    ),
    methods: str = typer.Option(",".join(B.METHODS), "--methods", help=METHODS_HELP),
    dflash_draft: Optional[Path] = typer.Option(
        None, "--dflash-draft", help="A DFlash draft checkpoint for the dflash row (its whole block per round)."
    ),
    vllm: bool = typer.Option(False, "--vllm", help=VLLM_ROWS_HELP),
    llamacpp: bool = typer.Option(False, "--llamacpp", help=LLAMACPP_ROWS_HELP),
    llamacpp_target: str = typer.Option("q4_1", "--llamacpp-target", help=LLAMACPP_TARGET_HELP),
    llamacpp_draft: str = typer.Option(
        "f32", "--llamacpp-draft", help="The draft GGUF's precision: " + ", ".join(DRAFT_PRECISIONS) + "."
    ),
    dtype: Optional[str] = typer.Option(None, "--dtype", help=BENCH_DTYPE_HELP),
    draft_dtype: DraftDtypeOpt = "auto",
    device: DeviceOpt = DEVICE_DEFAULT,
    repeats: int = typer.Option(1, "--repeats", min=1, help=REPEATS_HELP),
) -> None:
    """HF generate vs vanilla vs prompt lookup vs EAGLE-3 chain vs tree, interleaved in one process.

    Questions are taken round-robin over the file's categories (MT-bench: one of each of its 8 first)."""
    tgt, d = _load(target, draft, dtype, draft_dtype, device)
    block_draft = _block_draft(dflash_draft, tgt, d) if dflash_draft is not None else None
    prompts = B.bench_prompts(tgt, questions, limit, turns, answers)
    result = B.run_bench(
        tgt,
        d,
        prompts,
        max_new_tokens,
        TreeShape.chain(chain_k),
        TreeShape(num_steps=num_steps, topk=topk, num_draft_tokens=num_draft_tokens),
        log=_say,
        repeats=repeats,
        block_draft=block_draft,
        llamacpp_gguf=(llamacpp_target, llamacpp_draft),
        methods=_rows(methods, vllm, llamacpp),
    )
    _report(result, out, questions, draft, turns)


def _block_draft(path: Path, tgt: Any, d: Any) -> Any:
    """--dflash-draft, loaded in the dtype the EAGLE draft runs in."""
    from eaglewire.compose import load_draft

    _say(f"loading block draft {path}")
    return load_draft(path, tgt, dtype=d.fc.weight.dtype)


def _report(result: dict, out: Path, questions: str, draft: Optional[Path], turns: int) -> None:
    """The bench's result, with what it ran on, written to OUT (json, markdown, plot) and printed."""
    from eaglewire.export.checkpoint import resolve_draft

    result["questions"], result["draft"], result["turns"] = questions, str(resolve_draft(draft)), turns
    B.write(result, out)
    out_console.print(B.markdown(result), markup=False, highlight=False)
    out_console.print(f"-> {out}/bench.json, bench.md, bench.png")


def _rows(methods: str, vllm: bool, llamacpp: bool) -> list[str]:
    """--methods, then the peer rows --vllm / --llamacpp add, each once, in order."""
    listed = [m.strip() for m in methods.split(",") if m.strip()]
    return list(
        dict.fromkeys(listed + (list(PEER_METHODS) if vllm else []) + (list(LLAMACPP_METHODS) if llamacpp else []))
    )


def serve_cmd(
    draft: DraftOpt = None,
    target: TargetOpt = None,
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address (loopback by default)."),
    port: int = typer.Option(8000, "--port", help="TCP port to listen on (0: any free port, printed at start)."),
    model_name: Optional[str] = typer.Option(
        None, "--model-name", help="Name clients must send (default: target name)."
    ),
    max_context: int = typer.Option(4096, "--max-context", help="Prompt + generated tokens per request."),
    max_tokens_limit: int = typer.Option(
        1024, "--max-tokens-limit", help="The largest max_tokens a request may ask for (larger requests get a 400)."
    ),
    num_steps: Optional[int] = typer.Option(None, "--num-steps", help=TREE_HELP),
    topk: Optional[int] = typer.Option(
        None,
        "--topk",
        help="SGLang's --speculative-eagle-topk K: branching per tree node (1 = a chain; see --num-steps).",
    ),
    num_draft_tokens: Optional[int] = typer.Option(
        None,
        "--num-draft-tokens",
        help="SGLang's --speculative-num-draft-tokens N: verified tokens per round, "
        "the root included (see --num-steps).",
    ),
    num_speculative_tokens: Optional[int] = typer.Option(
        None,
        "--num-speculative-tokens",
        help="vLLM's k: a chain of k drafted tokens per round (= --num-steps k --topk 1 --num-draft-tokens k+1).",
    ),
    dtype: DtypeOpt = None,
    draft_dtype: DraftDtypeOpt = "auto",
    device: DeviceOpt = DEVICE_DEFAULT,
) -> None:
    """OpenAI-compatible server (/v1/chat/completions, /v1/completions, /metrics) with speculative decoding."""
    from eaglewire.serve.server import bind
    from eaglewire.serve.start import build_server

    TreeShape.from_knobs(num_steps, topk, num_draft_tokens, num_speculative_tokens)  # bad knobs fail before loading
    httpd = bind(host, port)  # a port in use fails before loading too
    try:
        tgt, d = _load(target, draft, dtype, draft_dtype, device)
        shape = _shape(d.contract, (num_steps, topk, num_draft_tokens, num_speculative_tokens))
        server = build_server(
            tgt, d, shape, model_name, max_context, max_tokens_limit, host, port, log=_say, httpd=httpd
        )
    except BaseException:  # a start that fails gives the port back (a retry in the same process finds it free)
        httpd.server_close()
        raise
    err_console.print(f"serving on http://{host}:{server.server_address[1]}/v1 (Ctrl-C to stop)")
    server.serve_forever()


def register(app: typer.Typer) -> None:
    add_command(app, generate_cmd, "generate", help="Speculative decoding with an EAGLE-3 draft. " + TREE_HELP)
    add_command(app, bench_cmd, "bench")
    add_command(app, serve_cmd, "serve")
