#!/usr/bin/env python3
"""Simulated legacy KTransformers server: a stand-in for `python -m ktransformers.server.main
--host H --port P --model_path M --gguf_path G ...` of KTransformers 0.2.1.post1 or 0.4.1 (no GPU,
no model; stdlib only).

As the real one: its options and their types are those of the release's
ktransformers/server/args.py (argparse: an unknown option or a value its type refuses fails,
unique prefixes are accepted; a release it has no table for is refused); --model_path and
--gguf_path must be directories that exist on the node; the model is "loaded" before the HTTP
server starts, so nothing answers until then; there is no health route, GET /v1/models answers
{"data": [{"id": NAME, "name": NAME}]} (0.2.1.post1: a fixed list); POST /v1/chat/completions
and /v1/completions generate (any model name is served). It keeps its state under
$HOME/.ktransformers (config copy, logs) as the real server does.
Faults and timings: see hpcserve_simcore (HPCSERVE_SIM_*).
"""

import argparse
import os
import signal
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hpcserve_simcore import (TAG, EngineBase, HandlerBase, bind_socket,  # noqa: E402
                              fatal, log, release, self_check, serve_http)

KT_VERSION = release("0.4.1")

# Each release's options, as its ktransformers/server/args.py declares them, by type: argparse
# converts the text with it (int, float; bool and list apply bool()/list() to the text, so any
# non-empty value is True), "flag" = argparse.BooleanOptionalAction (--x and --no-x, no value).
# tests/unit/test_kt_plan.py keeps each table equal to tools/extract_ktransformers_flags.py's,
# and tests/engine_parsers/test_ktransformers_legacy.py compares this parser with the real
# 0.2.1.post1 one. A release without a table is refused: the stand-in never accepts an option
# the release it stands in for would not.
TABLES = {
    "0.2.1.post1": {
        "str": """
            assistant_store_dir botname db_database db_host db_name db_port db_type device
            draft_model_dir dynamic_temperature file_upload_dir gguf_path gpu_split host log_dir
            log_file log_level mode model_dir model_name model_path optimize_config_path
            prompt_file ssl_certfile ssl_keyfile system_prompt type user_algorithm user_secret_key
            username
        """,
        "int": """
            backup_count batch_size cache_lens cpu_infer db_pool_size experts_per_token length
            max_batch_size max_chunk_size max_new_tokens max_response_tokens port response_chunk
            top_k total_context
        """,
        "float": """
            frequency_penalty presence_penalty repetition_penalty rope_alpha rope_scale skew
            smoothing_factor temperature top_a top_p typical
        """,
        "bool": """
            amnesia cache_8bit cache_q4 fast_safetensors force_think healing json_mode load_q4
            low_mem modes ngram_decoding no_code_formatting no_draft_scale no_flash_attn paged
            print_timings web web_cross_domain
        """,
        "list": """
            ban_strings
        """,
    },
    "0.4.1": {
        "str": """
            api_key architectures assistant_store_dir backend_type botname cpu_memory_size_GB
            db_database db_host db_name db_port db_type device draft_gguf_path draft_model_dir
            draft_model_path dynamic_temperature file_upload_dir gguf_path gpu_split host
            kvc2_config_dir log_dir log_file log_level memory_gpu_only mode model_dir model_name
            model_path optimize_config_path page_size prompt_file q4_gguf_path sched_strategy
            ssl_certfile ssl_keyfile system_prompt user_algorithm user_secret_key username
            utilization_percentage
        """,
        "int": """
            backup_count batch_size cache_lens chunk_size cpu_infer db_pool_size experts_per_token
            length max_batch_size max_new_tokens port response_chunk top_k tp
        """,
        "float": """
            frequency_penalty presence_penalty repetition_penalty rope_alpha rope_scale skew
            smoothing_factor temperature top_a top_p typical
        """,
        "bool": """
            amnesia cache_8bit cache_q4 fast_safetensors healing json_mode load_q4 low_mem modes
            ngram_decoding no_code_formatting no_draft_scale no_flash_attn print_timings web
            web_cross_domain
        """,
        "list": """
            ban_strings
        """,
        "flag": """
            force_think use_cuda_graph
        """,
    },
}
TYPES = {"str": str, "int": int, "float": float, "bool": bool, "list": list}


