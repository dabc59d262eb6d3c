"""Which fused-MoE shapes an engine release ships tuned Triton configurations for (data: tuned_moe.json).

SGLang looks up `E={E},N={N},device_name={CUDA device name}.json` in every `configs/triton_*` folder it ships
(sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py, get_moe_configs, 0.5.14), E the rank's
experts and N the expert width on the rank (w2's last dimension); a shape without a file runs
`get_default_config`, whose tiles change where the tokens outnumber E (MoeParams.large_tile_tokens). A bf16 layer's
file names no dtype. The lists are read from the release's wheel:

    python -m cost.engine_kernels.tuned_moe sglang-0.5.14-*.whl --engine sglang --release 0.5.14
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import zipfile
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

DATA = "tuned_moe.json"
_NAME = re.compile(r"^E=(\d+),N=(\d+),device_name=(.+)\.json$")   # no dtype, block shape or _down: a bf16 layer


@lru_cache(maxsize=1)
def _data() -> dict:
    return json.loads((resources.files("cost.engine_kernels") / DATA).read_text())


@lru_cache(maxsize=None)
def tuned_shapes(engine: str, profile_key: str, dtype: str) -> frozenset | None:
    """(experts, width) pairs with a tuned configuration for this device; None where tracecost has no list for the
    engine and format (every shape then counts as untuned). `dtype` is the MoE kernel model's key: a runner's own
    model (`bf16_flashinfer_trtllm`, moe_runners.py) runs no Triton configuration file. Remembered: a kernel fit
    asks for every evaluation."""
    entry = _data().get(engine)
    if not entry or dtype != "bf16":
        return None
    device = entry["device_names"].get(profile_key)
    return frozenset(tuple(s) for s in entry["bf16"].get(device, [])) if device else frozenset()


def _pair_codes(experts, width) -> np.ndarray:
    """One integer per (experts, width) pair, to match shapes as whole arrays."""
    return np.rint(np.asarray(experts, dtype=float)).astype(np.int64) * 2**32 + \
        np.rint(np.asarray(width, dtype=float)).astype(np.int64)


def tuned_mask(engine: str, profile_key: str, dtype: str, experts_local, inter_local) -> np.ndarray:
    """Per shape: whether the engine runs it on a tuned configuration."""
    e, n = np.broadcast_arrays(np.asarray(experts_local), np.asarray(inter_local))
    shapes = tuned_shapes(engine, profile_key, dtype)
    if not shapes:
        return np.zeros(e.shape, dtype=bool)
    return np.isin(_pair_codes(e, n), _pair_codes(*zip(*shapes)))


def config_note(engine: str, profile_key: str, dtype: str, experts_local: int, inter_local: int) -> str | None:
    """What configuration the engine runs a fused-MoE shape on, where tracecost has the release's list."""
    entry = _data().get(engine)
    if tuned_shapes(engine, profile_key, dtype) is None:
        return None
    device = entry["device_names"].get(profile_key, f"this device ({profile_key})")
    shape = f"E={experts_local}, N={inter_local}"
    if tuned_mask(engine, profile_key, dtype, experts_local, inter_local).item():
        return (f"fused MoE ({shape}): a tuned Triton configuration for {device} ships with {entry['label']} "
                f"{entry['release']}")
    return (f"fused MoE ({shape}): {entry['label']} {entry['release']} ships no tuned Triton configuration for it on "
            f"{device}; priced on the default one (16-row tiles up to {experts_local} tokens, 64 x 64 x 32 beyond)")


def read_wheel(path: str) -> dict[str, list[list[int]]]:
    """CUDA device name -> sorted (E, N) pairs of the bf16 configuration files in a wheel, every Triton folder."""
    found: dict[str, set] = {}
    with zipfile.ZipFile(path) as wheel:
        for name in wheel.namelist():
            if "/configs/triton_" not in name:
                continue
            if name.endswith("_down.json"):     # the down projection's own file, beside the layer's
                continue
            m = _NAME.match(name.rsplit("/", 1)[-1])
            if m and "," not in m.group(3):
                found.setdefault(m.group(3), set()).add((int(m.group(1)), int(m.group(2))))
    return {device: sorted(map(list, shapes)) for device, shapes in sorted(found.items())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m cost.engine_kernels.tuned_moe", description=__doc__.split("\n")[0])
    p.add_argument("wheel", help="the engine release's wheel (pip download sglang==R --no-deps)")
    p.add_argument("--engine", default="sglang")
    p.add_argument("--release", required=True)
    p.add_argument("--write", action="store_true", help=f"store the lists in cost/engine_kernels/{DATA}")
    args = p.parse_args(argv)
    if not Path(args.wheel).is_file():
        print(f"error: {args.wheel}: no such file", file=sys.stderr)
        return 2
    try:
        lists = read_wheel(args.wheel)
    except zipfile.BadZipFile:
        print(f"error: {args.wheel}: not a wheel (zip) file", file=sys.stderr)
        return 2
    if not lists:
        print(f"error: {args.wheel}: no fused-MoE configuration files", file=sys.stderr)
        return 2
    for device, shapes in lists.items():
        print(f"{device}: {len(shapes)} bf16 shapes")
    if args.write:
        target = Path(str(resources.files("cost.engine_kernels") / DATA))
        data = json.loads(target.read_text()) if target.exists() else {}
        entry = data.setdefault(args.engine, {})
        entry.update(release=args.release, source=f"{Path(args.wheel).name}: every configs/triton_*/E=..,N=..,"
                     f"device_name=...json without a dtype (bf16), read by python -m cost.engine_kernels.tuned_moe",
                     bf16=lists)
        # one (E, N) pair a line
        target.write_text(re.sub(r"\[\s+(\d+),\s+(\d+)\s+\]", r"[\1, \2]", json.dumps(data, indent=1)) + "\n")
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
