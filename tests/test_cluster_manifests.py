"""cluster.yaml against Ray's own cluster-config schema, and deploy/*.yaml (KubeRay RayJob,
RayCronJob, Kubernetes CronJob + RBAC) against schemas of the fields they use, written from
KubeRay's CRDs (ray-operator/config/crd/bases/ray.io_rayjobs.yaml, ray.io_raycronjobs.yaml) and
Kubernetes' batch/v1 CronJob. No cloud or cluster here: this checks shape and references, not
that a cluster comes up. The API server would silently drop a misspelt field of a CRD; these
schemas refuse unknown fields instead."""

import copy
import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


# ---- cluster.yaml (ray up) -------------------------------------------------------------------------

def _ray_schema() -> dict:
    import ray

    return json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())


def schema_errors(doc, schema: dict) -> list[str]:
    """Every violation of ``schema`` in ``doc``, as "path: message" (empty: the document conforms)."""
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in cls(schema).iter_errors(doc)]


@pytest.fixture(scope="module")
def cluster():
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def test_cluster_yaml_passes_rays_schema_and_validator(cluster):
    from ray.autoscaler._private.util import prepare_config, validate_config

    assert schema_errors(cluster, _ray_schema()) == []
    prepared = prepare_config(copy.deepcopy(cluster))  # what `ray up` runs, defaults filled in
    try:
        validate_config(prepared)
    except Exception as exc:  # ValueError or jsonschema's ValidationError, by Ray version
        pytest.fail(f"ray's validate_config refuses cluster.yaml: {type(exc).__name__}: {exc}")
    assert prepared["head_node_type"] == cluster["head_node_type"]
    assert set(prepared["available_node_types"]) == set(cluster["available_node_types"])


@pytest.mark.parametrize("breakage", [
    lambda c: c.__setitem__("setup_command", c.pop("setup_commands")),  # misspelt top-level key
    lambda c: c["available_node_types"]["gpu_worker"].__setitem__("min_worker", 0),
    lambda c: c["available_node_types"]["gpu_worker"].pop("node_config"),
])
def test_rays_schema_catches_a_broken_cluster_yaml(cluster, breakage):
    broken = copy.deepcopy(cluster)
    breakage(broken)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, _ray_schema())


def test_cluster_yaml_has_gpu_workers_and_installs_vllm(cluster):
    from packaging.requirements import Requirement

    types = cluster["available_node_types"]
    assert cluster["head_node_type"] in types
    gpu = [t for name, t in types.items() if t.get("resources", {}).get("GPU", 0) > 0]
    assert gpu and all(t["max_workers"] >= 1 for t in gpu)
    setup = " && ".join(cluster["setup_commands"])
    assert "pip install -q -e '.[vllm]'" in setup
    pin = re.search(r"torch==([\d.]+)", setup).group(1)
    torch_req = Requirement(re.search(r'"(torch[^"]*)"', (ROOT / "pyproject.toml").read_text()).group(1))
    assert pin in torch_req.specifier, f"torch {pin} outside pyproject's {torch_req.specifier}"
    (dest, src), = cluster["file_mounts"].items()
    assert src == "." and "cd ~/leakray" in setup and dest.endswith("/leakray")


# ---- KubeRay / Kubernetes manifests ----------------------------------------------------------------

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": r"^[0-9.]+([KMGTPE]i?|m)?$"}]}
_RESOURCES = {"type": "object", "additionalProperties": False, "properties": {
    "requests": {"type": "object", "additionalProperties": _QUANTITY},
    "limits": {"type": "object", "additionalProperties": _QUANTITY}}}
