/*
 * zs_pyext.c - zeroshard._zeroshard: the CPython extension over the C shard
 * client (worker/client/zs_client.h). One type, Client, whose methods are the
 * client's calls one for one (Hello, Initialize with parameter groups, Push,
 * Commit with the groups' learning rates, Pull,
 * Checkpoint with user_meta, the checkpoint list, GetCheckpointMeta,
 * Restore, DeleteCheckpoints); module functions version() and
 * protocol_version(); one exception, zeroshard.Error, carrying the C
 * library's message and status.
 *
 * Bulk data (master weights, gradients, parameters) is any C-contiguous
 * object with the buffer protocol (a NumPy view of a CPU tensor): read or
 * written in place, with the GIL released for the whole call, so the
 * client's parallel streams to all servers run while Python threads go on.
 * A Client is used by one thread at a time (a lock refuses a second caller).
 *
 * Client.shm_staging(nbytes) hands out the client's shared-memory staging
 * (zs_client_shm_staging) as a Staging object with the buffer protocol:
 * pushes from it and pulls into it travel by shared memory to the servers
 * on this host. A Staging keeps its Client alive, and the Client refuses
 * close() while a Staging exists (the segment is unmapped with the client).
 *
 * Does not: flatten tensors, keep manifests or decide steps (the Python
 * side, zeroshard/torch.py, does); talk to the servers by any other path
 * than the C client.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zs_client.h"
#include "zs_rpc.h"
#include "zs_version.h"

static PyObject *zs_py_error; /* zeroshard.Error (the module's, set at init) */

/* Raise zeroshard.Error(message) with .status ("ZS_ERR_...") and .code (the
 * negative zs_status_t) from a failed call; returns NULL for `return`. */
static PyObject *raise_err(const zs_err_t *err, int rc)
{
    int code = err->code ? err->code : rc;
    const char *msg = err->msg[0] ? err->msg : zs_status_name(code);
    PyObject *args = Py_BuildValue("(s)", msg);
    PyObject *exc = args ? PyObject_Call(zs_py_error, args, NULL) : NULL;
    Py_XDECREF(args);
    if (!exc)
        return NULL;
    PyObject *status = PyUnicode_FromString(zs_status_name(code));
    PyObject *pcode = PyLong_FromLong(code);
    if (status && pcode && !PyObject_SetAttrString(exc, "status", status) &&
        !PyObject_SetAttrString(exc, "code", pcode))
        PyErr_SetObject(zs_py_error, exc);
    Py_XDECREF(status);
    Py_XDECREF(pcode);
    Py_DECREF(exc);
    return NULL;
}

/* "f32"/"fp32"/"float32", "bf16"/"bfloat16", "f16"/"fp16"/"float16", and
 * (allow_none) "none"/None: the zs_dtype_t, or -1 with ValueError set. */
