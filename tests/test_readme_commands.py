"""The README and docs/ run: every `trainbox ...` line in them parses with the CLI's own parser against the shipped
stacks and recipes (tests/readme_commands.py says how lines are found and what is checked). The commands of the
quickstart and the how-tos are also run (tests/test_docs_run.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from readme_commands import Example, check, extract

ROOT = Path(__file__).resolve().parents[1]
#: the user's documents: the README, docs/, and the recipe schema beside the recipes
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "launchers/README.md"]


def test_every_documented_command_parses_and_names_what_exists():
    examples = [(f, e) for f in DOCS for e in extract(f.read_text())]
    assert len(examples) > 50, "the extractor lost the documents' examples"
    assert {f for f, _ in examples} >= {ROOT / "README.md", ROOT / "docs/quickstart.md"}, "a document lost its examples"
    bad = [f"{f.relative_to(ROOT)}:{e.line}: {e.text}\n    {p}" for f, e in examples if (p := check(e))]
    assert not bad, "documented examples that would not run as written:\n" + "\n".join(bad)


@pytest.mark.parametrize("line, expect", [
    ("trainbox run relax-qwen3-4b-4npu-colocate --set MODEL=/models/Qwen3-4B", "no input or environment variable"),
    ("trainbox fetch cpu-sources --sources-only", "no stack 'cpu-sources'"),
    ("trainbox image build --stack npu-910b --offline", "deprecated"),
    ("trainbox image build cpu --set nosuch.version=1", "no component 'nosuch'"),
    ("trainbox smoke --set cpu:torch.colour=red", "cannot be overridden"),
    ("trainbox launch render no-such-recipe", "no recipe 'no-such-recipe'"),
    ("trainbox image build cpu --no-such-option", "unrecognized arguments: --no-such-option"),
    ("trainbox image frobnicate cpu", "invalid choice"),
    ("trainbox image build", "required: STACK"),
])
def test_a_bad_example_fails(line, expect):
    problem = check(Example(1, line, inline=False))
    assert problem and expect in problem, problem


def test_bad_lines_are_found_in_code_blocks_comments_and_prose():
    text = "\n".join([
        "```bash",
        "make x   # trainbox fetch no-stack-here",
        "FOO=1 trainbox run cpu-ddp \\",
        "    --set NO_SUCH_INPUT=1",
        "```",
        "",
        "    trainbox launch render cpu-ddp -o a.sh && trainbox stack show nope",
        "",
        "Prose with `trainbox stack",
        "show npu-910b --bogus` split over lines, and `trainbox run` alone.",
    ])
    found = {e.line: e for e in extract(text)}
    problems = {line: check(e) for line, e in found.items()}
    assert "no stack 'no-stack-here'" in problems[2]
    assert "NO_SUCH_INPUT" in problems[3] and found[3].text.endswith("--set NO_SUCH_INPUT=1")
    assert "no stack 'nope'" in problems[7]
    assert "--bogus" in problems[9]
    assert len(found) == 5 and problems[10] is None  # an inline command name without its arguments is prose


def test_generated_files_suggest_current_spellings():
    """The GENERATED headers (and comments) of the rendered Dockerfiles name commands as they are spelled now."""
    files = [ROOT / "Dockerfile.npu", ROOT / "Dockerfile.cuda",
             *sorted((ROOT / "build/generated").glob("*/Dockerfile"))]
    examples = [(f, e) for f in files for e in extract(f.read_text())]
    assert len(examples) >= 2 * len(files), "the header's `trainbox ...` commands were not found"
    bad = [f"{f.relative_to(ROOT)}:{e.line}: {e.text}\n    {p}" for f, e in examples if (p := check(e))]
    assert not bad, "\n".join(bad)
