#!/usr/bin/env bash
# Fetches, idempotently, the one KTransformers release on PyPI that ships the legacy server's own
# argument parser (ktransformers/server/args.py), so tests can parse every generated legacy
# command line with it and check the optimize-rules file against those the release ships
# (tests/engine_parsers/test_ktransformers_legacy.py).
#
#   scripts/setup-ktransformers-parser.sh   # -> .cache/ktransformers-parser
#                                           #    (override: HPCSERVE_KT_PARSER_DIR=/path)
#
# Why this release and why not pip: PyPI has the legacy server only as the sdists of 0.1.x, 0.2.1
# and 0.2.1.post1 (0.2.2 to 0.4.1 were never uploaded; 0.5.x on are thin packages without it).
# 0.2.1.post1 is the newest; its ktransformers/server/args.py equals the v0.2.1.post1 tag's
# (https://github.com/kvcache-ai/ktransformers/blob/v0.2.1.post1/ktransformers/server/args.py).
# `pip download` cannot fetch an sdist without building its metadata, and this one's setup.py
# imports torch (pyproject build-system requires torch >= 2.3.0): over 2 GB of CUDA wheels for a
# 7 MB archive. So the archive is read from the package index pip is configured with (its JSON
# project page, PEP 691), pinned by name and sha256, and only the files the tests need are kept:
# the parser, the modules it imports (config, backend args), the packaged config.yaml it reads its
# defaults from, ktransformers/optimize/optimize_rules/ and the module of GET /v1/models (what the
# stand-in answers there). Never committed to this repository.
# The index's file list of the project is kept too (index.json): a test reads from it that the
# releases it cannot check are indeed not on PyPI.
# A stamp file (hash of this script) makes a re-run a no-op; ~7 MB download, a few seconds.
set -euo pipefail
SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$SELF")/.."

DIR=${HPCSERVE_KT_PARSER_DIR:-$PWD/.cache/ktransformers-parser}
PY=${PYTHON:-python3}
KT_VERSION=0.2.1.post1
KT_SDIST=ktransformers-$KT_VERSION.tar.gz
KT_SHA256=079ee36fbefe1280455f6cb2d9afaf840a9fed350acecdcf94f03b113aa94199

stamp=$DIR/.hpcserve-kt-parser-stamp
want="$(sha256sum < "$SELF" | cut -d' ' -f1)"
current() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }
current && exit 0

mkdir -p "$DIR"
# Serialise concurrent callers (e.g. two pytest sessions) on a lock inside the folder.
exec 9>"$DIR/.hpcserve-kt-parser.lock"
if command -v flock >/dev/null; then flock 9; fi
current && exit 0

t0=$(date +%s)
echo "hpcserve setup-ktransformers-parser: fetching $KT_SDIST into $DIR" >&2
KT_DIR="$DIR" KT_VERSION="$KT_VERSION" KT_SDIST="$KT_SDIST" KT_SHA256="$KT_SHA256" "$PY" - <<'EOF'
import hashlib, io, json, os, shutil, ssl, subprocess, sys, tarfile, urllib.parse, urllib.request

out, version, sdist, sha = (os.environ[k] for k in ("KT_DIR", "KT_VERSION", "KT_SDIST",
                                                     "KT_SHA256"))


def index_url():
    """The index pip uses: PIP_INDEX_URL, else pip's configuration, else pip's default."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"]
    run = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                         text=True)
    for line in run.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".index-url") and not key.endswith("extra-index-url"):
            return value.strip().strip("'\"")
    from pip._internal.models.index import PyPI
    return PyPI.simple_url


cafile = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
ctx = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()


def get(url, accept=None):
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, context=ctx, timeout=120) as r:
        return r.read()


page_url = index_url().rstrip("/") + "/ktransformers/"
page = json.loads(get(page_url, "application/vnd.pypi.simple.v1+json"))
files = {f["filename"]: f for f in page["files"]}
if sdist not in files:
    sys.exit(f"setup-ktransformers-parser: {sdist} is not on the index {page_url}")
data = get(urllib.parse.urljoin(page_url, files[sdist]["url"]))
if hashlib.sha256(data).hexdigest() != sha:
    sys.exit(f"setup-ktransformers-parser: {sdist} does not have the pinned sha256 {sha}")

root = f"ktransformers-{version}/"
keep = ("ktransformers/__init__.py", "ktransformers/server/__init__.py",
        "ktransformers/server/args.py", "ktransformers/server/backend/__init__.py",
        "ktransformers/server/backend/args.py", "ktransformers/server/config/",
        "ktransformers/configs/config.yaml", "ktransformers/optimize/optimize_rules/",
        "ktransformers/server/api/openai/endpoints/chat.py")
tmp = os.path.join(out, "src.tmp")
shutil.rmtree(tmp, ignore_errors=True)
with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
    members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith(root)
               and "__pycache__" not in m.name
               and any(m.name[len(root):].startswith(k) for k in keep)]
    for m in members:
        m.name = m.name[len(root):]
    tar.extractall(tmp, members=members)
missing = [k for k in keep if not os.path.exists(os.path.join(tmp, k))]
if missing:
    sys.exit(f"setup-ktransformers-parser: {sdist} lacks {missing}")
shutil.rmtree(os.path.join(out, "src"), ignore_errors=True)
os.rename(tmp, os.path.join(out, "src"))
with open(os.path.join(out, "index.json"), "w") as f:
    json.dump({"project_page": page_url, "version": version, "sdist": sdist,
               "files": sorted(files)}, f, indent=1)
EOF
echo "$want" > "$stamp"
echo "hpcserve setup-ktransformers-parser: done in $(( $(date +%s) - t0 )) s" >&2
