"""The planner's policies, one module each, under one planning ledger.

``controller.core.plan`` is the public entry (``plan()``, ``Desired``, ``backoff``...);
these modules are its parts, imported only through it. Bottom up, none importing a
later one:

``context``    the plan's frozen inputs, and the requests judging hands on (Want, Roll,
               Prefetch)
``ledger``     what this plan hands out (devices, ports, instances): start or hold
``lifecycle``  a record's life once it runs: readiness, crash, back-off, resync
``recreate``   a changed spec's instance gives way (its new model files pulled first)
``rolling``    RollingUpdate: ``<name>@next`` beside the old instance, then promote
``ondemand``   OnDemand: park idle engines, swap out the least recently used
``preemption`` priority: stop the fewest, lowest deployments so a higher one fits
``placing``    the starts, highest priority first, each a Start, a swap, a preemption
               or a Hold
``records``    judge every name: new, ours, another set's, reservations, orphans
``pulling``    model files first: a start whose source is not cached becomes a Pull
"""
