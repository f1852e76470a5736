"""`hpcserve plan` is read in a terminal: the topology, each instance's command once in its
launch script's own lines (what differs per node as the script's variables), within 100 columns;
`hpcserve plan --argv` keeps every node's whole command line."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hpcserve.author import config, plan
from hpcserve.cli import main
from hpcserve.author.words import show
from unitkit import EXAMPLES, ROOT

GOLDEN = ROOT / "tests" / "golden"
IDS = [e.stem for e in EXAMPLES]


def _plan(args: list[str]) -> str:
    r = CliRunner().invoke(main, ["plan", *args])
    assert r.exit_code == 0, r.output
    return r.stdout  # the plan itself; its warnings go to stderr first, one line each


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_no_line_of_the_plan_passes_100_columns(example):
    # a single shell word longer than that (a long path) stays whole on a line of its own
    long = [(n, len(ln)) for n, ln in enumerate(_plan([str(example)]).splitlines(), 1)
            if len(ln) > 100 and len(ln.strip().removesuffix(" \\").split()) > 1]
    assert not long, f"{example.name}: lines over 100 columns (line, width): {long}"


def _launch_options(stem: str, inst: str) -> list[str]:
    """The option lines of the golden launch/<inst>.sh's command (after `exec \\` and the
    program), without their indentation and continuation."""
    lines = (GOLDEN / stem / "launch" / f"{inst}.sh").read_text().splitlines()
    start = lines.index("exec \\") + 2
    out = []
    for ln in lines[start:]:
        if not ln.startswith("  --") and not ln.startswith("  serve "):
            break
        out.append(ln.strip().removesuffix(" \\"))
    return out


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_each_instance_command_is_its_launch_scripts_once(example):
    """The plan shows the very option lines the launch script runs, each instance's once."""
    text = _plan([str(example)])
    shown: list[str] = []
    indent = folded = 0
    for ln in text.splitlines():
        word, deeper = ln.strip().removesuffix(" \\"), len(ln) - len(ln.lstrip()) > indent
        if shown and folded and deeper and shown[-1].startswith("--") and \
                not word.startswith("--"):
            shown[-1] += " " + word  # an option's values folded onto a line of their own
            continue
        shown.append(word)
        indent, folded = len(ln) - len(ln.lstrip()), ln.endswith(" \\")
    p = plan.build(config.load(example))
    for i in p.instances:
        want = _launch_options(example.stem, i.name)
        assert want, f"{example.stem}/launch/{i.name}.sh: no option lines found"
        (at,) = [k for k, ln in enumerate(shown) if ln.startswith(f"{i.name} (component ")]
        got = shown[at + 2:at + 2 + len(want)]  # after the block's title and program
        assert got == want, f"{i.name}: the plan's lines differ from its launch script's"
    # each command once: its first option line appears once per instance, not once per node
    firsts = [_launch_options(example.stem, i.name)[0] for i in p.instances]
    for line in firsts:
        assert shown.count(line) == firsts.count(line), line


def test_the_4p12d_plan_is_short_and_names_what_differs_per_node():
    """16 nodes, 2 instances: the old text repeated the command per node (13,651 bytes). Now it
    is the header, 3 topology rows, 2 commands of about 30 options, the router's, the fit:
    under 4 KB and 110 lines, whatever the node count."""
    text = _plan([str(ROOT / "examples" / "kimi-k2-instruct-4p12d.yaml")])
    assert len(text.encode()) < 4096 and len(text.splitlines()) < 110, len(text)
    for var in ('--node-rank "${NODE_RANK}"', '--host "${NODE_IP}"',
                '--dist-init-addr "${LEADER_IP}":5757', 'http://"${PREFILL_0_IP}":30000'):
        assert var in text, var
    assert "$NODE_RANK" in text and "node's rank in its instance" in text  # the legend
    assert "<decode3>" not in text and "--node-rank 3" not in text  # no per-node copy


def test_what_a_node_rank_adds_is_shown_per_rank():
    text = _plan([str(ROOT / "examples" / "vllm-kimi-k2-pd-nixl.yaml")])
    assert "node rank 0 adds: (nothing)" in text
    assert "node rank 1 adds: --headless --data-parallel-start-rank 8" in text


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_plan_argv_has_every_nodes_whole_command(example):
    text = _plan(["--argv", str(example)])
    rows = [ln for ln in text.splitlines()]
    p = plan.build(config.load(example))
    for i in p.instances:
        c = p.components[i.component]
        for rank in range(i.nodes):
            n = i.node_offset + rank
            vals = {"NODE_RANK": str(rank), "NODE_IP": f"<{c.name}{n}>",
                    "LEADER_IP": f"<{c.name}{i.node_offset}>"}
            words = [show(w, vals) for w in i.argv + (i.rank_argv[rank] if i.rank_argv else ())]
            mine = [r for r in rows if r.split()[:5] == [str(i.component), str(n), i.role,
                                                         str(i.index), str(rank)]]
            assert len(mine) == 1, f"{i.name} node rank {rank}: {len(mine)} rows"
            assert mine[0].endswith(" ".join(words)), f"{i.name} node rank {rank}"


def test_a_long_option_folds_between_shell_words_never_inside_a_quoted_value():
    import shlex
    from hpcserve.author.table import _fold
    value = shlex.quote('{"max_loras": 4, "lora_modules": ["' + "a" * 40 + '", "' + "b" * 40
                        + '"], "x": 1}')
    line = f"--json-arg {value} --other 'two words' plain"
    folded = _fold(line, "    ", last=True)
    assert len(folded) > 1
    for ln in folded:  # every line closes its own quotes: no ` \` inside a quoted value
        shlex.split(ln.removesuffix(" \\"))
    # the continuations joined back give the same shell words
    joined = " ".join(ln.strip().removesuffix(" \\") for ln in folded)
    assert shlex.split(joined) == shlex.split(line)
