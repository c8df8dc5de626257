"""Stage 2, the supply: fetching what a spec pins (PyPI, git, URLs), verifying it, locking the closure, indexes,
wheelhouses and patch series against the fetched trees. Imports spec, never build or launch."""
