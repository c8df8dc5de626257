"""Stage 3, the build: plan, render, run (BuildKit through the engine), bases, bundles, push and the SBOM. Imports
spec and supply, never launch."""
