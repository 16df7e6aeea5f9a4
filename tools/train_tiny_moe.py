#!/usr/bin/python3
"""Train a tiny Mixtral-architecture MoE on the licence texts and write a Hugging Face folder.

Random weights say nothing about quantization quality; this model is small enough to train
on one CPU core in minutes and real enough (RMSNorm, RoPE, GQA attention, top-2
of 8 SwiGLU experts, a SentencePiece tokenizer) that perplexity, the KL divergence of a
quantized copy and the routing skew mean something.

  apt-get install -y python3-torch python3-sentencepiece libopenblas0-pthread   # Debian 12 packages (for /usr/bin/python3)
  tools/train_tiny_moe.py --out build/tiny-moe                 # 300 steps of 16: ~2.5 min on one core
  tools/train_tiny_moe.py --out build/tiny-moe --evaluate      # held-out NLL in torch, to check tandem

The folder loads in tandem exactly like a real Mixtral (config.json with model_type mixtral,
model.safetensors in bf16 under the Hugging Face tensor names, tokenizer.model,
tokenizer_config.json, generation_config.json). heldout.txt beside them is the text the
model never saw (whole licence files, listed in HELD_OUT), for tandem-perplexity.

Speed: Debian's torch does its matmuls through whatever libblas.so.3 the system selects. With
only libblas3 (the reference BLAS) a step of 16 x 128 tokens took 4.5 s on a Zen 5 core, with
OpenBLAS 0.48 s; the script warns when it finds the reference BLAS loaded.

Deterministic: fixed seeds, a fixed file order and split, torch.use_deterministic_algorithms,
one BLAS thread with OpenBLAS's Haswell kernels and ATen's AVX2 kernels on every CPU (set
below, before torch loads), and a fixed torch thread count (--threads): two runs write the same
model.safetensors (checked on one machine; the pins are there so that other AVX2 CPUs with the
same Debian packages give the same bits too, which is not yet checked). tokenizer.model
records its output path (SentencePiece's trainer spec), so it differs between folders only in
that field. The accuracy table in docs/BENCHMARKS.md is measured on the defaults.
"""

import argparse
import json
import math
import os
import struct
import sys
import time
from pathlib import Path

# Read once, when the libraries load: pinned kernels give the same bits on every AVX2 CPU
# (OpenBLAS and ATen otherwise pick theirs by CPU), and a second BLAS thread measured no
# faster on these small matrices (0.45 vs 0.48 s a step).
os.environ.update({"OPENBLAS_NUM_THREADS": "1", "OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2"})

try:
    import sentencepiece as spm
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the edge: say how to get what is missing
    sys.exit(f"train_tiny_moe.py: {e}; install with: apt-get install -y python3-torch python3-sentencepiece libopenblas0-pthread")

LICENSES = Path("/usr/share/common-licenses")
# Whole files the model never sees: one close relative of a training text (LGPL-2.1 of
# LGPL-2, the usual case of text in a known style) and one unrelated licence.
HELD_OUT = ("LGPL-2.1", "Artistic")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output folder (created; files in it are overwritten)")
    p.add_argument("--licenses", default=str(LICENSES), help="folder of licence texts (default %(default)s)")
    p.add_argument("--vocab_size", type=int, default=2048, help="SentencePiece pieces (at most; BPE)")
    p.add_argument("--hidden", type=int, default=256, help="hidden size (multiple of 256 for K-quants)")
    p.add_argument("--intermediate", type=int, default=256, help="expert FFN size (multiple of 256)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv_heads", type=int, default=2)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top_k", type=int, default=2)
    p.add_argument("--context", type=int, default=128, help="training sequence length")
    p.add_argument("--batch", type=int, default=16, help="sequences per step")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--aux_loss", type=float, default=0.02, help="router load-balancing loss coefficient")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout on the attention and expert outputs in training (0: none, the default model)")
    p.add_argument("--label_smoothing", type=float, default=0.0,
                   help="label smoothing of the training loss (0: none, the default model)")
    p.add_argument("--eval_every", type=int, default=0,
                   help="print the held-out perplexity of each held-out file every N steps (0: only at the end)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--evaluate", action="store_true",
                   help="only print the held-out NLL of the folder --out (torch, fp32 compute on its bf16 weights)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for its own kernels (matmuls run on one BLAS thread)")
    args = p.parse_args()
    for name in ("hidden", "intermediate"):
        if getattr(args, name) % 256 != 0:
            p.error(f"--{name} must be a multiple of 256 (the K-quant block), got {getattr(args, name)}")
    if args.hidden % args.heads != 0 or args.heads % args.kv_heads != 0:
        p.error("--hidden must divide by --heads and --heads by --kv_heads")
    if not 1 <= args.top_k <= args.experts:
        p.error("--top_k must be in [1, --experts]")
    return args


