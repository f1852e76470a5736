"""Stand-ins for the engines where the real one cannot run here (no GPU): each built from its
pinned release's facts (hpcserve/engines/facts.py) and strict: it never answers, moves a
counter or takes a flag that the real release would not. To add one: a module over
hpcserve_simcore.py named by its adapter's sim_source()."""
