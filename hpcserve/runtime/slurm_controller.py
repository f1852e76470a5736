"""Slurm's words for a busy or restarting controller (and for no cluster at all), and how long
to wait before asking again.

- `controller_unreachable`: Slurm's words for a busy or restarting slurmctld, in what a command
  printed; `retry_delay` and RETRY_DELAYS_S: how long to wait before asking again, and when to
  give up (the operator commands' runner and the in-job runtime both follow it).

Apart from the parsers: it reads any command's error text, not one command's output. Standard
library only and nothing of hpcserve: it ships in the job directory with the runtime.
"""

from __future__ import annotations

from typing import Sequence


__all__ = [
    "CONTROLLER_UNREACHABLE", "NOT_DELIVERED", "RETRY_DELAYS_S", "RETRY_WINDOW_S",
    "controller_unreachable", "request_not_delivered", "retry_delay",
]

# --------------------------------------------------------------------------------------------
# A busy or restarting controller
#
# Slurm's own words for a request slurmctld did not answer, from the error table of
# src/common/slurm_errno.c (the same texts from slurm-22-05-8-1, which Debian 12 ships, to
# master). Each command prints one behind a prefix of its own: `slurm_load_jobs error: ...`
# (squeue, scontrol show job, scancel --signal), `slurm_load_ctl_conf error: ...` (scontrol show
# config), `slurm_load_partitions: ...` (sinfo), `scancel: error: Kill job error on job id N: ...`,
# `sbatch: error: Batch job submission failed: ...`, `allocation failure: ...` (sbatch
# --test-only). Each client already retries a refused connection for MessageTimeout seconds
# (slurm_open_controller_conn in src/common/slurm_protocol_api.c) before it prints one.
CONTROLLER_UNREACHABLE = (
    # SLURMCTLD_COMMUNICATIONS_{CONNECTION,SEND,RECEIVE,SHUTDOWN}_ERROR: "Unable to contact slurm
    # controller (connect failure)" etc.; what every command prints while slurmctld is stopped.
    "Unable to contact slurm controller",
    # SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT: connected, but no answer within MessageTimeout (a
    # controller busy, or stopped with SIGSTOP).
    "Socket timed out on send/recv operation",
    # SLURM_PROTOCOL_SOCKET_ZERO_BYTES_SENT: the connection closed mid-request (going down).
    "Zero Bytes were transmitted or received",
    # ESLURM_IN_STANDBY_MODE / ESLURM_IN_STANDBY_USE_BACKUP: a backup controller that has not
    # taken over (yet), or a primary that went back to standby.
    "Slurm backup controller in standby mode",
    "Controller is in standby mode, try a different controller",
)
# Of those, the words that say the request never reached a controller that acts on it: the
# connection was refused, or a controller in standby turned it away. After any other one a
# request may have been carried out all the same: an `sbatch` that printed "Socket timed out on
# send/recv operation" against a stopped (SIGSTOP) slurmctld on the test cluster had its job
# queued once slurmctld went on.
NOT_DELIVERED = (
    "Unable to contact slurm controller (connect failure)",
    "Slurm backup controller in standby mode",
    "Controller is in standby mode, try a different controller",
)
# Waits before the 2nd, 3rd, ... try of a query the controller did not answer: 5 tries, 26 s of
# waiting in all; no try starts later than RETRY_WINDOW_S after the first one started (each
# failed try itself takes up to MessageTimeout, 10 s by default).
RETRY_DELAYS_S = (2.0, 4.0, 8.0, 12.0)
RETRY_WINDOW_S = 30.0


# What Slurm's commands print where they have no cluster to ask: no slurm.conf (SLURM_CONF,
# /etc/slurm) and no configless DNS SRV record (Slurm 22.05's src/common/fetch_config.c). Asking
# again cannot help: this is a machine outside the cluster, not a controller that is busy.
NOT_CONFIGURED = (
    "Could not establish a configuration source",
    "_establish_config_source: failed to fetch config",
)


def not_configured(text: str | None) -> bool:
    """True when a Slurm command says it has no configuration: no cluster is known here."""
    return bool(text) and any(words in text for words in NOT_CONFIGURED)


def controller_unreachable(text: str | None) -> bool:
    """True when a Slurm command's output says slurmctld did not answer (busy, restarting,
    stopped, or a backup in standby); False for every answer the controller gave, refusals
    included ('Invalid job id specified', 'Job/step already completing or completed')."""
    return bool(text) and any(words in text for words in CONTROLLER_UNREACHABLE)


def request_not_delivered(text: str | None) -> bool:
    """True when the output says the request never reached a controller that acts on it, so
    sending it again cannot do anything twice (see NOT_DELIVERED)."""
    return bool(text) and any(words in text for words in NOT_DELIVERED)


def retry_delay(tries: int, elapsed: float, delays: Sequence[float] = RETRY_DELAYS_S,
                window: float = RETRY_WINDOW_S) -> float | None:
    """Seconds to wait before asking again after `tries` tries that the controller did not
    answer, the first of which started `elapsed` seconds ago; None: give up."""
    if tries < 1 or tries > len(delays) or elapsed + delays[tries - 1] > window:
        return None
    return delays[tries - 1]