_CONTAINER = {
    "type": "object", "required": ["name", "image"], "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "image": {"type": "string", "minLength": 1},
        "command": {"type": "array", "items": {"type": "string"}},
        "args": {"type": "array", "items": {"type": "string"}},
        "ports": {"type": "array", "items": {"type": "object", "required": ["containerPort"],
                                             "additionalProperties": False,
                                             "properties": {"containerPort": {"type": "integer"},
                                                            "name": {"type": "string"}}}},
        "resources": _RESOURCES,
        "volumeMounts": {"type": "array", "items": {
            "type": "object", "required": ["name", "mountPath"], "additionalProperties": False,
            "properties": {"name": {"type": "string"}, "mountPath": {"type": "string"},
                           "readOnly": {"type": "boolean"}}}},
    }}
_VOLUME = {"type": "object", "required": ["name"], "minProperties": 2, "additionalProperties": False,
           "properties": {
               "name": {"type": "string"},
               "persistentVolumeClaim": {"type": "object", "required": ["claimName"],
                                         "properties": {"claimName": {"type": "string"}}},
               "configMap": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
               "emptyDir": {"type": "object", "properties": {"medium": {"type": "string"},
                                                              "sizeLimit": _QUANTITY}}}}
_POD_TEMPLATE = {
    "type": "object", "required": ["spec"], "additionalProperties": False,
    "properties": {"metadata": {"type": "object"}, "spec": {
        "type": "object", "required": ["containers"], "additionalProperties": False,
        "properties": {
            "containers": {"type": "array", "minItems": 1, "items": _CONTAINER},
            "volumes": {"type": "array", "items": _VOLUME},
            "tolerations": {"type": "array", "items": {"type": "object"}},
            "serviceAccountName": {"type": "string"},
            "restartPolicy": {"enum": ["Always", "OnFailure", "Never"]},
            "nodeSelector": _STR_MAP,
        }}}}
# ray.io/v1 RayJob .spec (the fields leakray uses; names and types as in the CRD)
RAYJOB_SPEC = {
    "type": "object", "required": ["entrypoint", "rayClusterSpec"], "additionalProperties": False,
    "properties": {
        "entrypoint": {"type": "string", "minLength": 1},
        "runtimeEnvYAML": {"type": "string"},
        "shutdownAfterJobFinishes": {"type": "boolean"},
        "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
        "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
        "backoffLimit": {"type": "integer", "minimum": 0},
        "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"]},
        "rayClusterSpec": {
            "type": "object", "required": ["headGroupSpec"], "additionalProperties": False,
            "properties": {
                "rayVersion": {"type": "string"},
                "headGroupSpec": {"type": "object", "required": ["template"], "additionalProperties": False,
                                  "properties": {"rayStartParams": _STR_MAP, "template": _POD_TEMPLATE,
                                                 "serviceType": {"type": "string"}}},
                "workerGroupSpecs": {"type": "array", "items": {
                    "type": "object", "required": ["groupName", "template"], "additionalProperties": False,
                    "properties": {"groupName": {"type": "string"}, "replicas": {"type": "integer", "minimum": 0},
                                   "minReplicas": {"type": "integer", "minimum": 0},
                                   "maxReplicas": {"type": "integer", "minimum": 0},
                                   "rayStartParams": _STR_MAP, "template": _POD_TEMPLATE}}},
            }},
    }}
_CRON = {"type": "string", "pattern": r"^(\S+\s+){4}\S+$"}
_META = {"type": "object", "additionalProperties": False,
         "properties": {"name": {"type": "string"}, "generateName": {"type": "string"},
                        "labels": _STR_MAP, "annotations": _STR_MAP}}


def _kind(kind: str, api: str, spec: dict | None = None, **extra) -> dict:
    props = {"apiVersion": {"const": api}, "kind": {"const": kind}, "metadata": _META, **extra}
    if spec is not None:
        props["spec"] = spec
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", *extra, *(["spec"] if spec else [])],
            "additionalProperties": False, "properties": props}


