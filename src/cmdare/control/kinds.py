"""The closed sets of names commands and events carry: string enums, so a value compares equal to its name (and
reads as it in JSON and the store) while a type checker and a reader see the whole set."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Destination", "DutyKind", "ShardAction"]


class DutyKind(StrEnum):
    """A chief's duty: store a checkpoint, or evaluate on the test set."""

    CHECKPOINT = "checkpoint"
    EVAL = "eval"


class ShardAction(StrEnum):
    """An action on quiesced state (``ActionDone.action``): the shards', or an all-reduce group's (``regroup``)."""

    EVACUATE = "evacuate"
    PARK = "park"
    UNPARK = "unpark"
    FILL = "fill"
    RESTORE = "restore"
    PLACEMENT = "placement"
    REGROUP = "regroup"


class Destination(StrEnum):
    """Where a noticed PS server's blocks go: the other shards, or (the last shard's) its replacement."""

    SURVIVORS = "survivors"
    REPLACEMENT = "replacement"
