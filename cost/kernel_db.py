"""Published kernel tables (NVIDIA AIConfigurator's measured kernel database) as tracecost kernel rows.

    pip download --no-deps aiconfigurator-core==0.12.0     # the wheel holds the tables (Apache-2.0)

DIR is the wheel itself, its unzipped folder, or any folder holding `<system>/<op>/<framework>/<version>/*.parquet`.
For each table the newest collected version is read (a MoE format whose newest rows time a kernel the engine's
default launch does not run comes from the newest version that times the one it does; the MoE rows of the newest
release's earlier candidates fill the formats and expert shapes its newest does not time). Reading parquet needs pyarrow
(`pip install 'tracecost[calibrate]'`); tracecost never needs the tables at run time.

Semantics (read from the collectors and checked against the numbers): latency is ms per call, timed as
CUDA-graph replays; generation attention is one query over step + 1 keys in vLLM >= 0.22 collectors (step
keys before); message sizes of the all-reduce tables count 2-byte elements per GPU; vLLM's MoE collectors
before 0.17 and SGLang's before 0.5.14 built every layer with gate and up projections, relu^2 models' too.
"""
from __future__ import annotations

import csv
import io
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .engine_kernels.common import release_series
from .engine_kernels.moe_runners import table_runner
from .kernel_rows import AllreduceRow, AttentionRow, GemmRow, MoeRow