static int parse_dtype(PyObject *o, int allow_none)
{
    if (o == NULL || o == Py_None)
        return allow_none ? ZS_DTYPE_NONE : ZS_DTYPE_F32;
    const char *s = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
    if (s && (!strcmp(s, "f32") || !strcmp(s, "fp32") || !strcmp(s, "float32")))
        return ZS_DTYPE_F32;
    if (s && (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")))
        return ZS_DTYPE_BF16;
    if (s && (!strcmp(s, "f16") || !strcmp(s, "fp16") || !strcmp(s, "float16")))
        return ZS_DTYPE_F16;
    if (s && allow_none && !strcmp(s, "none"))
        return ZS_DTYPE_NONE;
    PyErr_Format(PyExc_ValueError, "dtype must be 'fp32', 'bf16' or 'fp16'%s",
                 allow_none ? " or 'none'" : "");
    return -1;
}

typedef struct {
    PyObject_HEAD zs_client_t *c;
    pthread_mutex_t mu; /* one call at a time: the C client is not reentrant */
    int nservers;
    int stagings; /* live Staging objects over this client's segment */
} client_obj;

/* A view of the client's shared staging: [base, base + len), writable. */
typedef struct {
    PyObject_HEAD client_obj *client; /* strong reference: the segment lives with it */
    void *base;
    Py_ssize_t len;
} staging_obj;

static int staging_getbuffer(staging_obj *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->base, self->len, 0, flags);
}

static void staging_dealloc(staging_obj *self)
{
    if (self->client) {
        self->client->stagings--;
        Py_DECREF(self->client);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyBufferProcs staging_as_buffer = {(getbufferproc)staging_getbuffer, NULL};

static PyTypeObject staging_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zeroshard._zeroshard.Staging",
    .tp_basicsize = sizeof(staging_obj),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The client's shared-memory staging (a writable buffer); from Client.shm_staging",
    .tp_dealloc = (destructor)staging_dealloc,
    .tp_as_buffer = &staging_as_buffer,
};

/* The client, locked for one call, or NULL with an exception set (closed,
 * or another thread is inside a call). Unlocked by unlock(). */
static zs_client_t *lock(client_obj *self)
{
    if (!self->c) {
        PyErr_SetString(PyExc_ValueError, "zeroshard.Client: closed");
        return NULL;
    }
    if (pthread_mutex_trylock(&self->mu) != 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "zeroshard.Client: another thread is in a call on this client");
        return NULL;
    }
    return self->c;
}

static void unlock(client_obj *self)
{
    pthread_mutex_unlock(&self->mu);
}

/* Client(servers, token=None, timeout_ms=120000, retries=0, transport="auto",
 * tls_ca_pem=None): servers is "host:port,host:port" or a list of them (the
 * order is the server index). No I/O yet. */
static int client_init(client_obj *self, PyObject *args, PyObject *kw)
{
    static char *kws[] = {"servers",   "token",      "timeout_ms", "retries",
                          "transport", "tls_ca_pem", NULL};
    PyObject *servers;
    const char *token = NULL, *transport = "auto", *ca = NULL;
    int timeout_ms = 0, retries = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|ziisz", kws, &servers, &token, &timeout_ms,
                                     &retries, &transport, &ca))
        return -1;
    if (self->c) {
        PyErr_SetString(PyExc_ValueError, "zeroshard.Client: already initialized");
        return -1;
    }
    PyObject *joined = NULL;
    if (PyUnicode_Check(servers)) {
        joined = servers;
        Py_INCREF(joined);
    } else {
        PyObject *sep = PyUnicode_FromString(",");
        joined = sep ? PyUnicode_Join(sep, servers) : NULL;
        Py_XDECREF(sep);
        if (!joined)
            return -1;
    }
    int tr = zs_transport_parse(transport);
    if (tr < 0) {
        Py_DECREF(joined);
        PyErr_Format(PyExc_ValueError, "transport must be 'auto', 'shm' or 'tcp', not '%s'",
                     transport);
        return -1;
    }
    zs_client_opts_t o = {0};
    o.servers = PyUnicode_AsUTF8(joined);
    o.token = token;
    o.tls_ca_pem = ca;
    o.timeout_ms = timeout_ms;
    o.retries = retries;
    o.transport = tr;
    if (!o.servers) {
        Py_DECREF(joined);
        return -1;
    }
    zs_err_t err = {0};
    zs_client_t *c = NULL;
    int rc = zs_client_create(&o, &c, &err);
    Py_DECREF(joined);
    if (rc) {
        raise_err(&err, rc);
        return -1;
    }
    self->c = c;
    self->nservers = zs_client_nservers(c);
    return 0;
}

static PyObject *client_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    client_obj *self = (client_obj *)type->tp_alloc(type, 0);
    if (self)
        pthread_mutex_init(&self->mu, NULL);
    return (PyObject *)self;
}

static void client_dealloc(client_obj *self)
{
    zs_client_destroy(self->c);
    self->c = NULL;
    pthread_mutex_destroy(&self->mu);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* close(): the channels are closed; later calls raise ValueError. Refused
 * (RuntimeError) while a Staging over the client's segment exists. */
static PyObject *client_close(client_obj *self, PyObject *unused)
{
    if (self->stagings > 0) {
        PyErr_SetString(PyExc_RuntimeError, "zeroshard.Client.close: its shared staging is "
                                            "still in use (drop the Staging and tensors over it)");
        return NULL;
    }
    if (self->c && lock(self)) {
        zs_client_t *c = self->c;
        self->c = NULL;
        unlock(self);
        Py_BEGIN_ALLOW_THREADS zs_client_destroy(c);
        Py_END_ALLOW_THREADS
    }
    PyErr_Clear();
    Py_RETURN_NONE;
}

static PyObject *adam_dict(const zs_adam_hparams_t *a)
{
    return Py_BuildValue("{s:d,s:d,s:d,s:d,s:d,s:i,s:i}", "lr", (double)a->lr, "beta1",
                         (double)a->beta1, "beta2", (double)a->beta2, "eps", (double)a->eps,
                         "weight_decay", (double)a->weight_decay, "adam_w_mode", a->adam_w_mode,
                         "bias_correction", a->bias_correction);
}

/* [(end, weight_decay, lr_index), ...] of n ranges (new reference). */
static PyObject *groups_list(const zs_group_range_t *r, size_t n)
{
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *t = Py_BuildValue("(KdI)", (unsigned long long)r[i].end, (double)r[i].weight_decay,
                                    (unsigned)r[i].lr_index);
        if (!t) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, t);
    }
    return l;
}

