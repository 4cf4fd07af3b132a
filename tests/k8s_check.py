#!/usr/bin/python3
"""k8s_check.py - offline checks of the manifests in deploy/k8s.

1. Schema: every object (Service, StatefulSet, Job, ConfigMap) is checked
   against the Kubernetes API models of Debian's python3-kubernetes (API
   1.22): unknown field names, wrong value types, missing required fields.
   It is not an API server: defaulting, admission and cross-object rules
   are not checked.
2. zeroshard's own wiring: the StatefulSet's headless Service, stable names
   and ports, the RocksDB claim mounted where --data points, the readiness
   probe calling Hello on the listen port, SIGTERM reaching zs-server as PID
   1 with a grace period for a checkpoint, the Job's server list matching the
   StatefulSet's pods in ordinal order, and the ConfigMap keys it runs.
3. Writes what the functional part of tests/test_k8s.sh runs for real into
   OUT_DIR: train.sh and ds.json (from the ConfigMap), server.args (the
   StatefulSet container's args, one per line), probe.cmd (the readiness
   probe's command, one word per line) and job.env (the Job's env, NAME=VALUE).

Usage: k8s_check.py DEPLOY_K8S_DIR OUT_DIR     exit 0 ok, 1 problems (listed)
"""
import json
import os
import re
import sys

import yaml

try:
    import kubernetes.client as kc
except ImportError:
    print("SKIPPED: python3-kubernetes is not installed (deploy/install-deps.sh installs it)")
    sys.exit(77)

MODELS = {
    ("v1", "Service"): "V1Service",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("batch/v1", "Job"): "V1Job",
}
errors = []


def err(msg):
    errors.append(msg)


