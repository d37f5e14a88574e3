"""deploy/kubernetes/, checked offline: every object against the Kubernetes schemas (kubernetes-validate ships
them), kubectl's client-side rendering and decoding, the Secret commands docs/deploy.md gives, the ConfigMap's
bastion.toml through `bastion check`, and the Deployment against what the image promises (deploy/image/Dockerfile).
Nothing here talks to a cluster."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.deploy.dockerfile import DOCKERFILE, ROOT, stages
from tests.support import BASTION

MANIFESTS = ROOT / "deploy" / "kubernetes"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
# The oldest release the manifests are written for (hostUsers with procMount: Unmasked) and the newest schemas.
VERSIONS = ["1.33.0", kubernetes_validate.latest_version()]
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="no kubectl on PATH: scripts/setup.sh installs Debian's "
                                                           "kubernetes-client")


def manifest_files() -> list[Path]:
    return sorted(p for p in MANIFESTS.glob("*.yaml") if p.name != "kustomization.yaml")


def objects() -> list[dict]:
    return [doc for path in manifest_files() for doc in yaml.safe_load_all(path.read_text()) if doc]


def one(kind: str, name: str) -> dict:
    (found,) = [o for o in objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def bastion_container() -> dict:
    (container,) = one("Deployment", "bastion")["spec"]["template"]["spec"]["containers"]
    return container


def offline_env(tmp_path: Path) -> dict[str, str]:
    """kubectl with no configuration and no cluster: nothing it does may need one."""
    empty = tmp_path / "kubeconfig"
    empty.write_text("")
    return {**os.environ, "KUBECONFIG": str(empty), "HOME": str(tmp_path)}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_is_valid_against_the_kubernetes_schemas(version: str):
    found = objects()
    assert {o["kind"] for o in found} >= {"Namespace", "ServiceAccount", "ConfigMap", "Deployment", "Service",
                                          "PodDisruptionBudget", "HorizontalPodAutoscaler", "NetworkPolicy"}
    for document in found:
        kubernetes_validate.validate(document, version, strict=True)  # raises, naming the field, on any fault


def test_the_schema_check_catches_a_misspelt_field():
    deployment = one("Deployment", "bastion")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)


def test_the_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in manifest_files())
    assert kustomization["namespace"] == one("Namespace", "bastion")["metadata"]["name"]
    assert [i["name"] for i in kustomization["images"]] == [bastion_container()["image"]]


@needs_kubectl
def test_kubectl_renders_the_kustomization_offline(tmp_path: Path):
    rendered = subprocess.run([KUBECTL, "kustomize", str(MANIFESTS)], capture_output=True, text=True, timeout=120,
                              env=offline_env(tmp_path))
    assert rendered.returncode == 0, rendered.stderr
    documents = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in documents) == \
        sorted((o["kind"], o["metadata"]["name"]) for o in objects())
    for document in documents:
        if document["kind"] != "Namespace":
            assert document["metadata"]["namespace"] == "bastion", document["metadata"]
        kubernetes_validate.validate(document, VERSIONS[0], strict=True)
    (deployment,) = [d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "bastion"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example.com/bastion:0.1.0"


@needs_kubectl
def test_kubectl_decodes_the_workloads_into_kubernetes_types(tmp_path: Path):
    """`kubectl set image --local` reads a file into the API's own Go types without a server, so a field of the
    wrong type fails there; shown failing on a copy with one."""
    env = offline_env(tmp_path)
    for path in (MANIFESTS / "deployment.yaml", MANIFESTS / "redis.yaml"):
        decoded = subprocess.run([KUBECTL, "set", "image", "--local", "--dry-run=client", "-o", "yaml", "-f",
                                  str(path), "*=probe:1"], capture_output=True, text=True, timeout=120, env=env)
        workloads = [d for d in yaml.safe_load_all(decoded.stdout) if d]
        assert [w["kind"] for w in workloads] == ["Deployment"], decoded.stderr
        assert workloads[0]["spec"]["template"]["spec"]["containers"][0]["image"] == "probe:1"
        # The only complaint allowed is about the objects with no pod template beside it (a Service).
        assert all("does not have a pod template" in line for line in decoded.stderr.splitlines()), decoded.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text((MANIFESTS / "deployment.yaml").read_text().replace("replicas: 3", 'replicas: "three"'))
    refused = subprocess.run([KUBECTL, "set", "image", "--local", "-o", "yaml", "-f", str(broken), "*=probe:1"],
                             capture_output=True, text=True, errors="replace", timeout=120, env=env)
    assert refused.returncode != 0 and "replicas" in refused.stderr.lower()


def documented_secret_commands() -> list[str]:
    """The shell block under docs/deploy.md's **Secrets**, one command per item (continued lines joined)."""
    text = DEPLOY_DOC.read_text()
    block = re.search(r"\*\*Secrets\*\*.*?```sh\n(.*?)```", text, re.S).group(1)
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def secret_references() -> dict[str, set[str]]:
    """Every key of every Secret the manifests refer to, by Secret name."""
    found: dict[str, set[str]] = {}

    def walk(node) -> None:
        if isinstance(node, dict):
            if "secretKeyRef" in node:
                found.setdefault(node["secretKeyRef"]["name"], set()).add(node["secretKeyRef"]["key"])
            if "secret" in node and "secretName" in node["secret"]:
                found.setdefault(node["secret"]["secretName"], set())
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(objects())
    return found