/* A sequence of (end, weight_decay, lr_index) into a malloc'd array (*out,
 * *n; NULL and 0 for None or an empty sequence): 0, or -1 with an exception
 * set. The ranges' own rules (ascending ends, the last == P, ...) are the
 * C library's to check (zs_client_set_groups, Initialize). */
static int parse_groups(PyObject *o, zs_group_range_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (o == NULL || o == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(o, "groups must be a sequence of (end, weight_decay, "
                                       "lr_index)");
    if (!seq)
        return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    if (len > ZS_GROUPS_MAX_RANGES) {
        PyErr_Format(PyExc_ValueError, "%zd parameter group ranges, at most %d", len,
                     ZS_GROUPS_MAX_RANGES);
        Py_DECREF(seq);
        return -1;
    }
    zs_group_range_t *r = len ? calloc((size_t)len, sizeof *r) : NULL;
    if (len && !r) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        unsigned long long end;
        float wd;
        unsigned int li;
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(it) || !PyArg_ParseTuple(it, "KfI", &end, &wd, &li)) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "groups[%zd] must be a tuple (end, weight_decay, "
                                              "lr_index)", i);
            }
            free(r);
            Py_DECREF(seq);
            return -1;
        }
        r[i].end = end;
        r[i].weight_decay = wd;
        r[i].lr_index = li;
    }
    Py_DECREF(seq);
    *out = r;
    *n = (size_t)len;
    return 0;
}

/* hello(model="", num_params=0) -> [dict per server]: identity, range,
 * applied step, Adam t, complete checkpoints, hyperparameters, transport
 * facts, parameter groups ("groups": [(end, weight_decay, lr_index)], []
 * for none). With model/num_params set, refused if a server holds another. */
static PyObject *client_hello(client_obj *self, PyObject *args, PyObject *kw)
{
    static char *kws[] = {"model", "num_params", NULL};
    const char *model = "";
    unsigned long long P = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|sK", kws, &model, &P))
        return NULL;
    zs_client_t *c = lock(self);
    if (!c)
        return NULL;
    zs_server_info_t *info = calloc((size_t)self->nservers, sizeof *info);
    zs_err_t err = {0};
    int rc = ZS_ERR_NOMEM;
    if (info) {
        Py_BEGIN_ALLOW_THREADS rc = zs_client_hello(c, model, (uint64_t)P, info, &err);
        Py_END_ALLOW_THREADS
    }
    unlock(self);
    if (!info)
        return PyErr_NoMemory();
    if (rc) {
        free(info);
        return raise_err(&err, rc);
    }
    PyObject *list = PyList_New(self->nservers);
    for (int i = 0; list && i < self->nservers; i++) {
        const zs_server_info_t *s = &info[i];
        PyObject *ck = PyList_New((Py_ssize_t)s->ncheckpoints);
        for (size_t k = 0; ck && k < s->ncheckpoints; k++)
            PyList_SET_ITEM(ck, (Py_ssize_t)k, PyLong_FromUnsignedLongLong(s->checkpoints[k]));
        PyObject *d =
            ck ? Py_BuildValue("{s:O,s:s,s:K,s:I,s:I,s:K,s:K,s:K,s:K,s:N,s:N,s:s,s:O,s:O,s:N}",
                               "initialized", s->initialized ? Py_True : Py_False, "model_name",
                               s->model_name, "num_params", (unsigned long long)s->num_params,
                               "num_servers", s->num_servers, "server_index", s->server_index,
                               "range_begin", (unsigned long long)s->range_begin, "range_end",
                               (unsigned long long)s->range_end, "applied_step",
                               (unsigned long long)s->applied_step, "optimizer_step",
                               (unsigned long long)s->optimizer_step, "checkpoints", ck, "adam",
                               adam_dict(&s->adam), "shm_socket", s->shm_socket, "nvme",
                               s->nvme ? Py_True : Py_False, "store_degraded",
                               s->store_degraded ? Py_True : Py_False, "groups",
                               groups_list(s->groups, s->ngroups))
               : NULL;
        if (!d) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, d);
    }
    free(info);
    return list;
}

