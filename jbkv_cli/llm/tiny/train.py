"""Train the embedded LM from a seed on ONE CPU thread, and write its Hugging Face folder.

    python -m jbkv_cli.llm.tiny.train --out jbkv_cli/llm/tiny/weights [--seed 0]

The model is a stock transformers ``LlamaForCausalLM`` (so it runs through exactly the hosting
path every other model takes): 2 layers, hidden 128, 4 query heads over 2 KV heads of dimension
64 (GQA), SwiGLU MLP 256, RoPE, tied embeddings, 1024 positions. It learns the key–value
language of :mod:`jbkv_cli.llm.tiny.corpus` by next-token prediction on fresh documents from the
seed, with a length curriculum (:data:`PHASES`: short documents first, where the answer's binding
is close, so the retrieval circuit forms; then long ones, where it must reach far back). AdamW,
linear warm-up then cosine decay, gradient clipping. Deterministic given the seed
(``torch.set_num_threads(1)``, deterministic algorithms). The log (``train_log.json``) records
the measured wall-clock and CPU time, and the answer NLL by distance to the binding on held-out
documents (the evidence that the model uses its long prefix).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from jbkv_cli.llm.tiny.corpus import CorpusConfig, answer_mask, document_ids, eval_generator
from jbkv_cli.llm.tiny.tokenizer import build_tokenizer

PHASES = ((600, 128, 32), (900, 512, 8), (500, 1024, 4))  # (steps, document length, batch)


@dataclass(frozen=True)
class ModelConfig:
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    mlp: int = 256
    positions: int = 1024

    def llama(self, vocab: int):
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=vocab,
            hidden_size=self.hidden,
            intermediate_size=self.mlp,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.positions,
            rope_theta=10000.0,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=None,
            pad_token_id=None,
        )


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup: int = 30
    weight_decay: float = 0.01
    grad_clip: float = 1.0

    @property
    def steps(self) -> int:
        return sum(p[0] for p in PHASES)


def lr_at(step: int, tc: TrainConfig) -> float:
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    frac = (step - tc.warmup) / max(1, tc.steps - tc.warmup)
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def phase_at(step: int) -> tuple[int, int]:
    """(document length, batch size) at ``step``."""
    for steps, length, batch in PHASES:
        if step < steps:
            return length, batch
        step -= steps
    return PHASES[-1][1:]


def _distances(ids: list[int], cc: CorpusConfig) -> list[int | None]:
    """For each position predicting an answer, how far back its key's latest binding is."""
    last: dict[int, int] = {}
    out: list[int | None] = []
    first_query = cc.query(0)
    for t, tok in enumerate(ids[:-1]):
        nxt = ids[t + 1]
        if cc.binding(0, 0) <= tok < first_query:
            last[(tok - cc.binding(0, 0)) // cc.values] = t
        out.append(t - last[tok - first_query] if nxt >= cc.answer(0) else None)
    return out


@torch.no_grad()
def evaluate(model, cc: CorpusConfig, length: int = 1024, docs: int = 16) -> dict:
    """Held-out answer NLL by distance to the binding, and the NLL of the other tokens."""
    model.eval()
    ids = [document_ids(length, cc, eval_generator(10**6, i)) for i in range(docs)]
    x = torch.tensor(ids)
    logits = model(input_ids=x).logits[:, :-1].float()
    nll = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none"
    )
    nll = nll.view(docs, -1)
    answers = answer_mask(x[:, 1:], cc)
    buckets: dict[str, list[float]] = {}
    for d, row in enumerate(ids):
        for t, dist in enumerate(_distances(row, cc)):
            if dist is None:
                continue
            name = next(f"<{b}" for b in (16, 64, 256, 1024, 1 << 30) if dist < b)
            buckets.setdefault(name, []).append(float(nll[d, t]))
    model.train()
    return {
        "answer_nll": float(nll[answers].mean()),
        "other_nll": float(nll[~answers].mean()),
        "answer_nll_by_distance": {k: sum(v) / len(v) for k, v in sorted(buckets.items())},
        "answers": int(answers.sum()),
    }


def train(seed: int, log_every: int = 50) -> tuple[object, dict]:
    from transformers import LlamaForCausalLM

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(seed)
    cc, mc, tc = CorpusConfig(), ModelConfig(), TrainConfig()
    config = mc.llama(cc.vocab_size)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tc.weight_decay}, {"params": rest, "weight_decay": 0}],
        lr=tc.lr,
        betas=(0.9, 0.98),
    )
    gen = torch.Generator().manual_seed(seed + 1)
    wall, cpu = time.time(), time.process_time()
    history, window = [], []
    for step in range(tc.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tc)
        length, batch = phase_at(step)
        x = torch.tensor([document_ids(length, cc, gen) for _ in range(batch)])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        window.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == tc.steps:
            entry = {
                "step": step + 1,
                "length": length,
                "loss": sum(window) / len(window),
                "wall_seconds": round(time.time() - wall, 1),
                "cpu_seconds": round(time.process_time() - cpu, 1),
            }
            window = []
            if (step + 1) % (4 * log_every) == 0:
                entry["eval"] = evaluate(model, cc, length=length, docs=8)
            history.append(entry)
            print(json.dumps(entry), flush=True)
    log = {
        "seed": seed,
        "steps": tc.steps,
        "phases": [list(p) for p in PHASES],
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "wall_seconds": round(time.time() - wall, 1),
        "cpu_seconds": round(time.process_time() - cpu, 1),
        "params": sum(p.numel() for p in model.parameters()),
        "model": asdict(mc),
        "train": asdict(tc),
        "corpus": asdict(cc),
        "final_eval": evaluate(model, cc),
        "history": history,
    }
    return model.eval(), log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="model folder to write")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model, log = train(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    model.config._attn_implementation = "sdpa"
    model.save_pretrained(args.out)
    build_tokenizer().save_pretrained(args.out)
    (args.out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(json.dumps({k: v for k, v in log.items() if k != "history"}, indent=1))


if __name__ == "__main__":
    main()
