"""Stage 3, the image: `image build` (build), its pure plan, render, run (BuildKit through the engine), bases,
the SBOM, the CANN bake, bundles, push and the inventory of built images. Imports spec and supply, never launch."""