/* A C-contiguous buffer of whole elements of dtype dt: its element count, or
 * -1 with ValueError set (and the buffer released). */
static Py_ssize_t elements(Py_buffer *b, int dt, const char *what)
{
    size_t es = zs_dtype_size(dt);
    if (!es || b->len % (Py_ssize_t)es) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of %s elements", what,
                     b->len, zs_dtype_name(dt));
        PyBuffer_Release(b);
        return -1;
    }
    return b->len / (Py_ssize_t)es;
}

/* init(model, master, lr, beta1, beta2, eps, weight_decay, adam_w_mode=1,
 * bias_correction=1, start_step=0, overwrite=True, groups=None): Initialize
 * every server with its range of `master` (fp32 buffer of P = len/4
 * values). groups: the parameter groups (protocol version 3), a sequence of
 * (end, weight_decay, lr_index) ranges, consecutive from 0, the last ending
 * at P (zs_client_set_groups); None or []: none (one weight_decay, one lr). */
static PyObject *client_initialize(client_obj *self, PyObject *args, PyObject *kw)
{
    static char *kws[] = {"model",           "master",     "lr",           "beta1",
                          "beta2",           "eps",        "weight_decay", "adam_w_mode",
                          "bias_correction", "start_step", "overwrite",    "groups",
                          NULL};
    const char *model;
    Py_buffer b;
    PyObject *go = NULL;
    zs_adam_hparams_t hp = {0};
    hp.adam_w_mode = 1;
    hp.bias_correction = 1;
    unsigned long long start = 0;
    int overwrite = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sy*fffff|iiKpO", kws, &model, &b, &hp.lr,
                                     &hp.beta1, &hp.beta2, &hp.eps, &hp.weight_decay,
                                     &hp.adam_w_mode, &hp.bias_correction, &start, &overwrite,
                                     &go))
        return NULL;
    Py_ssize_t n = elements(&b, ZS_DTYPE_F32, "master");
    if (n < 0)
        return NULL;
    zs_group_range_t *groups;
    size_t ngroups;
    if (parse_groups(go, &groups, &ngroups)) {
        PyBuffer_Release(&b);
        return NULL;
    }
    zs_client_t *c = lock(self);
    if (!c) {
        free(groups);
        PyBuffer_Release(&b);
        return NULL;
    }
    zs_err_t err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = zs_client_set_groups(c, groups, ngroups, &err);
    if (!rc)
        rc = zs_client_init(c, model, (uint64_t)n, &hp, (const float *)b.buf, (uint64_t)start,
                            overwrite, &err);
    Py_END_ALLOW_THREADS unlock(self);
    free(groups);
    PyBuffer_Release(&b);
    if (rc)
        return raise_err(&err, rc);
    Py_RETURN_NONE;
}

/* push(step, begin, grad, dtype="fp32"): stage grad (a buffer of
 * elements [begin, begin + n) of dtype) for `step` on the servers owning
 * them. */
static PyObject *client_push(client_obj *self, PyObject *args, PyObject *kw)
{
    static char *kws[] = {"step", "begin", "grad", "dtype", NULL};
    unsigned long long step, begin;
    Py_buffer b;
    PyObject *dto = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KKy*|O", kws, &step, &begin, &b, &dto))
        return NULL;
    int dt = parse_dtype(dto, 0);
    Py_ssize_t n = dt < 0 ? -1 : elements(&b, dt, "grad");
    if (n < 0) {
        if (dt < 0)
            PyBuffer_Release(&b);
        return NULL;
    }
    zs_client_t *c = lock(self);
    if (!c) {
        PyBuffer_Release(&b);
        return NULL;
    }
    zs_err_t err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc =
        zs_client_push(c, step, begin, begin + (uint64_t)n, b.buf, (zs_dtype_t)dt, &err);
    Py_END_ALLOW_THREADS unlock(self);
    PyBuffer_Release(&b);
    if (rc)
        return raise_err(&err, rc);
    Py_RETURN_NONE;
}

