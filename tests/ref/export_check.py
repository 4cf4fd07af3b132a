#!/usr/bin/env python3
"""export_check.py - an independent reader of zs-ctl export's safetensors
files, for tests/test_export.c. It uses no safetensors library: the format
is parsed here from its definition (8-byte little-endian header length N,
N bytes of JSON, then the data; every tensor's data_offsets are relative to
the end of the header, packed, in bounds, of numel * dtype size bytes).

Usage:
  export_check.py gpt DIR
      DIR/config.txt: "layers heads width ctx vocab B T" (one line).
      DIR/tokens.bin: int32 inputs [B, T] then int32 targets [B, T].
      DIR/f32.safetensors, DIR/bf16.safetensors, DIR/f16.safetensors and
      DIR/opt.safetensors (fp32 weights + exp_avg, exp_avg_sq) of one
      checkpoint of the reference GPT.
    Checks every file's header (names and shapes exactly Hugging Face
    GPT-2's for the config, dtypes, offsets, sizes, metadata), that the bf16
    and fp16 weights are the fp32 weights rounded to nearest even (numpy
    bit arithmetic, not the C casts), and that the optimizer file's weights
    equal the fp32 file's. Builds the model of tests/ref/gpt_torch.py from
    the exported tensors (mapped back from GPT-2's names) and writes
      DIR/flat.bin        fp32 weights in zeroshard's flat order
      DIR/logits.bin      torch logits [B, T, V] on the tokens
      DIR/exp_avg.bin, DIR/exp_avg_sq.bin   the moments, flat order
    for the C test to compare.
  export_check.py synth FILE P
      FILE is the export of a model whose flat parameter i was set to
      ((i * 2654435761) mod 2^32 mod 65536) / 65536 - 0.5 (exact in fp32).
      Checks the header and that every tensor's data is that formula at its
      manifest offset (tensors are packed in flat order from 0: the offset
      is the running sum), covering all P parameters.

Exits 0 when every check holds, 1 (with a message) when one fails, 2 if
numpy/torch are missing.
"""
import json
import math
import os
import struct
import sys

try:
    import numpy as np
except ImportError:
    sys.stderr.write("export_check.py: cannot import numpy; run deploy/install-deps.sh\n")
    sys.exit(2)

DTYPES = {"F32": (np.float32, 4), "BF16": (np.uint16, 2), "F16": (np.float16, 2)}


def fail(msg):
    sys.stderr.write("export_check.py: FAIL: %s\n" % msg)
    sys.exit(1)