SCHEMAS = {
    "RayJob": _kind("RayJob", "ray.io/v1", RAYJOB_SPEC),
    # ray.io/v1 RayCronJob (KubeRay >= 1.6): .spec.schedule and .spec.jobTemplate, a RayJob spec
    "RayCronJob": _kind("RayCronJob", "ray.io/v1", {
        "type": "object", "required": ["schedule", "jobTemplate"], "additionalProperties": False,
        "properties": {"schedule": _CRON, "suspend": {"type": "boolean"}, "jobTemplate": RAYJOB_SPEC}}),
    "CronJob": _kind("CronJob", "batch/v1", {
        "type": "object", "required": ["schedule", "jobTemplate"], "additionalProperties": False,
        "properties": {
            "schedule": _CRON, "concurrencyPolicy": {"enum": ["Allow", "Forbid", "Replace"]},
            "successfulJobsHistoryLimit": {"type": "integer"}, "failedJobsHistoryLimit": {"type": "integer"},
            "jobTemplate": {"type": "object", "required": ["spec"], "additionalProperties": False, "properties": {
                "spec": {"type": "object", "required": ["template"], "additionalProperties": False,
                         "properties": {"backoffLimit": {"type": "integer"}, "template": _POD_TEMPLATE}}}},
        }}),
    "ConfigMap": _kind("ConfigMap", "v1", data={"type": "object", "additionalProperties": {"type": "string"}}),
    "ServiceAccount": _kind("ServiceAccount", "v1"),
    "PersistentVolumeClaim": _kind("PersistentVolumeClaim", "v1", {"type": "object", "required": ["accessModes"]}),
    "Role": _kind("Role", "rbac.authorization.k8s.io/v1", rules={"type": "array", "items": {
        "type": "object", "required": ["apiGroups", "resources", "verbs"], "additionalProperties": False,
        "properties": {k: {"type": "array", "items": {"type": "string"}}
                       for k in ("apiGroups", "resources", "verbs")}}}),
    "RoleBinding": _kind("RoleBinding", "rbac.authorization.k8s.io/v1", subjects={"type": "array"},
                         roleRef={"type": "object", "required": ["kind", "name"]}),
}


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


ALL = {name: _docs(name) for name in ("rayjob.yaml", "raycronjob.yaml", "cronjob.yaml", "storage.yaml")}


def _rayjob_specs() -> list[tuple[str, dict]]:
    """Every RayJob spec in deploy/, wherever it sits (RayJob, RayCronJob template, CronJob's ConfigMap)."""
    out = []
    for name, docs in ALL.items():
        for d in docs:
            if d["kind"] == "RayJob":
                out.append((name, d["spec"]))
            elif d["kind"] == "RayCronJob":
                out.append((name, d["spec"]["jobTemplate"]))
            elif d["kind"] == "ConfigMap" and "rayjob.yaml" in d["data"]:
                out.append((name, yaml.safe_load(d["data"]["rayjob.yaml"])["spec"]))
    return out


@pytest.mark.parametrize("name", sorted(ALL))
def test_manifests_match_their_schemas(name):
    assert ALL[name], f"deploy/{name} holds no documents"
    for doc in ALL[name]:
        assert doc.get("kind") in SCHEMAS, f"deploy/{name}: no schema for kind {doc.get('kind')!r}"
        assert schema_errors(doc, SCHEMAS[doc["kind"]]) == [], (name, doc["kind"])
        if doc["kind"] == "ConfigMap" and "rayjob.yaml" in doc["data"]:  # the RayJob the CronJob creates
            assert schema_errors(yaml.safe_load(doc["data"]["rayjob.yaml"]), SCHEMAS["RayJob"]) == [], name


@pytest.mark.parametrize("breakage", [
    lambda d: d["spec"].__setitem__("runtimeEnvYaml", d["spec"].pop("runtimeEnvYAML")),  # misspelt
    lambda d: d["spec"].pop("entrypoint"),
    lambda d: d["spec"]["rayClusterSpec"]["headGroupSpec"].__setitem__("rayStartParams", {"num-gpus": 0}),
    lambda d: d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].pop("groupName"),
    lambda d: d["spec"].__setitem__("ttlSecondsAfterFinished", "600"),
])
def test_schema_catches_a_broken_rayjob(breakage):
    (doc,) = copy.deepcopy(ALL["rayjob.yaml"])
    breakage(doc)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMAS["RayJob"])


