"""The runtime half of trainbox: what ships into every image.

Standard library only at import time (torch only lazily, inside functions), Python 3.10-3.12: device and
distributed helpers for workloads, the container entrypoint, the doctor, the stack manifest reader, the NPU
facts both sides share, and the patch applier the image build runs. Nothing here imports the host side
(`trainbox.specs.stack`, `trainbox.image.render`, ...); tests/test_layout.py enforces it.
"""
