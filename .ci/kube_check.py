"""What idem needs of its rendered Kubernetes workloads, beyond the schema (.ci/kube-validate).

Arguments: DIR=FILE pairs, a kustomization directory and its `kubectl kustomize` output.
Fails, naming the resource, unless:

- every Deployment and StatefulSet has at least one container, each with a readiness probe on
  GET /health/ready and a liveness probe on GET /health/live (the database must take a pod
  out of the Service, never restart it);
- its terminationGracePeriodSeconds is above 10 s and above the drain idem is given
  (IDEM_SHUTDOWN_TIMEOUT_MS, 10,000 ms when unset) plus any preStop sleep before SIGTERM,
  so SIGKILL never cuts a drain short;
- every IDEM_* variable in any container is one `idem` reads (an `env = "IDEM_..."` of
  src/cli), so a renamed or misspelt setting does not pass silently;
- all the kustomizations run one idem image (command `idem`): the migrate Job must run the
  coordinators' version.
"""

import pathlib
import re
import sys

import yaml

DEFAULT_SHUTDOWN_MS = 10_000
PROBES = (("readinessProbe", "/health/ready"), ("livenessProbe", "/health/live"))
ROOT = pathlib.Path(__file__).resolve().parent.parent


def known_env() -> set[str]:
    names = set()
    for source in (ROOT / "src" / "cli").rglob("*.rs"):
        names.update(re.findall(r'env = "(IDEM_[A-Z0-9_]+)"', source.read_text()))
    if not names:
        sys.exit("kube_check: no `env = \"IDEM_...\"` found in src/cli")
    return names


def pod_spec(doc: dict) -> dict | None:
    kind = doc.get("kind")
    if kind in ("Deployment", "StatefulSet", "Job"):
        return doc["spec"]["template"]["spec"]
    return None


def probe_path(container: dict, probe: str) -> str | None:
    return ((container.get(probe) or {}).get("httpGet") or {}).get("path")


def main(pairs: list[str]) -> int:
    env_names = known_env()
    errors: list[str] = []
    images: dict[str, str] = {}
    workloads = 0
    for pair in pairs:
        directory, _, file = pair.partition("=")
        for doc in yaml.safe_load_all(pathlib.Path(file).read_text()):
            if not doc:
                continue
            spec = pod_spec(doc)
            if spec is None:
                continue
            where = f"{directory}: {doc['kind']}/{doc['metadata']['name']}"
            containers = spec.get("containers") or []
            for c in containers + (spec.get("initContainers") or []):
                if (c.get("command") or [""])[0] == "idem":
                    images.setdefault(c["image"], where)
                for var in c.get("env") or []:
                    if var["name"].startswith("IDEM_") and var["name"] not in env_names:
                        errors.append(f"{where}: {var['name']} is not a variable idem reads")
            if doc["kind"] == "Job":
                continue
            workloads += 1
            if not containers:
                errors.append(f"{where}: no container")
            stop_ms = 0
            for c in containers:
                shutdown_ms = DEFAULT_SHUTDOWN_MS
                for probe, path in PROBES:
                    if probe_path(c, probe) != path:
                        errors.append(f"{where}: {c['name']} has no {probe} on GET {path}")
                for var in c.get("env") or []:
                    if var["name"] == "IDEM_SHUTDOWN_TIMEOUT_MS" and "value" in var:
                        shutdown_ms = max(shutdown_ms, int(var["value"]))
                pause = ((c.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}
                stop_ms = max(stop_ms, shutdown_ms + 1000 * int(pause.get("seconds", 0)))
            grace = spec.get("terminationGracePeriodSeconds")
            if grace is None or grace * 1000 <= stop_ms:
                errors.append(
                    f"{where}: terminationGracePeriodSeconds is {grace}, "
                    f"not above preStop pause + drain, {stop_ms} ms (nor 10 s)"
                )
            else:
                print(f"ok {where}: probes, grace {grace} s > preStop pause + drain {stop_ms} ms")
    if workloads == 0:
        errors.append("no Deployment or StatefulSet rendered")
    if len(images) > 1:
        found = ", ".join(f"{image} ({where})" for image, where in images.items())
        errors.append(f"more than one idem image: {found}")
    for e in errors:
        print(f"FAIL {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
