"""What every event shares (`_Event`: its time and schema version, a tagged struct) and the
small values events carry (a placement's `Slot`, a resume's `ResumePoint`)."""

from __future__ import annotations

import msgspec

from .input_types import SCHEMA_VERSION

# A field that is left out of an event's bytes while unset (msgspec.UNSET), whatever the
# event type's `omit_defaults`: a field added this way leaves every event that does not set
# it byte for byte as before.
OUTPUT_CAP_UNSET = msgspec.UNSET


class Slot(msgspec.Struct, array_like=False, frozen=True):
    """GPUs of one node in a placement."""

    node: str
    gpus: list[int]


class _Event(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=False):
    t: int
    v: int = SCHEMA_VERSION


class ResumePoint(msgspec.Struct, kw_only=True, frozen=True):
    """A checkpoint a resume may start from: its step, digest and where it lies."""

    step: int
    digest: str
    path: str
    # The node whose host reported it, and keeps its second copy (unset: the log does not say).
    node: str | msgspec.UnsetType = msgspec.UNSET
