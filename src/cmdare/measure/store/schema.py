"""The measurement store's tables (SQLAlchemy 2 declarative).

One schema holds what cmdare measures itself (runs, servers, events, step/shard/eval metrics,
staleness, checkpoints) and what others published (single-GPU and cluster speed, startup phases,
checkpoint timings, lifetimes, chief-rejoining curves). ``source`` columns say where a row came
from; ``import_id`` links imported rows to the :class:`Import` that wrote them.
Times are unix seconds (float) unless the column name says otherwise.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    """Declarative base of every store table."""

    type_annotation_map = {dict[str, Any]: JSON}


class Import(Base):
    """One imported file: makes imports idempotent (same kind and content hash -> skipped)."""

    __tablename__ = "imports"
    __table_args__ = (UniqueConstraint("kind", "sha256", name="uq_imports_kind_sha256"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(String(1024))
    sha256: Mapped[str] = mapped_column(String(64))
    rows_read: Mapped[int] = mapped_column(Integer, default=0)
    rows_imported: Mapped[int] = mapped_column(Integer, default=0)
    rows_skipped: Mapped[int] = mapped_column(Integer, default=0)
    imported_at: Mapped[float] = mapped_column(Float)


class Run(Base):
    """One training run (cmdare's own, or an imported TensorBoard run)."""

    __tablename__ = "runs"

    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    model: Mapped[str | None] = mapped_column(String(128))
    dataset: Mapped[str | None] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(32), default="running")
    started_at: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    code_version: Mapped[str] = mapped_column(String(128), default="")
    emulated: Mapped[bool] = mapped_column(Boolean, default=False)
    resumed_from_step: Mapped[int] = mapped_column(Integer, default=0)
    final_step: Mapped[int | None] = mapped_column(BigInteger)
    final_accuracy: Mapped[float | None] = mapped_column(Float)
    final_loss: Mapped[float | None] = mapped_column(Float)
    steps_per_s: Mapped[float | None] = mapped_column(Float)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    source: Mapped[str] = mapped_column(String(64), default="cmdare")
    import_id: Mapped[int | None] = mapped_column(ForeignKey("imports.id"))


class RunPartRow(Base):
    """One part of a run: its first ``cmdare train`` or a ``--resume`` of it (:mod:`cmdare.measure.run_parts`).

    The run's figures in all (``runs.cost_usd``, its summary's revocations and replacements) are the sums over
    its parts; a column left NULL is not known (the part is running, or stopped without an end).
    """

    __tablename__ = "run_parts"
    __table_args__ = (UniqueConstraint("run_id", "part", name="uq_run_parts_run_part"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(128), index=True)
    part: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float | None] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(32), default="running")
    from_step: Mapped[int] = mapped_column(BigInteger, default=0)
    to_step: Mapped[int | None] = mapped_column(BigInteger)
    ended_at: Mapped[float | None] = mapped_column(Float)
    wall_s: Mapped[float | None] = mapped_column(Float)
    steps_per_s: Mapped[float | None] = mapped_column(Float)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    revocations: Mapped[int | None] = mapped_column(Integer)
    replacements: Mapped[int | None] = mapped_column(Integer)
    time_lost_s: Mapped[float | None] = mapped_column(Float)
    emulated: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class Server(Base):
    """A server (VM or local Ray node): type, price, phase timestamps and why it ended.

    ``emulated`` marks a local stand-in for a cloud VM (its GPU type and price are the catalog's, its
    start-up phases drawn from the startup model); imported and real-cluster servers are False.
    """

    __tablename__ = "servers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    server_id: Mapped[str] = mapped_column(String(128), index=True)
    run_id: Mapped[str | None] = mapped_column(String(128), index=True)
    role: Mapped[str] = mapped_column(String(16), default="worker")  # worker, ps, head
    gpu_type: Mapped[str | None] = mapped_column(String(32))
    region: Mapped[str | None] = mapped_column(String(64))
    cloud: Mapped[str | None] = mapped_column(String(32))
    transient: Mapped[bool] = mapped_column(Boolean, default=False)
    price_per_hour_usd: Mapped[float | None] = mapped_column(Float)
    requested_at: Mapped[float | None] = mapped_column(Float)
    provisioned_at: Mapped[float | None] = mapped_column(Float)
    booted_at: Mapped[float | None] = mapped_column(Float)
    joined_at: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    end_reason: Mapped[str | None] = mapped_column(String(64))
    provisioning_s: Mapped[float | None] = mapped_column(Float)
    staging_s: Mapped[float | None] = mapped_column(Float)
    booting_s: Mapped[float | None] = mapped_column(Float)
    joining_s: Mapped[float | None] = mapped_column(Float)
    emulated: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    source: Mapped[str] = mapped_column(String(64), default="cmdare")
    import_id: Mapped[int | None] = mapped_column(ForeignKey("imports.id"))


