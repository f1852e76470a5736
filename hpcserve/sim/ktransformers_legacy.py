#!/usr/bin/env python3
"""Simulated legacy KTransformers server: a stand-in for `python -m ktransformers.server.main
--host H --port P --model_path M --gguf_path G ...` of KTransformers 0.2.0 to 0.4.1 (no GPU, no
model; stdlib only).

As the real one: its options are those of ktransformers/server/args.py (argparse: an unknown
one fails, unique prefixes are accepted); --model_path and --gguf_path must be directories that
exist on the node; the model is "loaded" before the HTTP server starts, so nothing answers until
then; there is no health route, GET /v1/models answers {"data": [{"id": NAME, "name": NAME}]};
POST /v1/chat/completions and /v1/completions generate (any model name is served). It keeps
its state under $HOME/.ktransformers (config copy, logs) as the real server does.
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

# The server's options in 0.4.1 (tools/extract_ktransformers_flags.py; a test keeps this table
# equal to hpcserve's) and those that take no value.
OPTIONS = frozenset((
    "--amnesia", "--api_key", "--architectures", "--assistant_store_dir", "--backend_type",
    "--backup_count", "--ban_strings", "--batch_size", "--botname", "--cache_8bit",
    "--cache_lens", "--cache_q4", "--chunk_size", "--cpu_infer", "--cpu_memory_size_GB",
    "--db_database", "--db_host", "--db_name", "--db_pool_size", "--db_port", "--db_type",
    "--device", "--draft_gguf_path", "--draft_model_dir", "--draft_model_path",
    "--dynamic_temperature", "--experts_per_token", "--fast_safetensors", "--file_upload_dir",
    "--force_think", "--frequency_penalty", "--gguf_path", "--gpu_split", "--healing", "--host",
    "--json_mode", "--kvc2_config_dir", "--length", "--load_q4", "--log_dir", "--log_file",
    "--log_level", "--low_mem", "--max_batch_size", "--max_new_tokens", "--memory_gpu_only",
    "--mode", "--model_dir", "--model_name", "--model_path", "--modes", "--ngram_decoding",
    "--no-force_think", "--no-use_cuda_graph", "--no_code_formatting", "--no_draft_scale",
    "--no_flash_attn", "--optimize_config_path", "--page_size", "--port", "--presence_penalty",
    "--print_timings", "--prompt_file", "--q4_gguf_path", "--repetition_penalty",
    "--response_chunk", "--rope_alpha", "--rope_scale", "--sched_strategy", "--skew",
    "--smoothing_factor", "--ssl_certfile", "--ssl_keyfile", "--system_prompt", "--temperature",
    "--top_a", "--top_k", "--top_p", "--tp", "--typical", "--use_cuda_graph",
    "--user_algorithm", "--user_secret_key", "--username", "--utilization_percentage", "--web",
    "--web_cross_domain"))
BARE = frozenset((
    "--force_think", "--no-force_think", "--no-use_cuda_graph", "--use_cuda_graph"))


def parse_args(argv):
    p = argparse.ArgumentParser(prog="ktransformers.server.main (hpcserve sim)")
    for opt in sorted(OPTIONS):
        if opt in BARE:
            p.add_argument(opt, action="store_true", dest=opt.lstrip("-").replace("-", "_"))
        else:
            p.add_argument(opt, dest=opt.lstrip("-").replace("-", "_"))
    a = p.parse_args(argv)  # argparse's own error and exit code 2 for an unknown option
    for name in ("model_path", "gguf_path"):
        path = getattr(a, name)
        if not path or not os.path.isdir(path):
            fatal(1, f"FileNotFoundError: --{name} {path!r} is not a directory on this node")
    return a


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