def licence_files(folder):
    """The licence files under their versioned names (GPL -> GPL-3 and the like are links), sorted."""
    files = sorted(p for p in Path(folder).iterdir() if p.is_file() and not p.is_symlink())
    if not files:
        sys.exit(f"train_tiny_moe.py: no licence texts in {folder}")
    return files


def split_texts(files, out):
    train = [f for f in files if f.name not in HELD_OUT]
    held = [f for f in files if f.name in HELD_OUT]
    if len(held) != len(HELD_OUT):
        sys.exit(f"train_tiny_moe.py: held-out files {HELD_OUT} not all in {files[0].parent}")
    train_txt, held_txt = out / "train.txt", out / "heldout.txt"
    train_txt.write_text("".join(f.read_text(encoding="utf-8") for f in train), encoding="utf-8")
    held_txt.write_text("".join(f.read_text(encoding="utf-8") for f in held), encoding="utf-8")
    return train_txt, held_txt, [f.name for f in train], [f.name for f in held]


def train_tokenizer(train_txt, out, vocab_size):
    """Llama's tokenizer settings (BPE with byte fallback, no normalisation), as tandem's own
    TrainTokenizer uses (common/model/tokenizer.cc)."""
    spm.SentencePieceTrainer.train(
        input=str(train_txt), model_prefix=str(out / "tokenizer"), vocab_size=vocab_size,
        hard_vocab_limit=False, model_type="bpe", byte_fallback=True, character_coverage=1.0,
        normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, shuffle_input_sentence=False,
        minloglevel=2)
    (out / "tokenizer.vocab").unlink(missing_ok=True)
    return spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))


