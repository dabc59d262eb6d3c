"""End-to-end serving measurements from the files benchmarks write, each parsed to one typed record.

    vllm bench serve --save-result       (vllm/benchmarks/serve.py: model_id, num_prompts, request_rate ("inf"),
                                          max_concurrency, completed, total_input/output_tokens, duration,
                                          output_throughput, mean_ttft_ms, mean_tpot_ms, ...)
    benchmark_latency.py --output-json   (avg_latency in s, latencies, percentiles: no model, batch or lengths)
    benchmark_throughput.py --output-json (elapsed_time, num_requests, total_num_tokens, requests_per_second,
                                          tokens_per_second: prompt + output tokens; no model or lengths)
    mlperf_log_summary.txt               (loadgen's summary: Scenario, Samples/Tokens per second, "Mean First Token
                                          latency (ns)", "Mean Time per Output Token (ns)", target_qps)
    development-set rows (*.jsonl)       (../shared/measurements/e2e/README.md)

A file that does not say the model, GPU, TP, formats, lengths or batch of its run takes them from `RunFacts`
(the CLI's flags); each record lists the fields so filled, and a field neither gives is a one-line error.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from tracer.cli_io import json_lines

from .engine_flags import StatedSettings, stated_settings

if TYPE_CHECKING:
    from .published_rows import PublishedRun

# the load a run put on the engine
BATCH, MAX, RATE, CONCURRENCY = "batch", "max", "rate", "concurrency"
ENGINES = {"tensorrt-llm": "trtllm", "trtllm": "trtllm", "vllm": "vllm", "sglang": "sglang"}


@lru_cache(maxsize=1)
def _mlperf_systems() -> dict:
    return json.loads((Path(__file__).parent / "data" / "mlperf_systems.json").read_text(encoding="utf-8"))


def _system(source: str | None) -> dict:
    """What serving/data/mlperf_systems.json states of the system a row's results folder belongs to ({}: nothing)."""
    return next((entry for path, entry in _mlperf_systems()["systems"].items() if path in (source or "")), {})


def _harness_benchmark(source: str | None, harness: str | None) -> dict:
    """What mlperf_systems.json states of a benchmark as the harness the row names runs it on every system
    ({}: nothing); the benchmark is the results folder below the system's (results/SYSTEM/BENCHMARK/...)."""
    m = re.search(r"/results/[^/]+/([^/]+)/", source or "")
    if not m or not harness:
        return {}
    for name, benchmarks in _mlperf_systems().get("harnesses", {}).items():
        if harness.startswith(name):
            return benchmarks.get(m.group(1), {})
    return {}


def system_device(device: str | None, source: str | None) -> str | None:
    """The profile of a published run's GPUs as its system joins them: `DEVICE:TOPOLOGY` where the submitter's
    system description states another interconnect than the profile's (serving/data/mlperf_systems.json)."""
    topology = _system(source).get("topology")
    return f"{device}:{topology}" if device and topology and ":" not in device else device


def harness_weights(source: str | None, harness: str | None) -> str | None:
    """The weight format the harness's code runs a benchmark in, whatever base precision the row names (MLPerf's
    system files say fp16 for NVIDIA's fp16 + use_fp8 builds): serving/data/mlperf_systems.json 'harnesses'."""
    return _harness_benchmark(source, harness).get("weights")


def system_kv_dtype(source: str | None, harness: str | None = None) -> str | None:
    """The KV-cache format the submitter's code states for its system, or the harness's code for the benchmark
    (serving/data/mlperf_systems.json), where the row itself states none."""
    return _system(source).get("kv_cache_dtype") or _harness_benchmark(source, harness).get("kv_cache_dtype")


