"""Model presets and their parallel layout, turned into a per-rank shard plan.

A :class:`Preset` is a transformer (:class:`Transformer`) trained with a parallel layout
(:class:`Layout`: tensor x pipeline x data parallel, ZeRO stage) in mixed precision
(:class:`Precision`: bytes per parameter of weights, fp32 master copy and Adam moments).
:func:`make_plan` turns it into a :class:`Plan`: for every rank (GPU) of the layout, how many
elements of model weights and of optimizer state it writes, and so how many bytes, objects and
requests a checkpoint costs.

Who writes what (as DeepSpeed/Megatron checkpoints do, and as MLPerf Storage's DLIO models it):

- **weights** are split over tensor-parallel ranks (attention and MLP matrices, embeddings) and
  over pipeline stages (layers). Data-parallel replicas hold identical weights, so with ZeRO 0,
  1 and 2 only data-parallel rank 0 writes them (replicated weights are written once); with
  ZeRO 3 they are sharded over the data-parallel ranks and every rank writes its shard.
- **optimizer state** (fp32 master weights and two Adam moments) is sharded over every rank
  with ZeRO ≥ 1; with ZeRO 0 it is replicated over data-parallel ranks and only the first
  model-parallel group (ranks ``0 .. TPxPP-1``) writes it.

The four ``llama3-*`` presets are MLPerf Storage v2.0's checkpointing workloads and follow
DLIO's parameter arithmetic (``dlio_benchmark/checkpointing/base_checkpointing.py``) exactly,
so their totals reproduce the checkpoint sizes of the MLPerf Storage v2.0
``Submission_guidelines.md``, Table 2 (which, like DLIO's log, writes GiB as "GB").

Everything is computed per pipeline stage and broadcast to ranks with numpy: planning
``llama3-1t`` on 1,024 ranks (or 100,000) takes milliseconds, and no per-tensor list is built.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ckptio import errors
from ckptio.units import (
    MAX_BYTES,
    MAX_GPUS,
    human_bytes,
    parse_size,
)

__all__ = [
    "COMPONENTS",
    "DEFAULT_OBJECT_SIZE",
    "DEFAULT_PART_SIZE",
    "GIB",
    "OBJECT_ALIGNMENT",
    "PRESETS",
    "Layout",
    "ObjectSpec",
    "Plan",
    "Precision",
    "Preset",
    "Transformer",
    "custom_preset",
    "get_preset",
    "make_plan",
    "plan_layout",
    "preset_names",
    "scale_plan",
]

DEFAULT_OBJECT_SIZE = 64 * 2**20
"""Bytes: the largest shard object the runner writes. A rank's share is written as a sequence
of objects of at most this size, each generated, written and closed in turn, so a rank's
memory is bounded by (objects in flight x this), never by the checkpoint's size."""

DEFAULT_PART_SIZE = 8 * 2**20
"""Bytes: the request size used to count requests when none is given (S3's usual part size)."""

OBJECT_ALIGNMENT = 4096
"""Bytes: object sizes are multiples of this (O_DIRECT, 4 KiB chunk alignment of the format)."""