def options(version):
    """{option: type name} of `version` ("flag": takes no value, --no-<x> too); None: no table."""
    table = TABLES.get(version)
    if table is None:
        return None
    return {"--" + name: kind for kind, names in table.items() for name in names.split()}


def build_parser(version):
    opts = options(version)
    if opts is None:
        fatal(2, f"the stand-in has no option table for KTransformers {version} (it has "
                 f"{', '.join(TABLES)}): it cannot tell which options that release accepts")
    # The real parser's prog and its argparse defaults (allow_abbrev: unique prefixes pass).
    p = argparse.ArgumentParser(prog="kvcache.ai", description="Ktransformers")
    for opt, kind in sorted(opts.items()):
        if kind == "flag":
            p.add_argument(opt, action=argparse.BooleanOptionalAction)
        else:
            p.add_argument(opt, type=TYPES[kind])
    return p


def parse_args(argv, version=None):
    a = build_parser(version or KT_VERSION).parse_args(argv)  # argparse's error, exit code 2
    for name in ("model_path", "gguf_path"):
        path = getattr(a, name)
        if not path or not os.path.isdir(path):
            fatal(1, f"FileNotFoundError: --{name} {path!r} is not a directory on this node")
    return a


# GET /v1/models of 0.2.1.post1 answers a module-level list
# (ktransformers/server/api/openai/endpoints/chat.py, lines 13-19 at tag v0.2.1.post1); from
# 0.2.3 on it answers {"data": [{"id": <model_name>, ...}], "object": "list"}.
STATIC_MODELS = {"0.2.1.post1": [{"id": "0", "name": "ktranformers-model"}]}


class Engine(EngineBase):
    def __init__(self, args):
        super().__init__(0)
        self.args = args
        self.name = args.model_name or "DeepSeek-Coder-V2-Instruct"  # the packaged default

    def on_sigterm(self, signum, frame):
        if self.frozen.is_set():
            log("SIGTERM received, but the server is hung")
            return
        self.terminating = True
        self.exit(0, "Shutting down (SIGTERM)")


class Handler(HandlerBase):
    do_POST = HandlerBase.openai_post
    quiet_paths = ("/v1/models",)

    def do_GET(self):
        self.freeze_if_hung()
        if self.path.split("?")[0] == "/v1/models":
            if self.engine.unhealthy:
                return self.send_json(500, {"detail": "Internal Server Error"})
            n = self.engine.name
            if KT_VERSION in STATIC_MODELS:  # a fixed list, whatever --model_name says
                return self.send_json(200, STATIC_MODELS[KT_VERSION])
            return self.send_json(200, {"data": [{"id": n, "name": n}], "object": "list"})
        return self.send_json(404, {"detail": "Not Found"})

    def error(self, kind, code, msg):
        self.send_json(code, {"detail": msg})

    def generate(self, kind, body):
        if "model" not in body:
            return self.send_json(422, {"detail": [{"loc": ["body", "model"],
                                                    "msg": "field required"}]})
        prompt, max_new, _ = self.openai_request(kind, body)
        time.sleep(prompt * self.engine.prefill_s)
        self.respond(kind, body, f"chatcmpl-{uuid.uuid4().hex}", self.engine.name, prompt,
                     max_new)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    TAG[0] = "ktransformers"
    eng = Engine(args)
    home = os.path.join(os.path.expanduser("~"), ".ktransformers")
    os.makedirs(os.path.join(home, "logs"), exist_ok=True)  # the real server's config copy
    log(f"hpcserve simulated KTransformers {KT_VERSION} legacy server (no GPU, no model) "
        f"pid={os.getpid()} model_path={args.model_path} gguf_path={args.gguf_path} "
        f"cpu_infer={args.cpu_infer} home={home}")
    signal.signal(signal.SIGTERM, eng.on_sigterm)
    eng.start_fault()
    host, port = args.host or "0.0.0.0", int(args.port or 10002)
    sock = bind_socket(host, port, "server (--host/--port)")
    eng.loading()  # the model loads before uvicorn starts
    serve_http(eng, sock, Handler)
    log(f"Uvicorn running on http://{host}:{port}")
    self_check(eng, host, port, "/v1/models")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