def warn_if_reference_blas():
    """The reference BLAS (Debian's libblas3) makes a step ~9x slower; say so once."""
    torch.ones(2, 2) @ torch.ones(2, 2)  # loads libblas.so.3 if it is not loaded yet
    maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    if "/blas/libblas.so" in maps:
        print("train_tiny_moe.py: torch runs on the reference BLAS (libblas3), ~9x slower than OpenBLAS; "
              "apt-get install -y libopenblas0-pthread", file=sys.stderr, flush=True)


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class TinyMixtral(torch.nn.Module):
    """Mixtral's forward pass as Hugging Face's modeling_mixtral computes it, parameters under
    its tensor names (ParameterDict keys with '.' replaced by '/')."""

    def __init__(self, a, vocab):
        super().__init__()
        self.a, self.vocab = a, vocab
        self.head_dim = a.hidden // a.heads
        self.eps, self.theta = 1e-5, 1e6
        d, hd, f = a.hidden, self.head_dim, a.intermediate
        shapes = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,), "lm_head.weight": (vocab, d)}
        for i in range(a.layers):
            p = f"model.layers.{i}."
            shapes.update({
                p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                p + "self_attn.q_proj.weight": (a.heads * hd, d), p + "self_attn.k_proj.weight": (a.kv_heads * hd, d),
                p + "self_attn.v_proj.weight": (a.kv_heads * hd, d), p + "self_attn.o_proj.weight": (d, a.heads * hd),
                p + "block_sparse_moe.gate.weight": (a.experts, d)})
            for e in range(a.experts):
                q = f"{p}block_sparse_moe.experts.{e}."
                shapes.update({q + "w1.weight": (f, d), q + "w3.weight": (f, d), q + "w2.weight": (d, f)})
        self.params = torch.nn.ParameterDict()
        for name, shape in shapes.items():
            t = torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape) * 0.02
            if name.endswith(("o_proj.weight", "w2.weight")):
                t /= math.sqrt(2 * a.layers)  # GPT-2's residual scaling: a stable start
            self.params[name.replace(".", "/")] = torch.nn.Parameter(t)

    def w(self, name):
        return self.params[name.replace(".", "/")]

    def dropout(self, x):
        """--dropout in training (the seeded torch generator); nothing otherwise."""
        return F.dropout(x, self.a.dropout, training=True) if self.training and self.a.dropout > 0 else x

    def rope(self, seq):
        inv = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def attention(self, p, x, cos, sin):
        a, (b, t, _) = self.a, x.shape
        q = (x @ self.w(p + "self_attn.q_proj.weight").T).view(b, t, a.heads, self.head_dim).transpose(1, 2)
        k = (x @ self.w(p + "self_attn.k_proj.weight").T).view(b, t, a.kv_heads, self.head_dim).transpose(1, 2)
        v = (x @ self.w(p + "self_attn.v_proj.weight").T).view(b, t, a.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = a.heads // a.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)  # torch 1.13 (Debian 12) has no fused attention
        o = F.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
        return o.transpose(1, 2).reshape(b, t, -1) @ self.w(p + "self_attn.o_proj.weight").T

    def moe(self, p, x):
        """Softmax over all experts, top-k, renormalised (Mixtral). Returns the output, the
        load-balancing loss (Switch Transformer's, as HF computes it) and the expert counts."""
        a, flat = self.a, x.reshape(-1, x.shape[-1])
        probs = F.softmax(flat @ self.w(p + "block_sparse_moe.gate.weight").T, dim=-1)
        weights, experts = probs.topk(a.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        counts = torch.zeros(a.experts)
        for e in range(a.experts):
            rows, slot = (experts == e).nonzero(as_tuple=True)
            counts[e] = rows.numel()
            if rows.numel() == 0:
                continue
            q, h = f"{p}block_sparse_moe.experts.{e}.", flat[rows]
            y = (F.silu(h @ self.w(q + "w1.weight").T) * (h @ self.w(q + "w3.weight").T)) @ self.w(q + "w2.weight").T
            out.index_add_(0, rows, y * weights[rows, slot].unsqueeze(-1))
        aux = a.experts * (counts / counts.sum() * probs.mean(0)).sum()
        return out.view_as(x), aux, counts

    def forward(self, tokens):
        x = self.w("model.embed_tokens.weight")[tokens]
        cos, sin = self.rope(tokens.shape[1])
        aux, counts = 0.0, []
        for i in range(self.a.layers):
            p = f"model.layers.{i}."
            h = self.attention(p, rms_norm(x, self.w(p + "input_layernorm.weight"), self.eps), cos, sin)
            x = x + self.dropout(h)
            y, layer_aux, layer_counts = self.moe(p, rms_norm(x, self.w(p + "post_attention_layernorm.weight"), self.eps))
            x, aux = x + self.dropout(y), aux + layer_aux
            counts.append(layer_counts)
        logits = rms_norm(x, self.w("model.norm.weight"), self.eps) @ self.w("lm_head.weight").T
        return logits, aux / self.a.layers, torch.stack(counts)


def batches(ids, a, gen):
    """Random windows of context+1 tokens from the training stream (a seeded generator)."""
    starts = torch.randint(0, len(ids) - a.context - 1, (a.batch,), generator=gen)
    w = torch.stack([ids[s:s + a.context + 1] for s in starts.tolist()])
    return w[:, :-1], w[:, 1:]


def train(model, ids, a, held_files):
    """held_files: (name, token ids) of each held-out file, scored every --eval_every steps."""
    gen = torch.Generator().manual_seed(a.seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup, start = max(1, a.steps // 20), time.time()
    for step in range(a.steps):
        lr = a.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / a.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batches(ids, a, gen)
        logits, aux, _ = model(x)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss = ce if a.label_smoothing == 0 else F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1), label_smoothing=a.label_smoothing)
        opt.zero_grad(set_to_none=True)
        (loss + a.aux_loss * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0 or step < 3 or step == a.steps - 1:
            print(f"step {step:4d}  loss {ce.item():.3f}  aux {aux.item():.3f}  lr {lr:.2e}  "
                  f"{time.time() - start:.0f} s", flush=True)
        if a.eval_every > 0 and (step + 1) % a.eval_every == 0:
            model.eval()
            scores = "  ".join(f"{name} {math.exp(evaluate(model, held, a.context)):.2f}" for name, held in held_files)
            print(f"step {step + 1:4d}  held-out perplexity (fp32 weights): {scores}", flush=True)
            model.train()


@torch.no_grad()
def evaluate(model, ids, context):
    """Mean NLL over the held-out stream as `tandem-perplexity --stride CONTEXT --add_bos=false` scores it:
    disjoint windows of `context` tokens, each window's first token unscored."""
    total, n = 0.0, 0
    for s in range(0, len(ids), context):
        w = ids[s:s + context]
        if len(w) < 2:
            break
        logits, _, _ = model(w[:-1].unsqueeze(0))
        total += F.cross_entropy(logits[0], w[1:], reduction="sum").item()
        n += len(w) - 1
    return total / n


def round_to_bf16(model):
    """The weights as the folder stores them."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def read_safetensors(path):
    """bf16 tensors of a file write_safetensors wrote."""
    raw = Path(path).read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    header, base, out = json.loads(raw[8:8 + size]), 8 + size, {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] != "BF16":
            sys.exit(f"train_tiny_moe.py: {path}: tensor {name} is {meta['dtype']}, expected BF16")
        begin, end = meta["data_offsets"]
        t = torch.frombuffer(bytearray(raw[base + begin:base + end]), dtype=torch.int16).view(torch.bfloat16)
        out[name] = t.float().reshape(meta["shape"])
    return out


def evaluate_folder(a):
    """--evaluate: the held-out NLL of a written folder, in torch (a cross-check of tandem-perplexity)."""
    out = Path(a.out)
    info = json.loads((out / "training.json").read_text())
    for k, v in info["args"].items():
        if k not in ("out", "evaluate", "threads"):
            setattr(a, k, v)
    sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    held = torch.tensor(sp.encode((out / "heldout.txt").read_text(encoding="utf-8")), dtype=torch.long)
    model = TinyMixtral(a, sp.get_piece_size())
    model.eval()
    tensors = read_safetensors(out / "model.safetensors")
    with torch.no_grad():
        for name, p in model.params.items():
            p.copy_(tensors[name.replace("/", ".")])
    nll = evaluate(model, held, a.context)
    print(json.dumps({"model": str(out), "held_out_tokens": len(held), "context": a.context, "mean_nll": nll,
                      "perplexity": math.exp(nll), "weights": "bf16 from model.safetensors", "compute": "torch fp32"}))


def write_safetensors(path, tensors):
    """bf16 safetensors: an 8-byte little-endian header size, a JSON header, the data."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for b in blobs:
            f.write(b)


def write_folder(model, a, vocab, out, info):
    config = {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": vocab,
        "hidden_size": a.hidden, "intermediate_size": a.intermediate, "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "head_dim": a.hidden // a.heads,
        "max_position_embeddings": 4 * a.context, "rope_theta": model.theta, "rms_norm_eps": model.eps,
        "sliding_window": None, "num_local_experts": a.experts, "num_experts_per_tok": a.top_k,
        "router_aux_loss_coef": a.aux_loss, "router_jitter_noise": 0.0, "tie_word_embeddings": False,
        "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
        "attention_dropout": 0.0, "initializer_range": 0.02, "output_router_logits": False, "use_cache": True,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}, indent=2) + "\n")
    tok_config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                  "unk_token": "<unk>", "pad_token": None, "tokenizer_class": "LlamaTokenizer",
                  "model_max_length": 4 * a.context, "legacy": True}
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    write_safetensors(out / "model.safetensors", {k.replace("/", "."): v for k, v in model.params.items()})
    (out / "training.json").write_text(json.dumps(info, indent=2) + "\n")


