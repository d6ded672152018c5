"""The host-async sections of a run's `recjax.config.Config`: the engine (``runtime``), the Ray
backend (``ray``) and each host-async algorithm's own settings (``shadowsync``, ``gba``,
``persia``). `recjax.config` imports them; import them from there.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from recjax.config_fields import check_choices


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """The host-async engine (algorithms/runtime/): topology, PS, stragglers, modelled costs.

    Attributes:
      trainers: n trainers (dense replicas) of the Hogwild algorithms (async, shadow, fr).
      workers_per_trainer: m Hogwild worker threads per trainer.
      ps_shards: S embedding parameter-server shards.
      placement: embedding shard placement: mod | binpack (ShadowSync Sec. 3.1).
      stragglers: straggler model, e.g. none | lognormal:sigma=0.5 | slow:k=2,factor=4
        (threads, Ray: a straggler sleeps (factor - 1) x its measured gradient computation).
      bandwidth_gbps: bandwidth of a PS link (virtual clock; threads with emulate_links).
      sync_bandwidth_gbps: bandwidth of the dense links (sync PS, all-reduce, dense PS);
        0 = bandwidth_gbps.
      example_cost_us: virtual-clock compute time of one training example (before straggling).
      profile_batches: warm-up batches profiled for bin-packing placement (ShadowSync Sec. 3.1).
      emulate_links: threaded mode also holds each PS link for bytes / bandwidth (as the
        virtual clock does), so communication costs wall time on a single host.
      backend: how the roles run: threads (one process) | virtual (the virtual clock, one
        process; the same as --deterministic) | ray (PS shards and worker groups as Ray actor
        processes, on one box or a cluster: the ``ray`` section, docs/distributed.md).
      watchdog_s: a role (threads, ray) that makes no progress for this many seconds is named,
        its stack printed, and the run stopped with a checkpoint; 0 = no watchdog.
    """

    trainers: int = 2
    workers_per_trainer: int = 2
    ps_shards: int = 2
    placement: Literal["mod", "binpack"] = "mod"
    stragglers: str = "none"
    bandwidth_gbps: float = 10.0
    sync_bandwidth_gbps: float = 0.0
    example_cost_us: float = 20.0
    profile_batches: int = 20
    emulate_links: bool = True
    backend: Literal["threads", "virtual", "ray"] = "threads"
    watchdog_s: float = 300.0

    def __post_init__(self):
        check_choices(self, "runtime")
        if self.watchdog_s < 0:
            raise ValueError(f"runtime.watchdog_s must be >= 0 (0 = no watchdog), got "
                             f"{self.watchdog_s}")
        for name in ("trainers", "workers_per_trainer", "ps_shards", "profile_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"runtime.{name} must be >= 1, got {getattr(self, name)}")
        if self.bandwidth_gbps <= 0 or self.sync_bandwidth_gbps < 0:
            raise ValueError("runtime.bandwidth_gbps must be > 0 and runtime.sync_bandwidth_gbps "
                             ">= 0 (0 = bandwidth_gbps)")
        if self.example_cost_us < 0:
            raise ValueError(f"runtime.example_cost_us must be >= 0, got {self.example_cost_us}")

    @property
    def hogwild_workers(self) -> int:
        """n x m, the worker roles of the Hogwild topology (async, shadow, fr); GBA's and
        Persia's workers are their own sections' ``gba.workers`` and ``persia.nn_workers``."""
        return self.trainers * self.workers_per_trainer


SYNC_RULES = ("easgd", "ma", "bmuf", "none")  # shadowsync.sync (algorithms/sync_rules.py)


@dataclasses.dataclass(frozen=True)
class ShadowSyncConfig:
    """ShadowSync and its foreground baselines (algorithms/shadowsync.py; Zheng et al. 2020).

    Attributes:
      sync: sync rule: easgd | ma | bmuf | none.
      alpha: elastic / averaging weight a of the sync rules (Alg. 2-4).
      sync_gap: k, iterations between foreground syncs (FR-variants).
      bmuf_lr: BMUF block learning rate eta.
      bmuf_momentum: BMUF block momentum.
      nesterov: BMUF Nesterov momentum.
      return_model: which dense replica is the result: first (paper) | average.
      shadow_interval_ms: pause between two syncs of a shadow thread (0 = back to back); it
        stands for the sync's network round trip and leaves CPU to the workers on small hosts.
      easgd_form: S-EASGD's exchange (Alg. 2): sequential (the paper's two lines in order, the
        second reading the new wPS) | simultaneous (both from the old values, EASGD's elastic
        force): algorithms/sync_rules.easgd.
    """

    sync: Literal[SYNC_RULES] = "easgd"
    alpha: float = 0.5
    sync_gap: int = 10
    bmuf_lr: float = 1.0
    bmuf_momentum: float = 0.0
    nesterov: bool = False
    return_model: Literal["first", "average"] = "first"
    shadow_interval_ms: float = 5.0
    easgd_form: Literal["sequential", "simultaneous"] = "sequential"

    def __post_init__(self):
        check_choices(self, "shadowsync")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"shadowsync.alpha must be in [0, 1], got {self.alpha}")
        if self.sync_gap < 1:
            raise ValueError(f"--sync-gap (shadowsync.sync_gap) must be >= 1, got {self.sync_gap}")
        if self.shadow_interval_ms < 0:
            raise ValueError(f"shadowsync.shadow_interval_ms must be >= 0, got "
                             f"{self.shadow_interval_ms}")


GBA_MODES = ("gba", "sync", "async", "hop_bs", "bsp", "hop_bw")


@dataclasses.dataclass(frozen=True)
class GbaConfig:
    """GBA and its baselines on one PS (algorithms/gba.py; Su et al., NeurIPS 2022, Sec. 4-5).

    ``train.batch_size`` is the global batch (``B_s x N_s`` of the sync run it continues);
    every worker trains on local batches of ``local_batch_size`` (B_a) rows.

    Attributes:
      mode: gba | sync | async | hop_bs | bsp | hop_bw (Sec. 5.1).
      workers: N_a worker roles; 0 = M (the paper's choice, Sec. 4.1).
      local_batch_size: B_a; 0 = train.batch_size / workers (or / 4 when workers is 0).
      buffer: M, gradients aggregated per global step; 0 = train.batch_size / B_a, which keeps
        the global batch of the sync run (Sec. 4.1: M = B_s N_s / B_a).
      iota: staleness threshold of Eq. 1: a gradient with k - token > iota is dropped.
      b1: hop_bs: the fastest worker may be at most b1 batches (gradients pushed) ahead of the
        slowest active one; the paper's "versions apart" counted in batches (docs/gba.md).
      b2: bsp: gradients aggregated per update, regardless of version (0 = workers).
      b3: hop_bw: backup workers; each update waits for workers - b3 gradients and drops the
        b3 slowest of that round.
      embedding_mean: an embedding row's aggregated gradient is the sum of its applied rows
        divided by: touched = how many gradients of the update touched it, dropped rows
        included (App. B, Alg. 2 l. 23) | buffer = the gradients aggregated (the mean loss over
        the global batch, as sync training computes it).
      embedding_staleness: which staleness drops an embedding row's gradient: id = the global
        step after the row's last update minus the token, judged apart from the dense part, so
        an Eq. 1-dropped gradient's rows of scarce ids survive (App. B, Alg. 2 l. 19-21) |
        token = k - token: the rows go with their gradient's dense part (Eq. 1).
      dense_mean: the dense gradients' sum is divided by: buffer = M, dropped ones included
        (App. B, Alg. 2 l. 22) | kept = the gradients kept.
    """

    mode: Literal[GBA_MODES] = "gba"
    workers: int = 0
    local_batch_size: int = 0
    buffer: int = 0
    iota: int = 3
    b1: int = 2
    b2: int = 0
    b3: int = 1
    embedding_mean: Literal["touched", "buffer"] = "touched"
    embedding_staleness: Literal["id", "token"] = "id"
    dense_mean: Literal["buffer", "kept"] = "buffer"

    def __post_init__(self):
        check_choices(self, "gba")
        for name in ("workers", "local_batch_size", "buffer", "iota", "b1", "b2", "b3"):
            if getattr(self, name) < 0:
                raise ValueError(f"gba.{name} must be >= 0, got {getattr(self, name)}")


PERSIA_MODES = ("hybrid", "sync", "async")
PERSIA_COMPRESS = ("none", "ids", "fp16", "both")


@dataclasses.dataclass(frozen=True)
class RayConfig:
    """The Ray backend of the host-async engine (``--backend ray``; algorithms/runtime/ray_backend.py).

    Attributes:
      address: "" starts a local Ray instance for the run (stopped at its end); "auto" or
        "HOST:PORT" joins a running cluster (``ray start --head`` / ``ray start --address``).
      num_cpus: CPUs of the local instance (0 = every core); ignored when joining a cluster.
      ps_concurrency: requests a PS actor serves at once (pulls and pushes of different
        workers overlap, as the threaded shards do).
      snapshot_every: pushes a PS actor applies between two in-memory snapshots; a PS actor
        that dies is restarted from its last one (the pushes in between are lost, counted).
      ps_resource: a custom Ray resource every PS actor asks for one unit of (place the shards
        on the hosts started with ``--resources '{"NAME": k}'``); "" = anywhere.
      worker_resource: the same for the worker-group actors.
      kill: fault injection, comma-separated: ``worker:W@I`` sends SIGKILL to worker W's
        process when W begins its I-th iteration; ``ps:S@I`` to PS shard S's process as its
        I-th push is sent.
      max_ps_restarts: PS restarts before the run stops with a checkpoint and says why.
      inline_kb: objects up to this many KiB travel inside a call's message (through its
        caller, who owns the reply); larger ones through Ray's shared-memory object store,
        read in place on the same host. On the 2-core box small messages are cheaper inline
        (a 131 KB reply 2.2 ms against 4.2 through the store) and messages of a few MB
        cheaper through the store (8 MB: 7.3 ms against 16.3): at 1024 every host-async
        algorithm ran as fast as at 16384 or faster (Persia 0.62 -> 0.69 of threads,
        docs/performance.md). Local instance only (a cluster keeps its own setting).
      roles: where the worker roles run. ``actors``: each worker's role (its loop of take,
        pull, compute, push) runs in its worker actor, which reads its own shard of the data
        and talks to the PS actors itself (the dense PS is an actor too); the driver only
        starts them, hands out steps in chunks and watches (issue 38). ``driver``: the roles
        run in the driver's threads and each step is one call from there.
        ``auto``: ``actors`` for the algorithms whose roles run there (every host-async one:
        async, GBA, ShadowSync and its FR baselines, Persia, whose embedding workers are
        actors of their own), not for an in-memory source of the driver's; an algorithm not
        ported would refuse ``actors`` with the reason (recjax/registry.py).
      dense_shards: with the roles in the actors, the dense server cut into this many actors,
        each holding (or reducing) a block of whole parameter arrays: async's dense PS
        (Downpour's sharded PS, Dean et al. 2012 Sec. 4.1; algorithms/runtime/ray_dense.py;
        not with ``dense.clip_norm``), ShadowSync's EASGD sync PS (`ray_dense.SyncShards`)
        and MA / BMUF all-reduce (`ray_wire.BlockGroup`), Persia's NN workers' dense replica
        and all-reduce (`ray_dense.GroupBlocks`; its async mode's dense PS as async's). Refused
        where there is no such server (GBA's PS0, ShadowSync's ``--sync none``).
      chunk_s: with the roles in the actors, seconds of steps a worker actor runs per call of
        the driver (it stops at the next step boundary after this): the driver's work is per
        chunk, not per step; a stop, an eval or a checkpoint waits for at most one chunk.
      final_tables: the run's returned ``final_state`` holds every table, gathered from the
        shard actors into the driver at the end (what `algorithms.run` and `recjax.api`
        callers read). False: the driver holds no table at the end (evaluation pulls each
        batch's rows from the shards, as the workers do; each shard writes its own tables
        into a checkpoint) unless it writes out/best or the store is LRU; the returned
        state's tables are empty. ``scripts/train.py`` sets it
        false: it prints the summary and never reads the state.
    """

    address: str = ""
    num_cpus: int = 0
    ps_concurrency: int = 4
    snapshot_every: int = 50
    ps_resource: str = ""
    worker_resource: str = ""
    kill: str = ""
    max_ps_restarts: int = 3
    inline_kb: int = 1024
    roles: Literal["auto", "driver", "actors"] = "auto"
    dense_shards: int = 1
    chunk_s: float = 0.5
    final_tables: bool = True

    def __post_init__(self):
        check_choices(self, "ray")
        if not self.chunk_s > 0:
            raise ValueError(f"ray.chunk_s must be > 0 seconds, got {self.chunk_s}")
        for name in ("num_cpus", "max_ps_restarts"):
            if getattr(self, name) < 0:
                raise ValueError(f"ray.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("ps_concurrency", "snapshot_every", "inline_kb", "dense_shards"):
            if getattr(self, name) < 1:
                raise ValueError(f"ray.{name} must be >= 1, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class PersiaConfig:
    """Persia's hybrid training and its two baselines (algorithms/persia.py; Lian et al., KDD 2022,
    Alg. 1-2, Sec. 4).

    ``train.batch_size`` is the global batch of one dense step: every NN worker trains on
    ``batch_size / nn_workers`` rows of it.

    Attributes:
      mode: hybrid = embeddings asynchronous (staleness <= staleness), dense all-reduced every
        step (Alg. 1 + 2) | sync = no outstanding embedding update (staleness 0), dense
        all-reduced | async = embeddings as hybrid, dense on an async PS (Downpour), no
        all-reduce.
      nn_workers: NN workers (dense forward/backward, all-reduce).
      embedding_workers: embedding workers (lookup, pooling, the gradient path to the PS).
      staleness: tau: a lookup for a global batch may start only while at most tau earlier
        batches have been looked up and not yet applied to the embedding PS (Sec. 5, Eq. 5);
        0 = synchronous embeddings.
      compress: none | ids (unique ids + uint16 indices) | fp16 (per-block scaled fp16
        activations and gradients) | both (Sec. 4.2.3).
      kappa: the constant of the fp16 scaling (a block v is sent as fp16(kappa * v / |v|_inf)).
      embedding_cost_us: modelled embedding-worker time per looked-up id (virtual clock), for
        the lookup and again for the gradient path.
      embedding_stragglers: straggler SPEC of the embedding workers (as runtime.stragglers,
        which slows the NN workers: a slow NN worker sleeps (factor - 1) x its timed
        forward/backward; a slow embedding worker (factor - 1) x the wall time of each task's
        step, its lookups and pushes being its compute).
      snapshot_every: global steps between in-memory snapshots of the embedding PS shards and
        the dense model (recovery, Sec. 4.2.4); 0 = only at the start.
      fail_ps_at: fault injection: at this global step embedding PS shard 0 loses its state
        and is restored from its last snapshot (0 = never).
      fail_nn_at: fault injection: at this global step NN worker 0 fails and every NN worker
        reloads the last dense snapshot (0 = never).
    """

    mode: Literal[PERSIA_MODES] = "hybrid"
    nn_workers: int = 2
    embedding_workers: int = 2
    staleness: int = 4
    compress: Literal[PERSIA_COMPRESS] = "none"
    kappa: float = 32768.0
    embedding_cost_us: float = 0.5
    embedding_stragglers: str = "none"
    snapshot_every: int = 50
    fail_ps_at: int = 0
    fail_nn_at: int = 0

    def __post_init__(self):
        check_choices(self, "persia")
        for name in ("nn_workers", "embedding_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"persia.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("staleness", "snapshot_every", "fail_ps_at", "fail_nn_at"):
            if getattr(self, name) < 0:
                raise ValueError(f"persia.{name} must be >= 0, got {getattr(self, name)}")
        if not 1.0 <= self.kappa <= 65504.0:
            raise ValueError(f"persia.kappa must be in [1, 65504] (fp16's largest value), got "
                             f"{self.kappa}")
        if self.embedding_cost_us < 0:
            raise ValueError(f"persia.embedding_cost_us must be >= 0, got "
                             f"{self.embedding_cost_us}")
