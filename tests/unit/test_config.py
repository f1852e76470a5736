"""The config layer: YAML positions, schema validation messages, --set overrides."""

from __future__ import annotations

import pytest

from hpcserve.author import config
from hpcserve.errors import ConfigError
from hpcserve.author.schema import Validator
from hpcserve.author.yamlsrc import Origin, Positions, load_text
from unitkit import ROOT, small_pd, write_yaml

# ----------------------------------------------------------------------------- yamlsrc positions

DOC = """\
name: x            # 1
roles:             # 2
  prefill:         # 3
    nodes: 1       # 4
  decode:          # 5

    nodes: 2       # 7
    args:          # 8
      foo: [1, 2]  # 9
list:              # 10
  - a              # 11
  -                # 12
    b: 1           # 13
"""


def test_positions_of_nested_keys_and_list_items():
    doc, pos = load_text(DOC, "f.yaml")
    line = {p: o.line for p, o in pos.table.items()}
    assert all(o.file == "f.yaml" for o in pos.table.values())
    assert line[("name",)] == 1
    assert line[("roles",)] == 2
    assert line[("roles", "prefill", "nodes")] == 4
    assert line[("roles", "decode")] == 5        # a mapping is reported at its key's line
    assert line[("roles", "decode", "nodes")] == 7
    assert line[("roles", "decode", "args", "foo")] == 9
    assert line[("roles", "decode", "args", "foo", 1)] == 9
    assert line[("list", 0)] == 11
    assert line[("list", 1, "b")] == 13
    assert doc["roles"]["decode"]["args"]["foo"] == [1, 2]


def test_lookup_falls_back_to_the_nearest_ancestor():
    _, pos = load_text(DOC, "f.yaml")
    assert pos.lookup(("roles", "decode", "tp")).line == 5
    assert pos.lookup(("nothing", "here")) .line == 1  # the document itself
    assert Positions().lookup(("a",)) is None


def test_positions_reach_validation_errors():
    _, pos = load_text(DOC, "f.yaml")
    with pytest.raises(ConfigError) as e:
        Validator(pos).convert("x", int, ("roles", "decode", "args", "foo", 1))
    assert (e.value.file, e.value.line, e.value.field) == ("f.yaml", 9, "roles.decode.args.foo[1]")


@pytest.mark.parametrize("text,line", [
    ("a: 1\na: 2\n", 2),                  # duplicate key
    ("a: 1\nb: 'ok'\n", None),            # fine
    ("a:\n  <<: {b: 1}\n", 2),            # merge keys are refused
    ('a: "x\\ny"\n', 1),                  # control character
    ("a: [1,\n", 2),                      # syntax
])
def test_load_errors_have_lines(text, line):
    if line is None:
        doc, _ = load_text(text, "f.yaml")
        assert doc == {"a": 1, "b": "ok"}
        return
    with pytest.raises(ConfigError) as e:
        load_text(text, "f.yaml")
    assert e.value.file == "f.yaml" and e.value.line == line


# ------------------------------------------------------------------------ validation messages

def _site_error(value: dict) -> ConfigError:
    _, pos = load_text("name: s\n", "site.yaml")
    with pytest.raises(ConfigError) as e:
        Validator(pos, "site").build(config.Site, {"name": "s", **value}, ())
    return e.value


