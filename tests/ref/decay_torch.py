#!/usr/bin/env python3
"""decay_torch.py - PyTorch's AdamW with parameter groups as the reference
for zs-train --decay (tests/test_train.c).

Usage: decay_torch.py A.safetensors B.safetensors MODE LR BETA1 BETA2 EPS WD T

A and B are zs-ctl export --optimizer files of two consecutive checkpoints
(steps T-1 and T) of the C GPT: fp32 weights with Hugging Face GPT-2 names
plus "<name>.exp_avg" / "<name>.exp_avg_sq". MODE is the --decay the run
used: "2d" (nanoGPT's rule: every tensor of 2 or more dimensions decays) or
"matmul" (2-D tensors other than the embeddings wte/wpe). The rule is
applied here to the names and shapes, independently of the C code.

Step T's gradient is recovered from the moments,
g = (exp_avg_T - beta1 * exp_avg_{T-1}) / (1 - beta1), and torch.optim.AdamW
with two param groups (weight_decay WD and 0) takes one step from step
T-1's weights and moments with it at lr LR (Adam's step count T). Its
parameters must equal step T's within 1e-6 relative (plus 1e-7 absolute:
the recovered gradient carries rounding). So that the check can fail, the
same step with decay on every tensor must differ from step T's on some
tensor of the no-decay group by more than that.

Exits 0 when both hold, 1 (with a message) when not, 2 if torch is missing.
"""
import json
import struct
import sys

try:
    import numpy as np
    import torch
except ImportError:
    sys.stderr.write("decay_torch.py: cannot import numpy/torch; run deploy/install-deps.sh\n")
    sys.exit(2)


def load(path):
    """{name: float32 numpy array} of a safetensors file (format: 8-byte
    little-endian header length, JSON header, data)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            sys.stderr.write("decay_torch.py: %s is %s, want F32\n" % (name, t["dtype"]))
            sys.exit(1)
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=np.float32).reshape(t["shape"]).copy()
    return out


def decays(name, shape, mode):
    if len(shape) < 2:
        return False
    if mode == "2d":
        return True
    return not (name.endswith("wte.weight") or name.endswith("wpe.weight"))


def step(A, B, names, mode_groups, lr, b1, b2, eps, wd, t):
    """One torch.optim.AdamW step from A's state with the recovered
    gradients; mode_groups(name, shape) says which tensors decay."""
    params, dec, nodec = {}, [], []
    for n in names:
        p = torch.nn.Parameter(torch.from_numpy(A[n].copy()))
        m0 = torch.from_numpy(A[n + ".exp_avg"].astype(np.float64))
        m1 = torch.from_numpy(B[n + ".exp_avg"].astype(np.float64))
        p.grad = ((m1 - b1 * m0) / (1 - b1)).float()
        params[n] = p
        (dec if mode_groups(n, A[n].shape) else nodec).append(p)
    opt = torch.optim.AdamW([{"params": dec, "weight_decay": wd},
                             {"params": nodec, "weight_decay": 0.0}],
                            lr=lr, betas=(b1, b2), eps=eps)
    for n in names:
        p = params[n]
        opt.state[p]["step"] = torch.tensor(float(t - 1))
        opt.state[p]["exp_avg"] = torch.from_numpy(A[n + ".exp_avg"].copy())
        opt.state[p]["exp_avg_sq"] = torch.from_numpy(A[n + ".exp_avg_sq"].copy())
    opt.step()
    return {n: params[n].detach().numpy() for n in names}, len(dec), len(nodec)


def main():
    if len(sys.argv) != 10:
        sys.stderr.write(__doc__)
        return 1
    A, B = load(sys.argv[1]), load(sys.argv[2])
    mode = sys.argv[3]
    lr, b1, b2, eps, wd = (float(x) for x in sys.argv[4:9])
    t = int(sys.argv[9])
    names = [n for n in A if not n.endswith(".exp_avg") and not n.endswith(".exp_avg_sq")]
    ours, nd, nn = step(A, B, names, lambda n, s: decays(n, s, mode), lr, b1, b2, eps, wd, t)
    alld, _, _ = step(A, B, names, lambda n, s: True, lr, b1, b2, eps, wd, t)
    worst, worst_name, apart = 0.0, "", 0.0
    for n in names:
        want, got = ours[n], B[n]
        err = np.max(np.abs(got - want) / (1e-6 * np.abs(want) + 1e-7))
        if err > worst:
            worst, worst_name = float(err), n
        if not decays(n, A[n].shape, mode):
            apart = max(apart, float(np.max(np.abs(alld[n] - got) / (1e-6 * np.abs(got) + 1e-7))))
    print("decay_torch.py: %s: %d tensors decay, %d do not; worst %.3g of the tolerance (%s); "
          "decay on all would be %.3g of it" % (mode, nd, nn, worst, worst_name, apart))
    if nd == 0 or nn == 0:
        print("decay_torch.py: FAIL: both groups must be non-empty")
        return 1
    if worst > 1:
        print("decay_torch.py: FAIL: %s differs from torch.optim.AdamW with the groups" % worst_name)
        return 1
    if apart <= 10:
        print("decay_torch.py: FAIL: decay on every tensor is not told apart (%.3g)" % apart)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
