"""``spec.source`` in a pod: an initContainer that downloads the model into a volume the
engine container shares (DESIGN: "Model files", "Export to Kubernetes"). Pure.

A pod has no model cache of ours, so the pull becomes Kubernetes' own "before the app"
step: init containers run to completion before the engine container starts, so the
engine's startupProbe (its readiness deadline) starts after the download, as it does
here. The volume is an ``emptyDir``: it outlives a restart of either container (a
crashed engine does not download again, a restarted initContainer resumes its partial
file), not the pod.

* ``url`` + ``sha256``: curl, resuming a partial file (``--continue-at -``) and retrying
  (``--retry``), a stall (under 1 B/s for 60 s) counted as an error like ours; then the
  digest is compared and a mismatch discards the file and fails the initContainer,
  naming both digests (Kubernetes backs it off). ``{model}`` = ``/models/<file>``.
* ``huggingFace``: ``huggingface_hub.snapshot_download`` (installed with pip when the
  image lacks it) into ``/models/files``; ``/models/model`` is then a link to the one
  file the globs chose, or to the folder when they chose several. ``{model}`` =
  ``/models/model``. The hub client sees what the engine sees: ``spec.env``'s ``HF_*``
  and, with ``spec.envFrom``, the engine's own Secret (its ``HF_TOKEN`` too); without
  one, ``HF_TOKEN`` comes from the optional Secret ``hf-token``.

User values reach the scripts as positional arguments, never as script text.
"""

from __future__ import annotations

from typing import Any

from controller.core.kubernetes.kubelet import literal
from controller.core.manifest.sources import Source
from controller.core.pulls import file_name
from controller.redact import redact_url

Object = dict[str, Any]

VOLUME = "models"
MOUNT = "/models"
CONTAINER = "pull-model"
# Images: curl's own (Alpine: sh, sha256sum), and Python's slim one for the hub client.
CURL_IMAGE = "curlimages/curl:8.11.1"
PYTHON_IMAGE = "python:3.12-slim"
HUB_CLIENT = "huggingface_hub==2.4.0"  # the version reconcile's own pulls are tested with
TOKEN_SECRET = "hf-token"  # optional: a gated or private repo needs it
STALL_SECONDS = 60

# $2 is the URL as messages show it (a password or token redacted); the URL itself then
# comes from the Secret in SOURCE_URL (a file's trailing newline dropped), so neither the
# Deployment object nor the pod's log holds it.
URL_SCRIPT = f"""set -eu
dir=$1 where=$2 file=$3 want=$4
url=$(printf '%s' "${{SOURCE_URL:-$where}}" | tr -d '\r\n')
[ -f "$dir/$file" ] && exit 0
curl --fail --location --silent --show-error --retry 5 --retry-delay 10 \\
  --speed-limit 1 --speed-time {STALL_SECONDS} --continue-at - \\
  --output "$dir/$file.partial" "$url"
got=$(sha256sum "$dir/$file.partial" | cut -d ' ' -f 1)
if [ "$got" != "$want" ]; then
  echo "$where: the file's sha256 is $got, source.sha256 says $want: discarded" >&2
  rm -f "$dir/$file.partial"
  exit 1
fi
mv "$dir/$file.partial" "$dir/$file"
echo "pulled $where into $dir/$file (sha256 $got)"
"""

HUB_SCRIPT = f"""import os, subprocess, sys
dest, repo, revision, globs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:] or None
try:
    import huggingface_hub
except ImportError:
    target = "/tmp/hub-client"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--target", target]
    subprocess.run([*pip, "{HUB_CLIENT}"], check=True)
    sys.path.insert(0, target)
from huggingface_hub import snapshot_download
files = os.path.join(dest, "files")
listing = snapshot_download(repo, revision=revision, allow_patterns=globs, local_dir=files,
                            dry_run=True)
if not listing:
    sys.exit(f"{{repo}}@{{revision}}: no file matches {{globs}}: check source.files")
snapshot_download(repo, revision=revision, allow_patterns=globs, local_dir=files)
names = [str(f.filename) for f in listing]
target = os.path.join("files", names[0]) if len(names) == 1 else "files"
link = os.path.join(dest, "model")
if os.path.lexists(link + ".new"):
    os.remove(link + ".new")
os.symlink(target, link + ".new")
os.replace(link + ".new", link)
print(f"pulled {{repo}}@{{revision}}: {{', '.join(names)}} into {{files}}")
"""


def model_path(source: Source, mount: str = MOUNT) -> str:
    """What ``{model}`` names in the engine container."""
    if source.url is not None:
        return f"{mount}/{file_name(source.url)}"
    return f"{mount}/model"


def url_secret(name: str, source: Source) -> str | None:
    """The Secret a URL holding a password or a token is read from (key ``url``), else
    None: the URL in clear in the Deployment would show it to whoever may read that."""
    if source.url is None or redact_url(source.url) == source.url:
        return None
    return f"{name}-source"


def init_container(
    source: Source,
    env: dict[str, str],
    *,
    env_secret: str | None = None,
    url_from: str | None = None,
    mount: str = MOUNT,
) -> Object:
    """The initContainer that fills ``mount`` with ``source``'s files. ``env_secret`` is
    the Secret the engine's envFrom reads, if any: the pull gets the same (a gated repo's
    HF_TOKEN in the env file reaches the download as it reaches the engine); ``url_from``
    the Secret that holds the URL (:func:`url_secret`)."""
    program = _program(source, mount)
    # The kubelet would expand `$(...)` and `$$` (the script's own `$(cmd)` too).
    program["args"] = [literal(a) for a in program["args"]]
    container: Object = {"name": CONTAINER, **program}
    hub = source.hugging_face is not None
    variables = _env(env, token_secret=env_secret is None) if hub else []
    if url_from is not None:
        ref = {"name": url_from, "key": "url"}
        variables.append({"name": "SOURCE_URL", "valueFrom": {"secretKeyRef": ref}})
    if variables:
        container["env"] = variables
    if hub and env_secret is not None:
        container["envFrom"] = [{"secretRef": {"name": env_secret}}]
    container["volumeMounts"] = [volume_mount(mount)]
    return container


def volume() -> Object:
    return {"name": VOLUME, "emptyDir": {}}


def volume_mount(mount: str = MOUNT) -> Object:
    return {"name": VOLUME, "mountPath": mount}


def _program(source: Source, mount: str) -> Object:
    if source.url is not None:
        assert source.sha256 is not None
        name = file_name(source.url)
        args = [URL_SCRIPT, CONTAINER, mount, redact_url(source.url), name, source.sha256]
        return {"image": CURL_IMAGE, "command": ["sh", "-c"], "args": args}
    hub = source.hugging_face
    assert hub is not None
    args = [HUB_SCRIPT, mount, hub.repo, hub.revision, *hub.files]
    return {"image": PYTHON_IMAGE, "command": ["python3", "-c"], "args": args}


def _env(spec_env: dict[str, str], *, token_secret: bool) -> list[Object]:
    """The hub client's settings from ``spec.env`` (HF_ENDPOINT, HF_TOKEN...), and the
    token from the optional Secret when the spec gives none and no envFrom Secret may:
    an ``env`` entry beats envFrom, so it would shadow the engine's own token."""
    out: list[Object] = [
        {"name": k, "value": literal(v)} for k, v in spec_env.items() if k[:3] == "HF_"
    ]
    if token_secret and "HF_TOKEN" not in spec_env:
        ref = {"name": TOKEN_SECRET, "key": "token", "optional": True}
        out.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    return out
