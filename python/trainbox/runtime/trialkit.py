"""Tiny artifacts for `trainbox trial`, made inside the recipe's image: nothing reaches a model hub.

Runtime module: standard library at import; torch, transformers and tokenizers only inside the functions (they
are the image's own). `trainbox trial` runs `python3 -m trainbox.runtime.trialkit SPEC.json OUT_DIR` in the image
with this checkout's runtime mounted, so the host needs no transformers. The spec (from the recipe's `trial:`
overlay) names what to make:

  tokenizer  a byte-level BPE trained here with the `tokenizers` library on the synthetic corpus, with the
             special tokens and the chat template the recipe's data format needs (`chat_template`: a name of
             CHAT_TEMPLATES); saved with save_pretrained beside the model
  model      the recipe's architecture (`arch`: a transformers model_type such as qwen3, qwen3_5, qwen3_moe) from
             its default config scaled down by `config` (the text config's keys for multimodal ones), random
             weights, saved with save_pretrained (safetensors) into OUT/model
  data       synthetic conversations in the recipe's format (`format`: FORMATS), `samples` of them, into
             OUT/data/train.jsonl; `drop_fields` leaves fields out (a test that breaks the data on purpose)
  files      JSON files derived from one in the image (`from`: a path), keys replaced by `set` (a dotted key
             reaches into a mapping; `@tokenizer.ATTR` is the made tokenizer's id, `@tokenizer.len` its size);
             e.g. SpecForge's draft config at the tiny target's sizes

OUT/made.json lists what was made (the trial's cache marker); a failure exits 1 naming the artifact.
"""

from __future__ import annotations

import json
import os
import random
import sys

