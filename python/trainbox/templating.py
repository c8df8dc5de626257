"""The one Jinja2 environment factory (host module): Dockerfile templates and launcher templates alike.

StrictUndefined (a missing value is an error, never an empty string), no autoescape (the outputs are
Dockerfiles, shell and YAML, each quoted by its own filter), blocks trimmed so templates can be indented.
"""

from __future__ import annotations

from pathlib import Path

import jinja2


def make_env(templates_dir: Path | str, filters: dict | None = None, **options) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        **options,
    )
    env.filters.update(filters or {})
    return env