class Event(Base):
    """A cluster event: revocation, notice, replacement, chief change, checkpoint, PS move, ..."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_run_time", "run_id", "time"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(128))
    time: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    global_step: Mapped[int] = mapped_column(BigInteger, default=0)
    worker_id: Mapped[int | None] = mapped_column(Integer)
    shard_id: Mapped[int | None] = mapped_column(Integer)
    server_id: Mapped[str | None] = mapped_column(String(128))
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class StepMetric(Base):
    """Progress of one worker over one chunk of steps."""

    __tablename__ = "step_metrics"
    __table_args__ = (Index("ix_step_metrics_run_step", "run_id", "global_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(128))
    time: Mapped[float] = mapped_column(Float)
    global_step: Mapped[int] = mapped_column(BigInteger)
    worker_id: Mapped[int] = mapped_column(Integer)
    steps: Mapped[int] = mapped_column(Integer)
    duration_s: Mapped[float] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float)
    cluster_steps_per_s: Mapped[float | None] = mapped_column(Float)
    compute_s: Mapped[float | None] = mapped_column(Float)
    comm_s: Mapped[float | None] = mapped_column(Float)


class ShardMetric(Base):
    """Load of one parameter shard since its previous report."""

    __tablename__ = "shard_metrics"
    __table_args__ = (Index("ix_shard_metrics_run_step", "run_id", "global_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(128))
    time: Mapped[float] = mapped_column(Float)
    global_step: Mapped[int] = mapped_column(BigInteger)
    shard_id: Mapped[int] = mapped_column(Integer)
    pushes: Mapped[int] = mapped_column(Integer)
    bytes_in: Mapped[int] = mapped_column(BigInteger)
    bytes_out: Mapped[int] = mapped_column(BigInteger)
    busy_s: Mapped[float] = mapped_column(Float)
    num_params: Mapped[int] = mapped_column(BigInteger, default=0)
    apply_s: Mapped[float | None] = mapped_column(Float)  # optimizer update part of busy_s
    queue_s: Mapped[float | None] = mapped_column(Float)  # summed over pushes: send to start of service
    wait_s: Mapped[float | None] = mapped_column(Float)  # summed over pushes: worker-observed send to reply


class BlockMetric(Base):
    """Load of one parameter block on its shard since the previous report (see ``BlockLoad``)."""

    __tablename__ = "block_metrics"
    __table_args__ = (Index("ix_block_metrics_run_step", "run_id", "global_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(128))
    time: Mapped[float] = mapped_column(Float)
    global_step: Mapped[int] = mapped_column(BigInteger)
    block_id: Mapped[int] = mapped_column(Integer)
    shard_id: Mapped[int] = mapped_column(Integer)
    pushes: Mapped[int] = mapped_column(Integer)
    bytes_in: Mapped[int] = mapped_column(BigInteger)
    bytes_out: Mapped[int] = mapped_column(BigInteger)
    apply_s: Mapped[float] = mapped_column(Float)
    queue_s: Mapped[float] = mapped_column(Float)
    wait_s: Mapped[float] = mapped_column(Float)


class EvalMetric(Base):
    """Test-set accuracy and loss at a global step."""

    __tablename__ = "eval_metrics"
    __table_args__ = (Index("ix_eval_metrics_run_step", "run_id", "global_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(128))
    time: Mapped[float] = mapped_column(Float)
    global_step: Mapped[int] = mapped_column(BigInteger)
    worker_id: Mapped[int | None] = mapped_column(Integer)
    accuracy: Mapped[float | None] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float)


class Staleness(Base):
    """Histogram of push staleness per worker: ``count`` pushes had staleness ``staleness``."""

    __tablename__ = "staleness"
    __table_args__ = (UniqueConstraint("run_id", "worker_id", "staleness", name="uq_staleness_bin"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(128))
    worker_id: Mapped[int] = mapped_column(Integer)
    staleness: Mapped[int] = mapped_column(Integer)
    count: Mapped[int] = mapped_column(BigInteger)


class Checkpoint(Base):
    """A checkpoint: written by a cmdare run, or an imported timing measurement (run_id NULL)."""

    __tablename__ = "checkpoints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str | None] = mapped_column(String(128), index=True)
    time: Mapped[float | None] = mapped_column(Float)
    step: Mapped[int | None] = mapped_column(BigInteger)
    worker_id: Mapped[int | None] = mapped_column(Integer)
    path: Mapped[str | None] = mapped_column(String(1024))
    model_name: Mapped[str | None] = mapped_column(String(128))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    num_tensors: Mapped[int | None] = mapped_column(Integer)
    num_params: Mapped[int | None] = mapped_column(BigInteger)
    local_duration_s: Mapped[float] = mapped_column(Float)
    remote_duration_s: Mapped[float | None] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(64), default="cmdare")
    import_id: Mapped[int | None] = mapped_column(ForeignKey("imports.id"))


class SpeedSample(Base):
    """Single-GPU training speed of one CNN."""

    __tablename__ = "speed_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(64))
    gpu_type: Mapped[str | None] = mapped_column(String(32))
    gpu_tflops: Mapped[float | None] = mapped_column(Float)
    model_name: Mapped[str | None] = mapped_column(String(128))
    model_flops: Mapped[float | None] = mapped_column(Float)
    num_params: Mapped[int | None] = mapped_column(BigInteger)
    num_tensors: Mapped[int | None] = mapped_column(Integer)
    avg_tensor_mb: Mapped[float | None] = mapped_column(Float)
    max_tensor_mb: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    steps_per_s: Mapped[float] = mapped_column(Float)
    step_time_s: Mapped[float | None] = mapped_column(Float)
    emulated: Mapped[bool] = mapped_column(Boolean, default=False)
    import_id: Mapped[int | None] = mapped_column(ForeignKey("imports.id"))


class ClusterSpeedSample(Base):
    """Cluster training speed (global steps/s) at one point of a run with ``workers`` and ``ps``."""

    __tablename__ = "cluster_speed_samples"
    __table_args__ = (Index("ix_cluster_speed_group", "gpu_type", "model_name", "workers", "ps"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[str | None] = mapped_column(String(128))
    gpu_type: Mapped[str | None] = mapped_column(String(32))
    model_name: Mapped[str | None] = mapped_column(String(128))
    workers: Mapped[int] = mapped_column(Integer)
    ps: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(BigInteger)
    wall_time: Mapped[float | None] = mapped_column(Float)
    steps_per_s: Mapped[float] = mapped_column(Float)
    import_id: Mapped[int | None] = mapped_column(ForeignKey("imports.id"))


class LifetimeObservation(Base):
    """How long one transient server lived, and whether it was preempted (else censored)."""

    __tablename__ = "lifetime_observations"
    __table_args__ = (Index("ix_lifetimes_type", "server_type"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(128))
    server_type: Mapped[str] = mapped_column(String(64))  # k80, p100, v100, cpu, gpu, ...
    machine_type: Mapped[str | None] = mapped_column(String(64))
    region: Mapped[str | None] = mapped_column(String(64))
    zone: Mapped[str | None] = mapped_column(String(64))
    idle: Mapped[bool | None] = mapped_column(Boolean)
    start: Mapped[float | None] = mapped_column(Float)
    end: Mapped[float | None] = mapped_column(Float)
    lifetime_s: Mapped[float] = mapped_column(Float)
    preempted: Mapped[bool] = mapped_column(Boolean)
    hour_of_day: Mapped[int | None] = mapped_column(Integer)  # local hour the server ended
    import_id: Mapped[int | None] = mapped_column(ForeignKey("imports.id"))


class ChiefRejoinPoint(Base):
    """Test accuracy over steps when the chief is revoked and rejoins (or a baseline run)."""

    __tablename__ = "chief_rejoin_points"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(64))
    experiment: Mapped[str] = mapped_column(String(128))
    rejoin_step: Mapped[int | None] = mapped_column(Integer)  # None for a baseline
    step: Mapped[int] = mapped_column(BigInteger)
    wall_time: Mapped[float | None] = mapped_column(Float)
    accuracy: Mapped[float] = mapped_column(Float)
    import_id: Mapped[int | None] = mapped_column(ForeignKey("imports.id"))


METRIC_TABLES = ("step_metrics", "shard_metrics", "block_metrics", "eval_metrics", "events", "checkpoints",
                 "staleness")
