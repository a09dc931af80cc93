"""``POST /hooks/git``: a signed push notification starts the git source's fetch at once.

GitHub, Gitea and Forgejo sign the body (``X-Hub-Signature-256: sha256=<hex hmac>``;
Gitea's and Forgejo's own ``X-Gitea-Signature`` / ``X-Forgejo-Signature`` carry the
bare hex); GitLab sends the secret itself (``X-Gitlab-Token``). The secret is the
git source's ``webhookSecretFile`` (named in ``<state>/git/source.json``, read at each
hook: a new secret needs no restart), which must not be readable by group or others;
its trailing newline is no part of it. Comparisons are constant-time. Anything unsigned,
wrongly signed, or with no usable secret file gets 401 and starts nothing; the hook needs
no API key (the signature is its key).

How the daemon hears it: the hook writes ``<state>/git/fetch-now`` (the next sync fetches
whatever else is due), then asks for a pass the way an OnDemand request does (the
gateway's wake-up to the daemon). The file makes the request durable (a daemon busy or
restarting still fetches at its next pass) and the wake-up makes it immediate.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from controller.gateway.http.answers import error
from controller.gateway.http.messages import Request, Response, json_response
from controller.gateway.http.router import Router
from controller.logsetup import get_logger
from controller.store import sidefiles
from controller.store.documents import write_atomic
from controller.store.statedir import StateDir

log = get_logger("reconcile")

PATH = "/hooks/git"
SIGNED = ("X-Hub-Signature-256", "X-Gitea-Signature", "X-Forgejo-Signature")


class Hooks:
    def __init__(self, state_dir: Path, request_pass: Callable[[], None]) -> None:
        self.state_dir = state_dir
        self.request_pass = request_pass

    def install(self, routes: Router) -> None:
        """Found before the gateway's catch-all."""
        routes.add_post(PATH, self.hook)

    async def hook(self, request: Request) -> Response:
        body = await request.read()
        secret, why = self._secret()
        if secret is None:
            log.warning("git webhook refused", reason=why)
            return error(401, "the webhook is not accepted here", "unauthorized")
        if not signed(secret, body, request.headers):
            log.warning("git webhook refused", reason="missing or wrong signature")
            return error(401, "the webhook's signature is missing or wrong", "unauthorized")
        state = StateDir(self.state_dir)
        sidefiles.folder_for_write(state.git)
        write_atomic(state.git_fetch_now, b"webhook\n")
        self.request_pass()
        log.info("git webhook accepted: fetching now")
        return json_response({"accepted": True, "fetch": "started"}, status=202)

    def _secret(self) -> tuple[bytes | None, str]:
        """(the secret, "") or (None, why): no git source, no file, a file others read.
        The git source's module is loaded at the first hook, not at the gateway's start."""
        from controller.store.sources.git import source as gitsource

        st = gitsource.peek_status(self.state_dir)  # a damaged file: named, read as none
        name = st.webhook_secret_file if st is not None else None
        if not name:
            return None, "no webhookSecretFile in node.yaml's git: section"
        return read_secret(Path(name))


def read_secret(path: Path) -> tuple[bytes | None, str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        return None, f"{path}: {exc.strerror}"
    try:
        info = os.fstat(fd)
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            return None, f"{path} is readable by group or others: chmod 600 {path}"
        data = os.read(fd, 64 * 1024)
    finally:
        os.close(fd)
    secret = data.rstrip(b"\r\n")
    if not secret:
        return None, f"{path} is empty"
    return secret, ""


def signed(secret: bytes, body: bytes, headers: Mapping[str, str]) -> bool:
    """Whether one of the forges' signatures (or GitLab's token) matches, constant-time
    (``headers``: a CIMultiDict, whose ``get`` ignores case)."""
    get = headers.get
    digest = hmac.new(secret, body, hashlib.sha256).hexdigest()
    for name in SIGNED:
        value = get(name)
        if value:
            given = value.strip().removeprefix("sha256=")
            if hmac.compare_digest(given.encode(), digest.encode()):
                return True
    token = get("X-Gitlab-Token")
    return token is not None and hmac.compare_digest(token.encode(), secret)
