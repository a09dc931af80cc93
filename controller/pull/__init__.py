"""Model pulls: the process that fills one model cache entry, and how a pass starts it.

A pull runs in its own process and session (``python -m controller.pull JOB``), so it
outlives the pass that started it, as engines do; its environment carries the marker
``RECONCILE_PULL=<cache entry folder>`` (:mod:`controller.pull.launch` finds it by that)
and it holds the entry's flock for its whole life, so a second pull of the same file
waits for the first and then finds it done.

Modules: ``job`` (what to pull, as JSON), ``failures`` (why a pull failed, for people),
``meter`` (progress.json), ``urlfetch`` (HTTP with Range resume and sha256),
``hubfetch`` (huggingface_hub), ``worker`` (lock, fetch, result), ``launch`` (spawn, find).
"""
