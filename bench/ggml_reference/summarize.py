#!/usr/bin/env python3
"""One line per (file, round, tandem weights) of a compare.sh run: both
engines' prefill and decode tok/s, tandem's ratios, and the weight bytes a
decode step reads per second by each engine as a fraction of the read-only
bandwidth probed around that engine's own run: for ggml the mean of the
probes compare.sh takes right before and after it, for tandem the mean of
those tandem-generate-bench takes right before and after its best decode
rep (older files: the start-up machine line of the round).

Why the fractions: a decode step streams every active weight once, so
neither engine can read faster than the machine. When ggml already reads
at a fraction f of the probe, tandem can be at most 1/f ahead of it on that
file, in that round; the table shows how much of the remaining gap is the
machine's. Both engines read the same bytes per token (same file, same
tensors); tandem's generate line counts them.

  bench/ggml_reference/summarize.py OUT.jsonl [--markdown]
"""
import argparse
import json
import statistics
import sys
from collections import defaultdict


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip().startswith("{")]


def rounds(lines):
    """(file, round) -> {'ggml': ggml's line, 'ggml_probes': [GB/s around it],
    'probes': [GB/s of tandem's start-up machine lines],
    'tandem': {gguf_weights: {'generate' | 'prefill' | 'decode_breakdown': line}}}."""
    by = defaultdict(lambda: {"tandem": defaultdict(dict), "probes": [], "ggml_probes": []})
    for d in lines:
        key = (d.get("file"), d.get("round"))
        if d.get("engine") == "ggml":
            by[key]["ggml"] = d
        elif d.get("engine") == "probe":
            by[key]["ggml_probes"].append(d["read_only_gb_s"])
        elif d.get("bench") == "machine":
            by[key]["probes"].append(d["read_only_gb_s"])
        elif d.get("bench") in ("generate", "prefill", "decode_breakdown"):
            by[key]["tandem"][d.get("gguf_weights", "")][d["bench"]] = d
    return by


def rows(by):
    out = []
    for (file, rnd), r in sorted(by.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        ggml = r.get("ggml")
        round_probe = statistics.median(r["probes"]) if r["probes"] else None
        ggml_probe = statistics.mean(r["ggml_probes"]) if r["ggml_probes"] else round_probe
        for weights, t in sorted(r["tandem"].items()):
            gen = t.get("generate")
            if ggml is None or gen is None:
                continue
            tandem_probe = gen.get("read_only_gb_s_around_decode") or round_probe
            per_token = gen["decode_weight_bytes_per_token"]
            g_dec, t_dec = ggml["decode_tokens_per_s"], gen["decode_tokens_per_s"]
            g_gbs, t_gbs = g_dec * per_token / 1e9, t_dec * per_token / 1e9
            out.append({
                "file": file, "round": rnd, "weights": weights,
                "ggml_prefill": ggml["prefill_tokens_per_s"], "tandem_prefill": gen["prefill_tokens_per_s"],
                "prefill_x": gen["prefill_tokens_per_s"] / ggml["prefill_tokens_per_s"],
                "ggml_decode": g_dec, "tandem_decode": t_dec, "decode_x": t_dec / g_dec,
                "ggml_probe_gb_s": ggml_probe, "tandem_probe_gb_s": tandem_probe,
                "ggml_decode_gb_s": g_gbs, "tandem_decode_gb_s": t_gbs,
                "ggml_of_probe": g_gbs / ggml_probe if ggml_probe else None,
                "tandem_of_probe": t_gbs / tandem_probe if tandem_probe else None,
                # tandem reading at its own probe, against ggml as it ran
                "most_x_at_probe": tandem_probe / g_gbs if tandem_probe else None,
            })
    return out


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("jsonl")
    p.add_argument("--markdown", action="store_true", help="a markdown table instead of JSON lines")
    args = p.parse_args()
    table = rows(rounds(load(args.jsonl)))
    if not table:
        sys.exit(f"{args.jsonl}: no round holds both a ggml line and a tandem generate line")
    if not args.markdown:
        for r in table:
            print(json.dumps(r))
        return
    print("| file | round | ggml prefill / decode | tandem prefill / decode | prefill x | decode x "
          "| ggml reads GB/s (of its probe) | tandem reads (of its probe) | tandem at its probe, x ggml |")
    print("|---|---:|---|---|---:|---:|---|---|---:|")
    for r in table:
        print(f"| {r['file']} | {r['round']} | {r['ggml_prefill']:.1f} / {r['ggml_decode']:.1f} "
              f"| {r['tandem_prefill']:.1f} / {r['tandem_decode']:.1f} | {r['prefill_x']:.2f} | {r['decode_x']:.2f} "
              f"| {r['ggml_decode_gb_s']:.1f} ({fmt(r['ggml_of_probe'], '.0%')} of {fmt(r['ggml_probe_gb_s'], '.1f')}) "
              f"| {r['tandem_decode_gb_s']:.1f} ({fmt(r['tandem_of_probe'], '.0%')} of {fmt(r['tandem_probe_gb_s'], '.1f')}) "
              f"| {fmt(r['most_x_at_probe'], '.2f')} |")


if __name__ == "__main__":
    main()
