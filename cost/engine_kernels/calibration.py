"""One engine's fitted kernel models on one device: the `engines.<name>` section of a hardware profile."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .attention import DecodeAttentionParams, PrefillAttentionParams
from .collective import IMPLEMENTATIONS, CollectiveCurve
from .common import release_series
from .gemm import GemmParams
from .moe import MoeParams
from .moe_runners import moe_key, runners
from .params import ParamSet
from .stream import StreamParams

GEMM_FORMATS = ("bf16", "fp8", "fp8_block", "nvfp4")
KV_FORMATS = ("bf16", "fp8", "bf16_window", "fp8_window")   # sliding-window attention: its own kernel instance
# decode sets: per KV format, and for engines with a multi-head decode kernel beside the grouped-query one
# (cost/engines.py Engine.gqa_decode_groups) its own set, `<kv>_mha`; for FlashInfer's tensor-core decode of large
# groups (DecodeAttentionParams.tensor_core_group) `<kv>_tc`
# an engine's other attention backend, fitted apart in both phases (`<kv>_triton`: SGLang's Triton kernels, which it
# runs for attention sinks off Hopper and SM100, where its default backend has none)
ATTENTION_BACKENDS = ("triton",)
PREFILL_KERNELS = KV_FORMATS + tuple(f"{k}_{b}" for k in KV_FORMATS for b in ATTENTION_BACKENDS)
DECODE_KERNELS = KV_FORMATS + tuple(f"{k}_mha" for k in KV_FORMATS) + tuple(f"{k}_tc" for k in KV_FORMATS) + \
    tuple(f"{k}_{b}" for k in KV_FORMATS for b in ATTENTION_BACKENDS)
MOE_FORMATS = ("bf16", "fp8", "fp8_block", "nvfp4", "int4")
# a format's kernel model on a runner other than the engine's default one (moe_runners.py): `<format>_<runner>`
MOE_MODELS = MOE_FORMATS + tuple(moe_key(f, r) for f in MOE_FORMATS for r in runners())
SECTIONS = ("gemm", "quant", "elementwise", "prefill_attention", "decode_attention", "moe", "allreduce")
# kernels an engine runs an attention with per-head sink logits (gpt-oss) through on a device whose fitted prefill
# kernel lacks them (cost/engine_kernels/unified_attention.py)
SINK_KERNELS = ("triton_unified",) + ATTENTION_BACKENDS


_AT_RELEASE: dict = {}    # (id(base), release) -> (base, the base at that release); the base held keeps its id unique


@dataclass(frozen=True)
class EngineCalibration:
    engine: str
    origin: str                                   # what it was fitted on, or which profile it comes from
    release: str | None = None                    # the engine release whose kernels were measured
    gemm: dict[str, GemmParams] = field(default_factory=dict)
    quant: StreamParams | None = None
    elementwise: StreamParams | None = None
    prefill_attention: dict[str, PrefillAttentionParams] = field(default_factory=dict)   # by KV-cache format
    decode_attention: dict[str, DecodeAttentionParams] = field(default_factory=dict)
    moe: dict[str, MoeParams] = field(default_factory=dict)
    allreduce: dict[str, dict[int, CollectiveCurve]] = field(default_factory=dict)
    # "section.format" (or "section") -> where it comes from, for every model taken from another calibration
    inherited: dict[str, str] = field(default_factory=dict)
    carried: dict = field(default_factory=dict)   # "section.format" -> {"from": PROFILE, "why": ..., "engine"?}:
                                                  # a format this device's tables do not time as the engine runs
                                                  # it, taken from a sibling device's fit of the same engine, or
                                                  # from another engine's fit that times the same kernel
    # {"kernel": one of SINK_KERNELS, "why": TEXT, "l2_share"?: 0-1}: where this device's fitted prefill kernel has
    # no sink logits and the engine runs such an attention on another kernel (vLLM's Triton unified kernel, priced
    # from the fitted one; or one of ATTENTION_BACKENDS, priced with its own `<kv>_<backend>` models); empty: the
    # fitted kernel runs them
    sink_attention: dict = field(default_factory=dict)
    # {"packs_gqa": BOOL, "why": TEXT}: the engine runs a step's one-token decode rows in its prefill kernel when the
    # step also carries a prompt chunk (one varlen call for the whole batch: vLLM's FlashAttention backend, whose
    # one-query decode path needs max_seqlen_q == 1), each row filling a query tile; `packs_gqa`: a tile holds the
    # query heads of one KV head (FlashAttention-3's pack_gqa), else a CTA per query head (FlashAttention-2's split-KV
    # kernel). Empty: decode rows run the decode kernel in every step (FlashInfer and MLA backends split the batch;
    # SGLang and TensorRT-LLM run the phases on kernels of their own)
    mixed_step_decodes: dict = field(default_factory=dict)
    # "major.minor" -> the kernel models an older release ran, fitted on that release's own tables (only the sections
    # whose kernels changed between releases: TensorRT-LLM's fused MoE ran 1.2-2x slower in 0.20 and 1.0 than in 1.3)
    releases: dict[str, "EngineCalibration"] = field(default_factory=dict)

    def at_release(self, release: str | None) -> "EngineCalibration":
        """The kernel models `release` (major.minor, or a full version) ran: this calibration with the sections
        fitted on that release's tables in place of its own; itself where no tables of that release were fitted."""
        older = self.releases.get(release_series(release)) if release else None
        if older is None:
            return self
        # one object per (calibration, release): the kernel price cache keys on the calibration's identity
        hit = _AT_RELEASE.get((id(self), older.release))
        if hit is not None and hit[0] is self:
            return hit[1]
        values = {name: getattr(older, name) for name in SECTIONS
                  if getattr(older, name) not in (None, {})}
        label = ", ".join(values)

        def outside(notes: dict) -> dict:     # the inherited / carried notes of the sections it keeps
            return {key: value for key, value in notes.items() if key.split(".")[0] not in values}
        result = EngineCalibration(**{**self.__dict__, **values, "releases": {}, "inherited": outside(self.inherited),
                                    "carried": outside(self.carried),
                                    "origin": f"{self.origin}; its {label} kernels as release {older.release} ran "
                                              f"them ({older.origin})",
                                    "release": f"{older.release} ({label}), {self.release}"})
        _AT_RELEASE[(id(self), older.release)] = (self, result)
        return result

    @property
    def sink_backend(self) -> str:
        """The engine backend with its own kernel models that runs an attention with sink logits here, "" if none."""
        kernel = self.sink_attention.get("kernel", "")
        return kernel if kernel in ATTENTION_BACKENDS else ""

    @property
    def inherited_notes(self) -> list[str]:
        """Each inherited model as a note: "moe.fp8 from the NVIDIA H200 SXM fit"."""
        return [f"{key} from {where}" for key, where in self.inherited.items()]

    def merged_over(self, base: "EngineCalibration", base_label: str) -> "EngineCalibration":
        """Fill what this calibration lacks from `base`, recording which sections were inherited."""
        taken: dict[str, str] = {}
        values = {}
        for name in SECTIONS:
            mine, theirs = getattr(self, name), getattr(base, name)
            if isinstance(mine, dict):
                missing = {k: v for k, v in theirs.items() if k not in mine}
                for k in missing:
                    further = base.inherited.get(f"{name}.{k}")
                    taken[f"{name}.{k}"] = base_label + (f", which takes it from {further}" if further else "")
                values[name] = {**missing, **mine}
            else:
                if mine is None and theirs is not None:
                    taken[name] = base_label
                values[name] = mine if mine is not None else theirs
        return EngineCalibration(engine=self.engine, origin=self.origin, release=self.release,
                                 inherited={**self.inherited, **taken}, carried=self.carried,
                                 sink_attention=self.sink_attention, mixed_step_decodes=self.mixed_step_decodes,
                                 releases=self.releases, **values)

    def with_format(self, key: str, params, label: str) -> "EngineCalibration":
        """This calibration with one `section.format` set to `params`, taken from `label` (said in notes)."""
        section, fmt = key.split(".", 1)
        values = {**getattr(self, section), fmt: params}
        return EngineCalibration(**{**self.__dict__, section: values,
                                    "inherited": {**self.inherited, key: label}})

    def to_json(self) -> dict:
        out: dict = {"origin": self.origin}
        if self.release:
            out["release"] = self.release
        if self.carried:
            out["carried"] = self.carried
        if self.sink_attention:
            out["sink_attention"] = self.sink_attention
        if self.mixed_step_decodes:
            out["mixed_step_decodes"] = self.mixed_step_decodes
        if self.gemm:
            out["gemm"] = {k: v.to_json() for k, v in self.gemm.items()}
        for name in ("quant", "elementwise"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name).to_json()
        for name in ("prefill_attention", "decode_attention", "moe"):
            if getattr(self, name):
                out[name] = {k: v.to_json() for k, v in getattr(self, name).items()}
        if self.allreduce:
            out["allreduce"] = {impl: {str(n): c.to_json() for n, c in sorted(curves.items())}
                                for impl, curves in self.allreduce.items()}
        if self.releases:
            out["releases"] = {key: cal.to_json() for key, cal in sorted(self.releases.items())}
        return out