def streamed(run_id: str, api_server: bool) -> bool:
    """A development-set run whose client took each token as it came: MLPerf's Server and Interactive scenarios
    (LoadGen times every token; the row id ends with the scenario), or a launch line that starts the engine's HTTP
    server (`vllm bench serve` and SGLang's bench_serving stream by default). Offline runs and the engines' own
    throughput tools (trtllm-bench, benchmark_throughput.py) take whole completions."""
    return api_server or run_id.endswith(("-Server", "-Interactive"))


class MeasurementError(ValueError):
    """A file that cannot be read as a serving measurement; the message names the file and what is wrong."""


# launch flags that change what the engine does (None: the engine's default): one parser for every input,
# serving/engine_flags.py
EngineSettings = StatedSettings
parse_engine_flags = stated_settings


@dataclass(frozen=True)
class RunFacts:
    """What the user says about the runs (CLI flags): fills what a file does not state."""
    model: str | None = None
    device: str | None = None
    engine: str | None = None
    tp: int | None = None
    dtype: str | None = None
    kv_dtype: str | None = None
    isl: float | None = None
    osl: float | None = None
    batch_size: int | None = None
    engine_flags: str | None = None
    kv_cache_tokens: int | None = None   # the KV capacity the engine logged per replica (vLLM: "GPU KV cache size")


@dataclass(frozen=True)
class ServingMeasurement:
    id: str
    source: str                  # the file (and line) it came from
    format: str                  # which parser read it
    model: str
    device: str
    engine: str
    engine_version: str
    dtype: str
    kv_dtype: str | None
    tp: int
    isl: float
    osl: float
    load: str                    # batch | max | rate | concurrency
    load_value: float = 0.0      # batch size, requests queued (0: unbounded), requests/s, or users
    settings: EngineSettings = EngineSettings()
    measured: dict = field(default_factory=dict)   # output_tok_s, ttft_ms, tpot_ms, e2e_latency_ms (means)
    filled: tuple[str, ...] = ()                    # fields taken from RunFacts, not from the file
    lengths: str | None = None   # a bundled length set the run's dataset follows (serving/lengths.py), else fixed
    chat_requests: bool = False  # sent as chat completions (`vllm bench serve --backend openai-chat`)
    unpriced: str = ""           # why tracecost cannot price this run (a development-set row the predictor refuses,
                                 # a served run that speculates)
    run: PublishedRun | None = None   # a development-set row as the predictor reads it (serving/published_rows.py)
    kv_cache_tokens: int | None = None   # the KV capacity its engine logged (RunFacts), priced at instead of estimated

    @property
    def streams(self) -> bool:
        """Its client took each token as it came (`vllm bench serve`, MLPerf Server and Interactive, a row served
        over HTTP), so each step answered every running request (cost/engines.py ServingOverheads.stream_us)."""
        if self.format in ("vllm_serve", "mlperf_server", "mlperf_interactive"):
            return True
        return self.format == "devset" and streamed(self.id, self.settings.api_server)


def _number(data: dict, key: str, where: str, required: bool = True) -> float | None:
    v = data.get(key)
    if v is None:
        if required:
            raise MeasurementError(f"{where}: no '{key}'")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise MeasurementError(f"{where}: '{key}' must be a finite number >= 0, got {v!r}")
    return float(v)


