"""The API key each probe of an engine presents, found when the probe is made and kept in
no record (DESIGN.md "Secrets"; docs/design.md, "API keys").

A pass has the entries it loaded: envFrom's values (resolved in memory each pass) and
llama.cpp's key file (read at load) are there, beside the args and env. A record whose
spec is the entry's (the same hash) is probed with the entry's key; any other (its
manifest gone, invalid, changed under it, or not read yet: a git source's first fetch)
with the key its own spec document gives, its args and env. The daemon's liveness prober
keeps the key it found for an engine as long as the engine runs (liveness.py): an engine
reads its key once, at its start.
"""

from __future__ import annotations

from collections.abc import Callable

from controller.core.engines.apikey import api_key, document_key
from controller.core.manifest.names import base_name
from controller.core.manifest.specs import Entry
from controller.core.plan import Desired
from controller.core.state import Record

Keys = Callable[[Record], str]  # a record -> the key its engine's probes present ("": none)


def keys_of(desired: Desired | None) -> Keys:
    """The keys of this pass's probes (``desired``: the pass's entries; None: none loaded,
    a preview's look)."""
    entries = {} if desired is None else desired.entries

    def key(rec: Record) -> str:
        entry = entries.get(base_name(rec.name))
        if entry is not None and entry.hash == rec.spec_hash:
            return entry_key(entry)
        return document_key(rec.stored_spec)

    return key


def no_keys(rec: Record) -> str:
    """What only the record itself says: its spec document's key."""
    return document_key(rec.stored_spec)


def entry_key(entry: Entry) -> str:
    """The key of ``entry``'s engine: its environment as render makes it (spec.env over
    envFrom's values) and llama.cpp's key file as the loader read it."""
    spec = entry.deployment.spec
    return api_key(spec.engine, spec.args, {**entry.secret_env, **spec.env}, entry.file_key)