def _keyed(data, where: str, allowed: tuple[str, ...], cls: type[ParamSet]) -> dict:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: must be an object keyed by {', '.join(allowed)}")
    for key in data:
        if key not in allowed:
            raise ValueError(f"{where}: unknown key '{key}' (choose from {', '.join(allowed)})")
    return {k: cls.from_json(v, f"{where}.{k}") for k, v in data.items()}


def _carried(data, where: str) -> dict:
    keyed = {"moe": MOE_MODELS, "gemm": GEMM_FORMATS, "prefill_attention": PREFILL_KERNELS,
             "decode_attention": DECODE_KERNELS}
    if not isinstance(data, dict):
        raise ValueError(f"{where}: must map 'section.format' to {{\"from\": PROFILE, \"why\": TEXT}}")
    for key, body in data.items():
        section, _, fmt = key.partition(".")
        if fmt not in keyed.get(section, ()):
            raise ValueError(f"{where}: '{key}' is not a section.format (e.g. moe.fp8)")
        if not isinstance(body, dict) or not {"from", "why"} <= set(body) <= {"from", "why", "engine"} or not all(
                isinstance(v, str) and v for v in body.values()):
            raise ValueError(f"{where}.{key}: must be {{\"from\": PROFILE, \"why\": TEXT}} (and \"engine\": "
                             f"ENGINE where another engine's fit runs the same kernel)")
    return dict(data)