@pytest.mark.parametrize("value,field,message", [
    ({"slurm": {"partiton": "x"}}, "slurm.partiton",
     "unknown key 'partiton' (did you mean 'partition'?); 12 keys are valid here: see "
     "`hpcserve schema site`"),
    ({"network": {"ifname": "x"}}, "network.ifname",
     "unknown key 'ifname'; valid keys here: interface, ib_devices, env, gid_index"),
    ({"slurm": {"max_nodes": 0}}, "slurm.max_nodes", "must be at least 1, got 0"),
    ({"slurm": {"max_nodes": "many"}}, "slurm.max_nodes",
     "expected an integer or null, got the string 'many'"),
    ({"slurm": {"exclusive": "yes"}}, "slurm.exclusive", "expected true or false"),
    ({"slurm": {"signal_grace": 5000}}, "slurm.signal_grace", "must be at most 3600, got 5000"),
    ({"container": {"runtime": "docker"}}, "container.runtime",
     "expected one of pyxis, enroot, apptainer, none; got the string 'docker'"),
    ({"container": {"mounts": ["/a:/a", "/b,/c:/d"]}}, "container.mounts[1]",
     "expected a mount SRC:DST or SRC:DST:ro of absolute paths"),
    ({"container": {"mounts": ["/a"]}}, "container.mounts[0]", "a mount SRC:DST"),
    ({"container": {"mounts": ["/a b:/c"]}}, "container.mounts[0]", "without commas, colons or "
                                                                    "whitespace"),
    ({"container": {"mounts": ["rel:/c"]}}, "container.mounts[0]", "absolute paths"),
    ({"container": {"mounts": ["/a:/b:rx"]}}, "container.mounts[0]", "got '/a:/b:rx'"),
    ({"container": {"env": ["NCCL_IB_HCA", "A,B"]}}, "container.env[1]",
     "an environment variable name"),
    ({"network": {"ib_devices": "all"}}, "network.ib_devices",
     "expected one of auto; got the string 'all'"),
    ({"network": {"ib_devices": [1]}}, "network.ib_devices[0]", "expected a string"),
    ({"network": {"env": {"1BAD": 1}}}, "network.env.1BAD", "does not match"),
    ({"name": "bad name"}, "name", "'bad name' does not match the pattern"),
    ({"node": {"gpus": True}}, "node.gpus", "expected an integer, got a boolean"),
    # an image pinned by digest: the whole sha256 digest, as enroot 4 and Apptainer read it
    ({"container": {"image": "nvcr.io#nvidia/pytorch@sha256:abc"}}, "container.image",
     "pinned by digest, it ends in @sha256: and 64 lower-case hex digits"),
    ({"container": {"image": "x@sha256:" + "AB" * 32}}, "container.image", "lower-case hex"),
    ({"container": {"image_cache": {"dir": "/site/images"}}}, "container.image_cache",
     "missing required key 'owner'"),
    ({"container": {"image_cache": {"dir": "images", "owner": "svc"}}},
     "container.image_cache.dir", "an absolute path"),
    ({"container": {"image_cache": {"dir": "/i", "owner": "svc;id"}}},
     "container.image_cache.owner", "a Unix user name"),
])
def test_schema_messages(value, field, message):
    e = _site_error(value)
    assert e.field == field
    assert message in e.message, e.message


def test_every_valid_mount_form_is_accepted():
    _, pos = load_text("name: s\n", "site.yaml")
    site = Validator(pos).build(config.Site, {"container": {
        "mounts": ["/a:/b", "/a:/b:ro", "/a:/b:rw", "/x.y-z_1/ünï:/x"]}}, ())
    assert len(site.container.mounts) == 4


# ------------------------------------------------------------------------------ --set overrides

def test_set_overrides_a_deployment_value_and_records_its_origin(tmp_path):
    f = write_yaml(tmp_path / "d.yaml", small_pd())
    cfg = config.load(f, ["roles.decode.nodes=3", "roles.decode.args.foo=[1, 2]",
                          "engine.simulate=true"])
    assert cfg.deployment.roles["decode"].nodes == 3
    assert cfg.deployment.roles["decode"].args == {"foo": [1, 2]}
    assert cfg.deployment.engine.simulate is True
    assert cfg.positions.lookup(("roles", "decode", "nodes")) == \
        Origin("--set roles.decode.nodes=3")
    assert cfg.positions.lookup(("roles", "decode", "args", "foo")) == \
        Origin("--set roles.decode.args.foo=[1, 2]")
    assert cfg.positions.lookup(("roles", "prefill", "nodes")).file == str(f)


