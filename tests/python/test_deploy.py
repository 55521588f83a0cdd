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
                 "resourcequota/gpu-quota", "limitrange/gpu-limits", "networkpolicy/abserve"]:
        assert f"resource {kind} " in out, out


def test_checkov_finds_nothing_unjustified():
    out = run(TOOLS / "checkov", "-d", "deploy", "--framework", "kubernetes", "dockerfile", "--compact", "--skip-download")
    assert "Failed checks: 0" in out, out
