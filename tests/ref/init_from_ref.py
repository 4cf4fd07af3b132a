#!/usr/bin/env python3
"""init_from_ref.py - an independent writer of GPT-2 weight files and the
PyTorch loss on them, for tests/test_init_from.c (zs-train --init-from).

Usage:
  init_from_ref.py write DIR L NH C T V SEED
      Random GPT-2 weights (torch, seeded; spread wider than GPT-2's init so
      the loss depends on every tensor) written three ways, by hand (json +
      struct, no safetensors or transformers library):
        DIR/export.safetensors  the names and layout `zs-ctl export` writes
                                ("transformer.h.0.attn.c_attn.weight", F32,
                                no lm_head), metadata {"format": "pt"} only
        DIR/hf.safetensors      GPT2Model's own names ("h.0.attn.c_attn...",
                                no prefix) plus the causal-mask buffers
                                h.N.attn.bias and a tied lm_head.weight, as
                                Hugging Face's gpt2 files hold, in a
                                different tensor order
        DIR/llmc.bin            an llm.c checkpoint (train_gpt2.py's
                                write_model: 256 int32 header, magic
                                20240326, version 3, padded vocab rounded up
                                to 128 with zero rows, matrices [out, in])
        DIR/llmc_bf16.bin       the same as version 5 (bf16)
      and DIR/loss.txt (DIR/loss_bf16.txt: on the weights rounded to bf16): the mean cross-entropy of tests/ref/gpt_torch.py's
      GPT on DIR/tokens.bin (int32 inputs [1, T] then targets [1, T]).
  init_from_ref.py loss FILE DIR L NH C T V [VAL]
      Load a safetensors FILE (any of the layouts above or an export) by
      hand and print the loss of gpt_torch.py's GPT on DIR/tokens.bin; with
      VAL (int32 tokens), the mean loss over its windows of T + 1 tokens
      starting every T tokens (zs-train's validation slice).
  init_from_ref.py greedy FILE L NH C T V N IDS
      Greedy decoding (argmax, first index on ties) of N tokens after the
      comma-separated prompt IDS, at most T in all; prints the ids.
Exits 2 if torch is missing.
"""
import json
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch
    import gpt_torch
except ImportError:
    sys.stderr.write("init_from_ref.py: cannot import torch; run deploy/install-deps.sh\n")
    sys.exit(2)

BLOCK = [("ln1_w", "ln_1.weight"), ("ln1_b", "ln_1.bias"), ("qkv_w", "attn.c_attn.weight"),
         ("qkv_b", "attn.c_attn.bias"), ("attn_proj_w", "attn.c_proj.weight"),
         ("attn_proj_b", "attn.c_proj.bias"), ("ln2_w", "ln_2.weight"), ("ln2_b", "ln_2.bias"),
         ("fc_w", "mlp.c_fc.weight"), ("fc_b", "mlp.c_fc.bias"),
         ("fc_proj_w", "mlp.c_proj.weight"), ("fc_proj_b", "mlp.c_proj.bias")]


def hf_names(L):
    """(our name, Hugging Face name without prefix) in our flat order."""
    n = [("wte", "wte.weight"), ("wpe", "wpe.weight")]
    for l in range(L):
        n += [("h%d.%s" % (l, a), "h.%d.%s" % (l, b)) for a, b in BLOCK]
    return n + [("lnf_w", "ln_f.weight"), ("lnf_b", "ln_f.bias")]


def write_safetensors(path, tensors, meta):
    """tensors: list of (name, float32 tensor), written in that order."""
    header, off, blobs = {"__metadata__": meta}, 0, []
    for name, t in tensors:
        b = t.contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        dt = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[e["dtype"]]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=dt).float()
        out[name[12:] if name.startswith("transformer.") else name] = t.view(e["shape"])
    return out


def loss_of(p, d, L, NH, C, T, V):
    tok = gpt_torch.read(d + "/tokens.bin", torch.int32)
    idx = tok[:T].view(1, T).long()
    tgt = tok[T:].view(1, T).long()
    with torch.no_grad():
        _, loss = gpt_torch.forward(p, idx, tgt, L, NH, C, V)
    return loss.item()


def val_loss_of(p, path, L, NH, C, T, V):
    """Mean loss over the windows of T + 1 tokens starting every T tokens of
    the int32 tokens in path (the validation slice of zs_train_eval.h)."""
    tok = gpt_torch.read(path, torch.int32).long()
    nwin = (tok.numel() - 1) // T
    idx = torch.stack([tok[w * T:w * T + T] for w in range(nwin)])
    tgt = torch.stack([tok[w * T + 1:w * T + T + 1] for w in range(nwin)])
    with torch.no_grad():
        _, loss = gpt_torch.forward(p, idx, tgt, L, NH, C, V)
    return loss.item()