def check_type(value, typename, path):
    """Check VALUE against the model type name TYPENAME (openapi_types)."""
    if typename == "object":  # IntOrString and free-form fields
        return
    m = re.fullmatch(r"list\[(.*)\]", typename)
    if m:
        if not isinstance(value, list):
            err(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            check_type(v, m.group(1), f"{path}[{i}]")
        return
    m = re.fullmatch(r"dict\(([^,]*), (.*)\)", typename)
    if m:
        if not isinstance(value, dict):
            err(f"{path}: expected a map, got {type(value).__name__}")
            return
        for k, v in value.items():
            # resource quantities are strings in the models but the API
            # accepts YAML numbers for them (cpu: 2, nvidia.com/gpu: 8)
            if (m.group(2) == "str" and isinstance(v, (int, float))
                    and re.search(r"\.(limits|requests)$", path)):
                continue
            check_type(v, m.group(2), f"{path}.{k}")
        return
    prim = {"str": str, "int": int, "bool": bool, "float": (int, float), "datetime": str}
    if typename in prim:
        ok = isinstance(value, prim[typename]) and not (typename == "int" and isinstance(value, bool))
        if not ok:
            err(f"{path}: expected {typename}, got {type(value).__name__} {value!r}")
        return
    cls = getattr(kc, typename, None)
    if cls is None:
        err(f"{path}: unknown model type {typename}")
        return
    if not isinstance(value, dict):
        err(f"{path}: expected an object ({typename}), got {type(value).__name__}")
        return
    json_to_py = {j: p for p, j in cls.attribute_map.items()}
    for k, v in value.items():
        if k not in json_to_py:
            err(f"{path}: unknown field '{k}' for {typename}")
            continue
        check_type(v, cls.openapi_types[json_to_py[k]], f"{path}.{k}")


def check_schema(doc, where):
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in MODELS:
        err(f"{where}: unexpected object {key}")
        return
    check_type(doc, MODELS[key], f"{where}:{doc['kind']}")
    # required fields: the generated models refuse None for them
    try:
        kc.ApiClient()._ApiClient__deserialize(doc, MODELS[key])
    except (ValueError, TypeError) as e:
        err(f"{where}: {e}")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    src, out = sys.argv[1], sys.argv[2]
    files = ["service.yaml", "statefulset.yaml", "job-train.yaml", "configmap.yaml"]
    objs = {}
    for f in files:
        with open(os.path.join(src, f)) as fh:
            for doc in yaml.safe_load_all(fh):
                if doc is None:
                    continue
                check_schema(doc, f)
                objs[doc["kind"]] = doc
    for kind in ("Service", "StatefulSet", "Job", "ConfigMap"):
        if kind not in objs:
            err(f"no {kind} in {files}")
    if errors:
        return report()

    svc, sts, job, cm = objs["Service"], objs["StatefulSet"], objs["Job"], objs["ConfigMap"]
    name = sts["metadata"]["name"]
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]

    # headless Service governing the StatefulSet: stable DNS names
    if spec.get("serviceName") != svc["metadata"]["name"]:
        err("StatefulSet.serviceName is not the Service's name")
    if svc["spec"].get("clusterIP") != "None":
        err("the Service is not headless (clusterIP: None)")
    if not all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()):
        err("the Service's selector does not select the StatefulSet's pods")
    if spec["selector"]["matchLabels"] != {k: labels.get(k) for k in spec["selector"]["matchLabels"]}:
        err("StatefulSet.selector does not match its pod template")

    ctr = [c for c in pod["containers"] if c["name"] == "zs-server"]
    if len(ctr) != 1:
        err("StatefulSet: no container named zs-server")
        return report()
    c = ctr[0]
    cmd, args = c.get("command", []), c.get("args", [])
    if cmd != ["zs-server"]:
        err(f"zs-server must be the container's PID 1 (command {cmd}), or SIGTERM goes to a shell")

    def flag(v):
        return args[args.index(v) + 1] if v in args and args.index(v) + 1 < len(args) else None

    listen, data = flag("--listen"), flag("--data")
    if not listen or not data:
        err("zs-server args lack --listen or --data")
        return report()
    port = int(listen.rsplit(":", 1)[1])
    cports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    if port not in cports.values():
        err(f"--listen port {port} is not a containerPort")
    sport = svc["spec"]["ports"][0]
    tp = sport.get("targetPort", sport["port"])
    if (cports.get(tp) if isinstance(tp, str) else tp) != port:
        err("the Service's targetPort is not the server's port")
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    claims = [t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])]
    if not claims or mounts.get(claims[0]) != data:
        err(f"the volumeClaimTemplate is not mounted at --data {data}")
    probe = c.get("readinessProbe", {}).get("exec", {}).get("command", [])
    if probe[:1] != ["zs-ctl"] or "status" not in probe or f"127.0.0.1:{port}" not in probe:
        err(f"readiness probe is not zs-ctl --servers 127.0.0.1:{port} status: {probe}")
    if c.get("livenessProbe"):
        err("a liveness probe would restart servers in the middle of a step or checkpoint")
    if pod.get("terminationGracePeriodSeconds", 30) < 120:
        err("terminationGracePeriodSeconds < 120 s: too short for a checkpoint write")

    # the Job: servers in ordinal order, config from the ConfigMap
    jpod = job["spec"]["template"]["spec"]
    jc = jpod["containers"][0]
    env = {e["name"]: e.get("value", "") for e in jc.get("env", [])}
    want = ",".join(f"{name}-{i}.{svc['metadata']['name']}:{sport['port']}"
                    for i in range(spec["replicas"]))
    if env.get("ZS_SERVERS") != want:
        err(f"Job ZS_SERVERS is {env.get('ZS_SERVERS')!r}, the StatefulSet's pods are {want!r}")
    vols = {v["name"]: v for v in jpod.get("volumes", [])}
    jm = {m["name"]: m["mountPath"] for m in jc.get("volumeMounts", [])}
    cfgvol = [n for n, v in vols.items() if v.get("configMap", {}).get("name") == cm["metadata"]["name"]]
    if not cfgvol or cfgvol[0] not in jm:
        err("the Job does not mount the ConfigMap")
        return report()
    cfgdir = jm[cfgvol[0]]
    script = jc.get("command", [])[-1]
    if os.path.dirname(script) != cfgdir or os.path.basename(script) not in cm["data"]:
        err(f"the Job runs {script}, which is not a key of the mounted ConfigMap")
    if "ds.json" not in cm["data"]:
        err("the ConfigMap has no ds.json")
        return report()
    try:
        json.loads(cm["data"]["ds.json"])
    except ValueError as e:
        err(f"ds.json in the ConfigMap is not JSON: {e}")
    if pod.get("restartPolicy", "Always") != "Always" or jpod.get("restartPolicy") not in ("Never", "OnFailure"):
        err("restart policies: servers Always, the Job Never or OnFailure")
    if errors:
        return report()

    os.makedirs(out, exist_ok=True)
    for key in ("train.sh", "ds.json"):
        with open(os.path.join(out, key), "w") as fh:
            fh.write(cm["data"][key])
    with open(os.path.join(out, "server.args"), "w") as fh:
        fh.write("\n".join(args) + "\n")
    with open(os.path.join(out, "probe.cmd"), "w") as fh:
        fh.write("\n".join(probe) + "\n")
    with open(os.path.join(out, "job.env"), "w") as fh:
        fh.write("".join(f"{k}={v}\n" for k, v in env.items()))
    print(f"k8s_check: {len(files)} files, schema of the Kubernetes {kc.__name__} models "
          f"(python3-kubernetes) and zeroshard wiring: ok")
    return 0


def report():
    for e in errors:
        print("k8s_check:", e)
    return 1


if __name__ == "__main__":
    sys.exit(main())
