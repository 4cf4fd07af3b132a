#!/usr/bin/env python3
"""gpt_torch.py - PyTorch reference for tests/test_gpt.c.

Usage: gpt_torch.py DIR [fp32|bf16|fp16 [fp32|bf16|fp16]]

DIR/config.txt: "layers heads width ctx vocab B T" (one line, integers).
DIR/params.bin: all parameters, fp32, in zs_gpt.h's flat order:
    wte [V, C], wpe [ctx, C];
    per block: ln1_w, ln1_b [C]; qkv_w [C, 3C], qkv_b [3C];
               attn_proj_w [C, C], attn_proj_b [C]; ln2_w, ln2_b [C];
               fc_w [C, 4C], fc_b [4C]; fc_proj_w [4C, C], fc_proj_b [C];
    lnf_w, lnf_b [C].
    Weights are [in, out] (y = x W + b); the LM head is tied: logits = x wte^T.
DIR/tokens.bin: int32 inputs [B, T] then int32 targets [B, T].

The model is written out layer by layer in float32 (no transformers
library): pre-LayerNorm blocks (eps 1e-5), causal attention with scores
scaled by 1/sqrt(head_dim) and a softmax, GELU tanh approximation, final
LayerNorm, tied head, mean cross-entropy over the B*T positions.

With bf16 / fp16 (the GEMM precision of kernels/zs_mixed.h) every matrix
product reads its two operands rounded to that dtype (torch's own
round-to-nearest-even casts) and computes in float32, in the forward and in
the backward (MixedMM: dA = r(dC) r(B)^T, dB = r(A)^T r(dC)); LayerNorm,
softmax, GELU, residuals, bias gradients and the loss stay float32. It writes
DIR/logits.bin ([B, T, V] fp32), DIR/loss.bin (one float64) and
DIR/grads.bin (d loss / d params, fp32, same flat order; wte's gradient
sums the embedding and head uses). Exits 2 if torch is missing.

The optional second dtype is the activation precision of
worker/model/zs_gpt_act16.c (fp32 GEMMs only): the tensors the C model
stores for the backward are rounded to it where they are produced and read
rounded from then on (a straight-through rounding: its gradient passes
unchanged): the residual stream after the embedding and after each block
and after attention, LayerNorm outputs ln1/ln2 (not the final one), qkv,
the attention output, the MLP pre-activation and GELU output. The
attention probabilities as the C attention op uses them: its P.V product
reads them unrounded, the backward (dV and the softmax backward) reads the
rounded ones (AttnPV). It does not
compare anything: the C test does.
"""
import math
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.stderr.write("gpt_torch.py: cannot import torch; run deploy/install-deps.sh\n")
    sys.exit(2)


def layout(L, C, ctx, V):
    """(name, shape) of every tensor in flat order."""
    t = [("wte", (V, C)), ("wpe", (ctx, C))]
    for l in range(L):
        for name, shape in (("ln1_w", (C,)), ("ln1_b", (C,)), ("qkv_w", (C, 3 * C)),
                            ("qkv_b", (3 * C,)), ("attn_proj_w", (C, C)), ("attn_proj_b", (C,)),
                            ("ln2_w", (C,)), ("ln2_b", (C,)), ("fc_w", (C, 4 * C)),
                            ("fc_b", (4 * C,)), ("fc_proj_w", (4 * C, C)), ("fc_proj_b", (C,))):
            t.append(("h%d.%s" % (l, name), shape))
    t += [("lnf_w", (C,)), ("lnf_b", (C,))]
    return t


def read(path, dtype):
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=dtype).clone()


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


class MixedMM(torch.autograd.Function):
    """C = r(A) @ r(B) in float32, r = round to DT and back; the backward
    rounds its GEMM operands the same way (the incoming gradient too)."""

    DT = None

    @staticmethod
    def r(x):
        return x.to(MixedMM.DT).to(torch.float32)

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return MixedMM.r(a) @ MixedMM.r(b)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        r = MixedMM.r
        return r(dc) @ r(b).transpose(-2, -1), r(a).transpose(-2, -1) @ r(dc)


class Act(torch.autograd.Function):
    """Round to DT and back in the forward; the gradient passes unchanged."""

    DT = None

    @staticmethod
    def forward(ctx, x):
        return x.to(Act.DT).to(torch.float32)

    @staticmethod
    def backward(ctx, g):
        return g


def R(x):
    """x as the C model stores it (Act.DT None: unchanged)."""
    return x if Act.DT is None else Act.apply(x)