/* commit(step, lr, grad_scale=1.0, clip_coef=1.0, skip=False,
 * param_dtype="none", lrs=None): apply `step` on every server with these
 * scalars (AdamW runs there). lr is the step's learning rate; lrs, for a
 * model initialized with parameter groups, the groups' learning rates
 * (lrs[k] for the ranges of lr_index k; None or []: lr everywhere). */
static PyObject *client_commit(client_obj *self, PyObject *args, PyObject *kw)
{
    static char *kws[] = {"step", "lr",          "grad_scale", "clip_coef",
                          "skip", "param_dtype", "lrs",        NULL};
    zs_step_scalars_t s = {0};
    unsigned long long step;
    s.grad_scale = 1.0f;
    s.clip_coef = 1.0f;
    PyObject *dto = NULL, *lo = NULL;
    float lrs[ZS_GROUPS_MAX_LRS];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Kf|ffpOO", kws, &step, &s.lr, &s.grad_scale,
                                     &s.clip_coef, &s.skip, &dto, &lo))
        return NULL;
    int dt = parse_dtype(dto, 1);
    if (dt < 0)
        return NULL;
    if (lo && lo != Py_None) {
        PyObject *seq = PySequence_Fast(lo, "lrs must be a sequence of floats");
        if (!seq)
            return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n > ZS_GROUPS_MAX_LRS) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "%zd group learning rates, at most %d", n,
                         ZS_GROUPS_MAX_LRS);
            return NULL;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, k));
            if (v == -1.0 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return NULL;
            }
            lrs[k] = (float)v;
        }
        Py_DECREF(seq);
        s.nlrs = (uint32_t)n;
        s.lrs = n ? lrs : NULL;
    }
    s.step = step;
    s.param_dtype = dt == ZS_DTYPE_F32 ? ZS_DTYPE_NONE : (zs_dtype_t)dt;
    zs_client_t *c = lock(self);
    if (!c)
        return NULL;
    zs_err_t err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = zs_client_commit(c, &s, &err);
    Py_END_ALLOW_THREADS unlock(self);
    if (rc)
        return raise_err(&err, rc);
    Py_RETURN_NONE;
}

/* pull(min_step, begin, dst, dtype="fp32") -> step: parameters [begin,
 * begin + n) as dtype into the writable buffer dst once every server has
 * reached min_step; returns the lowest step the servers reported. */
static PyObject *client_pull(client_obj *self, PyObject *args, PyObject *kw)
{
    static char *kws[] = {"min_step", "begin", "dst", "dtype", NULL};
    unsigned long long step, begin;
    Py_buffer b;
    PyObject *dto = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KKw*|O", kws, &step, &begin, &b, &dto))
        return NULL;
    int dt = parse_dtype(dto, 0);
    Py_ssize_t n = dt < 0 ? -1 : elements(&b, dt, "dst");
    if (n < 0) {
        if (dt < 0)
            PyBuffer_Release(&b);
        return NULL;
    }
    zs_client_t *c = lock(self);
    if (!c) {
        PyBuffer_Release(&b);
        return NULL;
    }
    zs_err_t err = {0};
    uint64_t got = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc =
        zs_client_pull(c, step, begin, begin + (uint64_t)n, b.buf, (zs_dtype_t)dt, &got, &err);
    Py_END_ALLOW_THREADS unlock(self);
    PyBuffer_Release(&b);
    if (rc)
        return raise_err(&err, rc);
    return PyLong_FromUnsignedLongLong(got);
}

/* checkpoint(step, keep=0, meta=b""): write `step` durably on every server
 * with the opaque meta (<= 60 KiB); returns when all have it. */
static PyObject *client_checkpoint(client_obj *self, PyObject *args, PyObject *kw)
{
    static char *kws[] = {"step", "keep", "meta", NULL};
    unsigned long long step;
    int keep = 0;
    Py_buffer b = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "K|iy*", kws, &step, &keep, &b))
        return NULL;
    zs_client_t *c = lock(self);
    if (!c) {
        PyBuffer_Release(&b);
        return NULL;
    }
    zs_err_t err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc =
        zs_client_checkpoint_meta(c, step, keep, b.buf, (size_t)b.len, &err);
    Py_END_ALLOW_THREADS unlock(self);
    PyBuffer_Release(&b);
    if (rc)
        return raise_err(&err, rc);
    Py_RETURN_NONE;
}

