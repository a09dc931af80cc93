"""The web page of the node: ``GET /ui`` on the gateway (same bind, same keys).

- ``pages.py``: the routes (the page's three static files, its JSON, its actions) and
  who may use them;
- ``snapshot.py``: the state the page polls, read from the state dir (the items of
  ``status -o json`` and ``devices -o json``, the events, the pulls);
- ``traffic.py``: per-deployment requests/s, errors/s and p50/p99 over time, sampled
  from the gateway's own counters;
- ``actions.py``: load, unload, restart, drain and uncordon, each written as desired
  state (never a manifest) with an event naming the key;
- ``static/``: the page (vanilla JS, no build step, no CDN).
"""
