"""zeroshard.torch: ShardOptimizer, a torch.optim.Optimizer whose AdamW runs
on zeroshard's shard servers.

The parameters are laid out in one flat fp32 space of P elements, which the
servers split into ranges (server i of S owns the i-th range). The order is
the order the parameters were given in: param groups in order, parameters in
order within a group. Built from ``model.named_parameters()`` each parameter
is known by its name; from ``model.parameters()`` by its position
("param.<i>"). A manifest (name, shape, dtype, offset of every parameter) is
stored with every checkpoint, so a resume refuses a model that differs,
naming the first parameter that does.

``step()`` gathers the gradients into one flat buffer, pushes it to the
servers, commits the step (AdamW runs there, with this step's lr read from the
param groups, so torch LR schedulers work) and pulls the new parameters back
into the model's tensors. The fp32 master weights and Adam moments live only
on the servers.

Param groups: each group is one range of the flat space (the layout puts
them one after another) with its own weight_decay, given to the servers at
the start (protocol version 3 parameter groups) and fixed from then on, and
its own lr, sent with every commit (per-group schedulers work). A group
without elements makes no range; a single group sends none (the servers'
one weight_decay, as before). A resume refuses a checkpoint whose groups
differ (another weight_decay, other parameters), naming the group. Groups
with different betas or eps are refused (one beta1, beta2, eps per model).

Parameters may be float32, bfloat16 or float16, all of one dtype: the
servers keep fp32 master weights (initialized from the parameters' values),
take the gradients in the parameters' dtype and send the parameters back
rounded to it (round to nearest even), as torch.optim.AdamW on an fp32 master
copy would.

Gradient clipping (max_grad_norm) has torch.nn.utils.clip_grad_norm_'s and
the C engine's meaning: the coefficient min(1, max_norm / (norm + 1e-6)) of
the global L2 norm, applied by the servers as they read the gradients. A
step whose gradients are not all finite is skipped, as the C engine does:
the parameters and Adam's step count stay, the step number advances.

Loss scaling (loss_scale="dynamic" or a number): the C engine's, which is
DeepSpeed's DynamicLossScaler (LossScaler below); scale_loss(loss) before
backward, the servers scale the gradients back; its state is stored with
every checkpoint.

Checkpoints carry the manifest in the C engine's checkpoint metadata, so
zs-ctl export writes a safetensors file with the model's parameter names.

Does not (yet): parameters of mixed dtypes or on several devices
(refused), param groups with different betas or eps (refused). The servers
hold the master weights: change the parameters through the optimizer
(load_state_dict, a resume), not by writing them, or the next step
overwrites the change.

Data parallel (ZeRO-2 with the optimizer on the servers): with
torch.distributed initialized (gloo for CPU parameters, nccl for device
parameters), every rank builds a ShardOptimizer over the same model; rank 0
starts or resumes the servers and broadcasts the parameters. The flat space
is cut into W equal parts (the last padded); at each step the flat gradient
is reduce-scattered in fp32 (dist.reduce_scatter where the backend has it,
else one dist.reduce of each part to its owner: gloo in torch 1.13), the
global norm comes from an all-reduce of the parts' squared norms (the same
clipping and skip decisions on every rank), rank r pushes its part, rank 0
commits (the servers average: DDP's mean), rank r pulls its part of the new
parameters and the parts are all-gathered. The servers' state does not
depend on W: a run resumes with another world size.

Device (CUDA) parameters: the host's flat buffers stay on the CPU (the C
client's shared staging); the gradients are gathered into a flat buffer on
the device and copied to the host in one copy, the pulled parameters copied
back in one copy and into the parameters (not bound to a CPU buffer). With
nccl the reduce-scatter and all-gather run on the device buffers and only
the rank's own part crosses to the host. Never run on a GPU here (Debian's
torch is CPU-only): the tests run this path on the CPU (_copy_params=True)
and find it bitwise equal to the bound path.

Transport: with servers on this host (transport "auto", the default) the
gradient and parameter buffers live in the C client's shared-memory staging,
so pushes and pulls move no bytes through gRPC; elsewhere they go over gRPC.
CPU parameters become views of the flat parameter buffer (their .data; the
Parameter objects stay), so a pull updates them in place; close() gives them
memory of their own again.
"""
import json
import math
import struct
import warnings
import zlib

import torch

from . import _zeroshard

Error = _zeroshard.Error

# Stored with every checkpoint as its user_meta, in the C engine's layout so
# that zs-ctl export reads it (worker/engine/zs_engine_ckpt.c): "ZSE1", step,
# Adam t (u64), the loss scaler's 40 bytes (a static scale of 1 here), then
# the length (u32) and JSON of a "zeroshard-manifest/1" (tools/zs_ctl_manifest.c)
# whose "model" says ShardOptimizer wrote it. A manifest too large for the
# 60 KiB user_meta is stored as _MAGIC + zlib(JSON) instead (resumable, not
# exportable).
_ENGINE_MAGIC = 0x3145535A
_ENGINE_FIXED = 4 + 8 + 8 + 40
_USER_META_MAX = 60 << 10
_MAGIC = b"ZSPY1\n"
_FORMAT = "zeroshard.torch/1"


# torch dtype -> the C library's name for it
_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _buf(t):
    """A writable buffer over tensor t's memory (NumPy has no bfloat16: 16-bit
    tensors are viewed as int16, the bytes are the same)."""
    return (t if t.dtype == torch.float32 else t.view(torch.int16)).numpy()


