"""The deployment files under deploy/ pass the linters an operator would run: hadolint on the
Dockerfile, kubernetes-validate (offline, against the Kubernetes 1.37 schemas, strict) on every
manifest, and checkov on both (findings fixed, or skipped inline with the reason)."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".venv-deploy" / "bin"


def run(*args):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, f"{args}:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def test_dockerfile_passes_hadolint():
    run(TOOLS / "hadolint", "deploy/Dockerfile")


def test_manifests_validate_against_the_kubernetes_schemas():
    manifests = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
    assert len(manifests) >= 2
    out = run(TOOLS / "kubernetes-validate", "--strict", *manifests)
    for kind in ["deployment/abserve", "service/abserve", "poddisruptionbudget/abserve", "horizontalpodautoscaler/abserve",
                 "resourcequota/gpu-quota", "limitrange/gpu-limits", "networkpolicy/abserve",
                 "deployment/abserve-worker", "networkpolicy/abserve-worker"]:
        assert f"resource {kind} " in out, out


def test_checkov_finds_nothing_unjustified():
    out = run(TOOLS / "checkov", "-d", "deploy", "--framework", "kubernetes", "dockerfile", "--compact", "--skip-download")
    assert "Failed checks: 0" in out, out


def test_keda_scales_the_worker_deployment_on_its_queue():
    """KEDA's CRDs are not among the Kubernetes schemas kubernetes-validate has (it only warns),
    so the ScaledObject is checked for what must agree with the worker Deployment."""
    import yaml

    keda = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / "keda.yaml").read_text()))
    worker = next(d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "worker.yaml").read_text()) if d["kind"] == "Deployment")
    scaled = next(d for d in keda if d["kind"] == "ScaledObject")
    auth = next(d for d in keda if d["kind"] == "TriggerAuthentication")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    assert scaled["metadata"]["namespace"] == worker["metadata"]["namespace"] == auth["metadata"]["namespace"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "rabbitmq" and trigger["metadata"]["mode"] == "QueueLength"
    args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--queue={trigger['metadata']['queueName']}" in args
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    # no more workers than the namespace's GPU quota allows
    quota = next(d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "quota.yaml").read_text()) if d["kind"] == "ResourceQuota")
    gpus = int(quota["spec"]["hard"]["requests.nvidia.com/gpu"])
    assert scaled["spec"]["maxReplicaCount"] <= gpus


def test_the_ports_each_deployment_listens_on_are_the_ones_probed_scraped_and_admitted():
    """The port in a container's arguments is the one its probes, its Prometheus annotation and
    its NetworkPolicy name: a port changed in one place only would leave pods never ready,
    never scraped or unreachable."""
    import yaml

    for file, flag in [("serve.yaml", "--port="), ("worker.yaml", "--listen=")]:
        docs = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / file).read_text()))
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
        pod = deployment["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        arg = next(a for a in container["args"] if a.startswith(flag))
        port = int(arg.rsplit(":", 1)[-1] if flag == "--listen=" else arg[len(flag):])
        (named,) = container["ports"]
        assert named["containerPort"] == port, file
        for probe in ["startupProbe", "readinessProbe", "livenessProbe"]:
            assert container[probe]["httpGet"]["port"] == named["name"], (file, probe)
        assert int(pod["metadata"]["annotations"]["prometheus.io/port"]) == port, file
        assert policy["spec"]["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"], file
        assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == [port], file
