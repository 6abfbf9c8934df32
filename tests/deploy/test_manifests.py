"""deploy/: the Kubernetes manifests, the image and the GPU check, all checked offline (no cluster, no
network, no Docker engine, no Ray).

- The manifests are checked as `kubectl kustomize deploy/kubernetes` renders them, document by
  document: the built-in kinds against the Kubernetes OpenAPI schemas (`kubernetes-validate`, strict:
  an unknown field is an error), the RayCluster's pod templates as PodTemplateSpecs and its spec
  against KubeRay's v1 fields. Where kubectl is absent, only the rendering test skips; the others
  read the files the kustomization lists, as they are.
- The environment the manifests give the containers is compared with what the service reads
  (`service.settings.Settings`), both ways.
- deploy/Dockerfile is read as text; deploy/gpu_check.sh is run with stand-ins for nvidia-smi and
  Python, so it never starts pytest, Ray or a GPU job here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import AliasChoices, ValidationError
from sqlalchemy.engine import make_url

from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
DOCKERFILE = DEPLOY / "Dockerfile"
GPU_CHECK = DEPLOY / "gpu_check.sh"
KUBECTL = shutil.which("kubectl")

# the oldest Kubernetes minor the README promises, and the newest kubernetes-validate knows
K8S_VERSIONS = ["1.30", kubernetes_validate.latest_version()]

# KubeRay's documented ray.io/v1 RayCluster fields (docs.ray.io, "KubeRay CRD API reference";
# ray-operator/apis/ray/v1/raycluster_types.go). A field outside these lists is a typo or a field of
# another KubeRay version: the CRD would drop it silently.
RAYCLUSTER_SPEC_FIELDS = {
    "rayVersion", "enableInTreeAutoscaling", "autoscalerOptions", "headGroupSpec", "workerGroupSpecs",
    "headServiceAnnotations", "suspend", "managedBy", "gcsFaultToleranceOptions",
}  # fmt: skip
HEAD_GROUP_FIELDS = {"rayStartParams", "template", "serviceType", "headService", "enableIngress"}
WORKER_GROUP_FIELDS = {
    "groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template", "scaleStrategy",
    "numOfHosts", "idleTimeoutSeconds", "suspend",
}  # fmt: skip
AUTOSCALER_FIELDS = {
    "resources", "image", "imagePullPolicy", "securityContext", "idleTimeoutSeconds", "upscalingMode",
    "version", "env", "envFrom", "volumeMounts",
}  # fmt: skip

# Variables the manifests may set although no Setting reads them: the tools' own.
TOOL_ENV = {
    # Ray: token authentication on every Ray process and client; no usage reports to Anyscale
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN",
    "RAY_USAGE_STATS_ENABLED",
    # S3 clients (pyarrow for Ray's s3:// storage, boto3 for MLflow's artifacts)
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "MLFLOW_S3_ENDPOINT_URL",
    # `mlflow server`'s --backend-store-uri and --artifacts-destination, read from the environment
    "MLFLOW_BACKEND_STORE_URI",
    "MLFLOW_ARTIFACTS_DESTINATION",
}
# Settings that are facts of each node that trains, which the API has no use for: a GPU's peak for MFU
# (unset in the manifests: worker/hardware.py's table knows the GPUs they ask for)
NODE_SETTINGS = {"BATCHSWEEP_PEAK_TFLOPS"}
# settings in the manifests ahead of the code that reads them (none: SWEEPS_STORAGE_URI is a Setting now)
PENDING_SETTINGS: set[str] = set()


# ---- loading --------------------------------------------------------------------------------------


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def listed_documents() -> list[dict[str, Any]]:
    """The resources the kustomization lists, as written (no namespace, labels or image rewrite)."""
    docs: list[dict[str, Any]] = []
    for name in kustomization()["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def kustomize() -> subprocess.CompletedProcess[str]:
    assert KUBECTL is not None
    return subprocess.run([KUBECTL, "kustomize", str(K8S)], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    """What runs: the rendered manifests (or, without kubectl, the listed files as they are), and the
    Secrets, which are applied on their own (secret.example.yaml shows them)."""
    if KUBECTL is None:
        rendered = listed_documents()
    else:
        out = kustomize()
        assert out.returncode == 0, out.stderr
        rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    return rendered + secret_example()


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_templates(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod template) of every Deployment and of the RayCluster's head and worker groups."""
    for d in docs:
        name = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "Deployment":
            yield name, d["spec"]["template"]
        elif d["kind"] == "RayCluster":
            yield f"{name} head", d["spec"]["headGroupSpec"]["template"]
            for group in d["spec"].get("workerGroupSpecs", []):
                yield f"{name} worker group {group['groupName']}", group["template"]


def containers(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for where, template in pod_templates(docs):
        for c in template["spec"].get("containers", []) + template["spec"].get("initContainers", []):
            yield f"{where} container {c['name']}", c


def raycluster(docs: list[dict[str, Any]]) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == "RayCluster"]
    assert len(found) == 1
    return found[0]


