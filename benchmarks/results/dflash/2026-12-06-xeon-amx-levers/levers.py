"""DFlash init/recipe experiment: python exp.py NAME INIT STEPS [key=val ...]"""

import json, sys, time, dataclasses
from pathlib import Path
import torch
from eaglewire.target.loader import load_target
from eaglewire.train import dflash as D, objectives as O
from eaglewire.train.config import TrainConfig
from eaglewire.train.loop import train
from eaglewire.workflows import feature_source
from eaglewire.data.samples import split_heldout

name, init, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
kw = dict(a.split("=", 1) for a in sys.argv[4:])
TAPS_ARG = kw.pop("taps", "")
FEATURES = kw.pop("features", "/tmp/dflash-run/features")
target = load_target()
orig = D.build_draft


def init_from_target(draft, target):
    taps = draft.contract.taps
    last = taps[-1]  # boundary read by the last tap = input of target layer `last`
    H = draft.cfg.target_hidden_size
    with torch.no_grad():
        for i, layer in enumerate(draft.layers):
            src = target.layer_parameters(min(last + i, target.num_layers - 1))
            for nm, p in layer.named_parameters():
                if nm in src and src[nm].shape == p.shape:
                    p.copy_(src[nm])
            if i == 0:
                draft.hidden_norm.weight.copy_(src["input_layernorm.weight"])
        if init.startswith("target_fc"):
            w = draft.fc.weight  # [H, n*H]
            scale = 0.0 if init == "target_fc" else 1.0
            w.mul_(scale)
            w[:, (len(taps) - 1) * H :].copy_(torch.eye(H))


def recency(d, feats, samples, kv_heads=(0, 1), hi=8, gain=2.0):
    """Content-free local attention at init for some heads: q and k both along u (the highest-frequency RoPE
    pairs), so q.R(delta)k = sum_i cos(w_i delta): peaked at delta 0..2, ~0 far away."""
    hd, g = d.cfg.head_dim, d.cfg.num_attention_heads // d.cfg.num_key_value_heads
    u = torch.zeros(hd)
    u[:hi] = 1
    u[hd // 2 : hd // 2 + hi] = 1
    with torch.no_grad():
        fb = feats.batch(samples[:2])
        c = d.context(fb.taps.float()).reshape(-1, d.cfg.hidden_size)
        m = torch.nn.functional.normalize(c.mean(0), dim=0)
        for layer in d.layers:
            at = layer.self_attn
            xm = layer.input_layernorm(d.embed(torch.tensor([d.block.mask_token_id])))[0]
            nm = torch.nn.functional.normalize(xm, dim=0)
            key_dir = torch.nn.functional.normalize(m + nm, dim=0)
            print("proj ctx", float((c @ key_dir > 0).float().mean()), "mask", float(nm @ key_dir))
            for h in kv_heads:
                at.k_proj.weight[h * hd : (h + 1) * hd] = torch.outer(u, key_dir)
                for qh in range(h * g, (h + 1) * g):
                    at.q_proj.weight[qh * hd : (qh + 1) * hd] = torch.outer(u, nm)
            at.q_norm.weight[u > 0] *= gain


def build(target, contract, vmap, c):
    d = orig(target, contract, vmap, c)
    if init.startswith("target"):
        init_from_target(d, target)
    if "recency" in init:
        recency(d, FEATS[0], FEATS[1])
    return d


FEATS = []
D.build_draft = build
O.register_part(
    "dflash", "objective", dataclasses.replace(O.objective("dflash"), build_draft=build)
)  # the family record's objective

c = TrainConfig(
    family="dflash",
    max_steps=steps,
    eval_every=int(kw.pop("eval_every", 25)),
    ckpt_every=int(kw.pop("ckpt_every", 1000)),
    **{k: type(getattr(TrainConfig(), k))(v) for k, v in kw.items()},
)
TAPS = tuple(int(x) for x in TAPS_ARG.split("-")) if TAPS_ARG else D.default_taps(target.num_layers)
contract = D.make_contract(target, TAPS, None, c)
feats, samples = feature_source(target, contract, Path(FEATURES), lambda: [])
FEATS[:] = [feats, samples]
tr, held = split_heldout(samples, 0.05)
out = Path(f"/tmp/dx/{name}")
import shutil

shutil.rmtree(out, ignore_errors=True)
t0 = time.time()


def on_step(r):
    if r["split"] == "heldout" or r["step"] % 5 == 0:
        print(
            json.dumps(
                {
                    "t": round(time.time() - t0),
                    "step": r["step"],
                    "split": r["split"],
                    "loss": round(r["loss"], 3),
                    "acc": [round(a, 3) for a in r["acc"]],
                    **({"tau": round(r["tau_chain"], 3)} if "tau_chain" in r else {}),
                }
            ),
            flush=True,
        )


ev = train(target, contract, None, feats, tr, held, c, out, on_step=on_step)
print("FINAL", json.dumps({k: ev[k] for k in ("loss", "acc", "tau_chain")}), flush=True)
