"""The state dir's layout: every path in it, named once (DESIGN.md "State dir layout").

A module that reads or writes the state dir asks :class:`StateDir` for the path, never
joins a literal onto the state dir itself, so the layout is read here and nowhere else
(``grep`` for a file's name finds its one definition). Paths only: what a file holds is
its store's (``documents.py`` for the JSON documents), and nothing here touches the disk.

```
instances/<name>.json  instances/logs/<name>.log  instances/.reserve   records, logs, ballast
events/<name>.jsonl    quarantine/                 run/<name>/         journal, aside, scratch
activation/ restart/ scale/ inflight/ engineload/                      side documents
devices/health.json  devices/measured.json  (+ .lock)                  observed devices
observed.json  drain.json  node.yaml  access-token  models/  cache/    the node's own
heartbeat/observed-at.json                                 each set's last pass's time
refused.json                                                           a reload's refusals
daemon.json                                                             the daemon's set
secrets-key  ui-open.html  quarantine/documents/
id                                                                      its identity
pass.lock  placement.lock  daemon.lock                                 the locks
gateway/  (gw-<nonce>.json, reloads-<nonce>, current.json, retire/, passed, metrics.prom,
           gateway.log, daemon.sock, daemon.addr, requests.jsonl, stopped, start.lock)
                                                                        the gateway's files
git/  (checkout/, source.json, history.json, git.lock, moving, fetch-now,
      running.json)                                                     the git source
notify/q-<time>-<hook>-<id>.json  source-state.json  send.lock        queued notifications
images/<key>.json  images/<key>.log  run/<name>.env  run/<name>.cid       container images, runs
spawnnotes/<nonce>.json                                     what a spawn knew of its engine
```
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from controller.core.manifest.names import in_repo


@dataclass(frozen=True, slots=True)
class StateDir:
    root: Path

    # -- records and what hangs off them --------------------------------------------
    @property
    def instances(self) -> Path:
        return self.root / "instances"

    @property
    def logs(self) -> Path:
        return self.instances / "logs"

    @property
    def events(self) -> Path:
        return self.root / "events"

    @property
    def quarantine(self) -> Path:
        return self.root / "quarantine"

    @property
    def quarantined_documents(self) -> Path:
        """Side documents set aside (records go to ``quarantine/`` itself, by name)."""
        return self.quarantine / "documents"

    @property
    def spawn_notes(self) -> Path:
        """What each spawn knew of its engine (``store/instances/spawnnotes.py``)."""
        return self.root / "spawnnotes"

    @property
    def runs(self) -> Path:
        """Engines' runtime dirs (``run/<name>/``)."""
        return self.root / "run"

    # -- side documents: one folder of ``<deployment>.json`` each ----------------------
    @property
    def activation(self) -> Path:
        return self.root / "activation"

    @property
    def restart(self) -> Path:
        return self.root / "restart"

    @property
    def scale(self) -> Path:
        return self.root / "scale"

    @property
    def inflight(self) -> Path:
        return self.root / "inflight"

    @property
    def engine_load(self) -> Path:
        """The engines' own figures, one folder per signal (``waiting/``, ``kvCache/``)."""
        return self.root / "engineload"

    # -- observed state of the node ---------------------------------------------------
    @property
    def devices(self) -> Path:
        return self.root / "devices"

    @property
    def device_health(self) -> Path:
        return self.devices / "health.json"

    @property
    def measured(self) -> Path:
        return self.devices / "measured.json"

    @property
    def observed(self) -> Path:
        return self.root / "observed.json"

    @property
    def observed_at(self) -> Path:
        """Each set's last pass's time (``side/observed.py``): out of the top folder,
        which the gateway watches, as a pass writes it every resync."""
        return self.root / "heartbeat" / "observed-at.json"

    @property
    def drain(self) -> Path:
        return self.root / "drain.json"

    @property
    def refused(self) -> Path:
        """What a reload (SIGHUP) refused and is still in force (``side/refused.py``)."""
        return self.root / "refused.json"

    @property
    def daemon(self) -> Path:
        """The manifest set the daemon holding ``daemon.lock`` runs (``side/daemonset.py``)."""
        return self.root / "daemon.json"

    @property
    def node_config(self) -> Path:
        return self.root / "node.yaml"

    @property
    def node_labels(self) -> Path:
        """The labels a pass last read in node.yaml (``config/nodelabels.py``)."""
        return self.root / "node-labels.json"

    @property
    def state_id(self) -> Path:
        """This state dir's random id, which its engines carry (``config/stateid.py``)."""
        return self.root / "id"

    @property
    def access_token(self) -> Path:
        return self.root / "access-token"

    @property
    def secrets_key(self) -> Path:
        """The key of the envFrom values' digest in records (``config/secretkey.py``)."""
        return self.root / "secrets-key"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def ui_opener(self) -> Path:
        """``reconcile ui --open``'s way to the page, the token unseen on a command line."""
        return self.root / "ui-open.html"

    @property
    def manifest_cache(self) -> Path:
        return self.root / "cache" / "manifests.json"

    # -- locks --------------------------------------------------------------------------
    @property
    def pass_lock(self) -> Path:
        return self.root / "pass.lock"

    @property
    def placement_lock(self) -> Path:
        return self.root / "placement.lock"

    @property
    def daemon_lock(self) -> Path:
        return self.root / "daemon.lock"

    # -- the gateway's files ------------------------------------------------------------
    @property
    def gateway(self) -> Path:
        return self.root / "gateway"

    @property
    def current_gateway(self) -> Path:
        return self.gateway / "current.json"

    def gateway_member(self, nonce: str) -> Path:
        """A live gateway process's own file (left behind by a crash)."""
        return self.gateway / f"gw-{nonce}.json"

    def gateway_reloads(self, nonce: str) -> Path:
        """A live gateway's count of the SIGHUPs it began and answered (gateway/reloads.py)."""
        return self.gateway / f"reloads-{nonce}"

    @property
    def retire(self) -> Path:
        return self.gateway / "retire"

    @property
    def gateway_stopped(self) -> Path:
        """``reconcile gateway stop`` asked: no gateway starts until a start asks again."""
        return self.gateway / "stopped"

    @property
    def gateway_start_lock(self) -> Path:
        """Held while a gateway starts, so a stop waits for it and then stops it."""
        return self.gateway / "start.lock"

    @property
    def passed(self) -> Path:
        return self.gateway / "passed"

    @property
    def gateway_log(self) -> Path:
        return self.gateway / "gateway.log"

    @property
    def gateway_metrics(self) -> Path:
        return self.gateway / "metrics.prom"

    @property
    def daemon_socket(self) -> Path:
        return self.gateway / "daemon.sock"

    @property
    def wake_name(self) -> Path:
        """The daemon's abstract wake-up name, when its socket's path is too long."""
        return self.gateway / "daemon.addr"

    @property
    def request_log(self) -> Path:
        return self.gateway / "requests.jsonl"

    def retire_ask(self, nonce: str) -> Path:
        """The daemon's ask that the gateways drain an engine (``retire/<nonce>.json``)."""
        return self.retire / f"{nonce}.json"

    def retire_ack(self, nonce: str, gateway: str) -> Path:
        """One gateway's answer: drained (``retire/<nonce>.<gateway>.done``)."""
        return self.retire / f"{nonce}.{gateway}.done"

    # -- the git source (store/sources/git/source.py) ------------------------------------------
    @property
    def git(self) -> Path:
        return self.root / "git"

    @property
    def git_checkout(self) -> Path:
        return self.git / "checkout"

    def in_repo(self, file: str) -> str:
        """A file of the git checkout as the repository names it (a record's source)."""
        return in_repo(self.git_checkout, file)

    @property
    def git_source(self) -> Path:
        """The source followed and what became of it (``reconcile source``)."""
        return self.git / "source.json"

    @property
    def git_history(self) -> Path:
        return self.git / "history.json"

    @property
    def git_lock(self) -> Path:
        return self.git / "git.lock"

    @property
    def git_moving(self) -> Path:
        """Written before the checkout moves: still there, the move starts again."""
        return self.git / "moving"

    @property
    def git_running(self) -> Path:
        """The last git started under git.lock, and its reconcile (store/sources/git/orphan.py)."""
        return self.git / "running.json"

    @property
    def git_fetch_now(self) -> Path:
        """Written by the gateway on a signed webhook: the next sync fetches at once."""
        return self.git / "fetch-now"

    # -- notifications (store/instances/outbox.py) ----------------------------------------------
    @property
    def notify(self) -> Path:
        """The outbox: one file per notification not yet delivered."""
        return self.root / "notify"

    @property
    def notify_lock(self) -> Path:
        """Held while notifications are posted: a daemon and a `--once` never post one twice."""
        return self.notify / "send.lock"

    @property
    def notify_source_state(self) -> Path:
        """The git source's state last notified (a restart does not repeat it)."""
        return self.notify / "source-state.json"

    # -- containers (backends/local/container.py) -------------------------------------
    @property
    def images(self) -> Path:
        """Image pulls in processes of their own: ``<key>.json`` (pid) and ``<key>.log``."""
        return self.root / "images"

    def container_env(self, name: str) -> Path:
        """A container's environment file (``run/<name>.env``; its id beside, ``.cid``)."""
        return self.runs / f"{name}.env"


def ballast(folder: Path) -> Path:
    """``<folder>/.reserve``: space kept to give back when the disk fills up."""
    return folder / ".reserve"


def lock_beside(document: Path) -> Path:
    """The lock of a document updated in place: ``health.json`` -> ``health.lock``."""
    return document.with_suffix(".lock")
