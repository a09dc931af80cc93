"""``reconcile ui [--open]``: the web page of the node, on the gateway that serves now.

The URL comes from the state dir's gateway registry (``reconcile gateway status`` reads
the same): the address it listens on (``https://`` when it has ``--tls-cert``), a
wildcard bind as loopback (the page is opened from this machine). A gateway without API
keys wants the state dir's access token for the page's data: the URL carries it
(``?token=``), so only the state dir's owner, who can read the token file, gets a URL
that works.
"""

from __future__ import annotations

import argparse
import html
import ipaddress
import sys
from pathlib import Path

from controller.cli.common import EXIT_FAIL, EXIT_OK
from controller.cli.gateway.gatewayverbs import state_dir_of
from controller.errors import ConfigError
from controller.gateway.lifecycle import registry
from controller.store.config import accesstoken
from controller.store.documents import write_atomic
from controller.store.statedir import StateDir

WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def page_url(host: str, port: int, token: str | None = None, tls: bool = False) -> str:
    """``http(s)://HOST:PORT/ui`` (``?token=T`` given one); an IPv6 host in brackets."""
    host = WILDCARDS.get(host, host)
    try:
        bracketed = ipaddress.ip_address(host).version == 6
    except ValueError:
        bracketed = False
    query = f"?{accesstoken.QUERY}={token}" if token else ""
    scheme = "https" if tls else "http"
    return f"{scheme}://{f'[{host}]' if bracketed else host}:{port}/ui{query}"


def _opener(state_dir: Path, url: str) -> str:
    """A ``file://`` page (0600) that sends the browser on to ``url``: a URL with the
    token on a browser's command line would show in every local user's ``ps`` (Jupyter
    opens such a file for the same reason)."""
    path = StateDir(state_dir).ui_opener
    link = html.escape(url, quote=True)
    page = (
        f'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={link}">'
        f'<title>reconcile</title><a href="{link}">open the page of the node</a>\n'
    )
    write_atomic(path, page.encode())
    return path.resolve().as_uri()


def cmd_ui(args: argparse.Namespace) -> int:
    state_dir = state_dir_of(args)
    current = registry.current_live(state_dir)
    if current is None:
        print(
            f"reconcile: no gateway runs for state dir {state_dir}: the page is served by "
            "the gateway; start the daemon with --listen [HOST:]PORT",
            file=sys.stderr,
        )
        return EXIT_FAIL
    keys = bool(current.settings.get("api_keys"))
    try:
        token = None if keys else accesstoken.ensure(state_dir)
    except (OSError, ConfigError) as exc:
        why = exc if isinstance(exc, ConfigError) else f"{accesstoken.path(state_dir)}: {exc}"
        print(f"reconcile: the page's access token: {why}", file=sys.stderr)
        return EXIT_FAIL
    url = page_url(current.host, current.port, token, tls=bool(current.settings.get("tls_cert")))
    print(url)
    if keys:
        print("the gateway has API keys: the page asks for one", file=sys.stderr)
    if args.open:
        import webbrowser

        if not webbrowser.open(_opener(state_dir, url) if token else url):
            print("reconcile: no browser found here: open the URL above", file=sys.stderr)
            return EXIT_FAIL
    return EXIT_OK
