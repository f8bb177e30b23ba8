"""The training pipeline through the CLI: vocab build -> data capture -> train (offline and online).

A tiny random Llama with the real SmolLM2 tokenizer and chat template stands in for the target, so the
whole CLI path runs in seconds; one short run uses the real embedded target.
"""

import json

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

from eaglewire.cli.app import app
from eaglewire.target.loader import resolve_target

CONVS = [
    {
        "id": f"c{i}",
        "messages": [
            {"role": "user", "content": f"Count from {i} to {i + 5}."},
            {"role": "assistant", "content": " ".join(str(j) for j in range(i, i + 6))},
        ],
    }
    for i in range(40)
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_target")
    tok = AutoTokenizer.from_pretrained(resolve_target(None)[1])
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    data = d / "convs.jsonl"
    data.write_text("\n".join(json.dumps(c) for c in CONVS))
    return d


def _run(*args):
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output + repr(r.exception)
    return r


def test_vocab_capture_train_offline_and_online(tiny_dir, tmp_path):
    data = tiny_dir / "convs.jsonl"
    r = _run(
        "vocab",
        "build",
        "--target",
        tiny_dir,
        "--data",
        data,
        "--out",
        tmp_path / "v.safetensors",
        "--draft-vocab-size",
        512,
    )
    assert "coverage train 100.00%" in r.output
    _run("data", "capture", "--target", tiny_dir, "--data", data, "--out", tmp_path / "feat", "--shard-samples", 16)
    manifest = json.loads((tmp_path / "feat" / "manifest.json").read_text())
    assert manifest["samples"] == 40 and manifest["contract"]["taps"] == [2, 4, 5]
    common = [
        "--target",
        tiny_dir,
        "--vocab",
        tmp_path / "v.safetensors",
        "--max-steps",
        6,
        "--eval-every",
        3,
        "--batch-size",
        4,
        "--ttt-steps",
        2,
        "--heldout-fraction",
        0.2,
    ]
    _run("train", "--features", tmp_path / "feat", "--out", tmp_path / "off", *common)
    _run("train", "--data", data, "--out", tmp_path / "on", *common)
    off = json.loads((tmp_path / "off" / "summary.json").read_text())
    on = json.loads((tmp_path / "on" / "summary.json").read_text())
    assert off["heldout_samples"] > 0 and len(off["heldout"]["acc"]) == 2
    # same samples, same order, same features up to batching noise -> the same training curve
    assert off["heldout"]["loss"] == pytest.approx(on["heldout"]["loss"], rel=1e-3)
    assert (tmp_path / "off" / "training.png").stat().st_size > 10_000
    assert (tmp_path / "off" / "draft" / "model.safetensors").exists()
    # the trained draft runs speculative decoding and the benchmark (lossless: same tokens as vanilla)
    r = _run(
        "generate",
        "--target",
        tiny_dir,
        "--draft",
        tmp_path / "off" / "draft",
        "-p",
        "Count from 3 to 8.",
        "--max-new-tokens",
        12,
        "--num-speculative-tokens",
        2,
        "--json",
    )
    assert len(json.loads(r.stdout)["tokens"]) <= 12
    _run(
        "bench",
        "--target",
        tiny_dir,
        "--draft",
        tmp_path / "off" / "draft",
        "--questions",
        data,
        "--limit",
        2,
        "--max-new-tokens",
        8,
        "--out",
        tmp_path / "bench",
        "--num-steps",
        2,
        "--topk",
        2,
        "--num-draft-tokens",
        4,
    )
    result = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert result["dtype"] == "float32"  # the --dtype default
    assert all(m["matches_vanilla"] == 2 for n, m in result["methods"].items() if n.startswith("eagle"))
    assert (tmp_path / "bench" / "bench.png").exists() and "eagle_tree" in (tmp_path / "bench" / "bench.md").read_text()
    qa = tmp_path / "qa.jsonl"  # second turns are asked after the target's regenerated first answer
    qa.write_text(
        "\n".join(
            json.dumps(
                {
                    "id": f"q{i}",
                    "messages": [
                        {"role": "user", "content": "Name a colour."},
                        {"role": "assistant", "content": "Blue."},
                        {"role": "user", "content": "Another one?"},
                        {"role": "assistant", "content": "Red."},
                    ],
                }
            )
            for i in range(2)
        )
    )
    _run(
        "bench",
        "--target",
        tiny_dir,
        "--draft",
        tmp_path / "off" / "draft",
        "--questions",
        qa,
        "--answers",
        qa,
        "--turns",
        2,
        "--limit",
        2,
        "--max-new-tokens",
        4,
        "--out",
        tmp_path / "bench2",
    )
    assert json.loads((tmp_path / "bench2" / "bench.json").read_text())["prompts"] == 4


def test_train_refuses_features_of_other_taps(tiny_dir, tmp_path):
    data = tiny_dir / "convs.jsonl"
    _run(
        "vocab",
        "build",
        "--target",
        tiny_dir,
        "--data",
        data,
        "--out",
        tmp_path / "v.safetensors",
        "--draft-vocab-size",
        512,
    )
    _run("data", "capture", "--target", tiny_dir, "--data", data, "--out", tmp_path / "feat", "--limit", 8)
    r = CliRunner().invoke(
        app,
        [
            "train",
            "--target",
            str(tiny_dir),
            "--features",
            str(tmp_path / "feat"),
            "--vocab",
            str(tmp_path / "v.safetensors"),
            "--out",
            str(tmp_path / "o"),
            "--taps",
            "1,2,3",
        ],
    )
    assert r.exit_code == 2 and "another wiring contract" in r.output and "taps" in r.output


def test_capture_skip_takes_only_the_conversations_after_an_earlier_capture(tiny_dir, tmp_path):
    from eaglewire.data.samples import load_samples
    from eaglewire.target.loader import load_target

    data = tiny_dir / "convs.jsonl"
    tok = load_target(str(tiny_dir)).tokenizer
    first8 = [s.id for s in load_samples(str(data), tok, max_length=64, limit=8)[0]]
    assert [s.id for s in load_samples(str(data), tok, max_length=64, skip=5, limit=3)[0]] == first8[5:]
    _run("data", "capture", "--target", tiny_dir, "--data", data, "--out", tmp_path / "feat", "--skip", 5, "--limit", 3)
    manifest = json.loads((tmp_path / "feat" / "manifest.json").read_text())
    assert manifest["samples"] == 3


def test_train_from_features_never_loads_the_target(tiny_dir, tmp_path, monkeypatch):
    """Offline: the taps come from the manifest (non-default ones, no --taps given) and the target model is
    never loaded; an explicit --taps that disagrees is refused naming both lists."""
    import transformers

    data = tiny_dir / "convs.jsonl"
    _run(
        "vocab",
        "build",
        "--target",
        tiny_dir,
        "--data",
        data,
        "--out",
        tmp_path / "v.safetensors",
        "--draft-vocab-size",
        512,
    )
    _run(
        "data",
        "capture",
        "--target",
        tiny_dir,
        "--data",
        data,
        "--out",
        tmp_path / "feat",
        "--limit",
        12,
        "--taps",
        "1,3,6",
    )

    def refuse(*args, **kwargs):
        raise AssertionError("offline training loaded the target model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    common = [
        "--target",
        tiny_dir,
        "--features",
        tmp_path / "feat",
        "--vocab",
        tmp_path / "v.safetensors",
        "--max-steps",
        2,
        "--eval-every",
        2,
        "--batch-size",
        2,
        "--ttt-steps",
        2,
        "--heldout-fraction",
        0.2,
    ]
    r = _run("train", "--out", tmp_path / "o", *common)
    assert "taps [1, 3, 6]" in r.output
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["contract"]["taps"] == [1, 3, 6]
    r = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "o2"), "--taps", "2,4,5", *map(str, common)])
    assert r.exit_code == 2 and "taps [2, 4, 5]" in r.output and "taps [1, 3, 6]" in r.output


