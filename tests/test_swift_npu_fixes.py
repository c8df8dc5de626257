"""What the swift stack's pins do with ms-swift PR #9382's two Qwen3.5 NPU pieces, read and run from the pinned
sources themselves (fetched and hash-checked as `trainbox patches verify` does, with their series applied):

- the GDN mask fix of the qwen3_5_npu branches (ms-swift PR #9196 in ms-swift 4.2.0, mcore-bridge PR #50 in
  mcore-bridge 1.4.3): the trainer's own `_prepare_batch` and mcore-bridge's own `resolve_gdn_attention_mask` are
  executed on real tensors; where the 2D mask stops on its way to the GDN is read from the code that drops it;
- the Qwen3.5 FLA NPU patch (ms-swift 4.2.0): every name its kernel module imports from MindSpeed is defined in the
  stack's MindSpeed tree (core_r0.15.3 with patches/mindspeed), and not in the bare tree.

The trainer and the resolver run outside their packages (their modules import megatron, mcore_bridge and
transformers at the top, which this host lacks): each function's own source, compiled on its own. Stand-ins, named
where they are made: torch_npu's availability (no NPU here) and Megatron's pipeline / context-parallel batch
slicing (identity on one rank).
"""

from __future__ import annotations

import ast
import contextlib
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from upstream_helpers import MINDSPEED, find_shared_upstream, git_env, mirror

from trainbox.supply.fetch import fetch, pin_from_component
from trainbox.supply.pins import Pin
from trainbox.supply.patches import applier, load_series
from trainbox.supply.sources import unpack
from trainbox.specs.stack import load_stack

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.network,  # PyPI: the ms-swift sdist, the mcore-bridge and megatron-core wheels
              pytest.mark.skipif(find_shared_upstream() is None, reason="../shared/upstream is missing")]

# ms-swift 4.2.0's chunk_gated_delta_rule.py imports these from mindspeed.lite.ops.triton (the test reads the module
# itself; this list only says what a reader should expect)
FLA_MODULES = {"chunk_delta_h", "chunk_o", "chunk_scaled_dot_kkt", "cumsum", "solve_tril", "utils", "wy_fast"}


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """The swift stack's ms-swift, mcore-bridge and megatron-core (patched) as pinned; MindSpeed both bare and with
    its series; ms-swift v4.1.3 (the tree PR #9382 was written against) from its mirror."""
    root = tmp_path_factory.mktemp("swift-fixes")
    stack = load_stack("swift")
    env = git_env({f"{n}.git": mirror(n, root / "mirrors") for n in ("MindSpeed", "ms-swift")})
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        for k in [k for k in env if k.startswith("GIT_CONFIG")]:
            mp.setenv(k, env[k])
        for key in ("ms-swift", "mcore-bridge", "megatron-core", "mindspeed"):
            comp = stack.components[key]
            got = fetch(pin_from_component(comp, stack))
            out[key] = unpack(got, root / key)
            if key == "mindspeed":
                out["mindspeed-bare"] = unpack(got, root / "mindspeed-bare")
            if comp.patches:
                applier().apply_series(load_series(comp.patches), out[key])
        v413 = Pin(key="ms-swift", source="git", name="ms-swift", git="https://github.com/modelscope/ms-swift.git",
                   commit="c6875ef6a962e83f01138bb239b5fb4e5e55b37f")
        out["ms-swift-4.1.3"] = unpack(fetch(v413), root / "ms-swift-4.1.3")
    assert stack.components["mindspeed"].commit == MINDSPEED[2]
    return out


def compiled(path: Path, names: list[str], cls: str | None = None, **globals_) -> SimpleNamespace:
    """The named functions (methods of `cls`) of a source file, compiled on their own with `globals_`."""
    tree = ast.parse(path.read_text())
    body = tree.body
    if cls:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    found = {n.name: n for n in body if isinstance(n, ast.FunctionDef) and n.name in names}
    assert sorted(found) == sorted(names), f"{path}: {sorted(found)} of {names}"
    ns = dict(globals_)
    exec(compile(ast.Module(body=list(found.values()), type_ignores=[]), str(path), "exec"), ns)
    return SimpleNamespace(**{n: ns[n] for n in names})