/* checkpoints() -> [step, ...]: complete on every server, ascending. */
static PyObject *client_checkpoints(client_obj *self, PyObject *unused)
{
    zs_client_t *c = lock(self);
    if (!c)
        return NULL;
    uint64_t steps[ZS_CLIENT_MAX_CKPTS];
    size_t n = 0;
    zs_err_t err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = zs_client_checkpoints(c, steps, ZS_CLIENT_MAX_CKPTS, &n, &err);
    Py_END_ALLOW_THREADS unlock(self);
    if (rc)
        return raise_err(&err, rc);
    if (n > ZS_CLIENT_MAX_CKPTS)
        n = ZS_CLIENT_MAX_CKPTS;
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++)
        PyList_SET_ITEM(list, (Py_ssize_t)i, PyLong_FromUnsignedLongLong(steps[i]));
    return list;
}

/* checkpoint_info(step) -> (dict, meta bytes): server 0's stored metadata of
 * complete checkpoint `step` (model, P, steps, hyperparameters, parameter
 * groups as in hello) and its
 * user_meta, read without a Restore (the servers' live state is not
 * touched); refused unless every server agrees. */
static PyObject *client_checkpoint_info(client_obj *self, PyObject *args)
{
    unsigned long long step;
    if (!PyArg_ParseTuple(args, "K", &step))
        return NULL;
    zs_client_t *c = lock(self);
    if (!c)
        return NULL;
    zs_ckpt_info_t *info = calloc((size_t)self->nservers, sizeof *info);
    char *buf = malloc(ZS_CLIENT_USER_META_MAX);
    size_t len = 0;
    zs_err_t err = {0};
    int rc = ZS_ERR_NOMEM;
    if (info && buf) {
        Py_BEGIN_ALLOW_THREADS rc =
            zs_client_checkpoint_info(c, step, info, buf, ZS_CLIENT_USER_META_MAX, &len, &err);
        Py_END_ALLOW_THREADS
    }
    unlock(self);
    PyObject *r = NULL;
    if (!info || !buf)
        PyErr_NoMemory();
    else if (rc)
        raise_err(&err, rc);
    else
        r = Py_BuildValue(
            "({s:s,s:K,s:I,s:K,s:K,s:N,s:K,s:N}y#)", "model_name", info[0].model_name,
            "num_params", (unsigned long long)info[0].num_params, "num_servers",
            info[0].num_servers, "applied_step", (unsigned long long)info[0].applied_step,
            "optimizer_step", (unsigned long long)info[0].optimizer_step, "adam",
            adam_dict(&info[0].adam), "created_unix_ms",
            (unsigned long long)info[0].created_unix_ms, "groups",
            groups_list(info[0].groups, info[0].ngroups), buf,
            (Py_ssize_t)(len < ZS_CLIENT_USER_META_MAX ? len : ZS_CLIENT_USER_META_MAX));
    free(info);
    free(buf);
    return r;
}

/* restore(step) -> meta bytes: load complete checkpoint `step` on every
 * server; returns its user_meta (refused if the servers' differ). */
static PyObject *client_restore(client_obj *self, PyObject *args)
{
    unsigned long long step;
    if (!PyArg_ParseTuple(args, "K", &step))
        return NULL;
    zs_client_t *c = lock(self);
    if (!c)
        return NULL;
    char *buf = malloc(ZS_CLIENT_USER_META_MAX);
    size_t len = 0;
    zs_err_t err = {0};
    int rc = ZS_ERR_NOMEM;
    if (buf) {
        Py_BEGIN_ALLOW_THREADS rc =
            zs_client_restore_meta(c, step, buf, ZS_CLIENT_USER_META_MAX, &len, &err);
        Py_END_ALLOW_THREADS
    }
    unlock(self);
    PyObject *r = NULL;
    if (!buf)
        PyErr_NoMemory();
    else if (rc)
        raise_err(&err, rc);
    else
        r = PyBytes_FromStringAndSize(
            buf, (Py_ssize_t)(len < ZS_CLIENT_USER_META_MAX ? len : ZS_CLIENT_USER_META_MAX));
    free(buf);
    return r;
}

/* delete_checkpoints(step=0, keep=0): delete `step` everywhere, or (step 0)
 * keep the newest `keep`; delete_all(): every checkpoint each server lists
 * (a fresh run). */