def main():
    a = parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    warn_if_reference_blas()
    if a.evaluate:
        evaluate_folder(a)
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    train_txt, held_txt, train_names, held_names = split_texts(licence_files(a.licenses), out)
    sp = train_tokenizer(train_txt, out, a.vocab_size)
    vocab = sp.get_piece_size()
    ids = torch.tensor(sp.encode(train_txt.read_text(encoding="utf-8")), dtype=torch.long)
    held = torch.tensor(sp.encode(held_txt.read_text(encoding="utf-8")), dtype=torch.long)
    print(f"tokenizer: {vocab} pieces; {len(ids)} training tokens ({', '.join(train_names)}); "
          f"{len(held)} held-out tokens ({', '.join(held_names)})", flush=True)
    held_files = [(name, torch.tensor(sp.encode((Path(a.licenses) / name).read_text(encoding="utf-8")),
                                      dtype=torch.long)) for name in held_names]
    model = TinyMixtral(a, vocab)
    train(model, ids, a, held_files)
    model.eval()
    round_to_bf16(model)
    held_nll = evaluate(model, held, a.context)
    print(f"held-out: mean NLL {held_nll:.4f}, perplexity {math.exp(held_nll):.2f} (bf16 weights, disjoint windows "
          f"of {a.context})", flush=True)
    per_file = {name: evaluate(model, t, a.context) for name, t in held_files}
    print("held-out by file: " + ", ".join(f"{name} perplexity {math.exp(nll):.2f}" for name, nll in per_file.items()),
          flush=True)
    info = {"args": vars(a), "vocab": vocab, "train_files": train_names, "held_out_files": held_names,
            "train_tokens": len(ids), "held_out_tokens": len(held), "held_out_nll_bf16_weights": held_nll,
            "held_out_nll_bf16_weights_by_file": per_file,
            "seconds": round(time.time() - start, 1), "torch": torch.__version__}
    write_folder(model, a, vocab, out, info)
    train_txt.unlink()
    print(f"wrote {out} in {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