# -- the model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer, described by what sets its parameter count."""

    hidden: int
    """Hidden (model) dimension."""
    layers: int
    """Number of transformer blocks."""
    ffn: int
    """MLP inner dimension."""
    vocab: int
    """Vocabulary size (token embedding rows)."""
    heads: int
    """Attention heads."""
    kv_heads: int
    """Key/value heads (grouped-query attention); equal to ``heads`` for multi-head attention."""
    gated_mlp: bool = True
    """SwiGLU-style MLP with two input matrices (Llama) instead of one (GPT-3, OPT, BLOOM)."""
    biases: bool = False
    """Linear layers and LayerNorms carry biases (GPT-3, OPT, BLOOM) or not (Llama, RMSNorm)."""
    tied_embeddings: bool = False
    """The output head reuses the token embedding (it is then stored only where a pipeline
    stage needs its own copy: on the last stage when PP > 1, as Megatron does)."""
    positions: int = 0
    """Learned position-embedding rows (0 for rotary or ALiBi position encodings)."""

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Columns of the K and V projections each (DLIO: ``head_size * num_kv_heads``)."""
        return self.head_size * self.kv_heads

    def layer_groups(self, tp: int) -> list[tuple[int, bool]]:
        """The weight groups of one transformer block as (elements, split over TP)."""
        h, b = self.hidden, self.biases
        mlp_in = (2 if self.gated_mlp else 1) * self.ffn
        groups: list[tuple[int, bool]] = [
            (h * (2 if b else 1), False),  # input norm
            (h * (h + 2 * self.kv_dim), True),  # Q, K, V
            (h * h, True),  # attention output
            (h * (2 if b else 1), False),  # post-attention norm
            (h * mlp_in, True),  # MLP in (gate + up)
            (h * self.ffn, True),  # MLP out
        ]
        if b:
            groups += [(h + 2 * self.kv_dim, True), (h, False), (mlp_in, True), (h, False)]
        return groups

    def num_parameters(self) -> int:
        """Unique parameters (what a single, unsharded copy of the model holds)."""
        h = self.hidden
        per_layer = sum(n for n, _ in self.layer_groups(1))
        embedding = self.vocab * h + self.positions * h
        head = 0 if self.tied_embeddings else self.vocab * h
        final_norm = h * (2 if self.biases else 1)
        return embedding + per_layer * self.layers + final_norm + head


@dataclass(frozen=True)
class Layout:
    """How the model is spread over GPUs: ``TP x PP x DP`` ranks and a ZeRO stage.

    Rank ``r`` has tensor rank ``r % TP``, pipeline stage ``(r // TP) % PP`` and data-parallel
    rank ``r // (TP x PP)`` (Megatron's order, as DLIO uses it).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 0
    """ZeRO stage: 0 (nothing sharded over DP), 1 or 2 (optimizer state sharded), 3 (weights too)."""

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp

    def describe(self) -> str:
        return f"TP{self.tp}xPP{self.pp}xDP{self.dp}, ZeRO {self.zero}"


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each part of a mixed-precision Adam checkpoint."""

    weights: int = 2
    """Model weights in bf16/fp16."""
    master: int = 4
    """fp32 master copy of the weights (held by the optimizer)."""
    exp_avg: int = 4
    """Adam first moment, fp32."""
    exp_avg_sq: int = 4
    """Adam second moment, fp32."""

    @property
    def optimizer(self) -> int:
        return self.master + self.exp_avg + self.exp_avg_sq

    @property
    def total(self) -> int:
        return self.weights + self.optimizer


@dataclass(frozen=True)
class Preset:
    name: str
    model: Transformer
    layout: Layout
    precision: Precision = field(default_factory=Precision)
    source: str = ""
    """Where the architecture and layout come from."""
    published_bytes: int | None = None
    """A published checkpoint size to compare against, in bytes."""
    published_text: str = ""
    """That figure as published, with its tolerance (the table's last digit), e.g. '105 GB'."""
    published_tolerance: int = 0
    """Bytes: one unit of the published figure's last digit."""
    note: str = ""


GIB = 2**30

_MLPERF = (
    "MLPerf Storage v2.0 checkpointing (mlcommons/storage Submission_guidelines.md Table 2; "
    "DLIO config configs/dlio/workload/{cfg}.yaml)"
)

PRESETS: Mapping[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "llama3-8b",
            Transformer(4096, 32, 14336, 128256, 32, 8),
            Layout(tp=1, pp=1, dp=8, zero=3),
            source=_MLPERF.format(cfg="llama3_8b"),
            published_bytes=105 * GIB,
            published_text="105 GB (DLIO's GB = GiB)",
            published_tolerance=GIB,
        ),
        Preset(
            "llama3-70b",
            Transformer(8192, 80, 28672, 128256, 128, 8),
            Layout(tp=8, pp=1, dp=8, zero=3),
            source=_MLPERF.format(cfg="llama3_70b"),
            published_bytes=912 * GIB,
            published_text="912 GB (DLIO's GB = GiB)",
            published_tolerance=GIB,
        ),
        Preset(
            "llama3-405b",
            Transformer(16384, 126, 53248, 128256, 128, 8),
            Layout(tp=8, pp=32, dp=2, zero=1),
            source=_MLPERF.format(cfg="llama3_405b"),
            published_bytes=5290 * GIB,
            published_text="5.29 TB (DLIO's TB = 1000 GiB)",
            published_tolerance=10 * GIB,
        ),
        Preset(
            "llama3-1t",
            Transformer(25872, 128, 98304, 128256, 32, 32),
            Layout(tp=8, pp=64, dp=2, zero=1),
            source=_MLPERF.format(cfg="llama3_1t")
            + "; attention heads as in configs/dlio/checkpointing/llama_1t.yaml",
            published_bytes=18000 * GIB,
            published_text="18 TB (DLIO's TB = 1000 GiB)",
            published_tolerance=1000 * GIB,
            note="Table 2 lists 192 attention / 32 KV heads, which by DLIO's arithmetic gives "
            "15.4 TB (15,427 GiB), not the published 18 TB; the published figure matches "
            "multi-head attention (32/32 heads, DLIO's earlier llama_1t config): 17,278 GiB. "
            "This preset uses 32/32 so that it reproduces the published size.",
        ),
        Preset(
            "gpt3-175b",
            Transformer(
                12288,
                96,
                49152,
                50257,
                96,
                96,
                gated_mlp=False,
                biases=True,
                tied_embeddings=True,
                positions=2048,
            ),
            Layout(tp=8, pp=16, dp=12, zero=0),
            source="Brown et al. 2020 (GPT-3, Table 2.1); layout of the 175B run in Narayanan "
            "et al. 2021 (Megatron-LM, Table 1: TP 8, PP 16 on 1,536 GPUs)",
            note="ZeRO 0 (classic Megatron): data-parallel replicas are identical, so only the "
            "first TPxPP ranks write.",
        ),
        Preset(
            "opt-175b",
            Transformer(
                12288,
                96,
                49152,
                50272,
                96,
                96,
                gated_mlp=False,
                biases=True,
                tied_embeddings=True,
                positions=2050,
            ),
            Layout(tp=8, pp=1, dp=124, zero=3),
            source="Zhang et al. 2022 (OPT, §2.4): 992 A100s, Megatron tensor parallelism 8 with "
            "FSDP (fully sharded, ZeRO-3-like) over data parallelism",
        ),
        Preset(
            "bloom-176b",
            Transformer(
                14336,
                70,
                57344,
                250880,
                112,
                112,
                gated_mlp=False,
                biases=True,
                tied_embeddings=True,
            ),
            Layout(tp=4, pp=12, dp=8, zero=1),
            source="BigScience 2022 (BLOOM, §3.4): 384 A100s, TP 4 x PP 12 x DP 8, ZeRO stage 1 "
            "(Megatron-DeepSpeed); ALiBi, no position embeddings",
        ),
    ]
}


