# The package hpcserve ships this folder as (pyproject.toml, [tool.setuptools.package-dir]).
# An editable install finds a mapped folder only when it is a regular package, one with an
# __init__.py (setuptools issue #4943), so this empty file is here for `pip install -e`.