_DTYPES = {"bfloat16": "bf16", "float16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}
_MOE_DTYPES = {**_DTYPES, "int4_wo": "int4", "w4a16_mxfp4": "int4"}
_KV = {"bfloat16": "bf16", "float16": "bf16", "fp8": "fp8"}
_GRAPH_BACKENDS = {"vllm_graph", "sglang_graph", "trtllm_graph", "graph"}


class KernelDBError(ValueError):
    """The kernel tables cannot be read; the message says what is missing."""


@dataclass
class KernelTable:
    """One kernel class's measured rows on one system and engine."""
    name: str              # gemm, context_attention, generation_attention, moe, custom_allreduce, nccl, quant
    source: str            # the table file it came from ("; "-joined where a format came from an older one)
    rows: list
    seconds: np.ndarray


def _version(file: str) -> str:
    """The collector version a table file sits under (`<system>/<op>/<framework>/<version>/<table>`)."""
    return file.split("/")[-2]


def _version_key(version: str) -> tuple:
    parts = re.findall(r"\d+|[a-z]+", version.lower())
    return tuple((0, int(p)) if p.isdigit() else (-1, p) for p in parts)


# the older wheels' CSV tables (aiconfigurator 0.4-0.5: TensorRT-LLM 0.20.0 and 1.0.0rc3 on H200, 1.0.0rc6 on B200)
_CSV_LAYOUT = re.compile(r"(^|/)([a-z0-9_]+)/([a-z]+)/([0-9][^/]*)/([a-z_]+)\.txt$")
_CSV_TABLE_OPS = {"gemm_perf": "gemm", "context_attention_perf": "attention", "generation_attention_perf": "attention",
                  "moe_perf": "moe", "custom_allreduce_perf": "comm", "nccl_perf": "comm"}
# their MoE tables name the even routing "uniform" where the newer ones say "balanced"
_CSV_VALUES = {"uniform": "balanced"}


def _read_csv(data) -> dict:
    """A CSV table as the columns a parquet one gives: numbers as numbers."""
    text = data.read().decode() if hasattr(data, "read") else Path(data).read_text()
    rows = list(csv.reader(io.StringIO(text)))
    columns = {}
    for i, name in enumerate(rows[0]):
        values = [r[i] for r in rows[1:]]
        try:
            columns[name] = [float(v) for v in values]
        except ValueError:
            columns[name] = [_CSV_VALUES.get(v, v) for v in values]
    return columns


class _Store:
    """Files under the tables root, in a folder or inside the wheel."""

    def __init__(self, path: str, version: str | None = None):
        """`version`: only the tables of this collector version (an older release's, e.g. 1.0.0rc6)."""
        p = Path(path).expanduser()
        if not p.exists():
            raise KernelDBError(f"kernel tables not found: {path}")
        self.zip = zipfile.ZipFile(p) if p.is_file() else None
        names = self.zip.namelist() if self.zip else [str(f.relative_to(p)) for f in p.rglob("*")
                                                      if f.suffix in (".parquet", ".txt")]
        self.root = p
        # the older wheels' layout, `<system>/<framework>/<version>/<table>.txt` (CSV), under the names the newer
        # one gives the same tables, so that one reader serves both
        self.real = {n: n for n in names if n.endswith(".parquet")}
        for name in names:
            if m := _CSV_LAYOUT.search(name):
                system, framework, found, table = m.group(2, 3, 4, 5)
                op = _CSV_TABLE_OPS.get(table)
                if op:
                    framework = "nccl" if table == "nccl_perf" else framework
                    self.real[f"{system}/{op}/{framework}/{found}/{table}.parquet"] = name
        if version is not None:
            self.real = {v: n for v, n in self.real.items() if _version(v) == version}
        self.files = list(self.real)
        if not self.files:
            raise KernelDBError(f"{path}: no tables inside" + (f" of version {version}" if version else "") +
                                " (pass an aiconfigurator wheel or its folder)")

    def find(self, system: str, op: str, framework: str, filename: str) -> str | None:
        found = self.find_all(system, op, framework, filename)
        return found[0] if found else None

    def find_all(self, system: str, op: str, framework: str, filename: str) -> list[str]:
        """Every collected version of a table, newest first."""
        pattern = re.compile(rf"(^|/){re.escape(system)}/{re.escape(op)}/{re.escape(framework)}/([^/]+)/"
                             rf"{re.escape(filename)}$")
        found = [(m.group(2), name) for name in self.files if (m := pattern.search(name))]
        return [name for _, name in sorted(found, key=lambda vn: _version_key(vn[0]), reverse=True)]

    def read(self, name: str):
        real = self.real[name]
        data = io.BytesIO(self.zip.read(real)) if self.zip else str(self.root / real)
        if real.endswith(".txt"):
            return _read_csv(data)
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise KernelDBError("reading the kernel tables needs pyarrow: pip install 'tracecost[calibrate]'") from None
        return pq.read_table(data).to_pydict()

    def systems(self) -> list[str]:
        return sorted({n.split("/")[-5] for n in self.files if n.count("/") >= 4})


def _gemm(t, dtypes: dict = _DTYPES) -> tuple[list, list]:
    """The rows of the table dtypes `dtypes` names, each as GemmRow of the format it maps to."""
    rows, ms = [], []
    for dtype, m, n, k, lat in zip(t["gemm_dtype"], t["m"], t["n"], t["k"], t["latency"]):
        if dtype in dtypes:
            rows.append(GemmRow(int(m), int(n), int(k), dtypes[dtype]))
            ms.append(lat)
    return rows, ms


_WEIGHT_ONLY_GEMM = {"int8_wo": "int8_wo", "int4_wo": "int4"}   # table dtype -> tracecost checkpoint format


def load_weight_only_gemm(path: str, system: str, engine: str) -> KernelTable | None:
    """The weight-only GEMM rows of the newest table (TensorRT-LLM's `int8_wo` / `int4_wo`), as GemmRows whose
    dtype is the checkpoint format (int8_wo, int4); None where the tables time none. They are kept out of
    load_tables: no kernel model is fitted on them (cost/engine_formats.json weight_only_kernel prices them)."""
    store = _Store(path)
    found = store.find(system, "gemm", engine, "gemm_perf.parquet")
    if found is None:
        return None
    rows, ms = _gemm(store.read(found), _WEIGHT_ONLY_GEMM)
    return KernelTable("gemm_weight_only", found, rows, np.asarray(ms, dtype=float) * 1e-3) if rows else None


def _served_backend_rows(t, backends: tuple) -> list[bool]:
    """Rows timed on the backend the engine's default selection runs for their head dim (windowed or not).
    `backends` lists the engine's attention backends in the order its selection prefers them; where a table
    times one head dim on more than one backend, only the most preferred one's rows are kept (the others
    time a kernel a default launch does not run); a head dim timed on one backend keeps its rows."""
    n = len(t["latency"])
    sources = t.get("kernel_source")
    if not backends or sources is None:
        return [True] * n
    windows = t.get("window_size") or [0] * n
    rank = {b: i for i, b in enumerate(backends)}
    shape = [(int(t["head_dim"][i]), bool(windows[i])) for i in range(n)]
    best: dict = {}
    for key, source in zip(shape, sources):
        best[key] = min(best.get(key, len(rank)), rank.get(source, len(rank)))
    return [rank.get(source, len(rank)) == best[key] for key, source in zip(shape, sources)]


def _served_query_rows(t, fp8_kv_query: str) -> list[bool]:
    """Rows whose query (compute) dtype is the one the engine runs over their KV format. A table can time one
    shape over an fp8 KV cache twice, with a bf16 and with an fp8 query (`attn_dtype`): two kernels, 7-36%
    apart on L40S and RTX PRO 6000 (the fp8 one slower), which one fit cannot follow. Where a backend times
    both, the engine's `fp8_kv_query` is kept; where it times one (SGLang's fa3 and trtllm_mha only fp8, its
    FlashInfer only bf16), that one is what the backend runs."""
    n = len(t["latency"])
    queries = t.get("attn_dtype")
    if queries is None:
        return [True] * n
    sources = t.get("kernel_source") or [""] * n
    windows = t.get("window_size") or [0] * n
    shape = [(sources[i], int(t["head_dim"][i]), bool(windows[i]), t["kv_cache_dtype"][i]) for i in range(n)]
    timed: dict = {}
    for key, query in zip(shape, queries):
        timed.setdefault(key, set()).add(query)
    return [len(timed[key]) == 1 or query == (fp8_kv_query if key[3] == "fp8" else key[3])
            for key, query in zip(shape, queries)]


def _attention(t, phase: str, keys_after_step: bool, backends: tuple = (), fp8_kv_query: str = "bfloat16",
               apart: tuple = (), chunk_windows: tuple = (), chunk_backends: tuple = ()) -> tuple[list, list]:
    """`apart`: backends whose rows are fitted as models of their own where the table times another one too.
    `chunk_windows`: window sizes the collector sets as attention chunks; on a backend not in `chunk_backends`
    such a row is a full-attention row."""
    rows, ms = [], []
    served = _served_backend_rows(t, backends)
    query_served = _served_query_rows(t, fp8_kv_query)
    sources = t.get("kernel_source") or [""] * len(t["latency"])
    windows = [0 if w in chunk_windows and s not in chunk_backends else w
               for w, s in zip(t.get("window_size") or [0] * len(t["latency"]), sources)]
    mixed = len(set(sources)) > 1
    for i, lat in enumerate(t["latency"]):
        kv = _KV.get(t["kv_cache_dtype"][i])
        if kv is None or not served[i] or not query_served[i]:
            continue
        b, h, kvh, d = (int(t[c][i]) for c in ("batch_size", "num_heads", "num_key_value_heads", "head_dim"))
        if phase == "prefill":
            q, c = int(t["isl"][i]), 0
        else:
            q, c = 1, int(t["step"][i]) if keys_after_step else max(0, int(t["step"][i]) - 1)
        backend = sources[i] if mixed and sources[i] in apart else ""
        rows.append(AttentionRow(phase, b, q, c, h, kvh, d, int(windows[i] or 0), kv, backend=backend))
        ms.append(lat)
    return rows, ms


def _gated(hidden: int, experts: int, top_k: int) -> bool:
    """The tables carry no activation column: Nemotron-H's relu^2 experts (no gate projection) are the collected
    geometries with 22 of 512 experts, or 6 of 128 at hidden 2688 (collector/cases/models/NemotronH*)."""
    return not ((experts, top_k) == (512, 22) or (experts, top_k, hidden) == (128, 6, 2688))


@dataclass(frozen=True)
class Collector:
    """Where one engine's collectors time something else than the rows say, by collector version."""
    step_keys_until: str | None = None     # decode rows attend `step` keys before this version (step + 1 after)
    gated_relu2_until: str | None = None   # MoE layers of relu^2 models were built gated before this version
    single_rank_ep: bool = True            # expert-parallel MoE rows time what one serving rank runs
    host_issued_gemm: tuple = ()           # GEMM formats timed as calls the host issues, not graph replays
    attention_backends: tuple = ()         # attention backends in the order the engine's default selection
                                           # prefers them (`kernel_source`); rows of a less preferred one
                                           # timing a head dim the preferred one also times are dropped
    fp8_kv_query: str = "bfloat16"         # the query dtype of attention over an fp8 KV cache, where a table
                                           # times both (`attn_dtype`)
    attention_apart: tuple = ()            # attention backends (`kernel_source`) whose rows, where a table also
                                           # times another backend, are fitted as their own kernel models
    moe_served: tuple = ()                 # (format, system prefixes, kernel_source substrings): the MoE kernels
                                           # the engine's default launch runs for checkpoints of that format
                                           # there; rows of another source are dropped, and a newest table with
                                           # none of them gives way to the newest one that times them
    chunk_windows: tuple = ()              # `window_size` values the collector applies as chunked local attention
                                           # (Llama-4's attention_chunk_size), not as a sliding window
    chunk_backends: tuple = ()             # backends (`kernel_source`) that run such a chunk by chunks; the others
                                           # run the full causal kernel, and their chunk rows are full rows

    def keys_after_step(self, version: str) -> bool:
        return not _before(version, self.step_keys_until)

    def relu2_timed_gated(self, version: str) -> bool:
        return _before(version, self.gated_relu2_until)


def _before(version: str, first: str | None) -> bool:
    return first is not None and _version_key(version) < _version_key(first)


COLLECTORS = {
    # vLLM's block-fp8 rows take 60-300 us for any small GEMM (57-172 us on Hopper, 160-300 us on Blackwell,
    # Grace hosts the slowest), 10-50x its fp8 rows of the same shape: the host's time to issue the Python op
    "vllm": Collector(step_keys_until="0.22", gated_relu2_until="0.17", host_issued_gemm=("fp8_block",),
                      # per-tensor and per-channel FP8 MoE checkpoints run Triton fused_moe (fp8_w8a8) on Hopper:
                      # vllm/model_executor/layers/quantization/fp8.py get_fp8_moe_backend takes FlashInfer only
                      # with VLLM_USE_FLASHINFER_MOE_FP8 set, and SGLang's fused_moe_triton is the same kernel.
                      # The 0.24 collector's fp8 rows time ModelOptFp8MoE through FlashInfer's CUTLASS MoE
                      # (kernel_source vllm_modeloptfp8moe_flashinfer_cutlass_*), 2-3x slower than bf16 on
                      # H200 at 512 experts; the 0.19 collector's (vllm_fused_moe) time the Triton kernel
                      moe_served=(("fp8", ("h100_", "h200_"), ("vllm_fused_moe", "tritonexperts")),)),
    # SGLang's expert-parallel rows feed only the tokens that reach rank 0 and compute their remote slots on
    # expert 0, work no serving rank does
    "sglang": Collector(gated_relu2_until="0.5.14", single_rank_ep=False,
                        # SGLang's tables time some head dims on two backends (B300: head dim 128 on FlashInfer
                        # and trtllm_mha, 256 on Triton and trtllm_mha, 25-140% apart). A default launch of an
                        # MHA model runs fa3 on Hopper, trtllm_mha on SM100, else FlashInfer, Triton where the
                        # others cannot (python/sglang/srt/server_args.py _get_default_attn_backend; the
                        # collector's collect_attn.py takes Triton for head dim 192 on SM100 and on SM120)
                        attention_backends=("fa3", "trtllm_mha", "flashinfer", "triton"),
                        # its Triton kernels time other head dims (gpt-oss's, MLA's) than the default backend's and
                        # run 1-3x apart from them: the rows of each are fitted apart
                        attention_apart=("triton",),
                        # its window 8192 is Llama-4's attention_chunk_size (AIConfigurator's
                        # Llama4ForConditionalGeneration_cases.yaml). Only FA3 runs it by chunks (local-attention
                        # virtual batches): there 16k-token prompts take 0.51 of the full rows' time; FlashInfer,
                        # Triton and trtllm_mha time them as the full rows, 0.999-1.001 in both phases
                        chunk_windows=(8192,), chunk_backends=("fa3",)),
    # TensorRT-LLM's PyTorch flow runs paged context FMHA (chunked prefill, KV-cache reuse: both on by default)
    # over an fp8 KV cache only as FP8 attention, an fp8 query (tensorrt_llm/_torch/attention_backend/trtllm.py
    # raises "When FP8 KV cache is being used, paged context FMHA cannot be used without FP8 attention")
    "trtllm": Collector(fp8_kv_query="fp8"),
}


def _moe(t, relu2_timed_gated: bool = False, single_rank_ep: bool = True, served: dict | None = None,
         formats: tuple | None = None, engine: str = "") -> tuple[list, list]:
    """`relu2_timed_gated`: the collector timed a relu^2 model's layers as gated work. Expert-parallel rows that
    do not time one serving rank's work (`single_rank_ep` false) are skipped. `served`: per format, the kernel
    sources the engine runs (rows of other sources are skipped); `formats`: only rows of these formats. A row of
    a runner other than the engine's default one says so (its `runner`: moe_runners.py)."""
    rows, ms = [], []
    sources = t.get("kernel_source") or [""] * len(t["latency"])
    for i, lat in enumerate(t["latency"]):
        dtype = _MOE_DTYPES.get(t["moe_dtype"][i])
        tp, ep = int(t["moe_tp_size"][i]), int(t["moe_ep_size"][i])
        if dtype is None or (tp > 1 and ep > 1) or (ep > 1 and not single_rank_ep):
            continue
        if (formats is not None and dtype not in formats) or \
                (served and dtype in served and not any(s in sources[i] for s in served[dtype])):
            continue
        hidden, experts, top_k = int(t["hidden_size"][i]), int(t["num_experts"][i]), int(t["topk"][i])
        rows.append(MoeRow(int(t["num_tokens"][i]), hidden, int(t["inter_size"][i]), experts, top_k, tp, ep, dtype,
                           t["distribution"][i], relu2_timed_gated or _gated(hidden, experts, top_k),
                           table_runner(engine, dtype, sources[i])))
        ms.append(lat)
    return rows, ms


def _allreduce(t, impl: str) -> tuple[list, list]:
    rows, ms = [], []
    backends = t.get("backend") or ["graph"] * len(t["latency"])
    ops = t.get("op_name") or ["all_reduce"] * len(t["latency"])
    dtypes = t.get("nccl_dtype") or t.get("allreduce_dtype") or ["half"] * len(t["latency"])
    for i, lat in enumerate(t["latency"]):
        if ops[i] != "all_reduce" or dtypes[i] not in ("half", "bfloat16", "float16"):
            continue
        if impl == "custom" and backends[i] not in _GRAPH_BACKENDS:
            continue
        rows.append(AllreduceRow(int(t["message_size"][i]) * 2, int(t["num_gpus"][i]), impl))
        ms.append(lat)
    return rows, ms


def _quant(static, dynamic_extra) -> tuple[list, list]:
    """Dynamic per-token fp8 quantization = the static quant kernel + the per-token scale computation."""
    extra = {(m, k): lat for m, k, lat in zip(dynamic_extra["m"], dynamic_extra["k"], dynamic_extra["latency"])}
    rows, ms = [], []
    for m, k, lat in zip(static["m"], static["k"], static["latency"]):
        if (m, k) in extra:
            rows.append((int(m), int(k)))
            ms.append(lat + max(0.0, extra[(m, k)]))
    return rows, ms


def _shape(row: MoeRow) -> tuple:
    return row.dtype, row.runner, row.hidden, row.inter, row.experts, row.top_k


def add_moe(files: list[str], store: _Store, collector: Collector, system: str, add, engine: str = "") -> None:
    """The newest MoE table, each format the engine runs another kernel for (`Collector.moe_served`) taken
    from the newest version that times the served one. The release candidates of the newest release are one
    release's kernels timed in parts (TensorRT-LLM's 1.3.0rc23 times three new expert shapes, rc20 two dozen):
    each format and expert shape comes from the newest of them that times it."""
    served = {fmt: sources for fmt, systems, sources in collector.moe_served if system.startswith(systems)}
    newest = files[0]
    rows, ms = _moe(store.read(newest), collector.relu2_timed_gated(_version(newest)), collector.single_rank_ep,
                    served, engine=engine)
    used = [newest]
    for older in files[1:]:
        if release_series(_version(older)) != release_series(_version(newest)):
            break
        seen = {_shape(r) for r in rows}
        more, more_ms = _moe(store.read(older), collector.relu2_timed_gated(_version(older)),
                             collector.single_rank_ep, served, engine=engine)
        keep = [i for i, r in enumerate(more) if _shape(r) not in seen]
        if keep:
            rows, ms = rows + [more[i] for i in keep], ms + [more_ms[i] for i in keep]
            used.append(older)
    for fmt in served:
        if any(r.dtype == fmt for r in rows):
            continue
        for older in files[1:]:
            more, more_ms = _moe(store.read(older), collector.relu2_timed_gated(_version(older)),
                                 collector.single_rank_ep, served, (fmt,), engine)
            if more:
                rows, ms, used = rows + more, ms + more_ms, used + [older]
                break
    add("moe", "; ".join(used), (rows, ms))


def table_systems(path: str) -> list[str]:
    """The systems the store holds tables for."""
    return list(_Store(path).systems())


def load_tables(path: str, system: str, engine: str, version: str | None = None) -> dict[str, KernelTable]:
    """Every kernel table of `engine` on `system` that the store holds, as typed rows and measured seconds
    (`version`: only that collector version's)."""
    store = _Store(path, version)
    collector = COLLECTORS.get(engine, Collector())
    if system not in store.systems():
        raise KernelDBError(f"{path}: no tables for system '{system}' (systems: {', '.join(store.systems())})")
    out: dict[str, KernelTable] = {}

    def add(name, file, rows_ms):
        rows, ms = rows_ms
        if rows:
            out[name] = KernelTable(name, file, rows, np.asarray(ms, dtype=float) * 1e-3)

    if f := store.find(system, "gemm", engine, "gemm_perf.parquet"):
        add("gemm", f, _gemm(store.read(f)))
    for table, phase in (("context_attention_perf.parquet", "prefill"), ("generation_attention_perf.parquet", "decode")):
        if f := store.find(system, "attention", engine, table):
            add(f"{phase}_attention", f, _attention(store.read(f), phase, collector.keys_after_step(_version(f)),
                                                    collector.attention_backends, collector.fp8_kv_query,
                                                    collector.attention_apart, collector.chunk_windows,
                                                    collector.chunk_backends))
    if files := store.find_all(system, "moe", engine, "moe_perf.parquet"):
        add_moe(files, store, collector, system, add, engine)
    if f := store.find(system, "comm", engine, "custom_allreduce_perf.parquet"):
        add("custom_allreduce", f, _allreduce(store.read(f), "custom"))
    if f := store.find(system, "comm", "nccl", "nccl_perf.parquet"):
        add("nccl", f, _allreduce(store.read(f), "nccl"))
    static = store.find(system, "quantize", engine, "scale_matrix_perf.parquet")
    extra = store.find(system, "quantize", engine, "computescale_perf.parquet")
    if static and extra:
        add("quant", static, _quant(store.read(static), store.read(extra)))
    if not out:
        raise KernelDBError(f"{path}: no {engine} tables for {system}")
    return out


# a decode row whose KV, stated and well beyond L2, streams faster than this share of the HBM's datasheet rate did not
# read what it says: the other tables' largest rows stay at 0.66-1.11 of it (boost clocks and timing noise)
_HBM_SHARE_LIMIT = 1.2


def without_impossible_rows(tables: dict[str, KernelTable], hw) -> tuple[dict[str, KernelTable], list[str]]:
    """The tables less the decode-attention rows that read their KV cache (more than 4 L2s of it) faster than
    `_HBM_SHARE_LIMIT` x the device's memory bandwidth, and a note per table that lost any. TensorRT-LLM 1.0.0's A100
    table times its grouped-query rows at up to 1.69x the A100's 2,039 GB/s for a bf16 cache (its multi-head rows
    of the same table: 0.82x); every other table's largest rows stay under 1.11x."""
    t = tables.get("decode_attention")
    if t is None:
        return tables, []
    keep = np.ones(len(t.rows), dtype=bool)
    for i, r in enumerate(t.rows):
        keys = min(r.context, r.window) if r.window else r.context
        kv = r.batch * keys * r.kv_heads * r.head_dim * 2 * (2.0 if r.kv_dtype == "bf16" else 1.0)
        keep[i] = kv <= 4 * hw.l2_bytes or kv / t.seconds[i] <= _HBM_SHARE_LIMIT * hw.bandwidth
    if keep.all():
        return tables, []
    kept = KernelTable(t.name, t.source, [r for r, k in zip(t.rows, keep) if k], t.seconds[keep])
    note = (f"decode_attention: {int((~keep).sum())} of {len(t.rows)} rows set aside, their KV read faster than "
            f"{_HBM_SHARE_LIMIT:g}x the {hw.bandwidth / 1e9:,.0f} GB/s the memory delivers")
    return {**tables, "decode_attention": kept}, [note]
