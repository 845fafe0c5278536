"""Read what an offline W&B run recorded (history keys and summary) from its ``run-*.wandb`` file,
so tests can check metrics reached W&B without a server. The file is a LevelDB-style log of
``wandb_internal_pb2.Record`` protobufs in 32 KiB blocks after a 7-byte header."""
from __future__ import annotations

import struct
from pathlib import Path

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes):
    pos, buf = HEADER, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        chunk, pos = data[pos:pos + length], pos + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            buf = chunk
        elif kind == MIDDLE:
            buf += chunk
        elif kind == LAST:
            yield buf + chunk
            buf = b""


def read_run(path: Path) -> tuple[set[str], dict[str, str]]:
    from wandb.proto import wandb_internal_pb2 as pb

    keys: set[str] = set()
    summary: dict[str, str] = {}
    data = Path(path).read_bytes()
    if len(data) <= HEADER:
        raise AssertionError(f"{path} holds no records (only its {len(data)}-byte header): the run was read "
                             "before wandb flushed it (finish() alone does not wait for that in wandb >= 0.2x)")
    for raw in _payloads(data):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        items = rec.history.item if kind == "history" else rec.summary.update if kind == "summary" else []
        for item in items:
            key = item.key or "/".join(item.nested_key)
            if kind == "history":
                keys.add(key)
            else:
                summary[key] = item.value_json
    return keys, summary


def read_run_info(path: Path) -> dict:
    """The run's own fields as the offline log holds them (its first ``run`` record): W&B run id,
    display name, group, job type, and the config keys it was given."""
    from wandb.proto import wandb_internal_pb2 as pb

    info: dict = {"config": {}}
    for raw in _payloads(Path(path).read_bytes()):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "run" and "id" not in info:
            run = rec.run
            info.update(id=run.run_id, name=run.display_name, group=run.run_group, job_type=run.job_type)
            info["config"].update({item.key or "/".join(item.nested_key): item.value_json for item in run.config.update})
        elif kind == "config":
            info["config"].update({item.key or "/".join(item.nested_key): item.value_json for item in rec.config.update})
    return info