def write(d, L, NH, C, T, V, seed):
    g = torch.Generator().manual_seed(seed)
    p = {}
    for name, shape in gpt_torch.layout(L, C, T, V):
        if name.endswith(("ln1_w", "ln2_w", "lnf_w")):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif len(shape) == 1:
            t = 0.05 * torch.randn(shape, generator=g)
        else:
            t = 0.15 * torch.randn(shape, generator=g)
        p[name] = t.float()
    names = hf_names(L)
    write_safetensors(d + "/export.safetensors",
                      [("transformer." + hf, p[ours]) for ours, hf in names], {"format": "pt"})
    native = [(hf, p[ours]) for ours, hf in reversed(names)]
    native += [("h.%d.attn.bias" % l, torch.tril(torch.ones(T, T)).view(1, 1, T, T))
               for l in range(L)]
    native.append(("lm_head.weight", p["wte"]))
    write_safetensors(d + "/hf.safetensors", native, {"format": "pt"})
    write_llmc(d + "/llmc.bin", p, 3, L, NH, C, T, V)
    write_llmc(d + "/llmc_bf16.bin", p, 5, L, NH, C, T, V)
    with open(d + "/loss.txt", "w") as f:
        f.write("%.9f\n" % loss_of(p, d, L, NH, C, T, V))
    rounded = {k: v.to(torch.bfloat16).float() for k, v in p.items()}
    with open(d + "/loss_bf16.txt", "w") as f:
        f.write("%.9f\n" % loss_of(rounded, d, L, NH, C, T, V))


def write_llmc(path, p, version, L, NH, C, T, V):
    """version 3: fp32; 5: bf16 (round to nearest even, torch's cast)."""
    Vp = (V + 127) // 128 * 128
    with open(path, "wb") as f:
        hdr = [20240326, version, T, V, L, NH, C, Vp] + [0] * 248
        f.write(struct.pack("<256i", *hdr))
        wte = torch.zeros(Vp, C)
        wte[:V] = p["wte"]
        arrays = [wte, p["wpe"]]
        for n in ("ln1_w", "ln1_b", "qkv_w", "qkv_b", "attn_proj_w", "attn_proj_b", "ln2_w",
                  "ln2_b", "fc_w", "fc_b", "fc_proj_w", "fc_proj_b"):
            per = [p["h%d.%s" % (l, n)] for l in range(L)]
            arrays.append(torch.stack([t.t() if t.dim() == 2 else t for t in per]))
        arrays += [p["lnf_w"], p["lnf_b"]]
        for a in arrays:
            a = a.contiguous()
            if version == 5:
                f.write(a.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes())
            else:
                f.write(a.numpy().astype("<f4").tobytes())


def main():
    if len(sys.argv) == 9 and sys.argv[1] == "write":
        d = sys.argv[2]
        L, NH, C, T, V, seed = (int(v) for v in sys.argv[3:9])
        write(d, L, NH, C, T, V, seed)
    elif len(sys.argv) in (9, 10) and sys.argv[1] == "loss":
        path, d = sys.argv[2], sys.argv[3]
        L, NH, C, T, V = (int(v) for v in sys.argv[4:9])
        t = read_safetensors(path)
        p = {ours: t[hf] for ours, hf in hf_names(L)}
        p["wpe"] = p["wpe"][:T]
        if len(sys.argv) == 10:
            print("%.9f" % val_loss_of(p, sys.argv[9], L, NH, C, T, V))
        else:
            print("%.9f" % loss_of(p, d, L, NH, C, T, V))
    elif len(sys.argv) == 10 and sys.argv[1] == "greedy":
        path = sys.argv[2]
        L, NH, C, T, V, N = (int(v) for v in sys.argv[3:9])
        tok = [int(v) for v in sys.argv[9].split(",")]
        t = read_safetensors(path)
        p = {ours: t[hf] for ours, hf in hf_names(L)}
        with torch.no_grad():
            while len(tok) < min(len(sys.argv[9].split(",")) + N, T):
                idx = torch.tensor([tok])
                logits, _ = gpt_torch.forward(p, idx, torch.zeros_like(idx), L, NH, C, V)
                tok.append(int(torch.argmax(logits[0, -1])))
        print(" ".join(str(v) for v in tok))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