def test_set_on_a_named_site_keeps_the_rest_of_the_site(tmp_path):
    doc = small_pd()
    doc["site"] = "local"
    f = write_yaml(tmp_path / "d.yaml", doc)
    plain = config.load(f)
    cfg = config.load(f, ["site.slurm.partition=x", "site.slurm.account=acct"])
    assert plain.site.slurm.partition == "local"
    assert cfg.site.slurm.partition == "x"
    assert cfg.site.slurm.account == "acct"
    # everything else still comes from site_configs/local.yaml
    assert cfg.site_file == plain.site_file == str(ROOT / "site_configs" / "local.yaml")
    assert cfg.site.slurm.max_nodes == plain.site.slurm.max_nodes == 4
    assert cfg.site.network == plain.site.network
    assert cfg.positions.lookup(("site", "slurm", "partition")) == \
        Origin("--set site.slurm.partition=x")


def test_set_replaces_a_whole_site(tmp_path):
    f = write_yaml(tmp_path / "d.yaml", small_pd())
    cfg = config.load(f, ["site=local"])
    assert cfg.site.name == "local"


@pytest.mark.parametrize("sets,source,field,message", [
    (["roles.decode.nodes=2", "roles.decode.nodes"], 1, None, "expected KEY.PATH=VALUE"),
    (["roles..nodes=2"], 0, None, "bad key path"),
    (["roles.decode.nodes=2", "roles.decode.tp=-1"], 1, "roles.decode.tp", "at least 1"),
    (["name=bad name"], 0, "name", "does not match"),
    (["site.slurm.max_nodes=zero"], 0, "site.slurm.max_nodes", "expected an integer or null"),
    (["name=ok", 'model.path="a\\nb"'], 1, "model.path", "control character"),
    (["roles.decode.args.x=[1,", "name=ok"], 0, "roles.decode.args.x", "not valid YAML"),
    (["model.path.x=1"], 0, "model.path.x", "model.path is not a mapping"),
    # a path the file lacks: the --set named it, not the file's `roles:` line
    (["roles.nope.nodes=2"], 0, "roles.nope", "unknown role"),
    (["roles.decode.nodez=2"], 0, "roles.decode.nodez", "did you mean 'nodes'?"),
])
def test_set_errors_point_at_the_set(tmp_path, sets, source, field, message):
    f = write_yaml(tmp_path / "d.yaml", small_pd())
    with pytest.raises(ConfigError) as e:
        config.load(f, sets)
    assert (e.value.file, e.value.line) == ("--set " + sets[source], None), str(e.value)
    if field:
        assert e.value.field == field
    assert message in e.value.message
    assert str(e.value).startswith(f"--set {sets[source]}: "), str(e.value)


def test_a_set_is_named_bounded_escaped_and_without_a_secret(tmp_path):
    f = write_yaml(tmp_path / "d.yaml", small_pd())
    with pytest.raises(ConfigError) as e:
        config.load(f, ["roles.decode.args.api-key=hunter2"])
    assert "hunter2" not in str(e.value)
    assert str(e.value).startswith("--set roles.decode.args.api-key=...: "), str(e.value)
    with pytest.raises(ConfigError) as e:  # the secret is a key inside the value
        config.load(f, ["roles.decode.env={HF_TOKEN: hf_secret123, X: [}"])
    assert "hf_secret123" not in str(e.value)
    assert str(e.value).startswith("--set roles.decode.env=...: "), str(e.value)
    with pytest.raises(ConfigError) as e:
        config.load(f, ["name=" + "x" * 500, "roles.decode.nodes=0"])
    assert str(e.value).startswith("--set name=" + "x" * 55 + "... (505 characters): name: ")
    with pytest.raises(ConfigError) as e:
        config.load(f, ["roles.decode\x1b[2J.nodes=0"])
    assert "\x1b" not in str(e.value) and "\\x1b[2J" in str(e.value)