class AttnPV(torch.autograd.Function):
    """y = softmax(s) @ v with the probabilities p rounded for the backward
    only: dv = r(p)^T dy, ds = r(p) * (dp - sum(r(p) * dp)), dp = dy v^T."""

    @staticmethod
    def forward(ctx, s, v):
        p = torch.softmax(s, dim=-1)
        pr = p.to(Act.DT).to(torch.float32)
        ctx.save_for_backward(pr, v)
        return p @ v

    @staticmethod
    def backward(ctx, dy):
        pr, v = ctx.saved_tensors
        dp = dy @ v.transpose(-2, -1)
        ds = pr * (dp - (pr * dp).sum(dim=-1, keepdim=True))
        return ds, pr.transpose(-2, -1) @ dy


def mm(a, b):
    """a @ b at the GEMM precision (MixedMM.DT None: plain float32)."""
    return a @ b if MixedMM.DT is None else MixedMM.apply(a, b)


def forward(p, idx, tgt, L, NH, C, V):
    B, T = idx.shape
    hs = C // NH
    x = R(p["wte"][idx] + p["wpe"][:T])
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        h = lambda n: p["h%d.%s" % (l, n)]
        a = R(F.layer_norm(x, (C,), h("ln1_w"), h("ln1_b"), eps=1e-5))
        qkv = R(mm(a, h("qkv_w")) + h("qkv_b"))
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = mm(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~mask, float("-inf"))
        if Act.DT is None:
            att = torch.softmax(att, dim=-1)
            y = mm(att, v)
        else:
            y = AttnPV.apply(att, v)
        y = R(y.transpose(1, 2).contiguous().view(B, T, C))
        x = R(x + (mm(y, h("attn_proj_w")) + h("attn_proj_b")))
        m = R(F.layer_norm(x, (C,), h("ln2_w"), h("ln2_b"), eps=1e-5))
        fch = R(mm(m, h("fc_w")) + h("fc_b"))
        x = R(x + (mm(R(gelu(fch)), h("fc_proj_w")) + h("fc_proj_b")))
    x = F.layer_norm(x, (C,), p["lnf_w"], p["lnf_b"], eps=1e-5)
    logits = mm(x, p["wte"].t())
    loss = F.cross_entropy(logits.view(-1, V), tgt.reshape(-1).long())
    return logits, loss


def main():
    if len(sys.argv) not in (2, 3, 4):
        sys.exit("usage: gpt_torch.py DIR [fp32|bf16|fp16 [fp32|bf16|fp16]]")
    d = sys.argv[1]
    gemm = sys.argv[2] if len(sys.argv) >= 3 else "fp32"
    act = sys.argv[3] if len(sys.argv) == 4 else "fp32"
    dts = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
    if gemm not in dts or act not in dts:
        sys.exit("gpt_torch.py: precision %s / %s is not fp32, bf16 or fp16" % (gemm, act))
    if gemm != "fp32" and act != "fp32":
        sys.exit("gpt_torch.py: 16-bit activations with fp32 GEMMs only")
    MixedMM.DT = dts[gemm]
    Act.DT = dts[act]
    torch.set_num_threads(2)
    with open(d + "/config.txt") as f:
        L, NH, C, ctx, V, B, T = (int(v) for v in f.read().split())
    flat = read(d + "/params.bin", torch.float32)
    shapes = layout(L, C, ctx, V)
    P = sum(math.prod(s) for _, s in shapes)
    if flat.numel() != P:
        sys.exit("gpt_torch.py: params.bin has %d floats, expected %d" % (flat.numel(), P))
    flat.requires_grad_(True)
    p, off = {}, 0
    for name, shape in shapes:
        n = math.prod(shape)
        p[name] = flat[off:off + n].view(shape)
        off += n
    tok = read(d + "/tokens.bin", torch.int32)
    if tok.numel() != 2 * B * T:
        sys.exit("gpt_torch.py: tokens.bin has %d ids, expected %d" % (tok.numel(), 2 * B * T))
    idx = tok[:B * T].view(B, T).long()
    tgt = tok[B * T:].view(B, T).long()
    logits, loss = forward(p, idx, tgt, L, NH, C, V)
    loss.backward()
    with open(d + "/logits.bin", "wb") as f:
        f.write(logits.detach().contiguous().numpy().tobytes())
    with open(d + "/loss.bin", "wb") as f:
        f.write(torch.tensor([loss.item()], dtype=torch.float64).numpy().tobytes())
    with open(d + "/grads.bin", "wb") as f:
        f.write(flat.grad.contiguous().numpy().tobytes())


if __name__ == "__main__":
    main()