def _sink_attention(data, where: str) -> dict:
    if not isinstance(data, dict) or not {"kernel", "why"} <= set(data) <= {"kernel", "why", "l2_share"} or not all(
            isinstance(data[k], str) and data[k] for k in ("kernel", "why")):
        raise ValueError(f"{where}: must be {{\"kernel\": KERNEL, \"why\": TEXT}} (and \"l2_share\": the share of "
                         f"L2 holding what every unit reads, 0-1)")
    share = data.get("l2_share", 1.0)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < share <= 1.0:
        raise ValueError(f"{where}.l2_share: must be a number in (0, 1]")
    if data["kernel"] not in SINK_KERNELS:
        raise ValueError(f"{where}.kernel: unknown kernel '{data['kernel']}' (choose from {', '.join(SINK_KERNELS)})")
    return dict(data)


def _mixed_step_decodes(data, where: str) -> dict:
    if not isinstance(data, dict) or set(data) != {"packs_gqa", "why"} or not isinstance(data["packs_gqa"], bool) \
            or not isinstance(data["why"], str) or not data["why"]:
        raise ValueError(f"{where}: must be {{\"packs_gqa\": true|false, \"why\": TEXT}}")
    return dict(data)


def _releases(engine: str, data, where: str) -> dict[str, EngineCalibration]:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: must map a release (major.minor) to the kernel models fitted on its tables")
    out = {}
    for key, body in data.items():
        if not re.fullmatch(r"\d+\.\d+", key):
            raise ValueError(f"{where}: '{key}' is not a release (major.minor, e.g. 1.0)")
        if not isinstance(body, dict) or "releases" in body or not isinstance(body.get("release"), str):
            raise ValueError(f"{where}.{key}: must be an object with the collector version it was fitted on "
                             f"(\"release\") and its sections, no releases of its own")
        if release_series(body["release"]) != key:
            raise ValueError(f"{where}.{key}: fitted on release {body['release']}, not {key}")
        out[key] = parse_calibration(engine, body, f"{where}.{key}")
    return out


