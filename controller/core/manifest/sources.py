"""``spec.source``: where a deployment's model files come from (DESIGN.md "Model files").

Pure: the manifest's pydantic models and the cache key of a source. The key is the
content's name in the shared model cache, so two deployments of one file share it:
a URL source is keyed by its sha256 (the bytes themselves), a hub source by
repo@revision and its file globs (what the hub will hand out for them).
"""

from __future__ import annotations

import re
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from controller.core.pulls import hub_key, url_key, url_origin
from controller.redact import redact_url

SHA256 = re.compile(r"^[0-9a-f]{64}$")
# owner/name as the hub spells repo ids (no '..', no leading '/': a key, never a path)
HF_REPO = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$"


class _Model(BaseModel):
    # specs.Model's configuration; specs imports this module, so it cannot import that one.
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class HuggingFace(_Model):
    repo: str = Field(
        pattern=HF_REPO, max_length=200, description="The hub repo id, e.g. Qwen/Qwen2.5-0.5B."
    )
    revision: str = Field(
        default="main",
        min_length=1,
        max_length=200,
        description="A branch, tag or commit (default main). A commit pins the files; a "
        "branch is pulled once and kept until `reconcile models prune`.",
    )
    files: tuple[str, ...] = Field(
        default=(),
        description="Globs of the files to pull (e.g. ['*q4_k_m.gguf']); empty: the whole repo.",
    )


class Source(_Model):
    hugging_face: HuggingFace | None = Field(
        default=None,
        description="Files from the Hugging Face hub (HF_ENDPOINT and HF_TOKEN as usual).",
    )
    url: str | None = Field(
        default=None,
        pattern=r"^https?://\S+$",
        description="One file over HTTP(S), resumed with Range requests; needs sha256.",
    )
    sha256: str | None = Field(
        default=None,
        description="The file's sha256 (64 hex digits): required with url, checked after "
        "the download (a mismatch never reaches the engine).",
    )

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        if value is not None and not SHA256.match(value.lower()):
            raise ValueError("sha256 must be 64 hexadecimal digits")
        return None if value is None else value.lower()

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if (self.hugging_face is None) == (self.url is None):
            raise ValueError("source takes exactly one of huggingFace or url")
        if self.url is not None and self.sha256 is None:
            raise ValueError("source.url needs source.sha256: the digest the file must have")
        if self.hugging_face is not None and self.sha256 is not None:
            raise ValueError("source.sha256 goes with url (the hub checks its own files)")
        return self

    @property
    def key(self) -> str:
        """The cache entry's name: hex and a prefix only, never a user's text."""
        if self.sha256 is not None:
            return url_key(self.sha256)
        hub = self.hugging_face
        assert hub is not None
        return hub_key(hub.repo, hub.revision, hub.files)

    @property
    def origin(self) -> str | None:
        """Which URL the file comes from (:func:`url_origin`); None for a hub source."""
        return url_origin(self.url) if self.url is not None else None

    def describe(self) -> str:
        """One line for messages and events: the URL (no secret in it), or repo@revision
        [files]."""
        if self.url is not None:
            return redact_url(self.url)
        hub = self.hugging_face
        assert hub is not None
        files = f" [{', '.join(hub.files)}]" if hub.files else ""
        return f"{hub.repo}@{hub.revision}{files}"
