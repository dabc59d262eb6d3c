import os
import tempfile

# tests never read traces cached by earlier runs or by the user: a fresh cache directory per session
os.environ["TRACECOST_CACHE_DIR"] = tempfile.mkdtemp(prefix="tracecost-test-cache-")
# nor the network: a Hugging Face id resolves from the local cache only (tests that need a download patch it in)
os.environ["HF_HUB_OFFLINE"] = "1"