@needs_kubectl
def test_the_documented_secret_commands_make_what_the_manifests_refer_to(tmp_path: Path):
    """Each command of the block, in order, in one folder; kubectl's as client-side dry runs (no cluster)."""
    env = offline_env(tmp_path) | {"DOCS_TOKEN": "docs-token-for-the-test",
                                   "PATH": f"{Path(BASTION).parent}:{os.environ['PATH']}"}
    made: dict[str, dict] = {}
    commands = documented_secret_commands()
    assert sum(c.startswith("kubectl") for c in commands) == 3, commands
    for command in commands:
        dry = command.startswith("kubectl")
        ran = subprocess.run(["sh", "-c", command + (" --dry-run=client -o yaml" if dry else "")], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120, env=env)
        assert ran.returncode == 0, (command, ran.stderr)
        if dry:
            made_object = yaml.safe_load(ran.stdout)
            kubernetes_validate.validate(made_object, VERSIONS[0], strict=True)
            made[made_object["metadata"]["name"]] = made_object
    assert made["bastion"]["kind"] == "Namespace"
    secrets = {name: o for name, o in made.items() if o["kind"] == "Secret"}
    for secret in secrets.values():
        assert secret["metadata"]["namespace"] == "bastion"
        assert all(secret["data"].values()), secret["metadata"]["name"]  # no empty value
    references = secret_references()
    assert set(secrets) == set(references)
    for name, keys in references.items():
        assert keys <= set(secrets[name]["data"]), name
    assert set(secrets["bastion-keys"]["data"]) == {"api_keys.json", "approval.key", "session.key"}
    # What Bastion reads from them is what it wants: a key file, a 32-byte approval key, a 32-byte credentials key.
    import base64
    from bastion.policy.approval import load_secret

    files = secrets["bastion-keys"]["data"]
    (tmp_path / "approval-from-secret.key").write_bytes(base64.b64decode(files["approval.key"]))
    assert len(load_secret(str(tmp_path / "approval-from-secret.key"))) == 32
    assert len(bytes.fromhex(base64.b64decode(files["session.key"]).decode().strip())) == 32
    assert "alice" in base64.b64decode(files["api_keys.json"]).decode()
    from bastion.credentials.store import parse_key

    credentials_key = base64.b64decode(secrets["bastion-secrets"]["data"]["credentials-key"]).decode()
    assert len(parse_key(credentials_key)) == 32  # as BASTION_CREDENTIALS_KEY is read


def configuration_files(tmp_path: Path) -> Path:
    data = one("ConfigMap", "bastion-config")["data"]
    for name, text in data.items():
        (tmp_path / name).write_text(text)
    return tmp_path / "bastion.toml"


def test_the_configmaps_configuration_passes_bastion_check(tmp_path: Path):
    config = configuration_files(tmp_path)
    env = {**os.environ, "REDIS_PASSWORD": "redis-password-for-the-test", "DOCS_TOKEN": "docs-token-for-the-test"}
    checked = subprocess.run([BASTION, "check", str(config)], capture_output=True, text=True, timeout=120, env=env)
    assert checked.returncode == 0, checked.stderr
    assert "configuration OK" in checked.stderr
    settings = tomllib.loads(config.read_text())
    assert settings["state"] == {"url": "redis://redis:6379/0", "password": "${env:REDIS_PASSWORD}"}
    # Every ${env:NAME} the configuration reads is set in the container from a Secret.
    named = set(re.findall(r"\$\{env:([A-Z0-9_]+)\}", config.read_text()))
    from_secrets = {e["name"] for e in bastion_container()["env"] if "valueFrom" in e}
    assert named <= from_secrets
    # The Redis the configuration names is the Service redis.yaml makes, on its port.
    service = one("Service", "redis")
    assert service["spec"]["ports"][0]["port"] == 6379


def test_probes_and_ports_name_what_bastion_serves():
    container = bastion_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = container["args"]
    assert args[:2] == ["serve", "/etc/bastion/bastion.toml"]
    assert int(args[args.index("--http") + 1].rpartition(":")[2]) == ports["http"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    settings = tomllib.loads(one("ConfigMap", "bastion-config")["data"]["bastion.toml"])
    assert int(settings["metrics"]["listen"].rpartition(":")[2]) == ports["metrics"]
    service = one("Service", "bastion")
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    # /etc/bastion is where the ConfigMap is mounted, read-only
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/etc/bastion"]["readOnly"] and mounts["/etc/bastion"]["name"] == "config"
    keys = next(p for p, m in mounts.items() if m["name"] == "keys")
    assert settings["auth"]["api_keys"].startswith(keys + "/")
    assert settings["policy"]["approval"]["secret_file"].startswith(keys + "/")
    # draining: the preStop wait fits well inside the grace period
    pod = one("Deployment", "bastion")["spec"]["template"]["spec"]
    wait = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] >= wait + 20