def right_padded_batch(lengths=(5, 3), seq=5):
    """A Megatron-style batch of ms-swift's collator: the 4D bool mask (True = masked), causal and right-padded."""
    i = torch.arange(seq)
    real = i[None, :] < torch.tensor(lengths)[:, None]                       # [b, s]
    allowed = (i[None, :, None] >= i[None, None, :]) & real[:, None, :]     # [b, q, k]
    return {"input_ids": torch.ones(len(lengths), seq, dtype=torch.long), "position_ids": i.repeat(len(lengths), 1),
            "attention_mask": (~allowed)[:, None], "num_samples": len(lengths)}, real


def trainer(tree: Path, npu: bool):
    """ms-swift's BaseMegatronTrainer batch preparation, from its own source. Stand-ins: torch_npu's availability, and
    Megatron's PP/CP batch slicing on one rank (identity)."""
    path = tree / "swift" / "megatron" / "trainers" / "base.py"
    names = [n for n in ("_prepare_batch", "_should_use_npu_generated_attention_mask")
             if f"def {n}(" in path.read_text()]
    f = compiled(path, names, cls="BaseMegatronTrainer", is_torch_npu_available=lambda: npu,
                 get_batch_on_this_pp_rank=lambda args, data, vp_stage=None: dict(data),
                 get_batch_on_this_cp_rank=lambda args, batch: batch,
                 get_packed_seq_params=lambda pos: SimpleNamespace(qkv_format="thd"))

    def prepare(**args):
        self = SimpleNamespace(args=SimpleNamespace(**args))
        if "_should_use_npu_generated_attention_mask" in names:
            self._should_use_npu_generated_attention_mask = lambda a: f._should_use_npu_generated_attention_mask(self, a)
        batch, real = right_padded_batch()
        return f._prepare_batch(self, batch), batch, real
    return prepare


NPU_FLASH = dict(task_type="causal_lm", padding_free=False, attention_backend="flash", use_flash_attn=True)


def test_ms_swift_420_hands_npu_flash_attention_no_mask_and_keeps_the_2d_mask(trees):
    prepare = trainer(trees["ms-swift"], npu=True)
    out, _, real = prepare(**NPU_FLASH)
    # MindSpeed's flash attention gets no 4D mask (with attention_mask None and a causal layer it makes its own:
    # mindspeed/core/transformer/dot_product_attention.py), the GDN's 2D mask rides along
    assert out["attention_mask"] is None
    assert torch.equal(out["attention_mask_2d"], real)
    # padding-free (the recipe's default) takes the thd path: no mask at all, cu_seqlens instead
    out, _, _ = prepare(**dict(NPU_FLASH, padding_free=True))
    assert "attention_mask_2d" not in out and out["packed_seq_params"].qkv_format == "thd"
    # not NPU, or not flash: the 4D mask stays as it was
    for npu, args in ((False, NPU_FLASH), (True, dict(NPU_FLASH, attention_backend="local", use_flash_attn=False))):
        out, batch, _ = trainer(trees["ms-swift"], npu=npu)(**args)
        assert out["attention_mask"] is batch["attention_mask"] and "attention_mask_2d" not in out


def test_ms_swift_413_handed_npu_flash_attention_the_4d_mask(trees):
    """The pair PR #9382 reports failing in aclnnFlashAttentionScore, on the tree the stack no longer pins."""
    out, batch, _ = trainer(trees["ms-swift-4.1.3"], npu=True)(**NPU_FLASH)
    assert out["attention_mask"] is batch["attention_mask"] and out["attention_mask"].dim() == 4