def preset_names() -> list[str]:
    return [*PRESETS, "custom"]


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise errors.InvalidArgumentError(
            f"unknown preset {name!r}; valid: {', '.join(preset_names())} "
            "(custom needs --hidden --layers --ffn --vocab --heads and a layout)"
        ) from None


# -- the plan ---------------------------------------------------------------------------------

COMPONENTS = ("model", "optim")
"""What each rank writes: ``model`` (weights, bf16) and ``optim`` (fp32 master weights and the
two Adam moments, one after the other)."""


@dataclass(frozen=True)
class ObjectSpec:
    """One shard object a rank writes: a contiguous run of one component's elements."""

    rank: int
    component: str
    index: int
    """Index of the object within (rank, component)."""
    dtype: str
    """Manifest dtype name of the component (``bfloat16``, ``float32``)."""
    element_offset: int
    """First element of the component held by this object."""
    nbytes: int
    number: int = 0
    """Index of the object among all of the rank's objects (its name in the key)."""


@dataclass(frozen=True)
class Plan:
    """What every rank writes for one checkpoint. Arrays are indexed by rank."""

    preset: Preset
    layout: Layout
    scale: float
    model_elements: np.ndarray
    """int64[ranks]: bf16 weight elements each rank writes."""
    optim_elements: np.ndarray
    """int64[ranks]: fp32 optimizer elements each rank writes (master + 2 moments)."""
    object_size: int = DEFAULT_OBJECT_SIZE

    @property
    def ranks(self) -> int:
        return int(self.model_elements.size)

    @property
    def model_bytes(self) -> np.ndarray:
        return self.model_elements * self.preset.precision.weights

    @property
    def optim_bytes(self) -> np.ndarray:
        return self.optim_elements * 4

    @property
    def rank_bytes(self) -> np.ndarray:
        """int64[ranks]: bytes each rank writes."""
        return self.model_bytes + self.optim_bytes

    @property
    def total_bytes(self) -> int:
        return int(self.rank_bytes.sum())

    @property
    def writing_ranks(self) -> int:
        return int(np.count_nonzero(self.rank_bytes))

    def _objects_per_rank(self, part_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(objects, data requests at ``part_size``) per rank, vectorised."""
        objs = np.zeros(self.ranks, dtype=np.int64)
        reqs = np.zeros(self.ranks, dtype=np.int64)
        size = self.object_size
        part = part_size or size
        for nbytes in (self.model_bytes, self.optim_bytes):
            full, rest = np.divmod(nbytes, size)
            objs += full + (rest > 0)
            reqs += full * -(-size // part) + -(-rest // part)
        return objs, reqs

    @property
    def objects(self) -> int:
        return int(self._objects_per_rank()[0].sum())

    def requests(self, part_size: int) -> int:
        """Data requests (parts, blocks) of ``part_size`` bytes to write the checkpoint."""
        return int(self._objects_per_rank(part_size)[1].sum())

    def rank_objects(self, rank: int) -> Iterator[ObjectSpec]:
        """The objects ``rank`` writes, in order (lazily: never a list of all of them)."""
        specs = (
            (
                "model",
                "bfloat16" if self.preset.precision.weights == 2 else "float32",
                int(self.model_bytes[rank]),
                self.preset.precision.weights,
            ),
            ("optim", "float32", int(self.optim_bytes[rank]), 4),
        )
        number = 0
        for component, dtype, nbytes, itemsize in specs:
            for index, start in enumerate(range(0, nbytes, self.object_size)):
                n = min(self.object_size, nbytes - start)
                yield ObjectSpec(rank, component, index, dtype, start // itemsize, n, number)
                number += 1

    def summary(self, part_size: int = DEFAULT_PART_SIZE) -> dict[str, Any]:
        """Totals for people and machines (``ckptio plan --json``). Bytes are bytes."""
        rb = self.rank_bytes
        writing = rb[rb > 0] if self.writing_ranks else rb
        m, pre = self.preset.model, self.preset.precision
        return {
            "preset": self.preset.name,
            "parameters": m.num_parameters(),
            "layout": asdict(self.layout),
            "layout_text": self.layout.describe(),
            "scale": self.scale,
            "total_bytes": self.total_bytes,
            "weights_bytes": int(self.model_bytes.sum()),
            "optimizer_bytes": int(self.optim_bytes.sum()),
            "bytes_per_parameter": {
                "weights": pre.weights,
                "fp32_master": pre.master,
                "adam_exp_avg": pre.exp_avg,
                "adam_exp_avg_sq": pre.exp_avg_sq,
                "total": pre.total,
            },
            "ranks": self.ranks,
            "writing_ranks": self.writing_ranks,
            "bytes_per_rank_min": int(writing.min()),
            "bytes_per_rank_median": int(np.median(writing)),
            "bytes_per_rank_max": int(writing.max()),
            "object_size": self.object_size,
            "objects": self.objects,
            "objects_per_rank_max": int(self._objects_per_rank()[0].max()),
            "part_size": part_size,
            "requests": self.requests(part_size),
            "published_bytes": self.preset.published_bytes,
            "published_text": self.preset.published_text,
            "source": self.preset.source,
            "note": self.preset.note,
        }


def _stage_layers(layers: int, pp: int) -> tuple[np.ndarray, np.ndarray]:
    """Transformer blocks per pipeline stage (DLIO's split: the first ``layers % pp`` stages
    take one more) and whether a stage holds the embedding (first) or head (last)."""
    base, rem = divmod(layers, pp)
    count = np.full(pp, base, dtype=np.int64)
    count[:rem] += 1
    return count, np.arange(pp)


def _check_layout(model: Transformer, layout: Layout) -> None:
    problems = []
    for name, v in (("tp", layout.tp), ("pp", layout.pp), ("dp", layout.dp)):
        if v < 1:
            problems.append(f"{name.upper()} must be >= 1, got {v}")
    if layout.zero not in (0, 1, 2, 3):
        problems.append(f"ZeRO stage must be one of 0, 1, 2, 3, got {layout.zero}")
    if problems:
        raise errors.InvalidArgumentError("invalid layout: " + "; ".join(problems))
    m = model
    for name, v in (
        ("hidden", m.hidden),
        ("layers", m.layers),
        ("ffn", m.ffn),
        ("vocab", m.vocab),
        ("heads", m.heads),
        ("kv_heads", m.kv_heads),
    ):
        if v < 1:
            problems.append(f"{name} must be >= 1, got {v}")
    if problems:
        raise errors.InvalidArgumentError("invalid model: " + "; ".join(problems))
    if m.heads % layout.tp:
        root = math.isqrt(m.heads)
        small = [d for d in range(1, root + 1) if m.heads % d == 0]
        valid = sorted({*small, *(m.heads // d for d in small)})
        problems.append(
            f"{m.heads} attention heads do not divide over TP {layout.tp} "
            f"(valid TP: {', '.join(map(str, valid))})"
        )
    if m.ffn % layout.tp:
        problems.append(f"FFN size {m.ffn} does not divide over TP {layout.tp}")
    if layout.pp > m.layers:
        problems.append(f"PP {layout.pp} exceeds the {m.layers} layers (valid PP: 1..{m.layers})")
    if layout.zero == 3 and layout.pp > 1:
        problems.append(
            "ZeRO 3 shards weights over data-parallel ranks and needs PP 1 "
            f"(got PP {layout.pp}); use ZeRO 1 or 2 with pipeline parallelism"
        )
    if problems:
        raise errors.InvalidArgumentError(
            f"layout {layout.describe()} does not divide the model: " + "; ".join(problems)
        )


def plan_layout(
    preset: Preset, layout: Layout | None = None, *, object_size: int = DEFAULT_OBJECT_SIZE
) -> Plan:
    """The unscaled per-rank plan of ``preset`` under ``layout`` (default: its own)."""
    layout = layout or preset.layout
    model = preset.model
    _check_layout(model, layout)
    if layout.world > MAX_GPUS:
        raise errors.InvalidArgumentError(
            f"layout {layout.describe()} has {layout.world} ranks; at most {MAX_GPUS}"
        )
    # about the whole checkpoint (every parameter once, the optimizer's per-rank padding), in
    # Python integers, before int64 arrays could overflow
    full = (
        model.num_parameters() * preset.precision.total
        + layout.world * 3 * 5 * model.hidden * preset.precision.optimizer
    )
    if full > MAX_BYTES:
        raise errors.InvalidArgumentError(
            f"{preset.name} under {layout.describe()} would checkpoint about {human_bytes(full)}; "
            f"at most {human_bytes(MAX_BYTES)}"
        )
    tp, pp, dp, zero = layout.tp, layout.pp, layout.dp, layout.zero
    sf = dp if zero == 3 else 1  # weights sharded over DP only with ZeRO 3
    h = model.hidden

    def part(n: int, split: bool) -> int:
        return (n // tp if split else n) // sf

    block = sum(part(n, s) for n, s in model.layer_groups(tp))
    embedding = part(model.vocab * h, True) + part(model.positions * h, False)
    head = part(model.vocab * h, True) if (not model.tied_embeddings or pp > 1) else 0
    final_norm = part(h * (2 if model.biases else 1), False)
    blocks, _ = _stage_layers(model.layers, pp)
    stage_weights = blocks * block
    stage_weights[0] += embedding
    stage_weights[-1] += head + final_norm

    ranks = np.arange(layout.world, dtype=np.int64)
    pp_rank = (ranks // tp) % pp
    dp_rank = ranks // (tp * pp)
    model_elems = stage_weights[pp_rank]
    if zero < 3:
        model_elems = np.where(dp_rank == 0, model_elems, 0)
    nump = model.num_parameters()
    if zero > 0:
        per_rank = nump // (dp * tp * pp)
        optim_writer = np.ones(layout.world, dtype=bool)
    else:
        per_rank = nump // (tp * pp)
        optim_writer = ranks < tp * pp
    # DLIO: three fp32 groups (master, exp_avg, exp_avg_sq) of num_p/ranks + 5h elements each
    optim_elems = np.where(optim_writer, 3 * (per_rank + 5 * h), 0).astype(np.int64)
    return Plan(preset, layout, 1.0, model_elems.astype(np.int64), optim_elems, object_size)


def scale_plan(plan: Plan, scale: float) -> Plan:
    """The same layout with every rank's share multiplied by ``scale`` (> 0). A rank that
    writes something keeps writing at least one element of each component it has."""
    if not isinstance(scale, int | float) or not math.isfinite(scale) or scale <= 0:
        raise errors.InvalidArgumentError(
            f"scale must be a number > 0 (e.g. 0.01, 2e-4), got {scale!r}"
        )
    if scale == 1:
        return plan
    if plan.total_bytes * scale > MAX_BYTES:
        raise errors.InvalidArgumentError(
            f"scale {scale:g} makes {plan.preset.name}'s checkpoint about "
            f"{human_bytes(plan.total_bytes * scale)}; at most {human_bytes(MAX_BYTES)}"
        )

    def shrink(a: np.ndarray) -> np.ndarray:
        out = np.floor(a.astype(np.float64) * scale).astype(np.int64)
        return np.where(a > 0, np.maximum(out, 1), 0)

    return replace(
        plan,
        scale=float(scale),
        model_elements=shrink(plan.model_elements),
        optim_elements=shrink(plan.optim_elements),
    )


def make_plan(
    preset: str | Preset,
    *,
    gpus: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
    zero: int | None = None,
    scale: float | None = None,
    total_size: int | str | None = None,
    object_size: int | str = DEFAULT_OBJECT_SIZE,
) -> Plan:
    """The plan of a preset (by name or object), optionally on ``gpus`` GPUs (data
    parallelism becomes ``gpus / (TP x PP)``), with TP/PP/ZeRO overrides, shrunk by ``scale``
    or to about ``total_size`` bytes. Raises :class:`InvalidArgumentError` naming what is
    wrong and what is valid."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    lay = p.layout
    lay = replace(
        lay,
        tp=tp if tp is not None else lay.tp,
        pp=pp if pp is not None else lay.pp,
        zero=zero if zero is not None else lay.zero,
    )
    if gpus is not None:
        mp = lay.tp * lay.pp
        if gpus < 1 or gpus % mp:
            examples = ", ".join(str(mp * k) for k in (1, 2, 4, 8, 16))
            raise errors.InvalidArgumentError(
                f"--gpus {gpus} does not fit {p.name}'s layout: it must be a multiple of "
                f"TPxPP = {mp} (valid: {examples}, ...)"
            )
        lay = replace(lay, dp=gpus // mp)
    osize = parse_size(object_size, field="object_size")
    if osize < OBJECT_ALIGNMENT or osize % OBJECT_ALIGNMENT:
        raise errors.InvalidArgumentError(
            f"object_size must be a positive multiple of {OBJECT_ALIGNMENT} bytes, got {osize}"
        )
    plan = plan_layout(p, lay, object_size=osize)
    if scale is not None and total_size is not None:
        raise errors.InvalidArgumentError("give either scale or total_size, not both")
    if total_size is not None:
        target = parse_size(total_size, field="total_size")
        if target <= 0:
            raise errors.InvalidArgumentError(f"total_size must be > 0, got {total_size!r}")
        scale = target / plan.total_bytes
    if scale is not None:
        plan = scale_plan(plan, scale)
    return plan


_LEGACY_ARCHITECTURE = (
    "hidden",
    "layers",
    "ffn",
    "vocab",
    "heads",
    "kv_heads",
    "gated_mlp",
    "biases",
    "tied_embeddings",
    "positions",
)
_LEGACY_LAYOUT = ("tp", "pp", "dp", "zero")


def custom_preset(
    model: Transformer | None = None,
    layout: Layout | None = None,
    *,
    name: str = "custom",
    **legacy: Any,
) -> Preset:
    """A preset from an architecture (a :class:`Transformer`) and a parallel layout (a
    :class:`Layout`, default one rank with ZeRO stage 1) of your own::

        custom_preset(Transformer(1024, 8, 4096, 32000, 16, 16), Layout(tp=2, pp=2, dp=2))

    The layout is checked against the model (a tensor-parallel degree that does not divide
    the heads is an :class:`~ckptio.errors.InvalidArgumentError`). The earlier spelling, every
    field as a keyword (``custom_preset(hidden=1024, ..., tp=2)``), still works and warns
    (:class:`DeprecationWarning`)."""
    if legacy:
        if model is not None or layout is not None:
            raise errors.InvalidArgumentError(
                f"custom_preset takes a Transformer and a Layout, or the keywords "
                f"{', '.join(_LEGACY_ARCHITECTURE + _LEGACY_LAYOUT)}, not both"
            )
        model, layout = _from_keywords(legacy)
    if not isinstance(model, Transformer):
        raise errors.InvalidArgumentError(
            f"custom_preset needs a Transformer (the model), got {type(model).__name__}"
        )
    layout = Layout(zero=1) if layout is None else layout
    if not isinstance(layout, Layout):
        raise errors.InvalidArgumentError(
            f"custom_preset's layout must be a Layout, got {type(layout).__name__}"
        )
    _check_layout(model, layout)
    return Preset(name, model, layout, source="user-defined")


def _from_keywords(given: dict[str, Any]) -> tuple[Transformer, Layout]:
    """The model and layout of :func:`custom_preset`'s keyword spelling (deprecated)."""
    import warnings

    unknown = sorted(set(given) - set(_LEGACY_ARCHITECTURE + _LEGACY_LAYOUT))
    if unknown:
        raise errors.InvalidArgumentError(
            f"custom_preset: unknown keyword {', '.join(unknown)}; it takes a Transformer and "
            "a Layout"
        )
    warnings.warn(
        "custom_preset(hidden=..., tp=...) is deprecated: pass custom_preset(Transformer(...), "
        "Layout(...))",
        DeprecationWarning,
        stacklevel=3,
    )
    arch = {k: given[k] for k in _LEGACY_ARCHITECTURE if k in given}
    missing = [k for k in ("hidden", "layers", "ffn", "vocab", "heads") if k not in arch]
    if missing:
        raise errors.InvalidArgumentError(f"custom_preset needs {', '.join(missing)}")
    if arch.get("kv_heads") is None:
        arch["kv_heads"] = arch["heads"]
    layout = Layout(**{"zero": 1, **{k: given[k] for k in _LEGACY_LAYOUT if k in given}})
    return Transformer(**arch), layout
