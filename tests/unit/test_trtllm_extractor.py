"""tools/extract_trtllm_flags.py: from single files saved at one commit (--src-dir) it reads the
`serve` and `disaggregated` click options, the LLM API fields and the disaggregated config keys,
and the table it writes names the repository, tag and commit the files came from; without a tag
and a commit it refuses to write one. The files here are small stand-ins written for this test
(same shapes as TensorRT-LLM's: click decorators, pydantic classes, keyword parameters), not
NVIDIA's code."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"

FILES = {
    "tensorrt_llm/version.py": '__version__ = "9.8.7"\n',
    "tensorrt_llm/logger.py": 'severity_map = {"info": 1, "debug": 2}\n',
    "tensorrt_llm/commands/serve.py": '''
import click
from tensorrt_llm.logger import severity_map

@click.command("serve")
@click.argument("model", type=str)
@click.option("--host", type=str, default="localhost")
@click.option("--tp_size", "--tensor_parallel_size", type=int, default=1)
@click.option("--trust_remote_code", is_flag=True, default=False)
@click.option("--log_level", type=click.Choice(severity_map.keys()), default="info")
@click.option("--config", "--extra_llm_api_options", "extra_llm_api_options", type=str)
def serve(model, host, tp_size, trust_remote_code, log_level, extra_llm_api_options):
    pass

@click.command("disaggregated")
@click.option("-c", "--config_file", type=str, default=None)
@click.option("-t", "--server_start_timeout", type=int, default=180)
def disaggregated(config_file, server_start_timeout):
    pass
''',
    "tensorrt_llm/llmapi/llm_args.py": '''
from pydantic import BaseModel

class StrictBaseModel(BaseModel):
    class Config:
        extra = "forbid"

class CacheTransceiverConfig(StrictBaseModel):
    backend: Optional[Literal["DEFAULT", "UCX"]] = None
    max_tokens_in_buffer: Optional[int] = None

class BaseLlmArgs(StrictBaseModel):
    model: str
    tensor_parallel_size: int = 1
    _private: int = 0

class TorchLlmArgs(BaseLlmArgs):
    cuda_graph_config: Optional[dict] = None
    print_iter_log: bool = False
''',
    "tensorrt_llm/llmapi/disagg_utils.py": '''
def extract_disagg_cfg(hostname="localhost", port=8000, context_servers=None,
                       generation_servers=None, **kwargs):
    pass

def extract_router_config(server_cfg):
    return server_cfg.pop("router", {})

def extract_ctx_gen_cfgs(type, num_instances=1, urls=None, **kwargs):
    pass
''',
}


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location(
        "extract_trtllm_flags", ROOT / "tools" / "extract_trtllm_flags.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def src(tmp_path):
    for rel, text in FILES.items():
        f = tmp_path / "src" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return tmp_path / "src"


def test_src_dir_table_names_repo_tag_commit_and_reads_the_files(tool, src, tmp_path):
    out = tmp_path / "flags.json"
    assert tool.main(["--src-dir", str(src), "--tag", "v9.8.7", "--commit", COMMIT,
                      "--out", str(out), "--no-merge"]) == 0
    entry = json.loads(out.read_text())["versions"]["9.8.7"]
    assert (entry["repo"], entry["ref"], entry["commit"]) == ("NVIDIA/TensorRT-LLM", "v9.8.7",
                                                              COMMIT)
    assert "NVIDIA/TensorRT-LLM tag v9.8.7" in entry["source"] and COMMIT in entry["source"]
    assert entry["flags"] == ["--config", "--extra_llm_api_options", "--host", "--log_level",
                              "--tensor_parallel_size", "--tp_size", "--trust_remote_code"]
    assert entry["bare"] == ["--trust_remote_code"]
    assert entry["choices"] == {"--log_level": ["debug", "info"]}
    assert entry["disaggregated"]["short"] == {"-c": "--config_file",
                                               "-t": "--server_start_timeout"}
    api = entry["llm_api"]
    assert api["fields"] == ["cuda_graph_config", "model", "print_iter_log",
                             "tensor_parallel_size"]
    assert api["cache_transceiver_backends"] == ["DEFAULT", "UCX"] and api["forbids_extra"]
    assert entry["disagg_config"]["top"] == ["context_servers", "generation_servers",
                                             "hostname", "port"]
    assert entry["disagg_config"]["server_keys"] == ["num_instances", "router", "urls"]


@pytest.mark.parametrize("meta", [[], ["--tag", "v9.8.7"], ["--tag", "v9.8.7", "--commit", "abc"]],
                         ids=["nothing", "no-commit", "short-commit"])
def test_src_dir_without_tag_and_commit_writes_no_table(tool, src, tmp_path, meta):
    out = tmp_path / "flags.json"
    with pytest.raises(SystemExit):
        tool.main(["--src-dir", str(src), "--out", str(out), "--no-merge", *meta])
    assert not out.exists()


def test_shipped_table_names_its_source_commit():
    """Each version of the shipped table says where it was read: a source sentence and the
    40-hex commit of the files (the lead's check that it is an NVIDIA tag reads `source`)."""
    doc = json.loads((ROOT / "hpcserve" / "engines" / "data" / "trtllm_flags.json").read_text())
    for version, entry in doc["versions"].items():
        assert len(entry["commit"]) == 40 and int(entry["commit"], 16) >= 0, version
        assert entry["source"].strip() and entry["ref"], version