class LossScaler:
    """fp16 loss scaling as the C engine's (worker/engine/zs_loss_scale.h),
    which is DeepSpeed's DynamicLossScaler: start at 2^initial_scale_power;
    an overflow skips the step and, once `hysteresis` overflows have used up
    the tolerance, halves the scale (not below min_loss_scale; an overflow
    at the minimum with no tolerance left raises, as DeepSpeed stops);
    after loss_scale_window clean steps since the last overflow the scale
    doubles. static (a number): that scale always; overflows still skip.
    save()/load(): the engine's 40-byte form, stored with every checkpoint."""

    def __init__(self, static=None, initial_scale_power=16, loss_scale_window=1000,
                 hysteresis=2, min_loss_scale=1.0, consecutive_hysteresis=False):
        self.dynamic = static is None
        self.scale = float(static) if static is not None else 2.0 ** initial_scale_power
        self.min_scale = float(min_loss_scale) if self.dynamic else self.scale
        self.window = int(loss_scale_window)
        self.hysteresis = self.cur_hysteresis = int(hysteresis)
        self.consecutive_hysteresis = bool(consecutive_hysteresis)
        self.last_overflow_iter = -1
        self.iter = 0

    def update(self, overflow):
        """1: skip this step, 0: apply it; ValueError at the minimum scale."""
        if not self.dynamic:
            self.iter += 1
            return 1 if overflow else 0
        if overflow:
            if self.hysteresis == 1 or self.cur_hysteresis == 1:
                if self.scale <= self.min_scale:
                    raise ValueError("ShardOptimizer: gradient overflow at the minimum loss scale "
                                     "%g; lower the learning rate or min_loss_scale" % self.scale)
                self.scale = max(self.scale / 2.0, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.hysteresis
            stable = (self.iter - self.last_overflow_iter) - 1
            if stable > 0 and stable % self.window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.hysteresis
                self.scale *= 2.0
        self.iter += 1
        return 1 if overflow else 0

    def save(self):
        w = (self.window & ((1 << 29) - 1)) | (1 << 29 if self.consecutive_hysteresis else 0) | \
            (1 << 30 if self.dynamic else 0) | (1 << 31)
        return struct.pack("<ddqqIHH", self.scale, self.min_scale, self.last_overflow_iter,
                           self.iter, w, self.hysteresis, self.cur_hysteresis)

    def load(self, b):
        (self.scale, self.min_scale, self.last_overflow_iter, self.iter, w, self.hysteresis,
         self.cur_hysteresis) = struct.unpack("<ddqqIHH", b)
        self.window = w & ((1 << 29) - 1)
        self.consecutive_hysteresis = bool(w & (1 << 29))
        self.dynamic = bool(w & (1 << 30))


# The 40 bytes of "no loss scaling" (scale 1, static) in a checkpoint.
_NO_SCALER = struct.pack("<ddqqIHH", 1.0, 1.0, -1, 0, 0, 0, 0)


def _is_named(params):
    return len(params) > 0 and isinstance(params[0], tuple)


def _as_f32(v):
    """v rounded to float32, as the servers hold it (for comparisons)."""
    return float(torch.tensor(float(v), dtype=torch.float32))


class ShardOptimizer(torch.optim.Optimizer):
    """AdamW on zeroshard's shard servers, as a torch.optim.Optimizer.

    params: ``model.parameters()``, ``model.named_parameters()`` or param
    groups (dicts whose "params" are tensors or (name, tensor) pairs; each
    group may have its own lr and weight_decay, as in torch: the no-decay
    group for biases and norms). servers: ["host:port", ...] (the order is
    the server index) or "host:port,host:port". model_name: the servers'
    name for the model. lr, betas, eps, weight_decay: torch.optim.AdamW's
    (the defaults of the groups). token: the servers' bearer token. resume:
    continue from the newest checkpoint complete on every server if they
    hold one of model_name (refusing a different model, or other groups'
    weight_decay), else start from the parameters' current values; False:
    always start from the current values, deleting the servers'
    checkpoints. timeout_ms: deadline of each call to the servers.
    max_grad_norm: clip the gradients' global L2 norm to it (None: no
    clipping). transport: "auto" (shared memory with the servers on this
    host that prove it, gRPC with the others), "shm" (shared memory with
    every server, else zeroshard.Error naming the one that cannot), "tcp"
    (gRPC only).

    Raises ValueError for what it does not support (see the module's doc),
    zeroshard.Error when a server call fails (the C library's message).
    """

    def __init__(self, params, servers, model_name, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=1e-2, token=None, resume=True, timeout_ms=120000,
                 max_grad_norm=None, transport="auto", loss_scale=None, loss_scale_args=None,
                 _copy_params=False):
        if not model_name:
            raise ValueError("ShardOptimizer: model_name is required")
        groups = list(params)
        if len(groups) == 0:
            raise ValueError("ShardOptimizer: got no parameters")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        # Names, then plain tensors for torch's Optimizer.
        names = []
        for g in groups:
            ps = list(g["params"]) if not isinstance(g["params"], torch.Tensor) else [g["params"]]
            if _is_named(ps):
                names += [n for n, _ in ps]
                g["params"] = [p for _, p in ps]
            else:
                names += ["param.%d" % (len(names) + i) for i in range(len(ps))]
                g["params"] = ps
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(groups, defaults)
        self._names = names
        self._params = [p for g in self.param_groups for p in g["params"]]
        if len(set(names)) != len(names):
            raise ValueError("ShardOptimizer: parameter names repeat")
        self._dtype = self._params[0].dtype if self._params else torch.float32
        self._dev = self._params[0].device if self._params else torch.device("cpu")
        for n, p in zip(names, self._params):
            if p.dtype not in _DTYPES:
                raise ValueError("ShardOptimizer: parameter '%s' is %s; float32, bfloat16 or "
                                 "float16 parameters only" % (n, p.dtype))
            if p.dtype != self._dtype:
                raise ValueError("ShardOptimizer: parameter '%s' is %s but '%s' is %s; all "
                                 "parameters must have one dtype (yet)"
                                 % (n, p.dtype, names[0], self._dtype))
            if p.device != self._dev:
                raise ValueError("ShardOptimizer: parameter '%s' is on %s but '%s' is on %s; all "
                                 "parameters must be on one device" % (n, p.device, names[0],
                                                                        self._dev))
        # CPU parameters are bound to the host's flat parameter buffer (their
        # .data are its views); device parameters (or _copy_params, which
        # runs that path on the CPU for the tests) keep their memory and are
        # copied: gradients device -> host, parameters host -> device.
        self._copy = bool(_copy_params) or self._dev.type != "cpu"
        self._manifest = self._make_manifest()
        self._P = self._manifest["num_params"]
        self._ngroups = len(self.param_groups)
        self._setup_groups()
        self._model_name = model_name
        self._servers = list(servers) if not isinstance(servers, str) else servers.split(",")
        dist = torch.distributed
        self._pg = None
        self._rank, self._world = 0, 1
        if dist.is_available() and dist.is_initialized():
            self._pg = dist.group.WORLD
            self._rank, self._world = dist.get_rank(), dist.get_world_size()
            backend = str(dist.get_backend())
            if backend == "nccl" and self._dev.type == "cpu":
                raise ValueError("ShardOptimizer: CPU parameters with the nccl backend; use "
                                 "gloo for CPU parameters")
            if backend != "nccl" and self._dev.type != "cpu":
                raise ValueError("ShardOptimizer: parameters on %s with the %s backend; device "
                                 "parameters need nccl" % (self._dev, backend))
        self._client = _zeroshard.Client(self._servers, token=token, timeout_ms=timeout_ms,
                                         transport=transport)
        self._zdt = _DTYPES[self._dtype]  # the wire dtype of parameters (W = 1: of gradients too)
        self._alloc(transport)
        self._step = 0
        self._t = 0  # Adam's step count: steps applied, not skipped
        self._max_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.scaler = None
        if loss_scale is not None:
            if loss_scale != "dynamic" and not (isinstance(loss_scale, (int, float))
                                                and loss_scale > 0):
                raise ValueError("ShardOptimizer: loss_scale must be None, 'dynamic' or a "
                                 "positive number")
            self.scaler = LossScaler(None if loss_scale == "dynamic" else loss_scale,
                                     **(loss_scale_args or {}))
        self.last_grad_norm = None  # the last step's global gradient norm (inf: skipped)
        self.last_skipped = False
        self._bound = False
        if self._world == 1:
            self._start(resume)
        else:
            self._start_dist(resume)
        if not self._copy:
            self._bind()

    def _alloc(self, transport):
        """The flat buffers. Host (where the C client reads and writes): the
        gradient pushed (self._grad: the parameters' dtype; fp32 in data
        parallel, where the pushed part is an fp32 sum) and the parameters
        pulled (self._flat), in the client's shared staging when the servers
        take it. Data parallel pads both to W equal parts of `chunk`
        elements (the collectives want equal sizes). The copy path adds
        the same two on the parameters' device (self._dgrad, self._dflat),
        where the gradients are gathered and, with nccl, reduce-scattered
        and all-gathered."""
        W = self._world
        self._chunk = -(-self._P // W)
        n = self._chunk * W
        gdt = self._dtype if W == 1 else torch.float32
        esz = torch.tensor([], dtype=self._dtype).element_size()
        gsz = torch.tensor([], dtype=gdt).element_size()
        self._gdt = gdt
        self._staging = None
        if transport != "tcp" and self._P > 0:
            try:
                self._staging = self._client.shm_staging(n * gsz + n * esz)
            except Error as e:
                if transport == "shm" or e.status != "ZS_ERR_UNAVAILABLE":
                    raise
        if self._staging is not None:  # gradients, then parameters, in shared memory
            self._grad = torch.frombuffer(self._staging, dtype=gdt, count=n)
            self._flat = torch.frombuffer(self._staging, dtype=self._dtype, count=n,
                                          offset=n * gsz)
            self._grad.zero_()
            self._flat.zero_()
        else:
            self._flat = torch.zeros(n, dtype=self._dtype)  # pull target
            self._grad = torch.zeros(n, dtype=gdt)  # push source
        if self._copy:
            self._dgrad = torch.zeros(n, dtype=self._dtype, device=self._dev)
            self._dflat = torch.zeros(n, dtype=self._dtype, device=self._dev)
            self._dg32 = None  # data parallel, 16-bit: the fp32 gradient on the device
        else:
            self._dgrad = self._dflat = self._dg32 = None
        # where the gradients are gathered, in the parameters' dtype
        if self._copy:
            self._gsrc = self._dgrad
        elif gdt == self._dtype:
            self._gsrc = self._grad
        else:
            self._gsrc = torch.zeros(n, dtype=self._dtype)

    # ---- layout and manifest ------------------------------------------------

    def _setup_groups(self):
        """The param groups as ranges of the flat space (protocol version 3):
        one range per group with elements, in order, with the group's
        weight_decay (fixed from now on) and its lr at every step. One such
        group: no ranges (the servers' one weight_decay, the step's lr).
        Groups with different betas or eps are refused."""
        self._gspan, off, i = [], 0, 0
        for gi, g in enumerate(self.param_groups):
            n = sum(p.numel() for p in g["params"])
            names = self._names[i:i + len(g["params"])]
            i += len(g["params"])
            if n > 0:
                self._gspan.append((gi, off, off + n, names))
            off += n
        live = [gi for gi, _, _, _ in self._gspan] or [0]
        self._live = live
        g0 = self.param_groups[live[0]]
        for gi in live:
            g = self.param_groups[gi]
            if tuple(float(b) for b in g["betas"]) != tuple(float(b) for b in g0["betas"]) or \
                    float(g["eps"]) != float(g0["eps"]):
                raise ValueError(
                    "ShardOptimizer: param group %d has betas=%s eps=%g but group %d has "
                    "betas=%s eps=%g; param groups with different betas or eps are not supported "
                    "(the servers hold one beta1, beta2 and eps per model; groups may differ in "
                    "lr and weight_decay)" % (gi, tuple(g["betas"]), g["eps"], live[0],
                                              tuple(g0["betas"]), g0["eps"]))
        if len(live) > 256:
            raise ValueError("ShardOptimizer: %d param groups with parameters; at most 256 (the "
                             "servers' learning rates per step)" % len(live))
        self._hp = dict(beta1=float(g0["betas"][0]), beta2=float(g0["betas"][1]),
                        eps=float(g0["eps"]), weight_decay=float(g0["weight_decay"]),
                        lr=float(g0["lr"]))
        self._wd = {gi: float(self.param_groups[gi]["weight_decay"]) for gi in live}
        # [(end, weight_decay, lr_index)]: lr_index k is the k-th group with elements
        self._ranges = None
        if len(self._gspan) > 1:
            self._ranges = [(e, _as_f32(self._wd[gi]), k)
                            for k, (gi, _, e, _) in enumerate(self._gspan)]

    def _group_desc(self, k):
        """'param group 1 (elements [a, b): 'x' ... 'y')' for the k-th range."""
        gi, b, e, names = self._gspan[k]
        who = "'%s'" % names[0] if len(names) == 1 else "'%s' ... '%s', %d parameters" % (
            names[0], names[-1], len(names))
        return "param group %d (elements [%d, %d): %s)" % (gi, b, e, who)

    def _check_fixed(self):
        """ValueError if a group's betas, eps or weight_decay changed since
        the start (only lr may change), or groups were added."""
        if len(self.param_groups) != self._ngroups:
            raise ValueError("ShardOptimizer: %d param groups, %d at the start; the layout is "
                             "fixed when the optimizer starts (add_param_group is not supported)"
                             % (len(self.param_groups), self._ngroups))
        for gi in self._live:
            g = self.param_groups[gi]
            if float(g["weight_decay"]) != self._wd[gi] or float(g["eps"]) != self._hp["eps"] \
                    or float(g["betas"][0]) != self._hp["beta1"] \
                    or float(g["betas"][1]) != self._hp["beta2"]:
                raise ValueError(
                    "ShardOptimizer: param group %d changed: betas=%s eps=%g weight_decay=%g, "
                    "at the start betas=(%g, %g) eps=%g weight_decay=%g; betas, eps and "
                    "weight_decay are fixed when the optimizer starts, only lr may change "
                    "between steps" % (gi, tuple(g["betas"]), g["eps"], g["weight_decay"],
                                       self._hp["beta1"], self._hp["beta2"], self._hp["eps"],
                                       self._wd[gi]))

    def _lrs(self):
        """This step's learning rates: one per group with elements."""
        return [float(self.param_groups[gi]["lr"]) for gi in self._live]

    def _check_groups(self, info, where):
        """ValueError unless checkpoint info's parameter groups (and
        hyperparameters) are the optimizer's, naming the first group that
        differs."""
        a, hp = info["adam"], self._hp
        for k in ("beta1", "beta2", "eps"):
            if _as_f32(hp[k]) != a[k]:
                raise ValueError("ShardOptimizer: %s has %s=%g, the optimizer asks %g (the "
                                 "servers keep one value per model)" % (where, k, a[k], hp[k]))
        stored = [tuple(r) for r in info.get("groups", [])]
        if self._ranges is None:
            if stored:
                raise ValueError(
                    "ShardOptimizer: %s has %d parameter groups (ranges ending at %s), the "
                    "optimizer has one param group with parameters; pass the run's param groups"
                    % (where, len(stored), ", ".join(str(r[0]) for r in stored)))
            if _as_f32(hp["weight_decay"]) != a["weight_decay"]:
                raise ValueError("ShardOptimizer: %s has weight_decay=%g, the optimizer asks %g "
                                 "(fixed when a run starts: resume=False to change it)"
                                 % (where, a["weight_decay"], hp["weight_decay"]))
            return
        if not stored:
            raise ValueError(
                "ShardOptimizer: %s has no parameter groups (one weight_decay=%g for the whole "
                "model: written with one param group, or by a zeroshard before protocol "
                "version 3), the optimizer has %d param groups with parameters; pass one group, "
                "or resume=False" % (where, a["weight_decay"], len(self._ranges)))
        for k, mine in enumerate(self._ranges):
            if k >= len(stored):
                raise ValueError("ShardOptimizer: %s has %d parameter groups, the optimizer has "
                                 "%d; %s is not in it" % (where, len(stored), len(self._ranges),
                                                          self._group_desc(k)))
            st = stored[k]
            if st[0] != mine[0]:
                raise ValueError("ShardOptimizer: %s: its parameter group %d ends at element %d, "
                                 "the optimizer's %s at %d (the groups hold other parameters)"
                                 % (where, k, st[0], self._group_desc(k), mine[0]))
            if st[1] != mine[1]:
                raise ValueError("ShardOptimizer: %s has weight_decay=%g for %s, the optimizer "
                                 "asks %g (fixed per group when a run starts: resume=False to "
                                 "change it)" % (where, st[1], self._group_desc(k),
                                                 self._wd[self._gspan[k][0]]))
            if st[2] != mine[2]:
                raise ValueError("ShardOptimizer: %s: %s has lr index %d there, %d here"
                                 % (where, self._group_desc(k), st[2], mine[2]))
        if len(stored) != len(self._ranges):
            raise ValueError("ShardOptimizer: %s has %d parameter groups, the optimizer has %d"
                             % (where, len(stored), len(self._ranges)))

    def _make_manifest(self):
        entries, off = [], 0
        for n, p in zip(self._names, self._params):
            entries.append({"name": n, "shape": list(p.shape), "dtype": str(p.dtype).replace(
                "torch.", ""), "offset": off})
            off += p.numel()
        return {"format": _FORMAT, "num_params": off, "params": entries}

    def _meta_bytes(self, step):
        ps = self._manifest["params"]
        man = {"format": "zeroshard-manifest/1",
               "model": {"format": _FORMAT, "dtype": self._manifest["params"][0]["dtype"],
                         "scalars": [e["name"] for e in ps if not e["shape"]]},
               "storage_dtype": "F32", "num_params": self._P,
               # zs-ctl export wants 1..8 dimensions: a scalar is exported as [1]
               "tensors": [[e["name"], e["shape"] or [1], e["offset"]] for e in ps]}
        js = json.dumps(man, separators=(",", ":")).encode()
        if _ENGINE_FIXED + 4 + len(js) <= _USER_META_MAX:
            return (struct.pack("<IQQ", _ENGINE_MAGIC, step, self._t) + self._scaler_bytes()
                    + struct.pack("<I", len(js)) + js)
        if not getattr(self, "_warned_meta", False):
            warnings.warn("ShardOptimizer: the manifest (%d bytes) does not fit a checkpoint's "
                          "60 KiB in zs-ctl export's form; stored compressed: the checkpoints "
                          "resume but zs-ctl export cannot read them" % len(js))
            self._warned_meta = True
        m = dict(self._manifest)
        m["step"] = step
        m["loss_scale"] = self._scaler_bytes().hex()
        return _MAGIC + zlib.compress(json.dumps(m, separators=(",", ":")).encode())

    def _scaler_bytes(self):
        return self.scaler.save() if self.scaler is not None else _NO_SCALER

    @staticmethod
    def _parse_meta(meta):
        """Our manifest ({"params": [{name, shape, dtype, offset}]}) from a
        checkpoint's user_meta, either form; ValueError if another program
        wrote it."""
        if meta.startswith(_MAGIC):
            m = json.loads(zlib.decompress(meta[len(_MAGIC):]).decode())
            if m.get("format") != _FORMAT:
                raise ValueError("checkpoint manifest format %r, expected %r"
                                 % (m.get("format"), _FORMAT))
            m["loss_scale_bytes"] = bytes.fromhex(m.get("loss_scale", _NO_SCALER.hex()))
            return m
        man = None
        if len(meta) >= _ENGINE_FIXED + 4 and struct.unpack_from("<I", meta)[0] == _ENGINE_MAGIC:
            n = struct.unpack_from("<I", meta, _ENGINE_FIXED)[0]
            if n == len(meta) - _ENGINE_FIXED - 4:
                man = json.loads(meta[_ENGINE_FIXED + 4:].decode())
        model = man.get("model") if isinstance(man, dict) else None
        if not isinstance(model, dict) or model.get("format") != _FORMAT:
            raise ValueError("this checkpoint was not written by zeroshard.torch.ShardOptimizer "
                             "(its manifest's model is %r)" % (model,))
        scalars = set(model.get("scalars", []))
        return {"format": _FORMAT, "num_params": man["num_params"],
                "loss_scale_bytes": meta[20:_ENGINE_FIXED],
                "params": [{"name": n, "shape": [] if n in scalars else list(shape),
                            "dtype": model["dtype"], "offset": off}
                           for n, shape, off in man["tensors"]]}

    def _check_manifest(self, theirs, where):
        """ValueError naming the first parameter whose name, shape, dtype or
        place differs between the model and `theirs` (a stored manifest)."""
        mine = self._manifest["params"]
        other = theirs["params"]
        for i in range(max(len(mine), len(other))):
            a = mine[i] if i < len(mine) else None
            b = other[i] if i < len(other) else None
            if a == b:
                continue
            if a is None:
                raise ValueError("%s holds parameter %d '%s' %s %s that the model lacks"
                                 % (where, i, b["name"], b["dtype"], b["shape"]))
            if b is None:
                raise ValueError("%s lacks the model's parameter %d '%s' %s %s"
                                 % (where, i, a["name"], a["dtype"], a["shape"]))
            raise ValueError("%s differs from the model at parameter %d: stored '%s' %s %s at "
                             "offset %d, model '%s' %s %s at offset %d"
                             % (where, i, b["name"], b["dtype"], b["shape"], b["offset"],
                                a["name"], a["dtype"], a["shape"], a["offset"]))

    # ---- flat buffers -------------------------------------------------------

    def _master(self):
        """The parameters as one fp32 flat tensor on the CPU (the servers'
        initial masters)."""
        m = torch.empty(self._P, dtype=torch.float32)
        with torch.no_grad():
            for e, p in zip(self._manifest["params"], self._params):
                m[e["offset"]:e["offset"] + p.numel()].copy_(p.reshape(-1))
        return m

    def _bind(self):
        """Make every parameter a view of its slice of the flat parameter
        buffer (p.data, the Parameter objects stay), so a pull writes the
        model's parameters in place: no copy per step. CPU parameters only."""
        with torch.no_grad():
            for e, p in zip(self._manifest["params"], self._params):
                v = self._flat[e["offset"]:e["offset"] + p.numel()]
                v.copy_(p.reshape(-1))
                p.data = v.view(p.shape)
        self._bound = True

    def _unbind(self):
        """The parameters back in memory of their own (before close)."""
        with torch.no_grad():
            for p in self._params:
                p.data = p.data.clone()
        self._bound = False

    def _params_from(self, src):
        """Copy the flat buffer src (host or device) into the parameters."""
        with torch.no_grad():
            for e, p in zip(self._manifest["params"], self._params):
                p.copy_(src[e["offset"]:e["offset"] + p.numel()].view_as(p))

    def _host_to_params(self):
        """After a pull of the whole range into the host buffer: into the
        parameters (nothing to do when they are its views; the copy path:
        one host -> device copy, then into the parameters on the device)."""
        if self._bound:
            return
        if self._copy:
            self._dflat[:self._P].copy_(self._flat[:self._P])
            self._params_from(self._dflat)
        else:
            self._params_from(self._flat)

    def _gather_grads(self):
        """The gradients into the flat gradient buffer (self._gsrc, on the
        parameters' device, in their dtype)."""
        with torch.no_grad():
            for e, p in zip(self._manifest["params"], self._params):
                dst = self._gsrc[e["offset"]:e["offset"] + p.numel()]
                if p.grad is None:
                    dst.zero_()  # no gradient: AdamW still decays and moves on m, v
                elif p.grad.is_sparse:
                    raise ValueError("ShardOptimizer: parameter '%s' has a sparse gradient"
                                     % e["name"])
                else:
                    dst.copy_(p.grad.reshape(-1))

    # ---- start and resume ---------------------------------------------------

    def _fresh(self):
        hp = self._hp
        self._client.init(self._model_name, self._master().numpy(), hp["lr"], hp["beta1"],
                          hp["beta2"], hp["eps"], hp["weight_decay"], 1, 1, 0, True,
                          groups=self._ranges)
        # A new run: no checkpoint of an earlier one may be restored into it.
        self._client.delete_all()
        self._step = 0
        self._t = 0

    def _start(self, resume):
        infos = self._client.hello()
        held = [i for i in infos if i["initialized"]]
        if not resume or not held:
            return self._fresh()
        others = sorted({i["model_name"] for i in held if i["model_name"] != self._model_name})
        if others:
            raise ValueError(
                "ShardOptimizer: the servers hold model %s, not '%s'; pass resume=False to "
                "replace it" % (", ".join("'%s'" % o for o in others), self._model_name))
        steps = self._client.checkpoints() if len(held) == len(infos) else []
        if not steps:
            return self._fresh()
        self._resume_from(steps[-1])

    def _resume_from(self, step):
        """Check checkpoint `step`'s manifest, hyperparameters and parameter
        groups against the optimizer's (before touching the servers' state),
        restore it everywhere and pull its parameters into the model."""
        info, meta = self._client.checkpoint_info(step)
        where = "checkpoint %d of model '%s' on the servers" % (step, self._model_name)
        stored = self._parse_meta(meta)
        self._check_manifest(stored, where)
        self._check_groups(info, where)
        self._client.restore(step)
        self._t = info["optimizer_step"]
        if self.scaler is not None and stored["loss_scale_bytes"] != _NO_SCALER:
            self.scaler.load(stored["loss_scale_bytes"])  # as the C engine resumes it
        self._client.pull(step, 0, _buf(self._flat[:self._P]), self._zdt)
        self._host_to_params()
        self._step = step

    def _start_dist(self, resume):
        """Data parallel: rank 0 starts or resumes the servers; every rank
        then takes rank 0's step and parameters (a broadcast), so all start
        from the same values whatever their own. Learns whether the backend
        has reduce_scatter (gloo in torch 1.13 has not)."""
        dist = torch.distributed
        dev = self._dev  # the collectives' device (gloo: the CPU; nccl: the parameters')
        err = None
        if self._rank == 0:
            try:
                self._start(resume)
            except Exception as e:  # every rank must hear of it
                err = e
        st = torch.tensor([0 if err else 1, self._step, self._t], dtype=torch.int64, device=dev)
        dist.broadcast(st, 0)
        if err is not None:
            raise err
        if int(st[0]) != 1:
            raise RuntimeError("ShardOptimizer: rank 0 could not start the servers (its "
                               "exception says why)")
        self._step, self._t = int(st[1]), int(st[2])
        flat = self._master().to(dev)  # rank 0's values to every rank, fp32 (exact for 16 bits)
        dist.broadcast(flat, 0)
        self._params_from(flat)
        if self._rank != 0:  # learn P (the client maps our part with it)
            self._client.hello(self._model_name, self._P)
        self._bcast_scaler()
        W = self._world
        out = torch.zeros(1, dtype=torch.float32, device=dev)
        try:
            dist.reduce_scatter(out, [torch.ones(1, dtype=torch.float32, device=dev)
                                      for _ in range(W)])
            self._rs = float(out[0]) == W
        except (RuntimeError, NotImplementedError, ValueError):
            self._rs = False  # one reduce per rank's part instead

    def _bcast_scaler(self):
        """Data parallel: rank 0's loss-scaler state (a resumed one) to all."""
        if self.scaler is not None:
            b = torch.tensor(list(self.scaler.save()), dtype=torch.uint8, device=self._dev)
            torch.distributed.broadcast(b, 0)
            self.scaler.load(bytes(b.cpu().tolist()))

    def _agree(self, ok):
        """Data parallel: rank 0's ok (1) or failure (0) to every rank."""
        t = torch.tensor([1 if ok else 0], dtype=torch.int64, device=self._dev)
        torch.distributed.broadcast(t, 0)
        return int(t[0]) == 1
    # ---- the optimizer ------------------------------------------------------

    @property
    def step_count(self):
        """The last step applied on the servers (0 before the first)."""
        return self._step

    @torch.no_grad()
    def step(self, closure=None):
        """Push the gradients, run AdamW on the servers with the groups'
        current lr (each group its own), pull the new parameters into the
        model. Returns the closure's loss (closure re-evaluated with grad
        enabled)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_fixed()
        lrs = self._lrs()
        s = self._step + 1
        self._gather_grads()
        if self._world > 1:
            return self._step_dist(s, lrs, loss)
        g = self._grad[:self._P]
        if self._gsrc is not self._grad:  # the copy path: one device -> host copy
            g.copy_(self._gsrc[:self._P])
        # The global norm in fp32 as clip_grad_norm_ (torch sums in fp32 blocks;
        # a double pass costs 30x more).
        skip, clip, gscale = self._decide(
            float(torch.linalg.vector_norm(g, dtype=torch.float32)), 1)
        if not skip:
            self._client.push(s, 0, _buf(g), self._zdt)
        self._commit(s, lrs, gscale, clip, skip)
        if not skip:
            self._client.pull(s, 0, _buf(self._flat[:self._P]), self._zdt)
            self._host_to_params()
        self._step = s
        self._t += 0 if skip else 1
        return loss

    def _commit(self, s, lrs, gscale, clip, skip):
        self._client.commit(s, lrs[0], grad_scale=gscale, clip_coef=clip, skip=skip,
                            param_dtype="none" if self._zdt == "fp32" else self._zdt,
                            lrs=lrs if self._ranges is not None else None)

    def _decide(self, raw_norm, W):
        """(skip, clip_coef, grad_scale) of a step from the global L2 norm of
        the summed, loss-scaled gradients, as the C engine decides them
        (zs__eng_optimize): grad_scale = 1 / (loss scale * W); the step is
        skipped when the norm is not finite (the loss scaler updates);
        clipping uses the unscaled norm."""
        scale = self.scaler.scale if self.scaler is not None else 1.0
        gscale = _as_f32(1.0 / (scale * W))  # the commit carries it as fp32
        norm = raw_norm * gscale
        overflow = not math.isfinite(norm)
        skip = overflow
        if self.scaler is not None:
            skip = self.scaler.update(overflow) == 1
        clip = 1.0
        if not skip and self._max_norm is not None and self._max_norm / (norm + 1e-6) < 1.0:
            clip = self._max_norm / (norm + 1e-6)
        self.last_grad_norm = math.inf if overflow else norm
        self.last_skipped = skip
        return skip, clip, gscale

    def scale_loss(self, loss):
        """loss times the loss scale (1 without loss_scale): backward() of
        it gives gradients the servers scale back (grad_scale)."""
        return loss * self.scaler.scale if self.scaler is not None else loss

    def _reduce_scatter(self, g):
        """Sum g's W parts over the ranks into part `rank` of g (the owner's):
        dist.reduce_scatter where the backend has it, else one dist.reduce
        of each part to its owner (the same sum; the other parts of g are
        left undefined)."""
        dist, W, r, c = torch.distributed, self._world, self._rank, self._chunk
        parts = [g[k * c:(k + 1) * c] for k in range(W)]
        if self._rs:
            out = torch.empty_like(parts[r])
            dist.reduce_scatter(out, parts)
            parts[r].copy_(out)
        else:
            for k in range(W):
                dist.reduce(parts[k], dst=k)

    def _all_gather(self, f):
        """Every rank's part of the flat parameter buffer f to every rank
        (as bytes: any dtype, bitwise)."""
        W, r, c = self._world, self._rank, self._chunk
        parts = [f[k * c:(k + 1) * c].view(torch.uint8) for k in range(W)]
        torch.distributed.all_gather(parts, parts[r].clone())

    def _step_dist(self, s, lrs, loss):
        """Data parallel (ZeRO-2 with the optimizer on the servers): the
        flat gradient is reduce-scattered in fp32 (rank r gets the sum of
        its 1/W part), the global norm comes from an all-reduce of the
        parts' squared norms (every rank decides clipping and skipping
        alike), rank r pushes its part, rank 0 commits once every part is
        staged (the servers average: grad_scale 1/W, as DDP does), rank r
        pulls its part of the new parameters and the parts are all-gathered.
        On the copy path the collectives run on the device buffers and only
        the own part crosses to the host and back."""
        dist = torch.distributed
        W, r, c, P = self._world, self._rank, self._chunk, self._P
        lo, hi = min(r * c, P), min((r + 1) * c, P)
        if self._copy:  # on the device: nccl (or gloo with the copy path on the CPU)
            if self._dtype == torch.float32:
                g = self._dgrad
            else:
                if self._dg32 is None:
                    self._dg32 = torch.empty(self._dgrad.numel(), dtype=torch.float32,
                                             device=self._dev)
                g = self._dg32.copy_(self._dgrad)
        else:
            g = self._grad  # host, fp32 (the shared staging when the servers take it)
            if self._gsrc is not g:
                g.copy_(self._gsrc)
        self._reduce_scatter(g)
        part = g[r * c:(r + 1) * c]
        sq = torch.zeros(W, dtype=torch.float64, device=g.device)
        sq[r] = torch.linalg.vector_norm(part, dtype=torch.float32).double() ** 2
        dist.all_reduce(sq)
        # the same sum in the same order on every rank: the same decisions
        skip, clip, gscale = self._decide(math.sqrt(sum(sq.cpu().tolist())), W)
        if not skip and hi > lo:
            if g is not self._grad:  # the own part only, device -> host
                self._grad[r * c:(r + 1) * c].copy_(part)
            self._client.push(s, lo, self._grad[lo:hi].numpy(), "fp32")
        dist.barrier()  # every part staged before the commit
        err = None
        if r == 0:
            try:
                self._commit(s, lrs, gscale, clip, skip)
            except Exception as e:
                err = e
        if not self._agree(err is None):
            if err is not None:
                raise err
            raise RuntimeError("ShardOptimizer: rank 0's commit of step %d failed (its "
                               "exception says why)" % s)
        if not skip:
            if hi > lo:
                self._client.pull(s, lo, _buf(self._flat[lo:hi]), self._zdt)
            f = self._flat
            if self._copy:  # the own part host -> device, gathered there
                f = self._dflat
                f[r * c:(r + 1) * c].copy_(self._flat[r * c:(r + 1) * c])
            self._all_gather(f)
            if not self._bound:
                self._params_from(f)
        self._step = s
        self._t += 0 if skip else 1
        return loss
    def checkpoint(self, keep=0):
        """Write the servers' state of the last step durably on every server,
        with the manifest; returns the step. Complete (resumable) only once
        every server has it: a failure leaves the previous one the newest.
        keep: newest checkpoints kept (0: each server's --keep). Data
        parallel: every rank calls it; rank 0 writes it."""
        if self._world == 1:
            self._client.checkpoint(self._step, keep, self._meta_bytes(self._step))
            return self._step
        err = None
        if self._rank == 0:
            try:
                self._client.checkpoint(self._step, keep, self._meta_bytes(self._step))
            except Exception as e:
                err = e
        if not self._agree(err is None):
            if err is not None:
                raise err
            raise RuntimeError("ShardOptimizer: rank 0's checkpoint of step %d failed (its "
                               "exception says why)" % self._step)
        return self._step

    def checkpoints(self):
        """Steps with a checkpoint complete on every server, ascending."""
        return self._client.checkpoints()

    def state_dict(self):
        """A small manifest, not the state (that stays on the servers): the
        model name, servers, step, parameter manifest and param groups' hyper-
        parameters. load_state_dict() of it restores checkpoint `step`."""
        groups = []
        i = 0
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(i, i + len(g["params"])))
            i += len(g["params"])
            groups.append(d)
        return {"state": {}, "param_groups": groups,
                "zeroshard": {"format": _FORMAT, "model_name": self._model_name,
                              "servers": list(self._servers), "step": self._step,
                              "manifest": self._manifest}}

    def load_state_dict(self, state_dict):
        """Take the groups' hyperparameters (lr...) from state_dict and restore
        the servers to its step (a checkpoint complete on every server; the
        step the optimizer is at already needs none). Refuses a manifest of
        another model, naming the first differing parameter, and groups
        whose betas, eps or weight_decay differ from the run's (fixed when
        it started)."""
        z = state_dict.get("zeroshard")
        if not z or z.get("format") != _FORMAT:
            raise ValueError("ShardOptimizer.load_state_dict: not a ShardOptimizer state_dict")
        if z["model_name"] != self._model_name:
            raise ValueError("ShardOptimizer.load_state_dict: state of model '%s', this "
                             "optimizer's is '%s'" % (z["model_name"], self._model_name))
        self._check_manifest(z["manifest"], "the state_dict")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("ShardOptimizer.load_state_dict: %d param groups, the optimizer "
                             "has %d" % (len(groups), len(self.param_groups)))
        for gi in self._live:
            t = groups[gi]
            if float(t["weight_decay"]) != self._wd[gi] or float(t["eps"]) != self._hp["eps"] \
                    or (float(t["betas"][0]), float(t["betas"][1])) != (self._hp["beta1"],
                                                                      self._hp["beta2"]):
                raise ValueError("ShardOptimizer.load_state_dict: param group %d has betas=%s "
                                 "eps=%g weight_decay=%g, this run's betas=(%g, %g) eps=%g "
                                 "weight_decay=%g (fixed when a run starts)"
                                 % (gi, tuple(t["betas"]), t["eps"], t["weight_decay"],
                                    self._hp["beta1"], self._hp["beta2"], self._hp["eps"],
                                    self._wd[gi]))
        for mine, theirs in zip(self.param_groups, groups):
            for k, v in theirs.items():
                if k != "params":
                    mine[k] = v
        if z["step"] == self._step:
            return
        if self._world == 1:
            return self._resume_from(z["step"])
        # Data parallel: rank 0 restores the servers, then every rank pulls.
        err = None
        if self._rank == 0:
            try:
                self._resume_from(z["step"])
            except Exception as e:
                err = e
        if not self._agree(err is None):
            if err is not None:
                raise err
            raise RuntimeError("ShardOptimizer.load_state_dict: rank 0 could not restore step "
                               "%d (its exception says why)" % z["step"])
        if self._rank != 0:
            self._client.pull(z["step"], 0, _buf(self._flat[:self._P]), self._zdt)
            self._host_to_params()
            self._step = z["step"]
        t = torch.tensor([self._t], dtype=torch.int64, device=self._dev)
        torch.distributed.broadcast(t, 0)
        self._t = int(t[0])
        self._bcast_scaler()

    def transports(self):
        """[(name, why)] per server: how its bulk data travels ("shm" or
        "tcp", and why)."""
        return [self._client.transport(i) for i in range(self._client.nservers)]

    def close(self):
        """Close the connections to the servers (their state stays). The
        optimizer cannot step afterwards."""
        if self._bound:
            self._unbind()
        # views of the staging: dropped first
        self._grad = self._flat = self._gsrc = self._dgrad = self._dflat = self._dg32 = None
        self._staging = None
        self._client.close()