def parse_calibration(engine: str, data: dict, where: str) -> EngineCalibration:
    """Validate an `engines.<engine>` section (without `from`); every error names the field."""
    allowed = {"origin", "release", "carried", "sink_attention", "mixed_step_decodes", "releases", *SECTIONS}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown field '{unknown[0]}' (fields: {', '.join(sorted(allowed))})")
    origin = data.get("origin", "fitted")
    if not isinstance(origin, str):
        raise ValueError(f"{where}.origin: must be a string")
    release = data.get("release")
    if release is not None and not isinstance(release, str):
        raise ValueError(f"{where}.release: must be a string (the engine release the kernel tables measured)")
    allreduce = {}
    raw = data.get("allreduce", {})
    if not isinstance(raw, dict):
        raise ValueError(f"{where}.allreduce: must be an object keyed by {', '.join(IMPLEMENTATIONS)}")
    for impl, curves in raw.items():
        if impl not in IMPLEMENTATIONS:
            raise ValueError(f"{where}.allreduce: unknown implementation '{impl}' (choose from "
                             f"{', '.join(IMPLEMENTATIONS)})")
        if not isinstance(curves, dict) or not curves:
            raise ValueError(f"{where}.allreduce.{impl}: must map GPU counts to curves")
        parsed = {}
        for n, curve in curves.items():
            if not str(n).isdigit() or int(n) < 2:
                raise ValueError(f"{where}.allreduce.{impl}: GPU count '{n}' must be an integer >= 2")
            parsed[int(n)] = CollectiveCurve.from_json(curve, f"{where}.allreduce.{impl}.{n}")
        allreduce[impl] = parsed

    def optional(name, cls):
        return cls.from_json(data[name], f"{where}.{name}") if name in data else None

    return EngineCalibration(
        engine=engine, origin=origin, release=release, carried=_carried(data.get("carried", {}), f"{where}.carried"),
        sink_attention=_sink_attention(data["sink_attention"], f"{where}.sink_attention")
        if "sink_attention" in data else {},
        mixed_step_decodes=_mixed_step_decodes(data["mixed_step_decodes"], f"{where}.mixed_step_decodes")
        if "mixed_step_decodes" in data else {},
        gemm=_keyed(data.get("gemm", {}), f"{where}.gemm", GEMM_FORMATS, GemmParams),
        quant=optional("quant", StreamParams), elementwise=optional("elementwise", StreamParams),
        prefill_attention=_keyed(data.get("prefill_attention", {}), f"{where}.prefill_attention", PREFILL_KERNELS,
                                 PrefillAttentionParams),
        decode_attention=_keyed(data.get("decode_attention", {}), f"{where}.decode_attention", DECODE_KERNELS,
                                DecodeAttentionParams),
        moe=_keyed(data.get("moe", {}), f"{where}.moe", MOE_MODELS, MoeParams), allreduce=allreduce,
        releases=_releases(engine, data["releases"], f"{where}.releases") if "releases" in data else {})
