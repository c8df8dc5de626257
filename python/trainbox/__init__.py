"""trainbox: container image build and launch for LLM training stacks.

Runtime modules (device, dist, entrypoint, doctor, manifest) import only the standard library at
import time; host modules (stack, rules, render, sources, patches, image, launch, cli helpers) may use
jinja2, pyyaml, pydantic, packaging, rich and docker.
"""

__version__ = "0.1.0"