@pytest.mark.real_target
def test_short_real_target_training_run(tmp_path):
    """Two TTT steps on the real SmolLM2 target, online features: the real path cannot rot."""
    data = tmp_path / "convs.jsonl"
    data.write_text("\n".join(json.dumps(c) for c in CONVS[:6]))
    _run("vocab", "build", "--data", data, "--out", tmp_path / "v.safetensors", "--draft-vocab-size", 2048)
    _run(
        "train",
        "--data",
        data,
        "--vocab",
        tmp_path / "v.safetensors",
        "--out",
        tmp_path / "run",
        "--max-steps",
        2,
        "--batch-size",
        2,
        "--ttt-steps",
        2,
        "--eval-every",
        2,
        "--heldout-fraction",
        0.3,
    )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["contract"]["target"]["num_layers"] == 30 and summary["contract"]["draft_vocab_size"] == 2048


def test_data_import_and_inspect_commands(tiny_dir, tmp_path):
    from dump_writers import write_specforge

    from eaglewire.data.samples import load_samples
    from eaglewire.target.loader import load_target

    tgt = load_target(str(tiny_dir))
    samples = load_samples(str(tiny_dir / "convs.jsonl"), tgt.tokenizer, max_length=64, limit=4)[0]
    write_specforge(tmp_path / "good", tgt, samples, stored=(2, 4, 5))  # SpecForge's default ids [1, 3, 4]
    write_specforge(tmp_path / "seeds", tgt, samples, stored=(0, 2, 4))  # the embedding where l1 was meant
    r = _run("data", "inspect", tmp_path / "good", "--target", tiny_dir)
    assert "output of decoder layer 4" in r.output and r.output.rstrip().endswith("OK")
    bad = CliRunner().invoke(app, ["data", "inspect", str(tmp_path / "seeds"), "--target", str(tiny_dir)])
    assert bad.exit_code == 1 and "embedding" in bad.output, bad.output
    _run("data", "import", tmp_path / "good", "--target", tiny_dir, "--out", tmp_path / "feat")
    manifest = json.loads((tmp_path / "feat" / "manifest.json").read_text())
    assert manifest["contract"]["taps"] == [2, 4, 5] and manifest["samples"] == len(samples)
    refused = CliRunner().invoke(
        app, ["data", "import", str(tmp_path / "seeds"), "--target", str(tiny_dir), "--out", str(tmp_path / "feat2")]
    )
    assert refused.exit_code != 0 and not (tmp_path / "feat2" / "manifest.json").exists()