static PyObject *client_delete(client_obj *self, PyObject *args, PyObject *kw)
{
    static char *kws[] = {"step", "keep", NULL};
    unsigned long long step = 0;
    int keep = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|Ki", kws, &step, &keep))
        return NULL;
    zs_client_t *c = lock(self);
    if (!c)
        return NULL;
    zs_err_t err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = zs_client_delete(c, step, keep, &err);
    Py_END_ALLOW_THREADS unlock(self);
    if (rc)
        return raise_err(&err, rc);
    Py_RETURN_NONE;
}

static PyObject *client_delete_all(client_obj *self, PyObject *unused)
{
    zs_client_t *c = lock(self);
    if (!c)
        return NULL;
    zs_err_t err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = zs_client_delete_all(c, &err);
    Py_END_ALLOW_THREADS unlock(self);
    if (rc)
        return raise_err(&err, rc);
    Py_RETURN_NONE;
}

/* transport(i) -> (name, why): how server i's bulk data travels now. */
static PyObject *client_transport(client_obj *self, PyObject *args)
{
    int i;
    if (!PyArg_ParseTuple(args, "i", &i))
        return NULL;
    if (!self->c || i < 0 || i >= self->nservers) {
        PyErr_SetString(PyExc_IndexError, "zeroshard.Client.transport: no such server");
        return NULL;
    }
    const char *why = "";
    int t = zs_client_transport(self->c, i, &why);
    return Py_BuildValue("(ss)", zs_transport_name(t), why ? why : "");
}

/* shm_staging(nbytes) -> Staging: the client's shared-memory staging of at
 * least nbytes, handed to every server on this host that accepts it (see
 * zs_client_shm_staging). zeroshard.Error ZS_ERR_UNAVAILABLE when no server
 * takes it (transport "tcp", none offers a socket, none accepted): use
 * ordinary memory then. */
static PyObject *client_shm_staging(client_obj *self, PyObject *args)
{
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n", &n))
        return NULL;
    if (n <= 0) {
        PyErr_SetString(PyExc_ValueError, "shm_staging: nbytes must be positive");
        return NULL;
    }
    zs_client_t *c = lock(self);
    if (!c)
        return NULL;
    zs_err_t err = {0};
    void *base = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = zs_client_shm_staging(c, (size_t)n, &base, &err);
    Py_END_ALLOW_THREADS unlock(self);
    if (rc)
        return raise_err(&err, rc);
    staging_obj *st = PyObject_New(staging_obj, &staging_type);
    if (!st)
        return NULL;
    Py_INCREF(self);
    st->client = self;
    st->base = base;
    st->len = n;
    self->stagings++;
    return (PyObject *)st;
}

static PyObject *client_get_nservers(client_obj *self, void *unused)
{
    return PyLong_FromLong(self->nservers);
}

static PyObject *client_get_num_params(client_obj *self, void *unused)
{
    return PyLong_FromUnsignedLongLong(self->c ? zs_client_num_params(self->c) : 0);
}

