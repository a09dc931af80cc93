"""``reconcile ui [--open]``: the web page of the node, on the gateway that serves now.

The URL comes from the state dir's gateway registry (``reconcile gateway status`` reads
the same): the address it listens on, a wildcard bind as loopback (the page is opened
from this machine).
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

from controller.cli.exitcodes import EXIT_FAIL, EXIT_OK
from controller.cli.gatewayverbs import state_dir_of
from controller.gateway import registry

WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def page_url(host: str, port: int) -> str:
    """``http://HOST:PORT/ui``; an IPv6 host in brackets."""
    host = WILDCARDS.get(host, host)
    try:
        bracketed = ipaddress.ip_address(host).version == 6
    except ValueError:
        bracketed = False
    return f"http://{f'[{host}]' if bracketed else host}:{port}/ui"


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
    url = page_url(current.host, current.port)
    print(url)
    if current.settings.get("api_keys"):
        print("the gateway has API keys: the page asks for one", file=sys.stderr)
    if args.open:
        import webbrowser

        if not webbrowser.open(url):
            print("reconcile: no browser found here: open the URL above", file=sys.stderr)
            return EXIT_FAIL
    return EXIT_OK
