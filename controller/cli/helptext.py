"""The examples and exit codes under each verb's ``--help`` (plain strings: start-up stays fast)."""

from __future__ import annotations

_EXAMPLES: dict[str, tuple[str, ...]] = {
    "reconcile": (
        "reconcile -f /etc/reconcile/manifests            # the daemon: watch, keep running",
        "reconcile --once                                 # one pass (cron, git hooks)",
        "reconcile --once --wait --timeout 10m            # pass until every deployment is Ready",
        "reconcile --dry-run -o json                      # what a pass would do, as JSON",
    ),
    "source": (
        "reconcile source                                 # the git source: commits, state",
        "reconcile source -o json | jq .state             # Synced, Progressing, PullFailed, ...",
    ),
    "history": (
        "reconcile history                                # the commits this node applied",
        "reconcile history -o json | jq '.[-1].outcome'",
    ),
    "rollback": (
        "reconcile rollback                               # back to the last all-Ready commit",
        "reconcile rollback 3f2c1a9 --dry-run             # what going back there would change",
        "reconcile rollback --resume                      # follow the branch again",
    ),
    "plan": (
        "reconcile plan                                   # terraform-style changes",
        "reconcile plan -o json | jq .summary",
        "reconcile plan -o name                           # the deployments that would change",
        "reconcile plan -l team=search",
    ),
    "status": (
        "reconcile status                                 # a table, like kubectl get",
        "reconcile status web -o json                     # a JSON list (fields: README)",
        "reconcile status web api                         # only these, in this order",
        "reconcile status -l team=search -o name          # names, one a line",
        "reconcile status -o wide                         # PID, SOURCE, REVISION; each replica",
        "reconcile status -w                              # print each change as it happens",
        "reconcile status --refresh                       # look now, not at the last pass's view",
    ),
    "describe": (
        "reconcile describe web",
        "reconcile describe -l team=search                # every deployment with that label",
        "reconcile describe web -o yaml                   # the same, per replica, for scripts",
    ),
    "logs": (
        "reconcile logs web --tail 50",
        "reconcile logs                                   # every deployment's, prefixed",
        "reconcile logs web chat -f                       # both, each line behind its name",
        "reconcile logs web -f                            # follow until the deployment goes",
        "reconcile logs web --previous                    # the run before the last restart",
        "reconcile logs web --replica 1                   # one replica (default: all, prefixed)",
        "reconcile --manifests DIR logs web               # -f after `logs` is --follow",
        "reconcile logs --requests -f                     # the gateway's request log",
        "reconcile logs --requests -o json --tail 100     # its last lines, as JSON",
    ),
    "events": (
        "reconcile events                                 # every deployment's, newest last",
        "reconcile events web -w                          # follow one deployment's",
        "reconcile events -o json | jq .outcome           # JSON lines",
    ),
    "validate": ("reconcile validate -f manifests/              # in CI, before a merge",),
    "schema": ("reconcile schema > deployment.schema.json       # for editors",),
    "devices": (
        "reconcile devices",
        "reconcile devices -o json | jq '.devices[] | select(.held_by == [])'",
        "reconcile devices -o name                        # device keys, one a line",
    ),
    "drain": (
        "reconcile drain --ttl 2h --reason 'driver upgrade'",
        "reconcile drain --evict                          # also stop what runs",
    ),
    "uncordon": ("reconcile uncordon",),
    "down": (
        "reconcile down                                   # stop everything this set owns",
        "reconcile down -l team=search                    # only those (their manifests stay)",
        "reconcile down web                               # one deployment, every replica",
        "reconcile down --gateway                         # and the gateway process too",
    ),
    "restart": (
        "reconcile restart web                            # new instances; waits until Ready",
        "reconcile restart web chat --no-wait             # ask; the daemon's next pass acts",
    ),
    "gateway": (
        "reconcile gateway                                # which gateway serves, since when",
        "reconcile gateway restart                        # take the port over, or start again",
        "reconcile gateway stop                           # finish its requests, exit, stay down",
        "reconcile gateway start                          # start it if none serves",
        "reconcile gateway reload                         # node.yaml's gateway settings, no drop",
    ),
    "ui": (
        "reconcile ui                                     # the page's URL (the gateway's bind)",
        "reconcile ui --open                              # and open it in a browser",
    ),
    "export": (
        "reconcile export -f manifests | kubectl apply -f -",
        "reconcile export -o json --namespace ml          # one v1 List",
        "reconcile export --lossy                         # drop what Kubernetes cannot express",
    ),
    "models": (
        "reconcile models                                 # cached files, sizes, who uses them",
        "reconcile models prune --dry-run                 # what no manifest names",
        "reconcile models prune                           # remove it",
    ),
    "completion": (
        "reconcile completion bash > /etc/bash_completion.d/reconcile",
        "reconcile completion zsh > ~/.zsh/reconcile.zsh   # source it after compinit",
        "reconcile completion fish > ~/.config/fish/completions/reconcile.fish",
    ),
}

