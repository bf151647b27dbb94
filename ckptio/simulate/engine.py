"""The engine of a simulation: SimPy processes for nodes, streams and ranks; shared pipes and
the prefixes' token buckets."""

from __future__ import annotations

import gc
import math
import random
from collections import deque
from collections.abc import Generator, Iterator
from typing import Any

import numpy as np

from ckptio import errors
from ckptio import format as fmt
from ckptio.protocol import save_protocol_requests
from ckptio.simulate.job import Job
from ckptio.simulate.results import Bound
from ckptio.simulate.storage import ROOT_PREFIX, Latency, Storage
from ckptio.stallmodel import RESTORE_PREAMBLE_OPS
from ckptio.units import human_seconds
from ckptio.workload import Plan

__all__ = ["STEP", "ObjectList", "Replication", "plan_work"]

STEP = 1  # the step whose keys the simulation names (any: only the prefix matters)

# -- the engine ------------------------------------------------------------------------------


class _Pipe:
    """A shared link of ``rate`` bytes/s, first come first served: bytes entering at ``t``
    leave after those queued before them (the Lindley recursion)."""

    __slots__ = ("free", "kind", "rate")

    def __init__(self, rate: float, kind: str) -> None:
        self.rate = rate
        self.free = 0.0
        self.kind = kind

    def finish(self, t: float, nbytes: float) -> float:
        start = t if t > self.free else self.free
        self.free = start + nbytes / self.rate
        return self.free


class _Bucket:
    """A prefix's request rate in one direction: a token bucket of ``rate`` tokens/s holding
    ``depth`` of them."""

    __slots__ = ("depth", "last", "rate", "refused", "tokens")

    def __init__(self, rate: float, depth: float) -> None:
        self.rate, self.depth = rate, max(1.0, depth)
        self.tokens, self.last, self.refused = self.depth, 0.0, 0

    def take(self, now: float) -> bool:
        tokens = self.tokens + (now - self.last) * self.rate
        self.last = now
        if tokens > self.depth:
            tokens = self.depth
        if tokens >= 1.0:
            self.tokens = tokens - 1.0
            return True
        self.tokens = tokens
        self.refused += 1
        return False


class _Draw:
    """Latencies of one distribution, drawn in blocks (one numpy call per 4,096)."""

    __slots__ = ("buf", "const", "dist", "i", "rng")

    def __init__(self, dist: Latency, rng: np.random.Generator) -> None:
        self.dist, self.rng = dist, rng
        self.const = None if dist.random else dist.median
        self.buf: list[float] = []
        self.i = 0

    def __call__(self) -> float:
        if self.const is not None:
            return self.const
        if self.i >= len(self.buf):
            self.buf = self.dist.draw(self.rng, 4096).tolist()
            self.i = 0
        v = self.buf[self.i]
        self.i += 1
        return v


class _Node:
    __slots__ = (
        "backoff",
        "factor",
        "idle",
        "index",
        "lat",
        "nlat",
        "pipe",
        "pipes",
        "queue",
        "rate",
        "straggler",
        "wait",
        "waits",
        "weight",
        "xfer",
    )

    def __init__(self, index: int, weight: int, straggler: bool, factor: float) -> None:
        self.index, self.weight, self.straggler, self.factor = index, weight, straggler, factor
        self.lat = self.xfer = self.wait = self.backoff = 0.0
        self.nlat = 0
        self.waits: dict[str, float] = {}
        self.pipe: _Pipe | None = None
        self.pipes: list[tuple[_Pipe, float]] | None = None
        self.queue: deque[tuple[_Object, int]] = deque()
        self.idle: list[Any] = []
        self.rate = 0.0


class _Object:
    __slots__ = ("bucket", "done", "failed", "left", "pipes", "rank")

    def __init__(self, rank: _Rank, left: int, bucket: _Bucket | None, done: Any) -> None:
        self.rank, self.left, self.bucket, self.done = rank, left, bucket, done
        self.failed = False
        self.pipes: list[tuple[_Pipe, float]] = []