def env_of(container: dict[str, Any], docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Every variable a container gets: `env` entries (their value or valueFrom) over its envFrom
    ConfigMaps and Secrets (their keys, resolved in the rendered documents)."""
    out: dict[str, Any] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            out |= one(docs, "ConfigMap", source["configMapRef"]["name"]).get("data", {})
        else:
            out |= one(docs, "Secret", source["secretRef"]["name"]).get("stringData", {})
    for entry in container.get("env", []):
        out[entry["name"]] = entry.get("value", entry.get("valueFrom"))
    return out


def api_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment", "batchsweep-api")["spec"]["template"]["spec"]["containers"][0]


def settings_env_names() -> set[str]:
    """The environment variables `Settings` reads (with the sweep's and the worker's it extends):
    SWEEPS_<FIELD>, or the names its validation aliases give (RAY_ADDRESS, MLFLOW_TRACKING_URI,
    MLFLOW_UI_URL, BATCHSWEEP_CACHE, ...)."""
    prefix = Settings.model_config["env_prefix"]
    names = set()
    for field, info in Settings.model_fields.items():
        alias = info.validation_alias
        if alias is None:
            names.add(f"{prefix}{field}".upper())
        else:
            choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
            names |= {str(c).upper() for c in choices if c != field}
    return names


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def pinned(package: str) -> str:
    for dep in pyproject()["project"]["dependencies"]:
        m = re.fullmatch(rf"{re.escape(package)}(\[[^\]]*\])?==([\w.]+)", dep.strip())
        if m:
            return m.group(2)
    raise AssertionError(f"{package} is not pinned with == in pyproject.toml")


# ---- rendering ------------------------------------------------------------------------------------


def kinds_and_names(docs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((d["kind"], d["metadata"]["name"]) for d in docs)


def test_kustomization_renders() -> None:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: `kubectl kustomize deploy/kubernetes` cannot be run here")
    out = kustomize()
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = {d["kind"] for d in rendered}
    assert kinds == {
        "Namespace",
        "ConfigMap",
        "RayCluster",
        "Deployment",
        "Service",
        "NetworkPolicy",
        "Ingress",
    }
    # every object in the namespace the kustomization names, labelled, with the image it names
    namespace = kustomization()["namespace"]
    assert all(d["metadata"].get("namespace") == namespace for d in rendered if d["kind"] != "Namespace")
    assert one(rendered, "Namespace", namespace)
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "batchsweep" for d in rendered)
    image = kustomization()["images"][0]
    images = {c["image"] for _, c in containers(rendered)}
    assert images == {f"{image['newName']}:{image['newTag']}"}
    # the rendering is the listed files, transformed: nothing lost, nothing added
    assert kinds_and_names(rendered) == kinds_and_names(listed_documents())


def test_kustomization_lists_every_manifest_but_the_example_secrets() -> None:
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert set(kustomization()["resources"]) == files


def test_the_default_apply_holds_no_secret_and_no_placeholder() -> None:
    """`kubectl apply -k` once put the example's CHANGE-ME tokens and keys in place, and they passed."""
    text = (
        kustomize().stdout
        if KUBECTL is not None
        else "\n".join((K8S / name).read_text() for name in kustomization()["resources"])
    )
    assert "CHANGE-ME" not in text.upper().replace("CHANGE-ME-", "CHANGE-ME")
    assert all(d["kind"] != "Secret" for d in yaml.safe_load_all(text) if d)


def test_every_pod_is_denied_by_default_and_selected_by_a_policy_with_egress_rules(docs: list[dict[str, Any]]) -> None:
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    deny = one(docs, "NetworkPolicy", "batchsweep-default-deny")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}  # no rule: nothing allowed
    for where, template in pod_templates(docs):
        labels = template["metadata"].get("labels", {})
        if "RayCluster" in where:  # KubeRay adds its labels to the pods it makes from these templates
            kind = "head" if "head" in where else "worker"
            labels = {**labels, "ray.io/cluster": "batchsweep", "ray.io/node-type": kind}
        mine = [
            p["spec"]
            for p in policies
            if p["spec"]["podSelector"].get("matchLabels")
            and all(labels.get(k) == v for k, v in p["spec"]["podSelector"]["matchLabels"].items())
        ]
        assert mine, where
        for spec in mine:
            assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["egress"], where
            # out to anywhere but the cloud's instance metadata endpoint (the node's credentials)
            blocks = [t["ipBlock"] for rule in spec["egress"] for t in rule["to"]]
            assert {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]} in blocks, where
            assert all(b.get("except") for b in blocks), where


def test_the_api_is_reached_through_the_ingress_controller_only(docs: list[dict[str, Any]]) -> None:
    policy = one(docs, "NetworkPolicy", "batchsweep-api")
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "batchsweep-api"}
    rule, _metrics = policy["spec"]["ingress"]  # the second: the metrics port, from monitoring only
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    config = one(docs, "ConfigMap", "batchsweep-config")["data"]
    assert config["SWEEPS_TRUSTED_PROXIES"] and config["SWEEPS_PUBLIC_URL"].startswith("https://")
    host = one(docs, "Ingress", "batchsweep-api")["spec"]["rules"][0]["host"]
    assert config["SWEEPS_PUBLIC_URL"] == f"https://{host}"