# Chat templates by the name a recipe's data format uses. qwen3.5: what SpecForge's `qwen3.5` template parses
# (assistant header "<|im_start|>assistant\n<think>\n", end of turn "<|im_end|>\n") and Qwen's own layout.
CHAT_TEMPLATES = {
    "qwen3.5": (
        "{%- for m in messages %}"
        "{%- if m['role'] == 'assistant' %}"
        "{{- '<|im_start|>assistant\\n<think>\\n' + (m.get('reasoning_content') or '') + '\\n</think>\\n\\n' "
        "+ m['content'] + '<|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
    ),
}
CHAT_TEMPLATES["qwen3"] = CHAT_TEMPLATES["qwen3.5"]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|MASK|>"]
WORDS = ("the model reads a token and writes the next one while gradients flow through every layer of the "
         "network so that loss falls step after step on a tiny corpus made here for a trial run of training "
         "code paths data parallel ranks exchange tensors over gloo and the optimizer updates each weight").split()


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversations(samples: int, words: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(samples):
        turns = [{"role": "user", "content": _sentence(rng, max(4, words // 4))},
                 {"role": "assistant", "content": _sentence(rng, words)}]
        out.append({"id": f"trial-{i}", "conversations": turns})
    return out


def _query_response(row: dict) -> dict:
    turns = row["conversations"]
    return {"query": turns[0]["content"], "response": turns[1]["content"]}


# data formats: sharegpt-jsonl (SpecForge: {"id", "conversations": [{"role", "content"}]}), query-response-jsonl
# (ModelScope's self-cognition layout that Twinkle's SelfCognitionProcessor reads: {"query", "response"}),
# messages-jsonl (ms-swift's standard: {"messages": [{"role", "content"}]})
FORMATS = {"sharegpt-jsonl": lambda row: row, "query-response-jsonl": _query_response,
           "messages-jsonl": lambda row: {"messages": row["conversations"]}}


def make_data(spec: dict, out: str) -> str:
    fmt = spec.get("format", "sharegpt-jsonl")
    if fmt not in FORMATS:
        raise ValueError(f"data.format: {fmt!r}: known formats: {', '.join(FORMATS)}")
    d = os.path.join(out, "data")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "train.jsonl")
    drop = set(spec.get("drop_fields") or [])
    with open(path, "w", encoding="utf-8") as fh:
        for row in conversations(int(spec.get("samples", 16)), int(spec.get("words", 64))):
            fh.write(json.dumps({k: v for k, v in FORMATS[fmt](row).items() if k not in drop}) + "\n")
    return path


def make_tokenizer(spec: dict, out: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = list(dict.fromkeys(SPECIAL_TOKENS + list(spec.get("special_tokens") or [])))
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=int(spec.get("vocab_size", 512)), special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [m["content"] for c in conversations(64, 64, seed=1) for m in c["conversations"]]
    tok.train_from_iterator(corpus, trainer=trainer)
    name = spec.get("chat_template")
    if name and name not in CHAT_TEMPLATES:
        raise ValueError(f"tokenizer.chat_template: {name!r}: known: {', '.join(sorted(CHAT_TEMPLATES))}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, mask_token="<|MASK|>", additional_special_tokens=special[1:5])
    if name:
        fast.chat_template = CHAT_TEMPLATES[name]
    return fast


def _set(target: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        target = target.setdefault(k, {})
    target[keys[-1]] = value


def make_model(spec: dict, tokenizer, out: str) -> str:
    import torch
    from transformers import AutoConfig

    arch = spec["arch"]
    config = AutoConfig.for_model(arch)
    sub = getattr(config, "text_config", None) or config
    scaled = dict(spec.get("config") or {})
    scaled.setdefault("vocab_size", len(tokenizer))
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        tid = getattr(tokenizer, key)
        if tid is not None:
            scaled.setdefault(key, tid)
    for key, value in scaled.items():
        if key.startswith("vision_config.") and hasattr(config, "vision_config"):
            setattr(config.vision_config, key.split(".", 1)[1], value)
        else:
            setattr(sub, key, value)
            if sub is not config and key in ("vocab_size", "pad_token_id", "eos_token_id", "bos_token_id",
                                             "tie_word_embeddings"):
                setattr(config, key, value)
    if "num_hidden_layers" in scaled and getattr(sub, "layer_types", None) and "layer_types" not in scaled:
        sub.layer_types = list(sub.layer_types[:scaled["num_hidden_layers"]])  # the real pattern's first layers
    torch.manual_seed(int(spec.get("seed", 0)))
    model = _build(spec, config)
    d = os.path.join(out, "model")
    model.to(getattr(torch, spec.get("dtype", "bfloat16"))).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


def _build(spec: dict, config):
    """The class the recipe loads: `class` names a transformers class (Qwen3_5ForConditionalGeneration, the
    multimodal wrapper whose weights sit under model.language_model), else AutoModelForCausalLM's choice."""
    import transformers

    cls = spec.get("class")
    if cls:
        return getattr(transformers, cls)._from_config(config)
    return transformers.AutoModelForCausalLM.from_config(config)


def make_files(spec: dict, out: str, made: dict) -> dict:
    paths = {}
    for name, f in (spec or {}).items():
        with open(f["from"], encoding="utf-8") as fh:
            data = json.load(fh)
        for key, value in (f.get("set") or {}).items():
            _set(data, key, _ref(value, made))
        path = os.path.join(out, f"{name}.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2)
        paths[name] = path
    return paths


def _ref(value, made: dict):
    """`@tokenizer.mask_token_id` style references to what was made (the tokenizer's ids)."""
    if isinstance(value, str) and value.startswith("@tokenizer."):
        tok, attr = made["tokenizer_object"], value.split(".", 1)[1]
        return len(tok) if attr == "len" else getattr(tok, attr)
    return value


def make(spec: dict, out: str) -> dict:
    os.makedirs(out, exist_ok=True)
    made: dict = {}
    steps = [("data", lambda: make_data(spec["data"], out))] if spec.get("data") else []
    if spec.get("model") or spec.get("tokenizer"):
        steps.append(("tokenizer", lambda: made.__setitem__("tokenizer_object",
                                                             make_tokenizer(spec.get("tokenizer") or {}, out))))
    if spec.get("model"):
        steps.append(("model", lambda: make_model(spec["model"], made["tokenizer_object"], out)))
    if spec.get("files"):
        steps.append(("files", lambda: make_files(spec["files"], out, made)))
    result = {}
    for name, fn in steps:
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - one line naming the artifact
            raise SystemExit(f"trialkit: making {name}: {type(exc).__name__}: {exc}") from exc
        if value is not None:
            result[name] = value
    if "tokenizer_object" in made:
        tok = made["tokenizer_object"]
        result["tokenizer"] = {"vocab": len(tok), "mask_token_id": tok.mask_token_id, "eos_token_id": tok.eos_token_id}
    with open(os.path.join(out, "made.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2)
    return result


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        sys.stderr.write("usage: python3 -m trainbox.runtime.trialkit SPEC.json OUT_DIR\n")
        return 2
    with open(args[0], encoding="utf-8") as fh:
        spec = json.load(fh)
    print(json.dumps(make(spec, args[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
