"""A checkpoint format with no pickle in it: torch.distributed.checkpoint (sharded tensors, any number of
ranks) with its metadata written as JSON instead of a pickle, and a load planner that refuses non-tensor
items (DCP would unpickle them).

A checkpoint folder is often a shared volume that others can write to: a planted `.metadata` pickle or
a pickled item would run code in the trainer when it resumes. Here the metadata is rebuilt only from a
fixed set of DCP's own dataclasses, and tensor data is read with `torch.load(weights_only=True)` (DCP's
own reader); everything else a checkpoint holds is JSON.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from flashdraft.errors import UserError

METADATA_NAME = "metadata.json"
# The only classes a metadata file may name.
_CLASSES = {cls.__name__: cls for cls in (Metadata, TensorStorageMetadata, BytesStorageMetadata,
                                          ChunkStorageMetadata, TensorProperties, MetadataIndex, StorageMeta,
                                          _StorageInfo)}
_ENUMS = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}


def _encode(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    for kind, cls in _ENUMS.items():
        if isinstance(value, cls):
            return {kind: str(value).removeprefix("torch.")}
    if dataclasses.is_dataclass(value) and type(value).__name__ in _CLASSES:
        fields = {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"class": type(value).__name__, "fields": fields}
    if isinstance(value, dict):
        return {"items": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"checkpoint metadata holds a {type(value).__name__}, which has no JSON form")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "size" in value:
        return torch.Size(value["size"])
    for kind, cls in _ENUMS.items():
        if kind in value:
            member = getattr(torch, value[kind], None)
            if not isinstance(member, cls):
                raise ValueError(f"unknown {kind} {value[kind]!r}")
            return member
    if "class" in value:
        cls = _CLASSES[value["class"]]  # KeyError for any other class: nothing else is ever built
        return cls(**{name: _decode(v) for name, v in value["fields"].items()})
    if "items" in value:
        return {_hashable(_decode(k)): _decode(v) for k, v in value["items"]}
    if "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    raise ValueError(f"unknown metadata entry {sorted(value)}")


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


class JsonMetadataWriter(FileSystemWriter):
    """DCP's file writer, with the metadata saved as JSON (METADATA_NAME) instead of a pickle."""

    def finish(self, metadata: Metadata, results) -> None:
        metadata.storage_data = {item.index: item.storage_data for writes in results for item in writes}
        metadata.storage_meta = self.storage_meta()
        path = Path(self.path) / METADATA_NAME
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w") as handle:
            json.dump(_encode(metadata), handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)


class JsonMetadataReader(FileSystemReader):
    """DCP's file reader, reading the JSON metadata and never a pickle."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / METADATA_NAME
        try:
            metadata = _decode(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UserError(f"checkpoint metadata {path} is unreadable ({type(err).__name__}: {err})") from err
        if not isinstance(metadata, Metadata):
            raise UserError(f"checkpoint metadata {path} does not describe a checkpoint")
        metadata.storage_meta = metadata.storage_meta or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class TensorsOnlyLoadPlanner(DefaultLoadPlanner):
    """Loads tensors only: a non-tensor item would be unpickled, so finding one is an error."""

    def load_bytes(self, read_item, value) -> None:
        raise UserError(f"checkpoint item {read_item.dest_index.fqn} is not a tensor; flashdraft checkpoints hold "
                        "only tensors (and JSON): this one was not written by flashdraft")