def test_site_search_path_env(tmp_path, monkeypatch):
    sites = tmp_path / "sites"
    sites.mkdir()
    write_yaml(sites / "mine.yaml", {"name": "mine", "slurm": {"partition": "mypart"}})
    doc = small_pd()
    doc["site"] = "mine"
    f = write_yaml(tmp_path / "d.yaml", doc)
    with pytest.raises(ConfigError, match="no site named 'mine'"):
        config.load(f)
    monkeypatch.setenv("HPCSERVE_SITE_PATH", str(sites))
    assert config.load(f).site.slurm.partition == "mypart"


def test_inline_site_errors_name_the_site_field(tmp_path):
    doc = small_pd()
    doc["site"]["slurm"]["qos"] = 5
    f = write_yaml(tmp_path / "d.yaml", doc)
    with pytest.raises(ConfigError) as e:
        config.load(f)
    assert e.value.field == "site.slurm.qos" and e.value.file == str(f)


def test_site_file_errors_name_the_site_file(tmp_path, monkeypatch):
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "bad.yaml").write_text("name: bad\nslurm:\n  qos: 5\n", encoding="utf-8")
    monkeypatch.setenv("HPCSERVE_SITE_PATH", str(sites))
    doc = small_pd()
    doc["site"] = "bad"
    with pytest.raises(ConfigError) as e:
        config.load(write_yaml(tmp_path / "d.yaml", doc))
    assert (e.value.file, e.value.line, e.value.field) == (str(sites / "bad.yaml"), 3, "slurm.qos")


def test_profile_defaults_merge_under_role_settings(tmp_path):
    doc = small_pd()
    doc["roles"]["decode"]["args"] = {"disable-radix-cache": None, "foo-bar": 1}
    doc["roles"]["decode"]["deepep_mode"] = "auto"
    cfg = config.load(write_yaml(tmp_path / "d.yaml", doc))
    prof = cfg.profile.sglang
    st = config.merged_settings(type(prof.common), prof.common, prof.decode,
                                cfg.deployment.roles["decode"])
    assert st["deepep_mode"] == "auto"              # role wins over the profile's low_latency
    assert st["moe_a2a_backend"] == "deepep"        # profile default kept
    assert st["trust_remote_code"] is True          # common layer
    assert st["args"] == {"foo-bar": 1}             # null removes the profile's default flag


def test_escape_writes_every_unprintable_character_out_and_leaves_printable_text_alone():
    """errors.escape returns printable text as it is without its regex: right only while every
    character the regex matches is one str.isprintable() refuses; checked over all of Unicode."""
    import re

    from hpcserve import errors
    matched = [chr(c) for c in range(0x110000) if re.fullmatch(errors._UNPRINTABLE, chr(c))]
    assert len(matched) > 2000 and not any(ch.isprintable() for ch in matched)
    assert errors.escape("a\nb\u202ec\x00") == "a\\nb\\u202ec\\x00"
    assert errors.escape("plain text, ü, 中") == "plain text, ü, 中"


def test_image_cache_refusals_and_a_whole_pin_accepted():
    """A pinned image whose digest is whole loads; the site cache's two names are required and
    checked (the hostile-string test leaves them to this one)."""
    _, pos = load_text("name: s\n", "site.yaml")
    pin = "nvcr.io#nvidia/pytorch:25.01-py3@sha256:" + "0f" * 32
    site = Validator(pos).build(config.Site, {"container": {
        "image": pin, "image_cache": {"dir": "/site/images", "owner": "hpcsvc"}}}, ())
    assert site.container.image == pin and site.container.image_cache.owner == "hpcsvc"
    for bad in ({"dir": "/i", "owner": "$(id)"}, {"dir": "/i b", "owner": "svc"}):
        with pytest.raises(ConfigError):
            Validator(pos).build(config.Site, {"container": {"image_cache": bad}}, ())


def test_the_configuration_and_plan_are_frozen():
    import dataclasses

    from hpcserve.author import plan
    c = config.load(ROOT / "examples" / "demo.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.name = "other"
    p = plan.build(c)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.instances[0].nodes = 99