def _record(where: str, fmt: str, stated: dict, facts: RunFacts, measured: dict, load: str, load_value: float,
            idx: str = "") -> ServingMeasurement:
    """One record from what the file states, the rest from `facts`; a field neither gives is an error."""
    values, filled = {}, []
    for name in ("model", "device", "engine", "tp", "dtype", "kv_dtype", "isl", "osl"):
        v = stated.get(name)
        if v is None and getattr(facts, name) is not None:
            v = getattr(facts, name)
            filled.append(name)
        values[name] = v
    values["dtype"] = values["dtype"] or "bf16"
    values["engine"] = values["engine"] or "vllm"
    values["tp"] = values["tp"] or 1
    for name, flag in (("model", "--model"), ("device", "--device"), ("isl", "--isl"), ("osl", "--osl")):
        if values[name] is None:
            raise MeasurementError(f"{where}: the file does not say the run's {name}; pass {flag}")
    if values["engine"] not in ENGINES.values():
        raise MeasurementError(f"{where}: engine '{values['engine']}' has no kernel models (vllm, sglang, trtllm)")
    if load == BATCH and not load_value:
        raise MeasurementError(f"{where}: the file does not say the batch size; pass --batch-size")
    settings_text = stated.get("engine_flags") or facts.engine_flags
    if stated.get("engine_flags") is None and facts.engine_flags:
        filled.append("engine_flags")
    name = Path(where.split(":")[0]).name
    return ServingMeasurement(id=stated.get("id") or f"{name}{idx}", source=where, format=fmt,
                              engine_version=stated.get("engine_version") or "", load=load, load_value=load_value,
                              settings=parse_engine_flags(settings_text, stated.get("launcher")), measured=measured,
                              filled=tuple(filled), kv_cache_tokens=facts.kv_cache_tokens,
                              **{k: values[k] for k in ("model", "device", "engine", "dtype", "kv_dtype")},
                              tp=int(values["tp"]), isl=float(values["isl"]), osl=float(values["osl"]))


# tokens a streamed chunk carries (mean ITL / mean TPOT) above which a run of a fixed number of users streams several
# tokens a step: a server that speculates sends a step's accepted tokens as one chunk. The development set's runs of
# a fixed number of users stream 0.99-1.11 tokens a chunk without a draft (16 runs) and 2.0-5.7 with one (83)
MULTI_TOKEN_CHUNKS = 1.3
SPECULATING = (f"its stream carries several tokens a chunk (mean ITL over mean TPOT above {MULTI_TOKEN_CHUNKS:g}): "
               "the server speculates, which --from-serving does not price")


def parse_vllm_serve(data: dict, where: str, facts: RunFacts) -> list[ServingMeasurement]:
    done = _number(data, "completed", where)
    if not done:
        raise MeasurementError(f"{where}: no completed requests")
    isl, osl = _number(data, "total_input_tokens", where) / done, _number(data, "total_output_tokens", where) / done
    rate, users = data.get("request_rate"), data.get("max_concurrency")
    if users:
        load, value = CONCURRENCY, float(users)
    elif rate not in (None, "inf") and isinstance(rate, (int, float)) and math.isfinite(rate):
        load, value = RATE, float(rate)
    else:     # every prompt sent at once: a finite burst
        load, value = MAX, float(data.get("num_prompts") or done)
    measured = {"output_tok_s": _number(data, "output_throughput", where)}
    for key, name in (("mean_ttft_ms", "ttft_ms"), ("mean_tpot_ms", "tpot_ms"), ("mean_e2el_ms", "e2e_latency_ms")):
        if data.get(key) is not None:
            measured[name] = _number(data, key, where)
    stated = {"model": data.get("model_id"), "isl": isl, "osl": osl, "engine": ENGINES.get(str(data.get("backend")))}
    # its backend is the client's endpoint: vllm / openai post completions, openai-chat (and *-chat) chats
    chat = "chat" in str(data.get("backend") or data.get("endpoint_type") or "")
    itl, tpot = _number(data, "mean_itl_ms", where, required=False), measured.get("tpot_ms")
    unpriced = SPECULATING if load == CONCURRENCY and itl and tpot and itl / tpot > MULTI_TOKEN_CHUNKS else ""
    return [replace(_record(where, "vllm_serve", stated, facts, measured, load, value), chat_requests=chat,
                    unpriced=unpriced)]


def parse_vllm_latency(data: dict, where: str, facts: RunFacts) -> list[ServingMeasurement]:
    latency = _number(data, "avg_latency", where)
    return [_record(where, "vllm_latency", {}, facts, {"e2e_latency_ms": latency * 1e3}, BATCH,
                    float(facts.batch_size or 0))]


