"""A vLLM general plugin for the real-engine tests: vLLM 0.32.0's CPU fused MoE under expert
parallelism gets the local expert ids that every other MoE kernel of vLLM gets.

Why it is needed: vLLM 0.32.0 has one unquantized MoE backend on CPUs
(vllm/model_executor/layers/fused_moe/oracle/unquantized.py), whose two ISA variants (`amx` on
CPUs with AMX tiles, `vec` elsewhere) both run `CPUUnquantizedExperts.apply`
(fused_moe/experts/cpu_moe.py). Its router returns global expert ids (fused_moe/router/
cpu_router.py) and `apply` receives the layer's `expert_map` but never uses it, so with
`--enable-expert-parallel` the kernel (csrc/cpu/cpu_fused_moe.cpp, `fused_moe_impl`) counts
tokens into `token_num_per_group_buffer[global id]` for a rank that holds only its local
experts: it reads and writes past its buffers, and whether that segfaults depends on what the
scratchpad held before, not on the CPU. No dimension, dtype, option or environment variable of
that release picks another kernel (a hidden size that is not a multiple of 32 leaves no
backend at all).

This plugin maps the ids through `expert_map` (a remote expert: local id 0 with weight 0) before
the kernel runs, which is what vLLM's GPU kernels do with the same map. It is loaded only where
a deployment puts this folder on PYTHONPATH and names it in VLLM_PLUGINS. It prints one line per
process on its first mapped call, so a test can see that each rank held its own experts."""

from __future__ import annotations

import inspect
import os
import sys


def register() -> None:
    import torch
    from vllm.model_executor.layers.fused_moe.experts import cpu_moe

    cls = cpu_moe.CPUUnquantizedExperts
    if getattr(cls, "_hpcserve_local_ids", False):
        return  # vLLM loads general plugins once per process, but may import twice
    apply = cls.apply
    params = inspect.signature(apply)
    said = []

    def apply_with_local_ids(self, *args, **kwargs):
        call = params.bind(self, *args, **kwargs)
        a = call.arguments
        emap = a["expert_map"]
        if emap is not None:
            local = emap[a["topk_ids"].long()]
            remote = local < 0
            a["topk_weights"] = a["topk_weights"].masked_fill(remote, 0.0).contiguous()
            a["topk_ids"] = local.clamp_min(0).to(torch.int32).contiguous()
            if not said:
                said.append(True)
                print(f"hpcserve-test-moe-ep: pid {os.getpid()}: expert ids mapped to this "
                      f"rank's {int((emap >= 0).sum())} local experts of {emap.numel()} "
                      f"({int(remote.sum())} of {remote.numel()} token-expert pairs remote)",
                      file=sys.stderr, flush=True)
        return apply(*call.args, **call.kwargs)

    cls.apply = apply_with_local_ids
    cls._hpcserve_local_ids = True