# ---- schemas --------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_builtin_kinds_validate_against_kubernetes_schemas(docs: list[dict[str, Any]], version: str) -> None:
    errors, no_schema = [], []
    for d in docs:
        where = f"{d['kind']}/{d['metadata']['name']}"
        try:
            kubernetes_validate.validate(d, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{where}: {'.'.join(map(str, e.path))}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError:
            no_schema.append(where)
    assert errors == []
    # only the CRD kind has no built-in schema (a misspelt kind or apiVersion would land here too)
    assert no_schema == ["RayCluster/batchsweep"]


def test_strict_validation_catches_an_unknown_field(docs: list[dict[str, Any]]) -> None:
    """The check above can fail: a misspelt field in the API's Deployment is refused."""
    broken = yaml.safe_load(yaml.safe_dump(one(docs, "Deployment", "batchsweep-api")))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/healthz"}}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_raycluster_pod_templates_are_valid_pod_template_specs(docs: list[dict[str, Any]], version: str) -> None:
    ray = [(where, t) for where, t in pod_templates(docs) if where.startswith("RayCluster/")]
    assert len(ray) == 1 + len(raycluster(docs)["spec"]["workerGroupSpecs"])
    errors = []
    for where, template in ray:
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
        try:
            kubernetes_validate.validate(pod_template, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{where}: {'.'.join(map(str, e.path))}: {e.message}")
    assert errors == []


def test_raycluster_spec_uses_kuberay_v1_fields_only(docs: list[dict[str, Any]]) -> None:
    rc = raycluster(docs)
    assert rc["apiVersion"] == "ray.io/v1"
    spec = rc["spec"]
    assert set(spec) <= RAYCLUSTER_SPEC_FIELDS, set(spec) - RAYCLUSTER_SPEC_FIELDS
    assert set(spec["headGroupSpec"]) <= HEAD_GROUP_FIELDS, set(spec["headGroupSpec"]) - HEAD_GROUP_FIELDS
    assert set(spec["autoscalerOptions"]) <= AUTOSCALER_FIELDS, set(spec["autoscalerOptions"]) - AUTOSCALER_FIELDS
    for group in spec["workerGroupSpecs"]:
        assert set(group) <= WORKER_GROUP_FIELDS, set(group) - WORKER_GROUP_FIELDS
    # rayStartParams is a map of strings in the CRD: a bare YAML number or boolean is refused
    for params in [spec["headGroupSpec"]["rayStartParams"]] + [g["rayStartParams"] for g in spec["workerGroupSpecs"]]:
        assert all(isinstance(v, str) for v in params.values()), params


# ---- the Ray cluster ------------------------------------------------------------------------------


def quantity_bytes(q: str | int) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
    m = re.fullmatch(r"(\d+)([A-Za-z]*)", str(q))
    assert m, q
    return int(m.group(1)) * units.get(m.group(2), 1) if m.group(2) else int(m.group(1))


def shm_volume(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
    return volume


def test_raycluster_cpu_head_runs_no_trials_and_gpu_workers_autoscale(docs: list[dict[str, Any]]) -> None:
    spec = raycluster(docs)["spec"]
    assert spec["rayVersion"] == pinned("ray")
    assert spec["enableInTreeAutoscaling"] is True
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head["serviceType"] == "ClusterIP" and head.get("enableIngress", False) is False
    (head_container,) = head["template"]["spec"]["containers"]
    assert not any("nvidia.com/gpu" in head_container["resources"].get(k, {}) for k in ("requests", "limits"))
    assert {p["containerPort"] for p in head_container["ports"]} >= {6379, 8265, 10001}

    groups = spec["workerGroupSpecs"]
    assert groups
    for group in groups:
        (c,) = group["template"]["spec"]["containers"]
        gpus = c["resources"]["limits"]["nvidia.com/gpu"]
        assert int(gpus) >= 1 and c["resources"]["requests"]["nvidia.com/gpu"] == gpus
        assert 0 <= group["minReplicas"] <= group.get("replicas", 0) <= group["maxReplicas"]
        assert group["maxReplicas"] > group["minReplicas"]

    # /dev/shm: a memory emptyDir that holds the object store, within the container's memory limit
    for params, template in [(head["rayStartParams"], head["template"])] + [
        (g["rayStartParams"], g["template"]) for g in groups
    ]:
        volume = shm_volume(template)
        assert volume["emptyDir"]["medium"] == "Memory"
        size = quantity_bytes(volume["emptyDir"]["sizeLimit"])
        (c,) = template["spec"]["containers"]
        assert int(params["object-store-memory"]) <= size < quantity_bytes(c["resources"]["limits"]["memory"])


def test_only_the_autoscaler_holds_a_kubernetes_token(docs: list[dict[str, Any]]) -> None:
    """Sweep drivers run in the ray-head container: no service-account token there, nor in any other
    pod; the autoscaler (which scales the worker pods) gets the head pod's token in its container only."""
    token_path = "/var/run/secrets/kubernetes.io/serviceaccount"
    for name, template in pod_templates(docs):
        assert template["spec"].get("automountServiceAccountToken") is False, name
    rc = raycluster(docs)
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    for c in head["containers"]:
        assert all(not m["mountPath"].startswith(token_path) for m in c.get("volumeMounts", [])), c["name"]
    (mount,) = [m for m in rc["spec"]["autoscalerOptions"]["volumeMounts"] if m["mountPath"] == token_path]
    assert mount["readOnly"] is True
    (volume,) = [v for v in head["volumes"] if v["name"] == mount["name"]]
    sources = volume["projected"]["sources"]
    assert {next(iter(s)) for s in sources} == {"serviceAccountToken", "configMap", "downwardAPI"}
    assert next(s for s in sources if "serviceAccountToken" in s)["serviceAccountToken"]["path"] == "token"


def test_ray_token_auth_is_on_everywhere(docs: list[dict[str, Any]]) -> None:
    """RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from the Secret in the head, each worker group, the
    autoscaler and the API, under `env` (KubeRay copies a worker's `env`, not its `envFrom`, into the
    wait-gcs-ready init container it adds, which must authenticate too)."""
    spec = raycluster(docs)["spec"]
    holders = {"autoscaler": spec["autoscalerOptions"], "api": api_container(docs)}
    holders["head"] = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    for g in spec["workerGroupSpecs"]:
        holders[f"worker group {g['groupName']}"] = g["template"]["spec"]["containers"][0]
    for where, holder in holders.items():
        env = {e["name"]: e for e in holder.get("env", [])}
        assert env.get("RAY_AUTH_MODE", {}).get("value") == "token", where
        ref = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref["key"] in one(docs, "Secret", ref["name"])["stringData"], where


def test_api_reaches_the_head_service_kuberay_creates(docs: list[dict[str, Any]]) -> None:
    rc = raycluster(docs)
    address = env_of(api_container(docs), docs)["RAY_ADDRESS"]
    m = re.fullmatch(r"ray://([\w.-]+):(\d+)", address)
    assert m, f"RAY_ADDRESS={address!r}: the API is no Ray node, so it connects as a Ray Client (ray://)"
    # KubeRay names the head's Service <RayCluster name>-head-svc
    assert m.group(1) == f"{rc['metadata']['name']}-head-svc"
    head_ports = {
        p["name"]: p["containerPort"] for p in rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert int(m.group(2)) == head_ports["client"]


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, selector  # the policies here use matchLabels only
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_network_policy_admits_only_the_api_and_the_cluster_to_the_head(docs: list[dict[str, Any]]) -> None:
    rc = raycluster(docs)
    # the labels KubeRay gives the head and the worker pods, and those of the API's pods
    head_labels = {"ray.io/cluster": rc["metadata"]["name"], "ray.io/node-type": "head"}
    worker_labels = {"ray.io/cluster": rc["metadata"]["name"], "ray.io/node-type": "worker"}
    api_labels = one(docs, "Deployment", "batchsweep-api")["spec"]["template"]["metadata"]["labels"]
    client_port = int(env_of(api_container(docs), docs)["RAY_ADDRESS"].rsplit(":", 1)[1])

    policies = [
        p
        for p in docs
        if p["kind"] == "NetworkPolicy"
        and p["spec"]["podSelector"]  # the default deny selects every pod and admits nothing
        and matches(p["spec"]["podSelector"], head_labels)
    ]
    assert len(policies) == 1
    policy = policies[0]["spec"]
    assert "Ingress" in policy["policyTypes"]
    admitted = []
    for rule in policy["ingress"]:
        for peer in rule["from"]:
            assert set(peer) == {"podSelector"}, f"only pods of this namespace may be admitted, not {peer}"
            if matches(peer["podSelector"], worker_labels) and matches(peer["podSelector"], head_labels):
                admitted.append("cluster")
            elif matches(peer["podSelector"], api_labels):
                assert [p["port"] for p in rule["ports"]] == [client_port], "the API needs the Ray Client port only"
                admitted.append("api")
            else:
                raise AssertionError(f"unexpected peer {peer}")
    assert sorted(admitted) == ["api", "cluster"]


# ---- the API and MLflow ---------------------------------------------------------------------------


def test_api_deployment_serves_with_probes_and_a_service(docs: list[dict[str, Any]]) -> None:
    deployment = one(docs, "Deployment", "batchsweep-api")
    c = api_container(docs)
    assert c["command"] == ["sweeps", "serve", "--host", "0.0.0.0", "--port", "8000"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8000, "metrics": 9100}  # metrics: test_metrics_are_scraped_from_inside_the_cluster_only
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/healthz"
        assert ports.get(c[probe]["httpGet"]["port"], c[probe]["httpGet"]["port"]) == 8000
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind])
    service = one(docs, "Service", "batchsweep-api")
    assert matches({"matchLabels": service["spec"]["selector"]}, deployment["spec"]["template"]["metadata"]["labels"])
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http", "metrics"]
    ingress = one(docs, "Ingress", "batchsweep-api")
    (rule,) = ingress["spec"]["rules"]
    assert rule["http"]["paths"][0]["backend"]["service"]["name"] == "batchsweep-api"
    assert ingress["spec"]["tls"][0]["hosts"] == [rule["host"]] and ingress["spec"]["tls"][0]["secretName"]


def test_mlflow_server_uses_the_external_stores(docs: list[dict[str, Any]]) -> None:
    deployment = one(docs, "Deployment", "batchsweep-mlflow")
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    cmd = c["command"]
    assert cmd[:2] == ["mlflow", "server"] and "--serve-artifacts" in cmd
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and cmd[cmd.index("--port") + 1] == "5000"
    env = env_of(c, docs)
    # `mlflow server` reads --backend-store-uri and --artifacts-destination from these variables
    assert make_url(env["MLFLOW_BACKEND_STORE_URI"]).drivername == "postgresql+psycopg"
    assert env["MLFLOW_ARTIFACTS_DESTINATION"].startswith("s3://")
    # the clients' tracking URI is this server's Service, and MLflow accepts that Host header
    service = one(docs, "Service", "batchsweep-mlflow")
    tracking = env_of(api_container(docs), docs)["MLFLOW_TRACKING_URI"]
    assert tracking == f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    allowed = cmd[cmd.index("--allowed-hosts") + 1].split(",")
    assert f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}" in allowed


def test_every_pod_runs_unprivileged(docs: list[dict[str, Any]]) -> None:
    """What the namespace's Pod Security "restricted" profile demands, checked before a cluster does."""
    namespace = one(docs, "Namespace", kustomization()["namespace"])
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    templates = list(pod_templates(docs))
    assert len(templates) == 4  # API, MLflow, Ray head, GPU workers
    for where, template in templates:
        pod = template["spec"]["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0, where
        assert pod["seccompProfile"]["type"] == "RuntimeDefault", where
    sidecars = [("autoscaler", raycluster(docs)["spec"]["autoscalerOptions"])]
    for where, c in list(containers(docs)) + sidecars:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, where
        assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], where
        assert sc.get("privileged", False) is False and sc.get("runAsUser", 1000) != 0, where


def test_no_container_can_change_its_image(docs: list[dict[str, Any]]) -> None:
    """A read-only root filesystem everywhere (a process that is taken over cannot plant code in the image
    for the next one), and a volume at every path the processes write: /tmp (Ray's sessions and logs) and
    HOME (the caches of torch, Triton and Hugging Face) in each container, as the Dockerfile sets HOME."""
    home = re.search(r"^ENV HOME=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert home is not None
    rc = raycluster(docs)["spec"]
    head_volumes = {v["name"] for v in rc["headGroupSpec"]["template"]["spec"]["volumes"]}
    sidecars = [("autoscaler", rc["autoscalerOptions"], head_volumes)]
    own = [
        (where, c, {v["name"] for v in t["spec"].get("volumes", [])})
        for where, t in pod_templates(docs)
        for c in t["spec"]["containers"]
    ]
    for where, c, volumes in own + sidecars:
        assert c["securityContext"].get("readOnlyRootFilesystem") is True, where
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        assert "/tmp" in mounts, where
        assert set(mounts.values()) <= volumes, where  # every mount names a volume of its pod
        if where != "autoscaler":
            assert home.group(1) in mounts, where


# ---- environment and Secrets ----------------------------------------------------------------------


def test_manifests_set_exactly_the_settings_the_service_reads(docs: list[dict[str, Any]]) -> None:
    settings = settings_env_names()
    assert {"RAY_ADDRESS", "MLFLOW_TRACKING_URI", "MLFLOW_UI_URL", "SWEEPS_DATA_DIR"} <= settings
    everywhere = set()
    for _, c in containers(docs):
        everywhere |= set(env_of(c, docs))
    everywhere |= set(env_of(raycluster(docs)["spec"]["autoscalerOptions"], docs))
    # every Setting reaches the API, where the service reads it, but the nodes' own facts
    assert settings - NODE_SETTINGS - set(env_of(api_container(docs), docs)) == set()
    assert NODE_SETTINGS <= settings
    # nothing else is set but the tools' own variables and the pending Setting
    assert everywhere - settings - TOOL_ENV - PENDING_SETTINGS == set()
    assert PENDING_SETTINGS - settings <= everywhere
    # the project's own variables are all Settings: none hides among the tools' names
    assert not {name for name in TOOL_ENV if name.startswith(("SWEEPS_", "BATCHSWEEP_"))}


def secret_example() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / "secret.example.yaml").read_text()) if d]