class _Rank:
    __slots__ = ("end", "failed", "index", "node", "todo")

    def __init__(self, index: int, node: _Node, todo: Iterator[tuple[int, int, int]]) -> None:
        self.index, self.node, self.todo = index, node, todo
        self.failed = False
        self.end = 0.0


#: (source rank, number, bytes) of each object a rank writes or reads
ObjectList = tuple[tuple[int, int, int], ...]


def _objects(plan: Plan, src: int, model: bool, optim: bool) -> ObjectList:
    """The objects of plan rank ``src`` (numbered as the runner names them: weights first),
    the weights' and/or the optimizer's."""
    size = plan.object_size
    out = []
    number = 0
    for take, nbytes in ((model, int(plan.model_bytes[src])), (optim, int(plan.optim_bytes[src]))):
        for start in range(0, nbytes, size):
            if take:
                out.append((src, number, min(size, nbytes - start)))
            number += 1
    return tuple(out)


def plan_work(job: Job, phase: str) -> list[ObjectList]:
    """What each process (a plan rank at full scale) writes, or reads in a restore."""
    plan = job.plan
    if job.processes is not None:
        return [
            tuple(o for r in ranks for o in _objects(plan, r, True, True))
            for ranks in job.processes
        ]
    if phase != "restore" or job.readers == "writers":
        return [_objects(plan, r, True, True) for r in range(plan.ranks)]
    # every rank reads what it holds: the weights of its model-parallel shard (written by
    # data-parallel rank 0 unless ZeRO 3 shards them) and its optimizer state (its own with
    # ZeRO >= 1, else its model-parallel shard's)
    lay = plan.layout
    mp = lay.tp * lay.pp
    out = []
    for r in range(plan.ranks):
        src_m = r if lay.zero == 3 else r % mp
        src_o = r if lay.zero >= 1 else r % mp
        if src_m == src_o:
            out.append(_objects(plan, src_m, True, True))
        else:
            out.append(_objects(plan, src_m, True, False) + _objects(plan, src_o, False, True))
    return out


