"""Will it fit: the weights on each GPU for the chosen layout, the memory the engine leaves for
the KV cache, and the tokens and requests that fit at the deployment's workload.

Pure arithmetic on the model profile (architecture), the site's GPUs and each role's layout,
run by the planner for every role: a role whose weights leave no KV cache is refused with the
numbers, a tight one is warned about, and `hpcserve plan` shows every figure.

Per GPU (pp pipeline stages split the layers):
  weights = (attention / attention_tp + other dense / tp
             + routed experts x (1 + redundant / experts) / max(EP, tp)) / pp
  attention_tp  = tp / attention-DP groups (DP attention replicates the attention weights);
  max(EP, tp)   = an expert-parallel group of EP ranks with MoE TP inside it
  KV per token  = MLA: (kv_lora_rank + qk_rope_head_dim) x layers / pp x KV dtype bytes (every
                  rank of an attention group holds the group's latent KV);
                  GQA: 2 x kv_heads x head_dim x layers / pp x bytes / min(attention_tp, kv_heads)
  tokens        = KV budget / KV per token, times the attention groups (DP replicas)
  requests      = tokens / (input + output tokens of the workload)
The engine's rule for the KV budget comes from its adapter (EngineAdapter.memory_budget).
"""

from __future__ import annotations


from dataclasses import dataclass
from typing import Any


# GPU memory is counted as nvidia-smi and the GPU names do (an H200's "141 GB" is 141 GiB).
GIB = 2 ** 30


@dataclass(frozen=True)
class RoleFit:
    role: str
    gpus: int                    # per instance
    gpu_gb: float
    weights_gb: float            # per GPU, redundant experts included
    budget: Any                  # engines.base.MemoryBudget, or None: not modelled
    kv_bytes_per_token: float    # per GPU
    groups: int                  # attention groups (DP) of one instance
    tokens: int                  # KV tokens of one instance
    requests: int                # at the workload's input + output
    seq_tokens: int              # input + output
    verdict: str                 # fits, tight, does not fit, not modelled
    why: str

    @property
    def kv_gb(self) -> float:
        return self.budget.kv_bytes / GIB if self.budget else 0.0


def shards(parallel: dict, ep: int | None) -> tuple[int, int, int, int]:
    """(dense shards, expert shards, pipeline stages, attention groups) of a layout."""
    tp = parallel.get("tp", 1)
    attn_dp = parallel.get("attn_dp")
    groups = attn_dp or parallel.get("dp") or 1
    dense = tp // attn_dp if attn_dp else tp
    return dense, max(ep or 1, tp), parallel.get("pp", 1), groups


def weights_per_gpu(arch: Any, parallel: dict, ep: int | None, redundant: int,
                    host_bytes: float) -> float:
    """Attention split over the attention TP size (replicated per DP-attention group), the
    other dense weights over TP, the routed experts over max(EP, TP)."""
    attn_div, expert_div, pp, _ = shards(parallel, ep)
    experts = arch.expert_bytes - host_bytes
    attention = arch.attention_bytes
    rest = arch.weight_bytes - arch.expert_bytes - attention
    if arch.experts and redundant:
        experts *= 1 + redundant / arch.experts
    return (attention / attn_div + rest / parallel.get("tp", 1) + experts / expert_div) / pp


def kv_bytes_per_token(arch: Any, parallel: dict, kv_dtype_bytes: float) -> float | None:
    dense_div, _, pp, _ = shards(parallel, None)
    layers = arch.layers / pp
    if arch.attention == "mla" and arch.kv_lora_rank and arch.qk_rope_head_dim:
        return (arch.kv_lora_rank + arch.qk_rope_head_dim) * layers * kv_dtype_bytes
    if arch.num_kv_heads and arch.head_dim:
        return (2 * arch.num_kv_heads * arch.head_dim * layers * kv_dtype_bytes
                / min(dense_div, arch.num_kv_heads))
    return None


def role_fit(*, role: str, arch: Any, gpus: int, gpu_gb: float, parallel: dict,
             ep: int | None, redundant: int, host_bytes: float, budget_of,
             workload: Any, context: int | None) -> RoleFit:
    """The fit of one role's instances; `budget_of(weights per GPU) -> MemoryBudget | None`
    is the engine's rule."""
    weights = weights_per_gpu(arch, parallel, ep, redundant, host_bytes)
    budget = budget_of(weights)
    seq = workload.input_tokens + workload.output_tokens
    groups = shards(parallel, ep)[3]
    per_token = kv_bytes_per_token(arch, parallel, budget.kv_dtype_bytes) if budget else None
    common = dict(role=role, gpus=gpus, gpu_gb=gpu_gb, weights_gb=weights / GIB, budget=budget,
                  groups=groups, seq_tokens=seq)
    if budget is None or per_token is None:
        return RoleFit(**common, kv_bytes_per_token=0.0, tokens=0, requests=0,
                       verdict="not modelled", why="the engine's memory rule or the model's "
                                                   "attention shape is not known")
    if budget.kv_bytes <= 0:
        return RoleFit(**common, kv_bytes_per_token=per_token, tokens=0, requests=0,
                       verdict="does not fit",
                       why=f"{weights / GIB:.1f} GiB of weights per GPU leave no KV cache "
                           f"({budget.how})")
    tokens = int(budget.kv_bytes / per_token) * groups
    requests = tokens // seq
    longest = context or arch.context_length
    if requests < 1 or tokens // groups < longest:
        verdict, why = "tight", (f"one attention group holds {tokens // groups:,} tokens: "
                                 f"fewer than one {max(longest, seq):,}-token sequence "
                                 "(context_length)" if requests else
                                 f"fewer than one {seq:,}-token request")
    elif budget.kv_bytes < 0.05 * gpu_gb * GIB:
        verdict, why = "tight", (f"{budget.kv_bytes / GIB:.1f} GiB per GPU left for the KV cache "
                                 "(under 5% of the GPU)")
    else:
        verdict, why = "fits", ""
    return RoleFit(**common, kv_bytes_per_token=per_token, tokens=tokens, requests=requests,
                   verdict=verdict, why=why)


def fit_table(fits: list[RoleFit]) -> list[str]:
    """Lines for `hpcserve plan`: the figures of every role and the rule behind them."""
    out = ["fit (per GPU; tokens and requests per instance, at "
           f"{fits[0].seq_tokens:,} tokens a request):" if fits else "fit: nothing to show"]
    for f in fits:
        if f.budget is None:
            out.append(f"  {f.role}: weights {f.weights_gb:.1f} GiB per GPU; {f.why}")
            continue
        out.append(f"  {f.role}: weights {f.weights_gb:.1f} GiB of {f.gpu_gb:g} GiB per GPU, "
                   f"KV cache {f.kv_gb:.1f} GiB ({f.budget.how}), "
                   f"{f.kv_bytes_per_token / 1e3:.1f} kB per token x {f.groups} attention "
                   f"group(s) -> {f.tokens:,} tokens, {f.requests:,} requests: {f.verdict}"
                   + (f" ({f.why})" if f.why else ""))
    return out