def test_mcore_bridge_gdn_prefers_the_2d_mask_on_npu_and_gets_none_without_it(trees):
    path = trees["mcore-bridge"] / "mcore_bridge" / "model" / "gpts" / "qwen3_next.py"
    _, real = right_padded_batch()
    mask4d = right_padded_batch()[0]["attention_mask"]
    for npu in (True, False):
        resolve = compiled(path, ["resolve_gdn_attention_mask"], torch=torch,
                           is_torch_npu_available=lambda npu=npu: npu).resolve_gdn_attention_mask
        assert resolve({"attention_mask": None}) is None
        assert torch.equal(resolve({"attention_mask": mask4d}), real)
        got = resolve({"attention_mask": None, "attention_mask_2d": real.to(torch.uint8)})
        assert (got is None) if not npu else torch.equal(got, real)
    # Qwen3.5's GDN (mm_gpts/qwen3_5.py) resolves through the same function
    qwen35 = (trees["mcore-bridge"] / "mcore_bridge" / "model" / "mm_gpts" / "qwen3_5.py").read_text()
    assert "attention_mask = resolve_gdn_attention_mask(kwargs)" in qwen35


def test_the_2d_mask_stops_before_the_gdn(trees):
    """Where attention_mask_2d stops on its way from the trainer's batch to the GDN's kwargs, so the GDN gets
    attention_mask None (exact for right-padded causal batches; the stack file says why). When an upstream release
    carries it through, one of these fails: then the GDN gets the 2D mask, and the stack comment must say so."""
    # mcore-bridge's MultimodalGPTModel (Qwen3.5's model), run from its own source with stand-ins for Megatron's
    # embedding and the language model: the visual tower's inputs replace every forward kwarg
    path = trees["mcore-bridge"] / "mcore_bridge" / "model" / "mm_gpt_model.py"

    class Embedding:  # stand-in for megatron's VocabParallelEmbedding (its forward is what the model patches)
        reduce_scatter_embeddings = False

        def forward(self, input_):
            return torch.zeros(*input_.shape, 4)

    seen = {}

    class LanguageModel:
        extra_forward_keys: list = []

        def __init__(self):
            self.embedding = lambda input_ids, position_ids: Embedding().forward(input_ids)

        def __call__(self, **kw):
            seen.update(kw)

    mm = compiled(path, ["_patch_word_embeddings", "forward"], cls="MultimodalGPTModel", torch=torch,
                  contextmanager=contextlib.contextmanager, VocabParallelEmbedding=Embedding)
    _, real = right_padded_batch()
    for pre_process in (True, False):  # the first pipeline stage, and the others (the recipe is PP 2)
        model = SimpleNamespace(
            language_model=LanguageModel(), pre_process=pre_process,
            visual=SimpleNamespace(get_inputs_embeds=lambda res, **kw: res),
            config=SimpleNamespace(language_model_only=False, context_parallel_size=1))
        model._patch_word_embeddings = lambda kw, model=model: mm._patch_word_embeddings(model, kw)
        seen.clear()
        mm.forward(model, input_ids=torch.ones(2, 5, dtype=torch.long), position_ids=None, attention_mask=None,
                   attention_mask_2d=real)
        assert "attention_mask_2d" not in seen["extra_block_kwargs"], pre_process
    # megatron-core 0.15.3 (patched as the stack installs it): the block and the layer take fixed arguments only,
    # so nothing but attention_mask, rotary embeddings and packed_seq_params reaches self_attention
    core = trees["megatron-core"] / "megatron" / "core" / "transformer"
    for file, cls, fn in (("transformer_block.py", "TransformerBlock", "forward"),
                          ("transformer_layer.py", "TransformerLayer", "_forward_attention")):
        tree = ast.parse((core / file).read_text())
        node = next(n for c in tree.body if isinstance(c, ast.ClassDef) and c.name == cls
                    for n in c.body if isinstance(n, ast.FunctionDef) and n.name == fn)
        assert node.args.kwarg is None, f"{cls}.{fn} takes **{node.args.kwarg.arg} now"