def parse_vllm_throughput(data: dict, where: str, facts: RunFacts) -> list[ServingMeasurement]:
    requests = _number(data, "num_requests", where)
    per_s = _number(data, "requests_per_second", where)
    r = _record(where, "vllm_throughput", {}, facts, {}, MAX, requests)
    # tokens_per_second counts prompt and output tokens: output tokens/s is requests/s x the output length
    return [replace(r, measured={"output_tok_s": per_s * r.osl})]


def parse_mlperf_summary(text: str, where: str, facts: RunFacts) -> list[ServingMeasurement]:
    def stat(label):
        m = re.search(rf"^\s*{re.escape(label)}\s*:\s*([0-9.eE+-]+)\s*$", text, re.M | re.I)
        return float(m.group(1)) if m else None

    scenario = re.search(r"^\s*Scenario\s*:\s*(\w+)", text, re.M)
    if not scenario:
        raise MeasurementError(f"{where}: not an MLPerf summary (no 'Scenario :' line)")
    scenario = scenario.group(1)
    if scenario == "Offline":
        tokens, samples = stat("Tokens per second"), stat("Samples per second")
        load, value = MAX, 0.0
    elif scenario in ("Server", "Interactive"):
        tokens, samples = stat("Completed tokens per second"), stat("Completed samples per second")
        load, value = RATE, stat("target_qps") or stat("Scheduled samples per second") or 0.0
        if not value:
            raise MeasurementError(f"{where}: no target_qps")
    else:
        raise MeasurementError(f"{where}: scenario {scenario} is not a serving load (Offline, Server, Interactive)")
    if not tokens or not samples:
        raise MeasurementError(f"{where}: no tokens- and samples-per-second lines (an LLM benchmark's summary)")
    measured = {"output_tok_s": tokens}
    for label, name in (("Mean First Token latency (ns)", "ttft_ms"), ("Mean Time per Output Token (ns)", "tpot_ms"),
                        ("Mean Time to Output Token (ns)", "tpot_ms")):
        if stat(label) is not None:
            measured[name] = stat(label) * 1e-6
    # the output length of the run: its tokens over its samples; the prompt length is the dataset's (--isl)
    stated = {"osl": tokens / samples}
    return [_record(where, f"mlperf_{scenario.lower()}", stated, facts, measured, load, value)]


def _replicas(r: dict) -> int:
    """Data-parallel copies of the engine a row ran: its stated DP, as serving/published_rows.py reads it (attention-DP
    ranks are one engine, not copies)."""
    return 1 if r.get("attention_dp") else max(1, int(r.get("dp") or 1))


