"""Where a model's config comes from: a bundled name, a local path, or the offline HF cache."""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path


class ModelError(ValueError):
    """A model that cannot be resolved or built; its message is one line for the user."""


@dataclass(frozen=True)
class BundledModel:
    name: str
    hf_id: str
    family: str
    source: str


def _configs_dir() -> Path:
    return Path(str(resources.files("tracer") / "configs"))


def bundled_models() -> dict[str, BundledModel]:
    index = json.loads((_configs_dir() / "models.json").read_text())
    return {name: BundledModel(name=name, **entry) for name, entry in index.items()}


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model: a display name and the config dict to build it from."""
    name: str
    config: dict
    origin: str
    folder: str | None = None   # where config.json (and any remote code) lives


# transformers writes floats JSON cannot hold (inf, nan) as {"__float__": "Infinity"}; it reads them back the same way
_SPECIAL_FLOATS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _decode_special_floats(obj: dict):
    if set(obj) == {"__float__"} and obj["__float__"] in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[obj["__float__"]]
    return obj


def _read_config(path: Path, name: str, origin: str) -> ModelSpec:
    try:
        config = json.loads(path.read_text(), object_hook=_decode_special_floats)
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"cannot read model config {path}: {e}") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ModelError(f"{path} is not a Hugging Face config.json (no 'model_type')")
    from .config_checks import check_model_config   # counts, sizes, divisibility: before anything is built
    check_model_config(config, str(path))
    return ModelSpec(name=name, config=config, origin=origin, folder=str(path.parent))


def resolve_model(model: str, revision: str | None = None, trust_remote_code: bool = False) -> ModelSpec:
    """MODEL may be a bundled name, a folder with config.json, a config.json path, or a Hugging Face Hub id
    (tracer/hub.py: the local HF cache, else config.json fetched; remote code only with trust_remote_code)."""
    bundled = bundled_models()
    is_hub_id = "/" in model and not model.startswith((".", "/", "~")) and not Path(model).expanduser().exists()
    if revision is not None and not is_hub_id:
        raise ModelError(f"--revision applies to Hugging Face Hub ids only, not to '{model}'")
    key = model.lower()
    if key in bundled:
        return _read_config(_configs_dir() / key / "config.json", key, bundled[key].source)
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"folder {path} has no config.json")
        return _read_config(path / "config.json", path.name, str(path))
    if path.is_file():
        return _read_config(path, path.parent.name if path.name == "config.json" else path.stem, str(path))
    if is_hub_id:
        from .hub import HubError, hub_config
        try:
            path, origin = hub_config(model, revision, trust_remote_code)
        except HubError as e:
            raise ModelError(str(e)) from None
        return _read_config(path, model, origin)
    raise ModelError(f"unknown model '{model}': use a bundled name (python -m tracer --list), "
                     f"a folder holding config.json, a config.json path, or a Hugging Face id (org/name)")


def config_weight_dtype(config: dict) -> str | None:
    """The weight format most of a config's weights are stored in (fp8, fp8_block, int8, int4, fp4, mxfp4), or
    None; tracer/weight_formats.py reads the per-module formats."""
    from .weight_formats import checkpoint_formats
    formats = checkpoint_formats(config)
    return formats.headline if formats is not None else None