def test_secret_example_documents_every_key() -> None:
    lines = (K8S / "secret.example.yaml").read_text().splitlines()
    keys_seen, undocumented, in_data = [], [], False
    for i, line in enumerate(lines):
        if re.match(r"^\S", line):
            in_data = line.startswith("stringData:")
        elif in_data and (m := re.match(r"^  ([A-Z][A-Z0-9_]*):", line)):
            keys_seen.append(m.group(1))
            if not lines[i - 1].strip().startswith("#"):
                undocumented.append(m.group(1))
    expected = [k for d in secret_example() for k in d["stringData"]]
    assert keys_seen == expected and len(expected) > 10
    assert undocumented == []
    assert all(d["kind"] == "Secret" and d["type"] == "Opaque" and "data" not in d for d in secret_example())


def test_secret_example_holds_placeholders_not_secrets() -> None:
    for secret in secret_example():
        for key, value in secret["stringData"].items():
            url = make_url(value) if value.startswith("postgresql") else None
            if url is not None:
                assert url.drivername == "postgresql+psycopg", f"{key}: psycopg 3 is the driver in the image"
                assert url.password == "CHANGE-ME", key
            elif re.search(r"TOKEN|SECRET|PASSWORD|ACCESS_KEY", key):
                assert "CHANGE-ME" in value, key


