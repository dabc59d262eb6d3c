"""Hugging Face Hub ids (tracer/hub.py): a fake local cache and a patched download, never the network."""
import json

import httpx
import huggingface_hub
import pytest
from huggingface_hub import errors

from cli.inference.text_generate import main as text_generate
from tracer import ModelError, resolve_model
from tracer import hub as hub_module
from tracer.__main__ import main as tracer_main

LLAMA = resolve_model("llama-3.2-1b").config


def _snapshot(cache, model_id, commit, files, ref="main"):
    repo = cache / ("models--" + model_id.replace("/", "--"))
    folder = repo / "snapshots" / commit
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return folder


class FakeHub:
    """Stands in for huggingface_hub's downloads: writes what the Hub would into the cache, records each call."""

    def __init__(self, cache, repos):
        self.cache, self.repos, self.calls = cache, repos, []

    def _repo(self, model_id, revision):
        if model_id not in self.repos:
            raise errors.RepositoryNotFoundError("404", response=httpx.Response(404, request=httpx.Request("GET", "x")))
        files = self.repos[model_id]
        if isinstance(files, Exception):
            raise files
        if revision not in (None, "main", "v1"):
            raise errors.RevisionNotFoundError("404", response=httpx.Response(404, request=httpx.Request("GET", "x")))
        return files

    def hf_hub_download(self, model_id, filename, *, revision=None, cache_dir=None, local_files_only=False, **kw):
        assert not local_files_only, "an online run should download"
        self.calls.append(("file", model_id, filename, revision))
        files = self._repo(model_id, revision)
        return str(_snapshot(cache_dir, model_id, f"c0ffee{revision or 'main'}", {filename: files[filename]},
                             revision or "main") / filename)

    def snapshot_download(self, model_id, *, revision=None, cache_dir=None, allow_patterns=None, **kw):
        self.calls.append(("snapshot", model_id, tuple(allow_patterns), revision))
        files = self._repo(model_id, revision)
        wanted = {n: t for n, t in files.items() if n == "config.json" or n.endswith(".py")}
        return str(_snapshot(cache_dir, model_id, f"c0ffee{revision or 'main'}", wanted, revision or "main"))


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    weights = "weights that must never be fetched"
    fake = FakeHub(tmp_path, {"acme/tiny": {"config.json": json.dumps(LLAMA), "model.safetensors": weights}})
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake.hf_hub_download)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake.snapshot_download)
    monkeypatch.setattr(hub_module, "_reachable", lambda endpoint, timeout_s=3.0: None)   # the fake Hub answers
    return fake


def test_an_unreachable_hub_fails_fast_naming_the_way_out(tmp_path, monkeypatch, capsys):
    import time
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")   # nothing listens there
    start = time.monotonic()
    assert text_generate(["acme/absent", "--device", "h100"]) == 2
    assert time.monotonic() - start < 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach the Hugging Face Hub" in err
    assert "HF_HUB_OFFLINE=1" in err and "config.json" in err


def test_a_silent_hub_is_given_up_on(monkeypatch):
    import socket
    import time
    def hanging(*args, **kwargs):   # a resolver that answers long after the probe gave up
        time.sleep(1.0)
        raise OSError("late")
    monkeypatch.setattr(socket, "create_connection", hanging)
    start = time.monotonic()
    why = hub_module._reachable("https://huggingface.co", timeout_s=0.3)
    assert time.monotonic() - start < 2 and "no answer from huggingface.co:443 within 0.3 s" in why


def test_online_fetches_only_the_config_then_reuses_the_cache(hub, capsys):
    assert text_generate(["acme/tiny", "--device", "h100", "-q", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "acme/tiny"
    assert hub.calls == [("file", "acme/tiny", "config.json", None)]
    assert not list(hub.cache.rglob("*.safetensors"))
    spec = resolve_model("acme/tiny")      # now cached: no second download
    assert len(hub.calls) == 1 and spec.config == LLAMA and spec.origin.startswith("HF cache")


def test_revision_is_passed_and_checked(hub):
    spec = resolve_model("acme/tiny", revision="v1")
    assert hub.calls == [("file", "acme/tiny", "config.json", "v1")] and "@v1" in spec.origin
    with pytest.raises(ModelError, match="no revision 'nope'"):
        resolve_model("acme/tiny", revision="nope")
    with pytest.raises(ModelError, match="Hub ids only"):
        resolve_model("llama-3.2-1b", revision="main")


def test_hub_errors_are_one_line(hub, capsys):
    response = httpx.Response(401, request=httpx.Request("GET", "x"))
    hub.repos["acme/gated"] = errors.GatedRepoError("401 gated\nlong body", response=response)
    for model, words in (("acme/gated", "HF_TOKEN"), ("acme/missing", "not on the Hugging Face Hub")):
        assert text_generate([model, "--device", "h100"]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1


def test_remote_code_is_fetched_only_with_the_flag(hub):
    config = dict(LLAMA, model_type="acme_llama", auto_map={"AutoConfig": "configuration_acme.AcmeConfig"})
    hub.repos["acme/custom"] = {"config.json": json.dumps(config), "configuration_acme.py": "raise SystemExit(9)\n"}
    spec = resolve_model("acme/custom")
    assert hub.calls[-1][0] == "file" and not list(hub.cache.rglob("*.py"))
    spec = resolve_model("acme/custom", trust_remote_code=True)
    assert hub.calls[-1] == ("snapshot", "acme/custom", ("config.json", "*.py"), None)
    assert (hub.cache.joinpath(spec.folder) / "configuration_acme.py").is_file()


def test_offline_uses_the_cache_and_fails_in_one_line_when_uncached(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("no download offline")
                        if not k.get("local_files_only") else (_ for _ in ()).throw(errors.LocalEntryNotFoundError("x")))
    assert text_generate(["acme/not-cached", "--device", "h100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: offline (HF_HUB_OFFLINE=1)") and "not in the local Hugging Face cache" in err
    assert err.count("\n") == 1
    folder = _snapshot(tmp_path, "acme/cached", "abc123", {"config.json": json.dumps(LLAMA)})
    assert resolve_model("acme/cached").folder == str(folder)
    assert tracer_main(["acme/cached", "-q", "8", "--revision", "abc123", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "acme/cached"
