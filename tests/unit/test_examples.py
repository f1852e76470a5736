"""What every example deployment owes its model and its engine release, whatever the engine.

The model cards and the engines' deployment guides launch Kimi-K2 with the model's own code
(`trust_remote_code`: its tokenizer is a tiktoken wrapper in the repository) and Kimi's
tool-call parser, and Kimi-K2-Thinking with Kimi's reasoning parser as well. Each example is
planned as `hpcserve plan` would, and every node rank's command line must carry them, spelled
the way its engine spells them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcserve.author import config, plan
from hpcserve import engines
from hpcserve.author.words import show

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

# What each model needs from any engine that serves it (model cards: moonshotai/Kimi-K2-Instruct,
# moonshotai/Kimi-K2-Thinking; the tiny test model's template writes Hermes-style tool calls).
NEEDS = {
    "kimi-k2-instruct": {"remote_code": True, "tool": "kimi_k2"},
    "kimi-k2-thinking": {"remote_code": True, "tool": "kimi_k2", "reasoning": "kimi_k2"},
    "tiny-llama": {"tool": "hermes"},
    # DeepSeek-V3's config names no remote code of its own, but its tokenizer set-up did
    "deepseek-v3": {"remote_code": True},
}
# How each engine spells them. None: the engine has no option for it (checked below against its
# option table, so a release that adds one fails this test until hpcserve sets it).
SGLANG = {"remote_code": "--trust-remote-code", "tool": "--tool-call-parser",
          "reasoning": "--reasoning-parser"}
SPELLING = {
    "sglang": SGLANG,
    "ktransformers": SGLANG,  # kt-kernel inside SGLang's launch_server
    "vllm": {"remote_code": "--trust-remote-code", "tool": "--tool-call-parser",
             "reasoning": "--reasoning-parser"},
    "trtllm": {"remote_code": "--trust_remote_code", "tool": "--tool_parser",
               "reasoning": "--reasoning_parser"},
    # The legacy server loads tokenizer and config with trust_remote_code=True itself
    # (ktransformers/server/backend/interfaces/*.py) and parses no tool calls or reasoning.
    "ktransformers_legacy": {"remote_code": None, "tool": None, "reasoning": None},
}


def rank_argvs(p) -> list[tuple[str, int, list[str]]]:
    """Every node rank's command line, as `hpcserve plan --json` lists it."""
    out = []
    for inst in p.instances:
        for rank in range(inst.nodes):
            words = inst.argv + (inst.rank_argv[rank] if inst.rank_argv else ())
            out.append((inst.name, rank, [show(w, {"NODE_RANK": str(rank)}) for w in words]))
    return out


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_rank_carries_what_its_model_needs(example):
    cfg = config.load(example)
    p = plan.build(cfg)
    needs = NEEDS[cfg.deployment.model.profile]
    spell = SPELLING[p.engine]
    flags = set(engines.get(p.engine).matrix.release(p.version).flags)
    for need, value in needs.items():
        flag = spell[need]
        if flag is None:
            assert not any(need.split("_")[0] in f for f in flags), (p.engine, need, flags)
            continue
        for inst, rank, argv in rank_argvs(p):
            assert flag in argv, (example.stem, inst, rank, flag)
            if value is not True:
                assert argv[argv.index(flag) + 1] == value, (example.stem, inst, rank, flag)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_pins_a_release_its_engine_table_holds(example):
    """Checked against its own release's option table, never a neighbour's."""
    p = plan.build(config.load(example))
    assert p.version in engines.get(p.engine).matrix.versions(), (p.engine, p.version)
    assert not [w for w in p.warnings if "checked against" in w], p.warnings