class Replication:
    """One phase of one checkpoint in virtual time (a fresh SimPy environment)."""

    def __init__(
        self,
        job: Job,
        storage: Storage,
        phase: str,
        work: list[ObjectList],
        *,
        rng: np.random.Generator,
        jitter: random.Random,
        stragglers: set[int],
        slowdown: float,
        aggregate: bool,
        only_nodes: set[int] | None = None,
    ) -> None:
        simpy = errors.require("simpy", extra="sim", purpose="simulating a checkpoint")
        self.env = simpy.Environment()
        self.job, self.storage, self.phase = job, storage, phase
        self.objects = sum(len(objs) for objs in work)
        self.reading = phase == "restore"
        p = storage.profile
        self.streams = job.streams or p.streams
        self.part = job.part_size or p.part_size
        self.retry = storage.retry
        self.jitter = jitter.uniform
        self.rng = rng
        self.attempts = self.requests = self.throttled = self.retried = self.failed_req = 0
        self.bytes = 0
        self.failed = False
        self.first_failed: _Rank | None = None
        rpn = job.ranks_per_node
        nodes_work: dict[int, list[tuple[int, ObjectList]]] = {}
        for r, objs in enumerate(work):
            if objs and (only_nodes is None or r // rpn in only_nodes):
                nodes_work.setdefault(r // rpn, []).append((r, objs))
        # which nodes stand for others: identical work, same straggler status
        classes: dict[Any, list[int]] = {}
        for n, ranks in nodes_work.items():
            key = (
                (n in stragglers, tuple(tuple(b for _, _, b in objs) for _, objs in ranks))
                if aggregate
                else n
            )
            classes.setdefault(key, []).append(n)
        self.classes = len(classes)
        sbw = p.side("stream_bandwidth", read=self.reading)
        nbw = p.side("node_bandwidth", read=self.reading)
        abw = p.value("aggregate_bandwidth")
        rate = p.value("read_request_rate" if self.reading else "write_request_rate")
        lat_dist = storage.read_latency if self.reading else storage.latency
        active_nodes = len(nodes_work)
        # shared pipes only where the streams behind them can fill them (else exact to omit)
        self.agg: _Pipe | None = None
        self.targets: list[_Pipe] = []
        if storage.targets:
            self.targets = [
                _Pipe(abw / storage.targets, "storage target (OST) contention")
                for _ in range(storage.targets)
            ]
        elif not math.isinf(abw) and active_nodes * self.streams * sbw > abw:
            self.agg = _Pipe(abw, "aggregate bandwidth")
        # throttling: buckets when the job could ever exceed a prefix's rate
        self.buckets: dict[tuple[str, bool], _Bucket] | None = None
        if p.rate_scope != "none" and not math.isinf(rate):
            lanes = job.restore_readers if self.reading else job.object_concurrency
            nranks = sum(len(v) for v in nodes_work.values())
            own = storage.object_metadata
            floor = min(lat_dist.minimum, storage.metadata.minimum, (own or lat_dist).minimum)
            peak = (
                math.inf if floor <= 0 else (active_nodes * self.streams + nranks * lanes) / floor
            )
            if peak > min(p.value("read_request_rate"), p.value("write_request_rate")):
                self.buckets = {}
        self.rate_scope = p.rate_scope
        self.next_target = 0
        self.nodes: list[_Node] = []
        self.ranks: list[_Rank] = []
        for members in classes.values():
            n = members[0]
            strag = n in stragglers
            factor = slowdown if strag else 1.0
            node = _Node(n, len(members), strag, factor)
            node.rate = sbw / factor
            if not math.isinf(nbw) and self.streams * sbw > nbw:
                node.pipe = _Pipe(nbw / factor, "node link")
            self.nodes.append(node)
            for r, objs in nodes_work[n]:
                self.ranks.append(_Rank(r, node, iter(objs)))
        self.lat = _Draw(lat_dist, rng)
        self.meta = _Draw(storage.metadata, rng)
        own = storage.object_metadata
        self.object_meta = self.meta if own is None else _Draw(own, rng)

    # -- requests ----------------------------------------------------------------------------

    def _bucket(self, prefix: str, read: bool) -> _Bucket | None:
        if self.buckets is None:
            return None
        key = ("(the bucket)" if self.rate_scope == "bucket" else prefix, read)
        b = self.buckets.get(key)
        if b is None:
            p = self.storage.profile
            rate = p.value("read_request_rate" if read else "write_request_rate")
            b = self.buckets[key] = _Bucket(rate, rate * self.storage.burst)
        return b

    def _request(
        self,
        node: _Node,
        bucket: _Bucket | None,
        draw: _Draw,
        nbytes: int,
        pipes: list[tuple[_Pipe, float]],
        granted: bool | None = None,
    ) -> Generator[Any, Any, bool]:
        """One request with ckptio's retries; True when it succeeded, False when it ran out
        of attempts (each refused attempt is answered after one latency). ``granted``: what
        the bucket already answered the first attempt, now (None: ask it)."""
        env = self.env
        w = node.weight
        self.requests += w
        attempt = 1
        while True:
            lat = draw() * node.factor
            self.attempts += w
            if granted is None:
                granted = bucket is None or bucket.take(env.now)
            if not granted:
                granted = None
                self.throttled += w
                if attempt >= self.retry.max_attempts:
                    yield env.timeout(lat)
                    node.backoff += lat
                    self.failed_req += w
                    return False
                pause = self.retry.delay(attempt, self.jitter)
                node.backoff += lat + pause
                self.retried += w
                yield env.timeout(lat + pause)
                attempt += 1
                continue
            node.lat += lat
            node.nlat += 1
            if not nbytes:
                yield env.timeout(lat)
                return True
            own = nbytes / node.rate
            node.xfer += own
            if not pipes:
                yield env.timeout(lat + own)
                return True
            yield env.timeout(lat)
            t = env.now
            yield env.timeout(self._through(node, pipes, nbytes, t, own) - t)
            return True

    def _unrefused(self, node: _Node, draw: _Draw) -> float:
        """The latency of a request nothing can refuse (no bucket), counted as
        :meth:`_request` counts one: :meth:`_request` without its generator."""
        lat = draw() * node.factor
        node.lat += lat
        node.nlat += 1
        self.requests += node.weight
        self.attempts += node.weight
        return lat

    def _through(
        self, node: _Node, pipes: list[tuple[_Pipe, float]], nbytes: int, t: float, own: float
    ) -> float:
        """When a request whose bytes start at ``t`` is done: the latest of its own transfer
        (``own`` seconds) and each shared pipe it crosses (the node's own link carries its
        bytes once; a shared pipe the bytes of every node it stands for)."""
        end = t + own
        worst = None
        w = node.weight
        for pipe, share in pipes:
            e = pipe.finish(t, nbytes * share * (1 if pipe is node.pipe else w))
            if e > end:
                end, worst = e, pipe
        if worst is not None:
            node.wait += end - t - own
            node.waits[worst.kind] = node.waits.get(worst.kind, 0.0) + end - t - own
        return end

    def _worker(self, node: _Node) -> Generator[Any, Any, None]:
        """One stream of a node: takes the node's queued parts, first come first served, and
        waits on an event of its own while there are none (a SimPy ``Store`` would do the
        same with two more events per part: a third of the run time)."""
        env, queue, idle, draw = self.env, node.queue, node.idle, self.lat
        timeout, const, weight = env.timeout, draw.const, node.weight
        while True:
            if not queue:
                wake = env.event()
                idle.append(wake)
                yield wake
                continue
            obj, nbytes = queue.popleft()
            if obj.failed:
                continue
            bucket = obj.bucket
            if bucket is None or bucket.take(env.now):
                # the first attempt went through: inline, without a generator (most parts)
                if const is not None:
                    lat = const * node.factor
                elif draw.i < len(draw.buf):  # _Draw.__call__, inline
                    lat = draw.buf[draw.i] * node.factor
                    draw.i += 1
                else:
                    lat = draw() * node.factor
                own = nbytes / node.rate
                node.lat += lat
                node.nlat += 1
                node.xfer += own
                self.requests += weight
                self.attempts += weight
                pipes = obj.pipes
                if not pipes:
                    yield timeout(lat + own)
                elif len(pipes) == 1 and pipes[0][1] == 1.0:
                    # one shared pipe (the node's link or the aggregate): _through, inline
                    yield timeout(lat)
                    t = env.now
                    pipe = pipes[0][0]
                    start = t if t > pipe.free else pipe.free
                    fin = pipe.free = (
                        start + (nbytes if pipe is node.pipe else nbytes * weight) / pipe.rate
                    )
                    if fin > t + own:
                        late = fin - t - own
                        node.wait += late
                        node.waits[pipe.kind] = node.waits.get(pipe.kind, 0.0) + late
                        yield timeout(fin - t)
                    else:
                        yield timeout(own)
                else:
                    yield timeout(lat)
                    t = env.now
                    yield timeout(self._through(node, pipes, nbytes, t, own) - t)
            elif not (
                yield from self._request(node, bucket, draw, nbytes, obj.pipes, granted=False)
            ):
                self._fail(obj)
                continue
            obj.left -= 1
            if obj.left == 0:
                obj.done.succeed()

    def _fail(self, obj: _Object) -> None:
        if not obj.failed:
            obj.failed = True
            obj.rank.failed = True
            self._give_up(obj.rank)
            if not obj.done.triggered:
                obj.done.succeed()

    def _pipes_for(self, node: _Node, nbytes: int) -> list[tuple[_Pipe, float]]:
        """The shared pipes an object's requests cross, with each one's share of a request's
        bytes (a file striped over k targets puts 1/k of each request on each)."""
        if not self.targets and node.pipes is not None:
            return node.pipes  # the same for every object of the node
        pipes: list[tuple[_Pipe, float]] = []
        if node.pipe is not None:
            pipes.append((node.pipe, 1.0))
        if self.agg is not None:
            pipes.append((self.agg, 1.0))
        if self.targets:
            s = self.storage
            n = len(self.targets)
            if s.placement == "random":
                first = int(self.rng.integers(n))
            else:
                first = self.next_target
                self.next_target = (self.next_target + s.stripe_count) % n
            k = min(s.stripe_count, n, max(1, -(-nbytes // s.stripe_size)))
            pipes += [(self.targets[(first + i) % n], 1.0 / k) for i in range(k)]
        else:
            node.pipes = pipes
        return pipes

    def _prefix(self, src: int, number: int) -> str:
        if self.buckets is None or self.job.key_layout == "flat":
            return "data"
        key = fmt.shard_key(STEP, src, number, key_layout=self.job.key_layout)
        return key.rsplit("/", 1)[0].split("/", 1)[1]

    # -- ranks -------------------------------------------------------------------------------

    def _object(self, rank: _Rank, src: int, number: int, nbytes: int) -> Generator[Any, Any, bool]:
        """One object: created (a write) or its size checked beside its first reads (a
        restore, as :meth:`ckptio.checkpoint.CheckpointReader.read_many` does), its parts
        queued on the node's streams, then completed (a write). False when a request
        failed."""
        env = self.env
        node = rank.node
        part = self.part
        reading = self.reading
        bucket = self._bucket(self._prefix(src, number), reading)
        meta = self.meta if reading else self.object_meta
        head: Any = None
        if reading:  # nothing can refuse it (no bucket): a timeout
            head = (
                env.timeout(self._unrefused(node, meta), True)
                if bucket is None
                else env.process(self._request(node, bucket, meta, 0, []))
            )
        elif bucket is None:  # nothing can refuse it: _request, inline
            yield env.timeout(self._unrefused(node, meta))
        elif not (yield from self._request(node, bucket, meta, 0, [])):
            return False
        obj = _Object(rank, -(-nbytes // part), bucket, env.event())
        obj.pipes = self._pipes_for(node, nbytes)
        self.bytes += nbytes * node.weight
        full, rest = divmod(nbytes, part)
        queue = node.queue
        queue.extend([(obj, part)] * full)
        if rest:
            queue.append((obj, rest))
        idle = node.idle
        for _ in range(obj.left if obj.left < len(idle) else len(idle)):
            idle.pop().succeed()
        yield obj.done
        if obj.failed:
            return False
        if reading:
            return bool((yield head))
        if bucket is None:
            yield env.timeout(self._unrefused(node, meta))
            return True
        return (yield from self._request(node, bucket, meta, 0, []))

    def _lane(self, rank: _Rank) -> Generator[Any, Any, None]:
        """One of a rank's objects in flight: the next object as soon as this one is done."""
        for src, number, nbytes in rank.todo:
            if rank.failed:
                return
            if not (yield from self._object(rank, src, number, nbytes)):
                rank.failed = True
                self._give_up(rank)
                return

    def _node_groups(self, ranks: list[_Rank], size: int) -> Generator[Any, Any, None]:
        """The model's client (:attr:`Job.lockstep`): every rank of a node sends its next
        ``size`` objects together, and the node's next group starts when the whole group is
        done."""
        env = self.env
        todo = [list(r.todo) for r in ranks]
        for i in range(0, max(map(len, todo), default=0), size):
            group = [
                (r, env.process(self._object(r, *o)))
                for r, objs in zip(ranks, todo, strict=True)
                for o in objs[i : i + size]
            ]
            yield env.all_of([g for _, g in group])
            for r, g in group:
                r.end = env.now
                if not g.value:
                    r.failed = True
                    self._give_up(r)
            if self.failed:
                return

    def _rank(self, rank: _Rank) -> Generator[Any, Any, None]:
        env = self.env
        node = rank.node
        if self.reading:  # list the steps, read the manifest
            root = self._bucket(ROOT_PREFIX, True)
            preamble = [self.meta] * RESTORE_PREAMBLE_OPS + [self.lat]
            for draw in preamble:
                if not (yield from self._request(node, root, draw, 0, [])):
                    rank.failed = True
                    self._give_up(rank)
                    return
        if self.job.lockstep:
            return
        lanes = self.job.restore_readers if self.reading else self.job.object_concurrency
        yield env.all_of([env.process(self._lane(rank)) for _ in range(lanes)])
        rank.end = env.now

    def _phase(self) -> Generator[Any, Any, None]:
        env = self.env
        for node in self.nodes:
            for _ in range(self.streams):
                env.process(self._worker(node))
        if not self.reading and self.ranks:
            # the save's lease, published while the manifest is checked absent (two requests
            # at once), before any rank writes (ckptio.checkpoint.commit.lease_new_step)
            first = self.ranks[0].node
            root = self._bucket(ROOT_PREFIX, False)
            lease = [env.process(self._request(first, root, self.meta, 0, [])) for _ in "ab"]
            yield env.all_of(lease)
            if not all(p.value for p in lease):
                self._give_up(self.ranks[0])
                return
        ranks = [env.process(self._rank(r)) for r in self.ranks]
        if self.job.lockstep:  # after each rank's preamble, the node's groups
            yield env.all_of(ranks)
            lanes = self.job.restore_readers if self.reading else self.job.object_concurrency
            by_node: dict[int, list[_Rank]] = {}
            for r in self.ranks:
                by_node.setdefault(id(r.node), []).append(r)
            ranks = [env.process(self._node_groups(rs, lanes)) for rs in by_node.values()]
        yield env.all_of(ranks)
        if not self.reading and not self.failed and self.ranks:
            first = self.ranks[0].node
            root = self._bucket(ROOT_PREFIX, False)
            # the commit: the manifest, the step's listing, the lease's release, in series
            for _ in range(save_protocol_requests(self.objects) - 1):
                if not (yield from self._request(first, root, self.meta, 0, [])):
                    self._give_up(self.ranks[0])
                    return

    def _give_up(self, rank: _Rank) -> None:
        """A request ran out of attempts: the checkpoint has failed (the commit will not
        publish it), and the replication ends now (what the other ranks do until they hear
        of it changes nothing, and is not simulated)."""
        self.failed = True
        if not self.stop.triggered:
            rank.end = self.env.now
            self.first_failed = rank
            self.stop.succeed()

    def run(self) -> tuple[float, Bound]:
        env = self.env
        self.stop = env.event()
        done = env.process(self._phase())
        # the cyclic garbage collector off while it runs: its passes over the run's million
        # live events and generators took 25-40% of the time, and every cycle the run makes
        # (SimPy's processes and their events) lives until it ends; collected after
        enabled = gc.isenabled()
        gc.disable()
        try:
            env.run(until=env.any_of([done, self.stop]))
        finally:
            if enabled:
                gc.enable()
        return env.now, self._bound()

    def _bound(self) -> Bound:
        if not self.ranks:
            return Bound(-1, -1, "", "no rank has anything to do", "none")
        last = self.first_failed or max(self.ranks, key=lambda r: (r.end, -r.index))
        node = last.node
        parts = {
            "request latency": node.lat,
            "per-stream bandwidth": node.xfer,
            "request-rate limit": node.backoff,
        }
        for kind, t in node.waits.items():
            parts[kind] = t
        total = sum(parts.values()) or 1.0
        limit = max(parts, key=lambda k: parts[k])
        words = ", ".join(
            f"{k} {v / total:.0%}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v
        )
        mean = node.lat / node.nlat if node.nlat else 0.0
        mech = (
            f"node {node.index}'s request time: {words}; its requests waited "
            f"{human_seconds(mean)} on average for their latency"
        )
        if node.straggler:
            others = [r.end for r in self.ranks if not r.node.straggler]
            ahead = max(others, default=0.0)
            if not others or last.end > 1.02 * ahead:
                limit = "straggler node"
                behind = f", {last.end / ahead - 1:.0%} after the last other node" if ahead else ""
                mech = f"straggler node ({node.factor:g}x slower{behind}); " + mech
            else:  # the straggler ended with the others: a shared limit binds them all
                mech = f"a straggler ({node.factor:g}x slower) ends with the others; " + mech
        prefix = ""
        if self.buckets:
            worst = max(self.buckets.items(), key=lambda kv: kv[1].refused)
            if worst[1].refused:
                prefix = worst[0][0]
                mech += f"; prefix {prefix!r} refused {worst[1].refused:,} requests (503 SlowDown)"
        if self.failed:
            limit = "failed"
            mech = (
                f"a request ran out of its {self.retry.max_attempts} attempts "
                "(503 SlowDown after every backoff): the checkpoint fails; " + mech
            )
        return Bound(last.index, node.index, prefix, mech, limit, node.weight)