def test_the_security_context_is_what_the_image_needs():
    _, (builder, runtime) = stages(DOCKERFILE.read_text())
    uid, _, gid = runtime.all("USER")[0].arguments.partition(":")
    pod = one("Deployment", "bastion")["spec"]["template"]["spec"]
    context = bastion_container()["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"]) == (int(uid), int(gid))
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (int(uid), int(gid))
    assert context["runAsNonRoot"] and pod["securityContext"]["runAsNonRoot"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False and context["privileged"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    # What docs/deploy.md says bubblewrap needs from the runtime, and nothing more.
    assert context["procMount"] == "Unmasked" and pod["hostUsers"] is False
    assert context["seccompProfile"] == {"type": "Unconfined"}
    assert context["appArmorProfile"] == {"type": "Unconfined"}
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert pod["automountServiceAccountToken"] is False
    # Everything the image writes is on an emptyDir: its VOLUMEs, and the XDG variables set to the same places.
    (volume,) = runtime.all("VOLUME")
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    mounted = {m["mountPath"] for m in bastion_container()["volumeMounts"] if m["name"] in empty_dirs}
    assert mounted == set(volume.words())
    env = {e["name"]: e.get("value") for e in bastion_container()["env"]}
    image_env = runtime.env()
    for name in ("HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        assert env[name] == image_env[name]
    docs = DEPLOY_DOC.read_text()
    for promise in ("procMount: Unmasked", "hostUsers: false", "seccomp=unconfined", "apparmor=unconfined",
                    "allowPrivilegeEscalation: false", f"User {uid}:{gid}"):
        assert promise in docs, promise


def test_the_autoscaler_follows_the_request_rate_metric():
    hpa = one("HorizontalPodAutoscaler", "bastion")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "bastion"}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == "bastion_requests_per_second"
    assert hpa["spec"]["minReplicas"] == one("Deployment", "bastion")["spec"]["replicas"] == 3
    # The adapter rule in the docs turns the counter Bastion exports into that metric.
    assert "`bastion_requests_total`" in (ROOT / "docs" / "operations.md").read_text()
    assert 'matches: "^bastion_requests_total$", as: "bastion_requests_per_second"' in DEPLOY_DOC.read_text()
    budget = one("PodDisruptionBudget", "bastion")
    assert budget["spec"]["selector"] == one("Deployment", "bastion")["spec"]["selector"]


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (scripts/setup.sh)")
def test_the_redis_pod_command_sets_the_password_from_stdin_not_the_command_line(tmp_path: Path):
    """redis.yaml's container command, run by sh as the pod runs it, with Debian's redis-server: its folder and
    port moved to this test's (and bound to loopback). The password from the environment is required, and it is on
    no process's command line."""
    import redis

    from tests.support import free_port, wait_for

    (container,) = one("Deployment", "redis")["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["/bin/sh", "-c"]
    port = free_port()
    script = container["args"][0].replace("--dir /data", f"--dir {tmp_path} --port {port} --bind 127.0.0.1")
    password = "p4ss-" + os.urandom(8).hex()
    process = subprocess.Popen(["/bin/sh", "-c", script], env={**os.environ, "REDIS_PASSWORD": password},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def answers() -> bool:
            try:
                return redis.Redis(port=port, password=password, socket_timeout=5).ping()
            except redis.ConnectionError:
                assert process.poll() is None, "redis-server exited"
                return False

        assert wait_for(answers, timeout=60)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, socket_timeout=5).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, password="wrong", socket_timeout=5).ping()
        command_line = Path(f"/proc/{process.pid}/cmdline").read_bytes()  # sh exec'd redis-server: same pid
        assert b"redis-server" in command_line and password.encode() not in command_line
    finally:
        process.terminate()
        process.wait(30)


@pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="bubblewrap is not installed (scripts/setup.sh)")
def test_schema_validation_needs_no_network():
    """kubernetes-validate ships the schemas: the same validation in a network namespace with no interface up."""
    script = ("import sys, yaml, kubernetes_validate as kv\n"
              "for path in sys.argv[1:]:\n"
              "    for document in yaml.safe_load_all(open(path)):\n"
              "        kv.validate(document, kv.latest_version(), strict=True)\n"
              "print('validated')\n")
    ran = subprocess.run(["/usr/bin/bwrap", "--unshare-net", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                          "--", sys.executable, "-c", script, *map(str, manifest_files())],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and ran.stdout.strip() == "validated", ran.stderr