def test_every_rayjob_runs_a_job_script_with_shared_outputs():
    specs = _rayjob_specs()
    assert {name for name, _ in specs} == {"rayjob.yaml", "raycronjob.yaml", "cronjob.yaml"}
    for name, spec in specs:
        argv = shlex.split(spec["entrypoint"])
        assert argv[0] == "python" and (ROOT / argv[1]).is_file() and argv[1].startswith("jobs/"), (name, argv)
        out = argv[argv.index("--output") + 1]
        assert out.startswith("/mnt/leakray/"), (name, out)  # absolute, on the shared volume
        env = yaml.safe_load(spec["runtimeEnvYAML"])
        assert set(env) <= {"working_dir", "env_vars", "pip", "py_modules", "excludes"}, env
        assert env["working_dir"].endswith(".zip") and env["env_vars"]["LEAKRAY_HOME"] == "/mnt/leakray"
        assert spec["shutdownAfterJobFinishes"] is True
        workers = spec["rayClusterSpec"]["workerGroupSpecs"]
        assert any(c["resources"]["limits"].get("nvidia.com/gpu") for w in workers
                   for c in w["template"]["spec"]["containers"])
        groups = [spec["rayClusterSpec"]["headGroupSpec"], *workers]
        for group in groups:  # every mount has its volume, and the shared volume is on every node
            pod = group["template"]["spec"]
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            mounts = {m["name"]: m["mountPath"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
            assert set(mounts) <= set(volumes), (name, mounts, volumes)
            assert mounts.get("leakray-data") == "/mnt/leakray"
            assert volumes["leakray-data"]["persistentVolumeClaim"]["claimName"] == "leakray-data"


def test_referenced_objects_exist():
    """ConfigMaps, the PVC and the ServiceAccount the manifests name are defined in deploy/."""
    defined = {(d["kind"], d["metadata"]["name"]) for docs in ALL.values() for d in docs}
    assert ("PersistentVolumeClaim", "leakray-data") in defined
    for name, spec in _rayjob_specs():
        pod = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        for v in pod.get("volumes", []):
            if "configMap" in v:
                assert ("ConfigMap", v["configMap"]["name"]) in defined, (name, v)
    (cron,) = [d for d in ALL["cronjob.yaml"] if d["kind"] == "CronJob"]
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert ("ServiceAccount", pod["serviceAccountName"]) in defined
    assert all(("ConfigMap", v["configMap"]["name"]) in defined for v in pod["volumes"])
    (binding,) = [d for d in ALL["cronjob.yaml"] if d["kind"] == "RoleBinding"]
    (role,) = [d for d in ALL["cronjob.yaml"] if d["kind"] == "Role"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
    assert any("ray.io" in r["apiGroups"] and "rayjobs" in r["resources"] and "create" in r["verbs"]
               for r in role["rules"])
    # `kubectl create -f` of the template: generateName gives every run a new RayJob
    (tmpl,) = [d for d in ALL["cronjob.yaml"] if d["kind"] == "ConfigMap" and "rayjob.yaml" in d["data"]]
    assert "generateName" in yaml.safe_load(tmpl["data"]["rayjob.yaml"])["metadata"]
    assert pod["containers"][0]["command"][:3] == ["kubectl", "create", "-f"]


def test_the_scheduled_sweep_file_is_a_valid_sweep(tmp_path):
    from leakray.protocols.sweep.spec import read_spec

    for name in ("raycronjob.yaml", "cronjob.yaml"):
        (cm,) = [d for d in ALL[name] if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "leakray-sweep"]
        path = tmp_path / name / "sweep.yaml"
        path.parent.mkdir()
        path.write_text(cm["data"]["sweep.yaml"])
        spec = read_spec(path)
        assert spec.models and spec.benchmarks and spec.output_dir.startswith("/mnt/leakray/")