_EXIT_CODES: dict[str, tuple[str, ...]] = {
    "reconcile": (
        "0   --once: in sync, everything placed; --dry-run: nothing to change; the daemon: "
        "stopped by SIGTERM/SIGINT",
        "1   --once (or --dry-run): an invalid manifest, a Pending or Failed deployment, or an "
        "error",
        "2   --dry-run: changes pending, none of those (it is `plan`: its codes)",
    ),
    "plan": (
        "0   in sync",
        "1   what `--once` would exit 1 on: invalid input or records, a deployment left "
        "Pending (no room, preempted), Failed or crash-looping",
        "2   changes pending, none of those",
    ),
    "status": (
        "0   shown (even with no deployments)",
        "1   a NAME matches no deployment, or a record cannot be read (the rest is shown)",
    ),
    "describe": (
        "0   shown",
        "1   a NAME matches no deployment (the rest shown; or none matches -l), or its record "
        "cannot be read",
    ),
    "devices": ("0   shown", "1   a record cannot be read: who holds what is not whole"),
    "logs": ("0   printed (or followed to the end)", "1   no log: never started?"),
    "validate": (
        "0   every manifest is valid",
        "1   one or more invalid, a folder missing, or no manifest at all (--allow-empty)",
    ),
    "events": ("0   printed (or followed until interrupted)", "1   no such deployment here"),
    "down": (
        "0   stopped",
        "1   some of this set runs on another node (run down there), an engine is not "
        "stopped (not provably reconcile's), or no such NAME",
    ),
    "restart": (
        "0   every instance is new and Ready (--no-wait: the restart is asked)",
        "1   no such deployment, the node is drained (refused), a new instance cannot "
        "come up, or --timeout",
    ),
    "gateway": (
        "0   done (start: also when one serves already)",
        "1   no gateway runs (status, restart, start, reload), it did not start, or "
        "node.yaml, the key file or the TLS pair is refused (restart, start, reload)",
    ),
    "ui": ("0   printed (and opened)", "1   no gateway runs (no --listen), or no browser"),
    "source": (
        "0   shown (whatever its state: --once's exit says Synced or not)",
        "1   no git source",
    ),
    "history": ("0   shown", "1   no git source"),
    "rollback": (
        "0   applied and pinned (--resume: following again; --dry-run: shown)",
        "1   no git source, no such commit, or the pass at that commit failed",
    ),
    "export": (
        "0   every deployment converted",
        "1   an invalid manifest, a missing folder or a field with no form",
    ),
}
_USAGE = "64  bad flags or arguments"


def epilog(verb: str) -> str:
    verb = "status" if verb == "get" else verb  # kubectl's alias
    examples = "\n".join(f"  {line}" for line in _EXAMPLES.get(verb, ()))
    codes = _EXIT_CODES.get(verb, ("0   done", "1   failed (the message says why)"))
    exits = "\n".join(f"  {line}" for line in (*codes, _USAGE))
    return f"examples:\n{examples}\n\nexit codes:\n{exits}"