def read_header(path):
    """(header dict without __metadata__, metadata, data start, file size)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            fail("%s: shorter than 8 bytes" % path)
        (n,) = struct.unpack("<Q", raw)
        if n == 0 or n > 100 * 1024 * 1024 or 8 + n > size:
            fail("%s: header length %d does not fit the file (%d bytes)" % (path, n, size))
        head = f.read(n)
    if n % 8 != 0:
        fail("%s: header length %d is not a multiple of 8" % (path, n))
    h = json.loads(head.decode("utf-8"))
    meta = h.pop("__metadata__", None)
    if not isinstance(meta, dict) or meta.get("format") != "pt":
        fail("%s: __metadata__.format is not 'pt' (transformers wants it)" % path)
    for k, v in meta.items():
        if not isinstance(v, str):
            fail("%s: metadata %s is not a string" % (path, k))
    # data_offsets: packed from 0 in file order, sizes from dtype and shape
    spans = []
    for name, t in h.items():
        if set(t) != {"dtype", "shape", "data_offsets"} or t["dtype"] not in DTYPES:
            fail("%s: tensor %s: bad entry %r" % (path, name, t))
        b, e = t["data_offsets"]
        numel = math.prod(t["shape"])
        if e - b != numel * DTYPES[t["dtype"]][1]:
            fail("%s: %s holds %d bytes for shape %s %s" % (path, name, e - b, t["shape"],
                                                            t["dtype"]))
        spans.append((b, e, name))
    spans.sort()
    at = 0
    for b, e, name in spans:
        if b != at:
            fail("%s: %s starts at %d, expected %d (gap or overlap)" % (path, name, b, at))
        at = e
    if 8 + n + at != size:
        fail("%s: data ends at %d but the file has %d bytes" % (path, 8 + n + at, size))
    return h, meta, 8 + n, size


def tensor(path, h, start, name):
    t = h[name]
    b, e = t["data_offsets"]
    dt = DTYPES[t["dtype"]][0]
    a = np.fromfile(path, dtype=dt, count=(e - b) // np.dtype(dt).itemsize, offset=start + b)
    return a.reshape(t["shape"]) if t["shape"] else a


def gpt2_layout(L, C, T, V):
    """[(hf_name, zs_name, shape)] in zeroshard's flat order, from the config."""
    t = [("transformer.wte.weight", "wte", [V, C]), ("transformer.wpe.weight", "wpe", [T, C])]
    block = [("ln_1.weight", "ln1_w", [C]), ("ln_1.bias", "ln1_b", [C]),
             ("attn.c_attn.weight", "qkv_w", [C, 3 * C]), ("attn.c_attn.bias", "qkv_b", [3 * C]),
             ("attn.c_proj.weight", "attn_proj_w", [C, C]), ("attn.c_proj.bias", "attn_proj_b", [C]),
             ("ln_2.weight", "ln2_w", [C]), ("ln_2.bias", "ln2_b", [C]),
             ("mlp.c_fc.weight", "fc_w", [C, 4 * C]), ("mlp.c_fc.bias", "fc_b", [4 * C]),
             ("mlp.c_proj.weight", "fc_proj_w", [4 * C, C]), ("mlp.c_proj.bias", "fc_proj_b", [C])]
    for l in range(L):
        for hf, zs, shape in block:
            t.append(("transformer.h.%d.%s" % (l, hf), "h%d.%s" % (l, zs), shape))
    t += [("transformer.ln_f.weight", "lnf_w", [C]), ("transformer.ln_f.bias", "lnf_b", [C])]
    return t