def test_settings_refuse_the_example_placeholders_and_accept_filled_in_values(
    docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API's environment, as the manifests give it, through the service's own Settings model: as the
    example has it, refused (placeholder tokens); filled in, accepted."""
    for name in list(os.environ):
        if name.startswith("SWEEPS_") or name in settings_env_names():
            monkeypatch.delenv(name)
    env = {k: v for k, v in env_of(api_container(docs), docs).items() if isinstance(v, str)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match="placeholder"):
        Settings()
    monkeypatch.setenv("SWEEPS_TOKENS", "alice=0123456789abcdef0123,bob=fedcba9876543210fedc")
    with pytest.raises(ValidationError, match="SWEEPS_SESSION_SECRET"):  # the next placeholder
        Settings()
    monkeypatch.setenv("SWEEPS_SESSION_SECRET", "0123456789abcdef" * 4)
    settings = Settings()
    assert settings.host == "0.0.0.0" and settings.port == 8000
    assert settings.data_dir == Path("/var/lib/batchsweep")
    assert settings.ray_address == "ray://batchsweep-head-svc:10001"
    assert sorted(settings.tokens) == ["alice", "bob"]
    assert make_url(settings.database).drivername == "postgresql+psycopg"
    assert make_url(settings.optuna_url).drivername == "postgresql+psycopg"
    assert settings.tracking_uri == "http://batchsweep-mlflow:5000"


# ---- the image ------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    out = []
    for line in logical:
        word, _, rest = line.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_runs_as_a_non_root_user(docs: list[dict[str, Any]]) -> None:
    users = [args.split(":")[0] for word, args in dockerfile_instructions() if word == "USER"]
    assert users, "no USER line: the image would run as root"
    assert users[-1] not in {"root", "0"}
    # numeric, so the kubelet can verify runAsNonRoot; the same user the manifests ask for
    assert users[-1].isdigit()
    assert {t["spec"]["securityContext"]["runAsUser"] for _, t in pod_templates(docs)} == {int(users[-1])}


def test_dockerfile_has_no_secret_build_args_or_env() -> None:
    names = []
    for word, args in dockerfile_instructions():
        if word == "ARG":
            names.append(args.split("=")[0])
        elif word == "ENV":
            pairs = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", args)
            names += pairs or [args.split()[0]]  # `ENV NAME value`, the legacy form
    assert "TORCH_INDEX_URL" in names and "PYTHONUNBUFFERED" in names  # the parser sees them
    assert [n for n in names if re.search(r"TOKEN|PASSWORD|PASSWD|SECRET|KEY|CREDENTIAL", n, re.I)] == []


def test_dockerfile_installs_the_pinned_torch_and_every_package() -> None:
    instructions = dockerfile_instructions()
    args = dict(a.split("=", 1) for w, a in instructions if w == "ARG" and "=" in a)
    assert args["TORCH_VERSION"] == pinned("torch")
    assert re.fullmatch(r"https://download\.pytorch\.org/whl/cu\d+", args["TORCH_INDEX_URL"])
    run = " ".join(a for w, a in instructions if w == "RUN")
    assert '"torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"' in run
    assert '".[dashboards,postgres]"' in run
    # every package setuptools installs is copied into the image, and kept by the .dockerignore
    packages = {p.rstrip("*") for p in pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {src for w, a in instructions if w == "COPY" for src in a.split()[:-1] if not src.startswith("--")}
    assert packages <= copied
    assert all((ROOT / src).exists() for src in copied), copied
    kept = set((DEPLOY / "Dockerfile.dockerignore").read_text().split())
    assert {f"!{src}" for src in copied} <= kept


def test_make_venv_installs_the_lock_s_versions() -> None:
    """`make venv` installs the project with deploy/requirements.lock as constraints, its hashes dropped: the
    command the Makefile runs gives every locked name==version and nothing else, and the install reads it."""
    recipe = subprocess.run(
        ["make", "-n", "-B", ".venv/.installed"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    (sed,) = [line for line in recipe if line.startswith("sed ") and "deploy/requirements.lock" in line]
    command, target = sed.split(" > ")
    pins = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    locked = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$", (DEPLOY / "requirements.lock").read_text(), re.M)
    assert len(pins) > 100 and pins == [f"{name}=={version}" for name, version in locked]
    (install,) = [line for line in recipe if "pip install" in line and " -e " in line]
    assert f"-c {target.strip()}" in install


def test_the_image_installs_every_dependency_from_a_hash_lock() -> None:
    """Every dependency but torch's family is installed from deploy/requirements.lock, each with its sha256, with
    --require-hashes and --no-deps; the lock holds exactly the closure this virtualenv resolved and is tested
    with (deploy/lock_requirements.py), at the same versions, so the image runs what the suite ran."""
    import importlib.util

    run = " ".join(a for w, a in dockerfile_instructions() if w == "RUN")
    assert "pip install --require-hashes --no-deps -r deploy/requirements.lock" in run
    assert 'pip install --no-deps ".[dashboards,postgres]"' in run and "pip check" in run
    entries = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\\n((?:\s+--hash=sha256:[0-9a-f]{64}(?: \\\n)?)+)",
                         (DEPLOY / "requirements.lock").read_text(), re.M)  # fmt: skip
    locked = {name: version for name, version, _ in entries}
    assert entries and len(locked) == len(entries)
    spec = importlib.util.spec_from_file_location("lock_requirements", DEPLOY / "lock_requirements.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert locked == module.closure(), "deploy/requirements.lock is stale: run deploy/lock_requirements.py"
    assert not [n for n in locked if module.NOT_LOCKED.match(n)]  # torch's family comes from PyTorch's index


def test_the_image_has_a_c_compiler_and_installs_every_data_file() -> None:
    # torch.compile (Triton's CUDA launcher, inductor's CPU kernels) compiles C at run time: the slim base
    # image has no compiler until the Dockerfile installs one
    run = " ".join(a for w, a in dockerfile_instructions() if w == "RUN")
    installed = re.search(r"apt-get install ([^&]*)", run)
    assert installed is not None and {"gcc", "libc6-dev"} <= set(installed.group(1).split())
    # `pip install .` copies a package's non-Python files only where package-data names them: every such
    # file in the packages (templates, migrations, examples) must match a glob
    data = pyproject()["tool"]["setuptools"]["package-data"]
    packages = [p.rstrip("*") for p in pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]]
    missing = []
    for package in packages:
        for file in (ROOT / package).rglob("*"):
            if not file.is_file() or file.suffix in {".py", ".pyc"} or "__pycache__" in file.parts:
                continue
            relative = file.relative_to(ROOT / package)
            if not any(relative.match(glob) for glob in data.get(package, [])):
                missing.append(f"{package}/{relative}")
    assert missing == [], f"not in [tool.setuptools.package-data]: {missing}"


# ---- the GPU check --------------------------------------------------------------------------------


def stand_in(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


# what the benchmarks print last, as deploy/gpu_check.sh reads them: numbers that meet the targets, and not
BENCH_OUTPUT = {
    "meets": {
        "train_throughput": "loop (worker.loop.train, default metrics): 421,337 tokens/s, MFU 43.2%\n"
        "bare PyTorch loop:                         430,121 tokens/s, MFU 44.1%\nloop / bare = 0.980 (target >= 0.95)",
        "optimizer_step": "MERIT / AdamW(foreach) = 0.90x (target <= 1.5x)\n"
        "MERIT / AdamW(fused) = 1.31x (MERIT (compiled), MERIT's default on cuda; target <= 1.5x)",
    },
    "misses": {
        "train_throughput": "loop (worker.loop.train, default metrics): 301,337 tokens/s, MFU 30.9%\n"
        "bare PyTorch loop:                         330,121 tokens/s, MFU 33.8%\nloop / bare = 0.913 (target >= 0.95)",
        "optimizer_step": "MERIT / AdamW(fused) = 2.40x (MERIT (compiled), MERIT's default on cuda; target <= 1.5x)",
    },
}


def run_gpu_check(
    tmp_path: Path, nvidia_smi: str, python_rc: int = 0, bench: dict[str, str] = BENCH_OUTPUT["meets"]
) -> tuple[subprocess.CompletedProcess[str], str]:
    """deploy/gpu_check.sh with a stand-in Python that records its arguments and prints `bench[name]` when run
    as benchmarks/<name>.py (and stand-ins for python, python3, pytest and ray on PATH), so nothing real runs."""
    calls = tmp_path / "calls.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    outputs = {}
    for name, text in bench.items():
        outputs[name] = tmp_path / f"{name}.out"
        outputs[name].write_text(text + "\n")
    recorder = (
        f'echo "$0 $*" >> "{calls}"\n'
        f'case "$*" in\n'
        f'  *train_throughput.py*) cat "{outputs["train_throughput"]}" ;;\n'
        f'  *optimizer_step.py*) cat "{outputs["optimizer_step"]}" ;;\n'
        f'  *) echo "stand-in output" ;;\n'
        f"esac\nexit {python_rc}"
    )
    for name in ("python", "python3", "pytest", "ray"):
        stand_in(bin_dir / name, recorder)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "NVIDIA_SMI": nvidia_smi}
    env["PYTHON"] = str(bin_dir / "python")
    out = subprocess.run(["bash", str(GPU_CHECK)], capture_output=True, text=True, env=env, timeout=60, check=False)
    return out, calls.read_text() if calls.exists() else ""


def test_gpu_check_does_nothing_without_nvidia_smi(tmp_path: Path) -> None:
    out, calls = run_gpu_check(tmp_path, nvidia_smi=str(tmp_path / "no-such-nvidia-smi"))
    assert out.returncode == 0, out.stderr
    assert (
        out.stdout.strip() == f"gpu_check: no GPU present ({tmp_path / 'no-such-nvidia-smi'} not found); nothing to run"
    )
    assert calls == ""  # no Python, pytest or Ray was started


def test_gpu_check_does_nothing_when_nvidia_smi_lists_no_gpu(tmp_path: Path) -> None:
    smi = stand_in(tmp_path / "nvidia-smi", 'echo "No devices were found"; exit 6')
    out, calls = run_gpu_check(tmp_path, nvidia_smi=str(smi))
    assert out.returncode == 0, out.stderr
    assert "no GPU present" in out.stdout and calls == ""


GPU_TARGETS = ["cuda", "pytest-gpu", "train-throughput-mfu", "train-throughput-ratio", "optimizer-step"]


@pytest.mark.parametrize(("python_rc", "bench"), [(0, "meets"), (0, "misses"), (1, "meets")])
def test_gpu_check_runs_each_target_once_on_a_gpu_machine(tmp_path: Path, python_rc: int, bench: str) -> None:
    smi = stand_in(tmp_path / "nvidia-smi", 'echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000)"')
    out, calls = run_gpu_check(tmp_path, nvidia_smi=str(smi), python_rc=python_rc, bench=BENCH_OUTPUT[bench])
    lines = [line for line in out.stdout.splitlines() if re.match(r"gpu_check: [\w-]+: ", line)]
    assert [line.split(":")[1].strip() for line in lines] == GPU_TARGETS
    recorded = calls.splitlines()
    assert any(" -m pytest " in c and " -m gpu" in c for c in recorded)
    assert not any(Path(c.split()[0]).name == "ray" for c in recorded)
    # each benchmark once, on the GPU; the throughput one as its target says: GPT-2 small, bf16
    (throughput,) = [c for c in recorded if "benchmarks/train_throughput.py" in c]
    assert all(a in throughput.split() for a in ("gpt2-small", "bf16", "--compile", "cuda"))
    (optimizer,) = [c for c in recorded if "benchmarks/optimizer_step.py" in c]
    assert "cuda" in optimizer.split()
    verdicts = {line.split(":")[1].strip(): line.split(":", 2)[2].split()[0] for line in lines}
    if python_rc == 1:
        assert out.returncode == 1 and lines[0].startswith("gpu_check: cuda: FAIL")
        assert lines[1].startswith("gpu_check: pytest-gpu: FAIL exit 1")
        assert set(verdicts.values()) == {"FAIL"}
    elif bench == "meets":
        assert out.returncode == 0 and "FAIL" not in out.stdout
        assert lines[1].endswith("PASS stand-in output")
        assert lines[2].endswith("PASS MFU (%) 43.2 (target >= 40)")
        assert lines[3].endswith("PASS loop / bare 0.980 (target >= 0.95)")
        assert lines[4].endswith("PASS MERIT / AdamW(fused) 1.31 (target <= 1.5)")
    else:
        assert out.returncode == 1
        assert verdicts == {
            "cuda": "PASS",
            "pytest-gpu": "PASS",
            "train-throughput-mfu": "FAIL",
            "train-throughput-ratio": "FAIL",
            "optimizer-step": "FAIL",
        }
        assert lines[2].endswith("FAIL MFU (%) 30.9 (target >= 40)")


def test_gpu_check_fails_a_target_whose_benchmark_prints_no_number(tmp_path: Path) -> None:
    smi = stand_in(tmp_path / "nvidia-smi", 'echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000)"')
    silent = {"train_throughput": "MFU n/a", "optimizer_step": "nothing"}
    out, _ = run_gpu_check(tmp_path, nvidia_smi=str(smi), bench=silent)
    assert out.returncode == 1
    assert "gpu_check: train-throughput-mfu: FAIL no MFU (%) in the output: MFU n/a" in out.stdout
    assert "gpu_check: optimizer-step: FAIL no MERIT / AdamW(fused) in the output: nothing" in out.stdout


def test_gpu_marker_is_registered() -> None:
    markers = pyproject()["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("gpu:") for m in markers)


# ---- the operators' guide ---------------------------------------------------------------------------


def test_the_operators_guide_walks_through_the_kubernetes_deploy() -> None:
    readme = (ROOT / "docs" / "operators.md").read_text()
    headings = re.findall(r"^## .*$", readme, flags=re.M)
    assert "## Deploy on Kubernetes" in headings
    assert headings.index("## Deploy on Kubernetes") + 1 == headings.index("## GPU install")
    section = readme.split("## Deploy on Kubernetes", 1)[1].split("## GPU install", 1)[0]
    for step in ("KubeRay", "docker build -f deploy/Dockerfile", "secret.example.yaml",
                 "kubectl apply -k deploy/kubernetes", "batchsweep-api-tls", "port-forward", "maxReplicas"):  # fmt: skip
        assert step in section, step


# ---- monitoring -----------------------------------------------------------------------------------


def test_metrics_are_scraped_from_inside_the_cluster_only(docs: list[dict[str, Any]]) -> None:
    config = one(docs, "ConfigMap", "batchsweep-config")["data"]
    port = int(config["SWEEPS_METRICS_PORT"])
    api = api_container(docs)
    assert {"name": "metrics", "containerPort": port} in api["ports"]
    service = one(docs, "Service", "batchsweep-api")["spec"]
    assert {"name": "metrics", "port": port, "targetPort": "metrics"} in service["ports"]
    # the Ingress routes the http port only; the policy admits the monitoring namespace to the metrics port
    backend = one(docs, "Ingress", "batchsweep-api")["spec"]["rules"][0]["http"]["paths"][0]["backend"]
    assert backend["service"]["port"] == {"name": "http"}
    rules = one(docs, "NetworkPolicy", "batchsweep-api")["spec"]["ingress"]
    metric_rules = [r for r in rules if any(p["port"] == port for p in r["ports"])]
    assert metric_rules == [
        {
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
            "ports": [{"protocol": "TCP", "port": port}],
        }
    ]


def test_the_monitoring_kustomization_scrapes_the_api_and_ships_a_dashboard_of_real_metrics() -> None:
    import json

    monitoring = K8S / "monitoring"
    if KUBECTL is not None:
        out = subprocess.run([KUBECTL, "kustomize", str(monitoring)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
        assert {d["kind"] for d in rendered} == {"ServiceMonitor", "ConfigMap"}
        dashboard_cm = next(d for d in rendered if d["kind"] == "ConfigMap")
        assert dashboard_cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    monitor = yaml.safe_load((monitoring / "servicemonitor.yaml").read_text())
    assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "batchsweep-api"}
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    # every metric the dashboard queries is one the service exports (service/api/metrics.py)
    from service.api import metrics

    exported = set(re.findall(r"batchsweep_[a-z_]+", metrics.__doc__ or ""))
    dashboard = json.loads((monitoring / "grafana-dashboard.json").read_text())
    queried = {
        name.removesuffix("_bucket")
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"batchsweep_[a-z_]+", target["expr"])
    }
    assert queried and queried <= exported, queried - exported


def test_the_api_holds_no_s3_key_and_the_ray_pods_hold_theirs(docs: list[dict[str, Any]]) -> None:
    api = env_of(api_container(docs), docs)
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(api)  # it never touches trial storage
    assert api["SWEEPS_STORAGE_URI"].startswith("s3://")  # but knows where it is, for the drivers
    for where, template in pod_templates(docs):
        if "RayCluster" in where:
            env = env_of(template["spec"]["containers"][0], docs)
            assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(env), where
