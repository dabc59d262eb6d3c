"""A Hugging Face Hub id as a model source: its config.json from the local HF cache, else fetched through
huggingface_hub into that cache. Never weights; the model's own Python files only with --trust-remote-code.

huggingface_hub reads HF_TOKEN (gated repos) and the cache location itself; HF_HUB_OFFLINE is read here at call
time so that an offline run looks only in the cache. A config already cached for the revision is used without a
network round trip: config files rarely change, and every command starts faster (pass --revision for another one).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

CONFIG = "config.json"
CODE_FILES = [CONFIG, "*.py"]   # remote code: the config and the repo's Python modules, no weights
_TRUE = {"1", "ON", "YES", "TRUE"}


class HubError(ValueError):
    """A Hub id that cannot be resolved; the message is one line for the user."""


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def cache_dir() -> Path:
    """huggingface_hub's cache folder, read from the environment now (it reads it once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home) / "hub"


def cached_config(model_id: str, revision: str | None = None) -> Path | None:
    """config.json of a revision in the local cache, or None. Without a revision: main, else the newest snapshot
    (a cache copied from another machine may lack its refs)."""
    from huggingface_hub import try_to_load_from_cache
    try:
        found = try_to_load_from_cache(model_id, CONFIG, cache_dir=cache_dir(), revision=revision)
    except ValueError:   # an id huggingface_hub refuses; the download reports it properly
        found = None
    if isinstance(found, str):
        return Path(found)
    if revision is not None:
        return None
    snapshots = cache_dir() / ("models--" + model_id.replace("/", "--")) / "snapshots"
    candidates = sorted(snapshots.glob(f"*/{CONFIG}"), key=lambda p: p.stat().st_mtime, reverse=True)
    return candidates[0] if candidates else None


def _needs_code(config_path: Path) -> bool:
    try:
        return "auto_map" in json.loads(config_path.read_text())
    except (OSError, ValueError):
        return False


REACH_TIMEOUT_S = 3.0   # the Hub answers a TCP connect in well under a second; an unreachable one fails in this
WAY_OUT = ("give a local config.json (or a folder holding one) instead of the Hub id, or set HF_HUB_OFFLINE=1 "
           "to use only the local Hugging Face cache")


def _reachable(endpoint: str, timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """None when a TCP connection to the Hub's host opens within `timeout_s`, else why not. Name resolution
    cannot be given a timeout, so the probe runs in a daemon thread that is abandoned when it is too slow (a
    resolver that never answers made huggingface_hub's own retries take about 25 s)."""
    import socket
    import threading
    from urllib.parse import urlparse
    url = urlparse(endpoint)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    outcome: list = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as e:
            outcome.append(f"{type(e).__name__}: {e}")

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        return f"no answer from {host}:{port} within {timeout_s:g} s"
    return outcome[0]


def _fetch(model_id: str, revision: str | None, with_code: bool) -> Path:
    import huggingface_hub
    from huggingface_hub import constants, errors
    where = f"{model_id}" + (f" at revision {revision}" if revision else "")
    local_only = offline()
    if not local_only:
        why = _reachable(constants.ENDPOINT)
        if why is not None:
            raise HubError(f"cannot reach the Hugging Face Hub ({why}) and {CONFIG} of {where} is not in the local "
                           f"cache ({cache_dir()}): {WAY_OUT}")
    hub_logging = huggingface_hub.utils.logging
    verbosity = hub_logging.get_verbosity()
    hub_logging.set_verbosity_error()   # its retry warnings would bury the one-line error below
    try:
        if with_code:
            folder = huggingface_hub.snapshot_download(model_id, revision=revision, cache_dir=cache_dir(),
                                                       allow_patterns=CODE_FILES, local_files_only=local_only)
            path = Path(folder) / CONFIG
            if not path.is_file():
                raise HubError(f"{where} has no {CONFIG} on the Hugging Face Hub")
            return path
        return Path(huggingface_hub.hf_hub_download(model_id, CONFIG, revision=revision, cache_dir=cache_dir(),
                                                    local_files_only=local_only))
    except errors.GatedRepoError:
        raise HubError(f"{model_id} is gated: accept its licence on huggingface.co and set HF_TOKEN to a token "
                       f"with access") from None
    except errors.RepositoryNotFoundError:
        raise HubError(f"{model_id} is not on the Hugging Face Hub, or is private (set HF_TOKEN for private "
                       f"repos)") from None
    except errors.RevisionNotFoundError:
        raise HubError(f"{model_id} has no revision '{revision}' on the Hugging Face Hub") from None
    except errors.LocalEntryNotFoundError:
        what = f"{CONFIG} and its code" if with_code else CONFIG
        if local_only:
            raise HubError(f"offline (HF_HUB_OFFLINE=1) and {what} of {where} is not in the local Hugging Face "
                           f"cache ({cache_dir()})") from None
        raise HubError(f"cannot reach the Hugging Face Hub and {what} of {where} is not in the local cache "
                       f"({cache_dir()}): {WAY_OUT}") from None
    except errors.EntryNotFoundError:
        raise HubError(f"{where} has no {CONFIG} on the Hugging Face Hub") from None
    except errors.HFValidationError as e:
        raise HubError(f"'{model_id}' is not a valid Hugging Face id: {str(e).splitlines()[0]}") from None
    except (errors.HfHubHTTPError, OSError) as e:
        raise HubError(f"cannot fetch {CONFIG} of {where}: {type(e).__name__}: "
                       f"{str(e).splitlines()[0] if str(e) else ''}") from None
    finally:
        hub_logging.set_verbosity(verbosity)


def hub_config(model_id: str, revision: str | None = None, trust_remote_code: bool = False) -> tuple[Path, str]:
    """(path of config.json, where it came from). With trust_remote_code, a config that names its own code
    (auto_map) brings the repo's Python files into the same snapshot folder."""
    path = cached_config(model_id, revision)
    origin = f"HF cache: {path}"
    if path is None:
        path = _fetch(model_id, revision, with_code=False)
        origin = f"Hugging Face Hub: {model_id}" + (f"@{revision}" if revision else "")
    if trust_remote_code and _needs_code(path):
        path = _fetch(model_id, revision, with_code=True)
    return path, origin