def round_bf16(x):
    """fp32 -> bf16 bits, round to nearest even (NaN kept quiet)."""
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def check_gpt(d):
    with open(os.path.join(d, "config.txt")) as f:
        L, NH, C, T, V, B, TT = (int(v) for v in f.read().split())
    layout = gpt2_layout(L, C, T, V)
    want = {hf: shape for hf, _, shape in layout}
    files = {}
    for tag, dtype in (("f32", "F32"), ("bf16", "BF16"), ("f16", "F16")):
        path = os.path.join(d, tag + ".safetensors")
        h, meta, start, _ = read_header(path)
        if {k: v["shape"] for k, v in h.items()} != want:
            fail("%s: names/shapes are not GPT-2's: extra %s, missing %s" % (
                path, sorted(set(h) - set(want))[:5], sorted(set(want) - set(h))[:5]))
        if any(v["dtype"] != dtype for v in h.values()):
            fail("%s: not all tensors are %s" % (path, dtype))
        cfg = json.loads(meta["zeroshard.model"])["config"]
        if (cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["n_positions"],
                cfg["vocab_size"]) != (L, NH, C, T, V):
            fail("%s: metadata config %r" % (path, cfg))
        files[tag] = (path, h, start)
    w = {hf: tensor(*files["f32"], hf) for hf in want}
    worst = {"bf16": 0, "f16": 0}
    for hf in want:
        b16 = tensor(*files["bf16"], hf)
        if not np.array_equal(b16, round_bf16(w[hf])):
            fail("bf16 %s is not the fp32 weights rounded to nearest even" % hf)
        h16 = tensor(*files["f16"], hf)
        if not np.array_equal(h16.view(np.uint16), w[hf].astype(np.float16).view(np.uint16)):
            fail("fp16 %s is not the fp32 weights rounded to nearest even" % hf)
        back = b16.astype(np.uint32) << 16
        worst["bf16"] = max(worst["bf16"], float(np.max(np.abs(back.view(np.float32) - w[hf]))))
        worst["f16"] = max(worst["f16"], float(np.max(np.abs(h16.astype(np.float32) - w[hf]))))
    print("  bf16 / fp16 exports = fp32 rounded to nearest even (max |diff| %.3g / %.3g)" % (
        worst["bf16"], worst["f16"]))
    # optimizer file: weights + exp_avg + exp_avg_sq
    path = os.path.join(d, "opt.safetensors")
    h, meta, start, _ = read_header(path)
    wanto = dict(want)
    for hf, shape in want.items():
        wanto[hf + ".exp_avg"] = shape
        wanto[hf + ".exp_avg_sq"] = shape
    if {k: v["shape"] for k, v in h.items()} != wanto:
        fail("%s: names/shapes are not GPT-2's + .exp_avg/.exp_avg_sq" % path)
    if any(v["dtype"] != "F32" for v in h.values()):
        fail("%s: optimizer export is not all F32" % path)
    for hf in want:
        if not np.array_equal(tensor(path, h, start, hf), w[hf]):
            fail("%s: %s differs from the fp32 export" % (path, hf))
    for k in ("exp_avg", "exp_avg_sq"):
        np.concatenate([tensor(path, h, start, hf + "." + k).reshape(-1)
                        for hf, _, _ in layout]).astype(np.float32).tofile(
                            os.path.join(d, k + ".bin"))
    flat = np.concatenate([w[hf].reshape(-1) for hf, _, _ in layout]).astype(np.float32)
    flat.tofile(os.path.join(d, "flat.bin"))
    # torch: the GPT of gpt_torch.py from the exported tensors
    try:
        import torch
    except ImportError:
        sys.stderr.write("export_check.py: cannot import torch\n")
        sys.exit(2)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpt_torch
    torch.set_num_threads(2)
    p = {zs: torch.from_numpy(np.array(w[hf])) for hf, zs, _ in layout}
    tok = np.fromfile(os.path.join(d, "tokens.bin"), dtype=np.int32)
    if tok.size != 2 * B * TT:
        fail("tokens.bin has %d ids, expected %d" % (tok.size, 2 * B * TT))
    idx = torch.from_numpy(tok[:B * TT].reshape(B, TT).astype(np.int64))
    tgt = torch.from_numpy(tok[B * TT:].reshape(B, TT).astype(np.int64))
    with torch.no_grad():
        logits, loss = gpt_torch.forward(p, idx, tgt, L, NH, C, V)
    logits.contiguous().numpy().astype(np.float32).tofile(os.path.join(d, "logits.bin"))
    print("  torch GPT from the export: loss %.5f on the fixed tokens" % loss.item())


def check_synth(path, P):
    h, meta, start, size = read_header(path)
    names = sorted(h, key=lambda k: h[k]["data_offsets"][0])
    at = 0
    for name in names:
        t = h[name]
        if t["dtype"] != "F32":
            fail("%s: %s is %s" % (path, name, t["dtype"]))
        n = math.prod(t["shape"])
        a = tensor(path, h, start, name).reshape(-1)
        i = np.arange(at, at + n, dtype=np.uint64)
        want = (((i * np.uint64(2654435761)) % np.uint64(1 << 32)) % np.uint64(65536)).astype(
            np.float32) / np.float32(65536) - np.float32(0.5)
        if not np.array_equal(a, want):
            k = int(np.argmax(a != want))
            fail("%s: %s element %d is %r, expected %r" % (path, name, k, a[k], want[k]))
        at += n
    if at != P:
        fail("%s: tensors cover %d parameters, the model has %d" % (path, at, P))
    print("  %s: %d tensors, %d parameters, every value as set (%.1f MB)" % (
        os.path.basename(path), len(names), P, size / 1e6))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "gpt":
        check_gpt(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "synth":
        check_synth(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit("usage: export_check.py gpt DIR | synth FILE P")


if __name__ == "__main__":
    main()