def top_level_names(path: Path) -> set[str]:
    """Names a module binds at import (defs, classes, assignments, imports; inside if/try blocks too)."""
    names, todo = set(), list(ast.parse(path.read_text()).body)
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                names |= {e.id for e in ast.walk(t) if isinstance(e, ast.Name)}
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, (ast.If, ast.Try)):
            todo += n.body + n.orelse + getattr(n, "finalbody", []) + [s for h in getattr(n, "handlers", [])
                                                                        for s in h.body]
    return names


def fla_imports(tree: Path) -> dict[str, set[str]]:
    src = tree / "swift" / "model" / "chunk_gated_delta_rule.py"
    out: dict[str, set[str]] = {}
    for n in ast.parse(src.read_text()).body:
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("mindspeed."):
            assert n.module.startswith("mindspeed.lite.ops.triton."), n.module
            out.setdefault(n.module.rsplit(".", 1)[1], set()).update(a.name for a in n.names)
    return out


def missing(mindspeed: Path, wanted: dict[str, set[str]]) -> list[str]:
    base = mindspeed / "mindspeed" / "lite" / "ops" / "triton"
    return sorted(f"{mod}.{name}" for mod, names in wanted.items() for name in names
                  if not (base / f"{mod}.py").is_file() or name not in top_level_names(base / f"{mod}.py"))


def test_qwen35_fla_npu_patch_finds_its_mindspeed_kernels_in_the_stacks_mindspeed(trees):
    wanted = fla_imports(trees["ms-swift"])
    assert set(wanted) == FLA_MODULES
    assert missing(trees["mindspeed"], wanted) == []
    # without patches/mindspeed (core_r0.15.3 as released) the import fails and ms-swift keeps transformers' torch GDN
    assert {m.split(".")[0] for m in missing(trees["mindspeed-bare"], wanted)} >= {"chunk_delta_h",
                                                                                     "chunk_scaled_dot_kkt"}
    # on NPU, ms-swift applies it whenever transformers has qwen3_5 (swift/model/npu_patch/model.py apply_patch)
    model = ast.parse((trees["ms-swift"] / "swift" / "model" / "npu_patch" / "model.py").read_text())
    apply = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "apply_patch")
    called = {c.func.id for c in ast.walk(apply) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    assert "patch_qwen3_5_chunk_gated_delta_rule_with_mindspeed" in called
    assert textwrap.dedent("""from . import npu_patcher""") in (trees["ms-swift"] / "swift" / "model" /
                                                                 "__init__.py").read_text()


# -- in the swift image: transformers' own GDN, which mcore-bridge wraps under USE_MCORE_GDN=0 -----------------------

GDN_CHECK = """
import torch
from transformers import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
cfg = Qwen3_5TextConfig(hidden_size=64, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                        linear_num_value_heads=4, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
torch.manual_seed(0)
gdn = Qwen3_5GatedDeltaNet(cfg, 0).eval()
x = torch.randn(2, 7, 64)
none = gdn(x, attention_mask=None)
for side, mask in (("right", [[1] * 7, [1] * 4 + [0] * 3]), ("left", [[1] * 7, [0] * 3 + [1] * 4])):
    mask = torch.tensor(mask)
    real = mask.bool()
    print(side, torch.allclose(gdn(x, attention_mask=mask)[real], none[real], atol=1e-5))
"""


@pytest.mark.docker
def test_the_gdn_without_its_mask_is_exact_on_right_padded_batches(tmp_path_factory):
    """Why the GDN getting no mask (above) is harmless for ms-swift's training batches, which it pads on the right
    (its template's padding_side default): transformers' Qwen3.5 GDN, as the swift image installs it, gives the
    real tokens the same output with and without the padding mask; left padding would change them."""
    import subprocess

    from test_recipe_args_megatron import swift_image

    tag, built = swift_image(tmp_path_factory.mktemp("mirrors"))
    try:
        proc = subprocess.run(["docker", "run", "--rm", "--network", "none", "-e", "TRAINBOX_DEVICE=cpu", tag,
                               "/opt/venv/bin/python", "-c", GDN_CHECK], capture_output=True, text=True, timeout=600)
    finally:
        if built:
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[-3:-1] == ["right True", "left False"], proc.stdout
