"""Writes the hand-made `squeue --json` samples for Slurm 23.02, 23.11 and 24.11 (see README.md).

No Slurm of those releases was at hand, so these are written from the data_parser source that
produces them (SchedMD/slurm, src/plugins/data_parser/<ver>/parsers.c, PARSER_ARRAY(JOB_INFO), the
DUMP_FUNCs of each field type, and src/interfaces/data_parser.c for the 23.02 envelope):

- 23.02, v0.0.39 (tag slurm-23-02-7-1): `job_state` a string (job_state_string()); *_NO_VAL
  numbers as {"set","infinite","number"}; times (UINT64) plain ints; exit codes a raw wait status in
  a NO_VAL object; envelope {"meta": {"plugins", "command", "Slurm"}, "errors", "warnings", "jobs"}.
- 23.11, v0.0.40 (tag slurm-23-11-10-1): `job_state` a list (base state, then flags); times are
  TIMESTAMP_NO_VAL objects; exit codes PROCESS_EXIT_CODE {"status", "return_code", "signal":
  {"id", "name"}} with a single-flag status string; envelope OPENAPI_JOB_INFO_RESP
  {"jobs", "last_backfill", "last_update", "meta", "errors", "warnings"}.
- 24.11, v0.0.42 (tag slurm-24-11-7-1): as v0.0.40, plus `priority_by_partition`, `qos` a plain
  string, `required_switches` (was `minimum_switches`), no `power`/`exclusive`/`oversubscribe`,
  and the new `job_resources` layout ({"select_type", "nodes": {"count", "select_type", "list",
  "whole", "allocation"}, "cpus", "threads_per_core"}).

The job values (ids, nodes, states, reasons) are invented to cover what hpcserve must read: a
running het job, a pending het job, a mixed het job (one component NODE_FAIL), pending reasons with
and without a description, an infinite and an unset time limit, COMPLETING and CONFIGURING (flags),
FAILED with exit code 3, CANCELLED by SIGTERM, an array task. Run from anywhere:
`python tests/data/slurm/make_json_samples.py` rewrites the three files.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
T0 = 1767261600  # 2026-01-01T10:00:00Z
INF = "inf"

# Semantic job values; None = NO_VAL (unset), INF = INFINITE.
JOBS = [
    dict(job_id=4001, het=(4001, 0, "4001-4002"), name="kimi-k2-pd", state="RUNNING", flags=(),
         reason="None", desc="", nodes="gpu-001", node_count=1, cpus=112, limit=240,
         submit=T0, start=T0 + 30, end=T0 + 30 + 240 * 60, exit=0, batch_host="gpu-001"),
    dict(job_id=4002, het=(4001, 1, "4001-4002"), name="kimi-k2-pd", state="RUNNING", flags=(),
         reason="None", desc="", nodes="gpu-[002-005]", node_count=4, cpus=448, limit=240,
         submit=T0, start=T0 + 30, end=T0 + 30 + 240 * 60, exit=0, batch_host="gpu-002"),
    dict(job_id=4010, het=(4010, 0, "4010-4011"), name="dsv3-pd", state="PENDING", flags=(),
         reason="Resources", desc="", nodes="", node_count=1, cpus=112, limit=120,
         submit=T0 + 60, start=T0 + 3600, end=T0 + 3600 + 7200, exit=None, batch_host=""),
    dict(job_id=4011, het=(4010, 1, "4010-4011"), name="dsv3-pd", state="PENDING", flags=(),
         reason="Resources", desc="", nodes="", node_count=8, cpus=896, limit=120,
         submit=T0 + 60, start=T0 + 3600, end=T0 + 3600 + 7200, exit=None, batch_host=""),
    dict(job_id=4020, het=None, name="qwen-serve", state="PENDING", flags=(),
         reason="QOSMaxNodePerUserLimit", desc="", nodes="", node_count=2, cpus=224, limit=INF,
         submit=T0 + 90, start=0, end=0, exit=None, batch_host=""),
    dict(job_id=4021, het=None, name="pinned", state="PENDING", flags=(), reason="ReqNodeNotAvail",
         desc="ReqNodeNotAvail, UnavailableNodes:gpu-[007-008]", nodes="", node_count=2, cpus=224,
         limit=None, submit=T0 + 95, start=0, end=0, exit=None, batch_host=""),
    dict(job_id=4030, het=None, name="ending", state="COMPLETED", flags=("COMPLETING",),
         reason="None", desc="", nodes="gpu-006", node_count=1, cpus=112, limit=60,
         submit=T0 - 4000, start=T0 - 3900, end=T0 - 100, exit=0, batch_host="gpu-006"),
    dict(job_id=4031, het=None, name="crashed", state="FAILED", flags=(), reason="NonZeroExitCode",
         desc="", nodes="gpu-009", node_count=1, cpus=112, limit=60,
         submit=T0 - 900, start=T0 - 800, end=T0 - 500, exit=3 << 8, batch_host="gpu-009"),
    dict(job_id=4032, het=None, name="stopped", state="CANCELLED", flags=(), reason="None", desc="",
         nodes="gpu-010", node_count=1, cpus=112, limit=60,
         submit=T0 - 700, start=T0 - 600, end=T0 - 60, exit=15, batch_host="gpu-010"),
    dict(job_id=4040, het=(4040, 0, "4040-4041"), name="half-broken", state="RUNNING", flags=(),
         reason="None", desc="", nodes="gpu-011", node_count=1, cpus=112, limit=240,
         submit=T0 - 300, start=T0 - 200, end=T0 - 200 + 240 * 60, exit=0, batch_host="gpu-011"),
    dict(job_id=4041, het=(4040, 1, "4040-4041"), name="half-broken", state="NODE_FAIL", flags=(),
         reason="NodeDown", desc="", nodes="gpu-[012-013]", node_count=2, cpus=224, limit=240,
         submit=T0 - 300, start=T0 - 200, end=T0 - 20, exit=9, batch_host="gpu-012"),
    dict(job_id=4045, het=None, name="booting", state="RUNNING", flags=("CONFIGURING",),
         reason="None", desc="", nodes="gpu-[014-015]", node_count=2, cpus=224, limit=30,
         submit=T0 - 10, start=T0 - 5, end=T0 - 5 + 1800, exit=0, batch_host="gpu-014"),
    dict(job_id=4053, het=None, array=(4050, 3), name="sweep", state="RUNNING", flags=(),
         reason="None", desc="", nodes="gpu-016", node_count=1, cpus=112, limit=30,
         submit=T0 - 50, start=T0 - 40, end=T0 - 40 + 1800, exit=0, batch_host="gpu-016"),
]

# job_state_string(): a set flag names the state.
_FLAG_ORDER = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED")


def noval(v):
    if v is None:
        return {"set": False, "infinite": False, "number": 0}
    if v == INF:
        return {"set": False, "infinite": True, "number": 0}
    return {"set": True, "infinite": False, "number": v}


def exit_verbose(raw):
    """DUMP_FUNC(PROCESS_EXIT_CODE) in v0.0.40/v0.0.42."""
    unset16 = {"set": False, "infinite": False, "number": 0}
    if raw is None:
        return {"status": "PENDING", "return_code": noval(None),
                "signal": {"id": unset16, "name": ""}}
    sig = raw & 0x7F
    if sig == 0:
        rc = (raw >> 8) & 0xFF
        return {"status": "ERROR" if rc else "SUCCESS", "return_code": noval(rc),
                "signal": {"id": unset16, "name": ""}}
    names = {9: "KILL", 15: "TERM"}
    return {"status": "SIGNALED", "return_code": noval(None),
            "signal": {"id": noval(sig), "name": names[sig]}}


def display_state(j):
    for f in _FLAG_ORDER:
        if f in j["flags"]:
            return f
    return j["state"]


def common(j, ver):
    het = j.get("het")
    arr = j.get("array")
    new = ver != "v0.0.39"
    ts = noval if new else (lambda v: v or 0)
    std = f"/home/alice/hpcserve/{j['name']}/slurm-{het[0] if het else j['job_id']}.out"
    out = {
        "account": "llm", "accrue_time": ts(j["submit"]), "admin_comment": "",
        "allocating_node": "login1",
        "array_job_id": noval(arr[0] if arr else 0),
        "array_task_id": noval(arr[1] if arr else None),
        "array_max_tasks": noval(0), "array_task_string": "",
        "association_id": 17, "batch_features": "", "batch_flag": True,
        "batch_host": j["batch_host"],
        "flags": ["EXACT_CPU_COUNT_REQUESTED", "JOB_WAS_RUNNING"] if j["start"] else [],
        "burst_buffer": "", "burst_buffer_state": "", "cluster": "h100", "cluster_features": "",
        "command": f"/home/alice/hpcserve/{j['name']}/job.sbatch", "comment": "",
        "container": "", "container_id": "", "contiguous": False, "core_spec": 0,
        "thread_spec": 0, "cores_per_socket": noval(None), "billable_tres": noval(j["cpus"]),
        "cpus_per_task": noval(1), "cpu_frequency_minimum": noval(None),
        "cpu_frequency_maximum": noval(None), "cpu_frequency_governor": noval(None),
        "cpus_per_tres": "", "cron": "", "deadline": ts(0), "delay_boot": noval(0),
        "dependency": "",
        "derived_exit_code": exit_verbose(j["exit"] and 0) if new else noval(j["exit"] and 0),
        "eligible_time": ts(j["submit"]), "end_time": ts(j["end"]), "excluded_nodes": "",
        "exit_code": exit_verbose(j["exit"]) if new else noval(j["exit"]),
        "extra": "", "failed_node": "gpu-012" if j["state"] == "NODE_FAIL" else "",
        "features": "", "federation_origin": "", "federation_siblings_active": "",
        "federation_siblings_viable": "", "gres_detail": [], "group_id": 1000,
        "group_name": "alice",
        "het_job_id": noval(het[0] if het else 0),
        "het_job_id_set": het[2] if het else "",
        "het_job_offset": noval(het[1] if het else 0),
        "job_id": j["job_id"],
        "job_resources": {},
        "job_size_str": [],
        "job_state": display_state(j) if not new else [j["state"], *j["flags"]],
        "last_sched_evaluation": ts(j["submit"] + 1), "licenses": "",
        "mail_type": [], "mail_user": "alice", "max_cpus": noval(0), "max_nodes": noval(0),
        "mcs_label": "", "memory_per_tres": "", "name": j["name"], "network": "",
        "nodes": j["nodes"], "nice": 0, "tasks_per_core": noval(None),
        "tasks_per_tres": noval(None), "tasks_per_node": noval(8),
        "tasks_per_socket": noval(None), "tasks_per_board": noval(0),
        "cpus": noval(j["cpus"]), "node_count": noval(j["node_count"]),
        "tasks": noval(8 * j["node_count"]), "partition": "gpu", "prefer": "",
        "memory_per_cpu": noval(None), "memory_per_node": noval(0),
        "minimum_cpus_per_node": noval(112), "minimum_tmp_disk_per_node": noval(0),
        "power": {"flags": []},
        "preempt_time": ts(0), "preemptable_time": ts(0), "pre_sus_time": ts(0),
        "hold": False, "priority": noval(4294901700),
        "profile": ["NOT_SET"], "qos": "normal", "reboot": False, "required_nodes": "",
        "minimum_switches": 0, "requeue": False, "resize_time": ts(0), "restart_cnt": 0,
        "resv_name": "", "scheduled_nodes": "", "selinux_context": "",
        "shared": [], "exclusive": ["false"], "oversubscribe": True,
        "show_flags": ["DETAIL", "LOCAL"], "sockets_per_board": 0,
        "sockets_per_node": noval(None), "start_time": ts(j["start"]),
        "state_description": j["desc"], "state_reason": j["reason"],
        "standard_error": std, "standard_input": "/dev/null", "standard_output": std,
        "submit_time": ts(j["submit"]), "suspend_time": ts(0), "system_comment": "",
        "time_limit": noval(j["limit"]), "time_minimum": noval(0),
        "threads_per_core": noval(None), "tres_bind": "", "tres_freq": "",
        "tres_per_job": "", "tres_per_node": "gres/gpu:8", "tres_per_socket": "",
        "tres_per_task": "", "tres_req_str": f"cpu={j['cpus']},node={j['node_count']},gres/gpu="
                                              f"{8 * j['node_count']}",
        "tres_alloc_str": (f"cpu={j['cpus']},node={j['node_count']},gres/gpu="
                           f"{8 * j['node_count']}") if j["nodes"] else "",
        "user_id": 1000, "user_name": "alice", "maximum_switch_wait_time": 0, "wckey": "",
        "current_working_directory": f"/home/alice/hpcserve/{j['name']}",
    }
    if ver == "v0.0.39":
        out["job_size_str"] = []  # CSV_LIST
        if j["nodes"]:
            out["job_resources"] = _res_v39_v40(j)
    elif ver == "v0.0.40":
        if j["nodes"]:
            out["job_resources"] = _res_v39_v40(j)
    else:  # v0.0.42
        for k in ("power", "exclusive", "oversubscribe", "minimum_switches"):
            del out[k]
        out["required_switches"] = 0
        out["priority_by_partition"] = []
        out["shared"] = []
        if j["nodes"]:
            out["job_resources"] = _res_v42(j)
    return out


def _node_names(j):
    expr = j["nodes"]
    if "[" not in expr:
        return [expr]
    prefix, rng = expr.split("[")
    lo, hi = rng.rstrip("]").split("-")
    return [f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1)]


def _res_v39_v40(j):
    names = _node_names(j)
    return {
        "nodes": j["nodes"], "allocated_cores": j["cpus"], "allocated_cpus": j["cpus"],
        "allocated_hosts": len(names),
        "allocated_nodes": [
            {"sockets": {"0": {"cores": {str(c): "allocated" for c in range(2)}}},
             "nodename": n, "cpus_used": 0, "memory_used": 0, "memory_allocated": 0}
            for n in names],
    }


def _res_v42(j):
    names = _node_names(j)
    return {
        "select_type": ["CORE", "MEMORY"],
        "nodes": {
            "count": len(names), "select_type": ["AVAILABLE"], "list": j["nodes"],
            "whole": False,
            "allocation": [
                {"index": i, "name": n, "cpus": {"count": 112, "used": 0},
                 "memory": {"used": 0, "allocated": 0},
                 "sockets": [{"index": 0, "cores": [{"index": c, "status": ["ALLOCATED"]}
                                                    for c in range(2)]}]}
                for i, n in enumerate(names)],
        },
        "cpus": j["cpus"], "threads_per_core": noval(1),
    }


def envelope(ver, jobs):
    if ver == "v0.0.39":
        return {
            "meta": {"plugins": {"data_parser": "data_parser/v0.0.39",
                                 "accounting_storage": "accounting_storage/slurmdbd"},
                     "command": ["squeue", "--json"],
                     "Slurm": {"version": {"major": 23, "micro": 7, "minor": 2},
                               "release": "23.02.7"}},
            "errors": [], "warnings": [], "jobs": jobs,
        }
    release = {"v0.0.40": ("23", "11", "10"), "v0.0.42": ("24", "11", "7")}[ver]
    return {
        "jobs": jobs, "last_backfill": noval(T0 - 5), "last_update": noval(T0 - 1),
        "meta": {"plugin": {"type": "", "name": "", "data_parser": f"data_parser/{ver}",
                            "accounting_storage": "accounting_storage/slurmdbd"},
                 "client": {"source": "/dev/pts/3", "user": "alice", "group": "alice"},
                 "command": ["squeue", "--json"],
                 "slurm": {"version": {"major": release[0], "micro": release[2],
                                       "minor": release[1]},
                           "release": ".".join((release[0], release[1], release[2])),
                           "cluster": "h100"}},
        "errors": [], "warnings": [],
    }


def main() -> None:
    for ver, rel in (("v0.0.39", "23.02"), ("v0.0.40", "23.11"), ("v0.0.42", "24.11")):
        doc = envelope(ver, [common(j, ver) for j in JOBS])
        path = HERE / rel / f"squeue_{ver}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(path)


if __name__ == "__main__":
    main()