def parse_devset_row(r: dict, where: str, facts: RunFacts) -> ServingMeasurement:
    """One row as one engine replica's measurement: a row over several DP replicas (MLPerf's 8 GPUs at TP2 run
    4) splits its load and its throughput among them; latencies are each replica's."""
    mode, measured, replicas = r.get("mode"), {}, _replicas(r)
    if mode == "offline_batch":
        load, value = BATCH, float(r.get("batch_size") or 0)
    elif r.get("request_rate"):
        load, value = RATE, float(r["request_rate"]) / replicas
    elif r.get("concurrency"):
        load, value = CONCURRENCY, float(r["concurrency"]) / replicas
    else:
        load, value = MAX, math.ceil(float(r.get("num_requests") or 0) / replicas)
    for key, name in (("ttft_ms", "ttft_ms"), ("tpot_ms", "tpot_ms"), ("itl_ms", "tpot_ms"),
                      ("e2e_latency_ms", "e2e_latency_ms")):
        v = (r.get(key) or {}).get("mean") if isinstance(r.get(key), dict) else None
        if v is not None and name not in measured:
            measured[name] = float(v)
    if r.get("output_tok_s") is not None and load != BATCH:   # a batch's tokens/s is derived from its latency
        measured["output_tok_s"] = float(r["output_tok_s"]) / replicas
    from .published_rows import DEVICES, map_row  # (published_rows.py reads this module: imported when used)
    engine = next((name for key, name in ENGINES.items() if key in (r.get("engine") or "").lower()), None)
    device = system_device(DEVICES.get(r.get("gpu"), r.get("gpu")), r.get("source"))
    stated = {"id": r.get("id"), "model": r.get("model"), "device": device,
              "engine": engine, "engine_version": r.get("engine_version"), "tp": r.get("tp"),
              "dtype": r.get("precision"), "kv_dtype": r.get("kv_cache_dtype") or system_kv_dtype(r.get("source")),
              "isl": r.get("isl"), "osl": r.get("osl"), "engine_flags": r.get("engine_flags"),
              "launcher": r.get("engine")}
    # the row as the development-set predictor reads it (serving/published_rows.py map_row): its bundled model, the
    # profile and topology of its GPUs, and the weight and KV formats its checkpoint and flags state
    run, why = map_row(r)
    if run is None:
        # kept with why not, for the fit to count and skip (bench/e2e_accuracy.py skips it the same way); what the
        # row leaves unstated is no error then
        stated.update({k: "?" if k in ("model", "device") else 0.0
                       for k in ("model", "device", "isl", "osl") if stated[k] is None})
        return replace(_record(where, "devset", stated, facts, measured, load, value), unpriced=why)
    stated.update(model=run.model, device=run.device.partition("@")[0], dtype=run.dtype, kv_dtype=run.kv_dtype)
    measured = {k: v for k, v in measured.items() if k not in run.set_aside}   # ruled out by the row's own others
    return replace(_record(where, "devset", stated, facts, measured, load, value), lengths=run.lengths, run=run)


def _devset(text: str, where: str, facts: RunFacts) -> list[ServingMeasurement]:
    out = []
    for i, row in json_lines(text.splitlines(), where, MeasurementError):
        if not isinstance(row, dict) or "source_kind" not in row:
            raise MeasurementError(f"{where}:{i}: not a development-set row (no 'source_kind')")
        out.append(parse_devset_row(row, f"{where}:{i}", facts))
    return out


# the keys that identify each JSON a vLLM benchmark writes -> its parser
JSON_FORMATS = ((("output_throughput", "completed"), parse_vllm_serve),
                (("avg_latency",), parse_vllm_latency),
                (("requests_per_second", "elapsed_time"), parse_vllm_throughput))


def load_file(path: str, facts: RunFacts = RunFacts()) -> list[ServingMeasurement]:
    """Every measurement in one file, whatever its format (told by its content)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MeasurementError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    if "MLPerf Results Summary" in text or re.search(r"^\s*Scenario\s*:", text, re.M):
        return parse_mlperf_summary(text, path, facts)
    stripped = text.lstrip()
    if p.suffix == ".jsonl" or (stripped.startswith("{") and "\n{" in stripped.rstrip()):
        return _devset(text, path, facts)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise MeasurementError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(data, dict):
        raise MeasurementError(f"{path}: a benchmark result is a JSON object")
    for keys, parser in JSON_FORMATS:
        if all(k in data for k in keys):
            return parser(data, path, facts)
    raise MeasurementError(f"{path}: not a vllm bench serve, benchmark_latency or benchmark_throughput result "
                           f"(keys: {', '.join(sorted(data)[:8])})")


def load_files(paths: list[str], facts: RunFacts = RunFacts()) -> list[ServingMeasurement]:
    out = [m for p in paths for m in load_file(p, facts)]
    ids = [m.id for m in out]
    if len(set(ids)) != len(ids):    # several files of one format: ids from file names collide only if repeated
        raise MeasurementError(f"the same measurement is given twice ({next(i for i in ids if ids.count(i) > 1)})")
    return out


__all__ = ["BATCH", "CONCURRENCY", "MAX", "RATE", "EngineSettings", "MeasurementError", "RunFacts",
           "ServingMeasurement", "load_file", "load_files", "parse_engine_flags"]