static PyMethodDef client_methods[] = {
    {"close", (PyCFunction)client_close, METH_NOARGS, "Close the channels."},
    {"hello", (PyCFunction)(void (*)(void))client_hello, METH_VARARGS | METH_KEYWORDS,
     "hello(model='', num_params=0) -> [dict per server]"},
    {"init", (PyCFunction)(void (*)(void))client_initialize, METH_VARARGS | METH_KEYWORDS,
     "init(model, master, lr, beta1, beta2, eps, weight_decay, adam_w_mode=1, "
     "bias_correction=1, start_step=0, overwrite=True, groups=None)"},
    {"push", (PyCFunction)(void (*)(void))client_push, METH_VARARGS | METH_KEYWORDS,
     "push(step, begin, grad, dtype='fp32')"},
    {"commit", (PyCFunction)(void (*)(void))client_commit, METH_VARARGS | METH_KEYWORDS,
     "commit(step, lr, grad_scale=1.0, clip_coef=1.0, skip=False, param_dtype='none', "
     "lrs=None)"},
    {"pull", (PyCFunction)(void (*)(void))client_pull, METH_VARARGS | METH_KEYWORDS,
     "pull(min_step, begin, dst, dtype='fp32') -> step"},
    {"checkpoint", (PyCFunction)(void (*)(void))client_checkpoint, METH_VARARGS | METH_KEYWORDS,
     "checkpoint(step, keep=0, meta=b'')"},
    {"checkpoints", (PyCFunction)client_checkpoints, METH_NOARGS,
     "checkpoints() -> [step]: complete on every server, ascending"},
    {"checkpoint_info", (PyCFunction)client_checkpoint_info, METH_VARARGS,
     "checkpoint_info(step) -> (dict, meta): stored metadata, without a Restore"},
    {"restore", (PyCFunction)client_restore, METH_VARARGS, "restore(step) -> meta"},
    {"delete_checkpoints", (PyCFunction)(void (*)(void))client_delete, METH_VARARGS | METH_KEYWORDS,
     "delete_checkpoints(step=0, keep=0)"},
    {"delete_all", (PyCFunction)client_delete_all, METH_NOARGS,
     "delete_all(): every checkpoint on every server"},
    {"shm_staging", (PyCFunction)client_shm_staging, METH_VARARGS,
     "shm_staging(nbytes) -> Staging: shared-memory staging (ZS_ERR_UNAVAILABLE: none)"},
    {"transport", (PyCFunction)client_transport, METH_VARARGS, "transport(i) -> (name, why)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef client_getset[] = {
    {"nservers", (getter)client_get_nservers, NULL, "number of servers", NULL},
    {"num_params", (getter)client_get_num_params, NULL, "model size P the client maps with", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject client_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zeroshard._zeroshard.Client",
    .tp_basicsize = sizeof(client_obj),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Client(servers, token=None, timeout_ms=120000, retries=0, transport='auto', "
              "tls_ca_pem=None): the C shard client (zs_client.h)",
    .tp_new = client_new,
    .tp_init = (initproc)client_init,
    .tp_dealloc = (destructor)client_dealloc,
    .tp_methods = client_methods,
    .tp_getset = client_getset,
};

/* version() -> the C library's version (zs_version()). */
static PyObject *mod_version(PyObject *m, PyObject *unused)
{
    return PyUnicode_FromString(zs_version());
}

/* protocol_version() -> the newest wire protocol version this client speaks. */
static PyObject *mod_protocol_version(PyObject *m, PyObject *unused)
{
    return PyLong_FromLong(ZS_PROTOCOL_VERSION);
}

static PyMethodDef mod_methods[] = {
    {"version", mod_version, METH_NOARGS, "the C library's version"},
    {"protocol_version", mod_protocol_version, METH_NOARGS,
     "the newest wire protocol version this client speaks"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef mod_def = {
    PyModuleDef_HEAD_INIT, "_zeroshard", "zeroshard's C extension over the shard client", -1,
    mod_methods,
};

/* Refuses (ImportError) a C library of another version than the headers
 * this extension was compiled against: a libzeroshard rebuilt or replaced
 * on its own. $ZS_PY_FAKE_LIB_VERSION stands for the library's version in
 * the test that sees this refusal (tests/test_python.py). */
PyMODINIT_FUNC PyInit__zeroshard(void)
{
    const char *lib = zs_version(), *fake = getenv("ZS_PY_FAKE_LIB_VERSION");
    if (fake && *fake)
        lib = fake;
    if (strcmp(lib, ZS_VERSION) != 0) {
        PyErr_Format(PyExc_ImportError,
                     "zeroshard: the extension was compiled against libzeroshard %s but runs "
                     "with libzeroshard %s; rebuild the extension (cmake --build, or pip "
                     "install ./python) against the library it runs with",
                     ZS_VERSION, lib);
        return NULL;
    }
    if (PyType_Ready(&client_type) < 0 || PyType_Ready(&staging_type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&mod_def);
    if (!m)
        return NULL;
    zs_py_error = PyErr_NewExceptionWithDoc(
        "zeroshard.Error",
        "A call of the C shard client failed: the message is the library's; .status is its "
        "status name (e.g. 'ZS_ERR_UNAVAILABLE') and .code the negative zs_status_t.",
        PyExc_RuntimeError, NULL);
    Py_INCREF(&client_type);
    if (!zs_py_error || PyModule_AddObject(m, "Error", zs_py_error) < 0 ||
        PyModule_AddObject(m, "Client", (PyObject *)&client_type) < 0 ||
        PyModule_AddStringConstant(m, "COMPILED_VERSION", ZS_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(zs_py_error); /* the module's reference was stolen; keep ours */
    return m;
}
