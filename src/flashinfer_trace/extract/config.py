"""Model configs: Hugging Face style `config.json` hyper-parameters (no weights), bundled for a few
models (configs/*.json, each with a `flashinfer_trace` block naming it and its serving defaults)
or read from any file. Nothing is fetched.

Each architecture lists the fields it needs; a missing or mistyped one is an error naming the file
and the field, before anything is planned.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).parent / "configs"

# model_type -> the extractor family that plans its kernels
ARCHITECTURES = {"llama": "llama", "mistral": "llama", "mixtral": "mixtral", "qwen2_moe": "qwen_moe",
                 "qwen3_moe": "qwen_moe", "deepseek_v3": "deepseek_v3", "nemotron_h": "nemotron_h",
                 "deepseek_v32": "deepseek_v32", "qwen3_next": "qwen3_next"}
# --model accepts an architecture family (every bundled config of it) or a bundled config's name
FAMILY_ALIASES = {"llama": "llama", "mixtral": "mixtral", "qwen2_moe": "qwen_moe", "qwen3_moe": "qwen_moe",
                  "qwen_moe": "qwen_moe", "deepseek_v3": "deepseek_v3", "deepseek": "deepseek_v3",
                  "nemotron_h": "nemotron_h", "deepseek_v32": "deepseek_v32", "qwen3_next": "qwen3_next"}

INT, FLOAT, BOOL, STR = "int", "float", "bool", "str"
REQUIRED: dict[str, dict[str, str]] = {
    "llama": {"hidden_size": INT, "intermediate_size": INT, "num_attention_heads": INT, "vocab_size": INT,
              "rms_norm_eps": FLOAT},
    "mixtral": {"hidden_size": INT, "intermediate_size": INT, "num_attention_heads": INT, "vocab_size": INT,
                "rms_norm_eps": FLOAT, "num_local_experts": INT, "num_experts_per_tok": INT},
    "qwen_moe": {"hidden_size": INT, "num_attention_heads": INT, "vocab_size": INT, "rms_norm_eps": FLOAT,
                 "moe_intermediate_size": INT, "num_experts": INT, "num_experts_per_tok": INT},
    "deepseek_v3": {"hidden_size": INT, "intermediate_size": INT, "moe_intermediate_size": INT,
                    "num_attention_heads": INT, "q_lora_rank": INT, "kv_lora_rank": INT, "qk_nope_head_dim": INT,
                    "qk_rope_head_dim": INT, "v_head_dim": INT, "n_routed_experts": INT, "n_shared_experts": INT,
                    "num_experts_per_tok": INT, "n_group": INT, "topk_group": INT, "routed_scaling_factor": FLOAT,
                    "first_k_dense_replace": INT, "vocab_size": INT, "rms_norm_eps": FLOAT},
    # hybrid Mamba2 / attention / MLP: hybrid_override_pattern has one character per layer (M, *, -)
    "nemotron_h": {"hidden_size": INT, "intermediate_size": INT, "num_attention_heads": INT,
                   "num_key_value_heads": INT, "vocab_size": INT, "layer_norm_epsilon": FLOAT,
                   "mamba_num_heads": INT, "mamba_head_dim": INT, "ssm_state_size": INT, "n_groups": INT,
                   "conv_kernel": INT, "hybrid_override_pattern": STR},
}
# Qwen3-Next: gated DeltaNet linear attention, with full (gated) attention every full_attention_interval layers
REQUIRED["qwen3_next"] = {"hidden_size": INT, "num_attention_heads": INT, "num_key_value_heads": INT, "head_dim": INT,
                          "vocab_size": INT, "rms_norm_eps": FLOAT, "moe_intermediate_size": INT, "num_experts": INT,
                          "num_experts_per_tok": INT, "linear_num_key_heads": INT, "linear_num_value_heads": INT,
                          "linear_key_head_dim": INT, "linear_value_head_dim": INT, "linear_conv_kernel_dim": INT,
                          "full_attention_interval": INT}
# DeepSeek-V3.2 (DeepSeek sparse attention): V3's fields plus the lightning indexer's
REQUIRED["deepseek_v32"] = {**REQUIRED["deepseek_v3"], "index_n_heads": INT, "index_head_dim": INT, "index_topk": INT}
OPTIONAL: dict[str, str] = {"num_key_value_heads": INT, "head_dim": INT, "norm_topk_prob": BOOL,
                            "shared_expert_intermediate_size": INT, "partial_rotary_factor": FLOAT,
                            "attention_head_dim": INT, "num_hidden_layers": INT}


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ModelConfig:
    name: str  # the model tag: "llama-3.1-8b"
    family: str  # "llama", "mixtral", "qwen_moe", "deepseek_v3"
    source: str  # where it was read from
    values: dict[str, Any]
    tp: int = 1
    ep: int = 1
    fp8_block: int | None = None  # block size of an fp8 block-scale checkpoint, else None (bf16)
    extra: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def bundled() -> dict[str, Path]:
    """Bundled config name -> file."""
    return {p.stem: p for p in sorted(CONFIG_DIR.glob("*.json"))}


def _typed(value: Any, kind: str) -> bool:
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool) and value > 0
    if kind == FLOAT:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if kind == STR:
        return isinstance(value, str) and value != ""
    return isinstance(value, bool)


def parse_config(data: Any, source: str, *, name: str | None = None, tp: int | None = None,
                 ep: int | None = None) -> ModelConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a config is a JSON object, got {type(data).__name__}")
    model_type = data.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ConfigError(f"{source}: model_type: {model_type!r} is not supported "
                          f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    family = ARCHITECTURES[model_type]
    for key, kind in REQUIRED[family].items():
        if key not in data:
            raise ConfigError(f"{source}: {key}: missing (a {model_type} config needs it)")
        if not _typed(data[key], kind):
            want = "non-empty string" if kind == STR else f"positive {kind}"
            raise ConfigError(f"{source}: {key}: {data[key]!r} is not a {want}")
    for key, kind in OPTIONAL.items():
        if key in data and data[key] is not None and not _typed(data[key], kind) and not (
                kind == INT and data[key] == 0 and key == "shared_expert_intermediate_size"):
            raise ConfigError(f"{source}: {key}: {data[key]!r} is not a valid {kind}")
    meta = data.get("flashinfer_trace") or {}
    tp = tp or meta.get("tp") or 1
    ep = ep or meta.get("ep") or 1
    for key, v in (("tp", tp), ("ep", ep)):
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"{source}: {key}: {v!r} must be a positive integer")
    quant = data.get("quantization_config") or {}
    fp8_block = None
    if quant:
        block = quant.get("weight_block_size")
        if quant.get("quant_method") != "fp8" or not (isinstance(block, list) and len(block) == 2
                                                       and block[0] == block[1] and _typed(block[0], INT)):
            raise ConfigError(f"{source}: quantization_config: only fp8 with a square weight_block_size "
                              f"is supported, got {quant!r}")
        fp8_block = block[0]
    name = name or meta.get("name") or data.get("_name_or_path") or Path(source).stem
    name = str(name).rsplit("/", 1)[-1].lower()
    return ModelConfig(name, family, source, data, tp, ep, fp8_block, meta)


def load_config(path: str | Path, **overrides: Any) -> ModelConfig:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not JSON: line {e.lineno} column {e.colno}: {e.msg}") from None
    return parse_config(data, str(path), **overrides)


def select_models(model: str, **overrides: Any) -> list[ModelConfig]:
    """--model: a bundled config by name, or every bundled config of an architecture family."""
    files = bundled()
    if model in files:
        return [load_config(files[model], **overrides)]
    family = FAMILY_ALIASES.get(model)
    if family is None:
        raise ConfigError(f"--model {model!r}: not a bundled model ({', '.join(files)}) nor an architecture "
                          f"({', '.join(sorted(FAMILY_ALIASES))}); use --config FILE for another model")
    configs = [load_config(p, **overrides) for p in files.values()]
    return [c for c in configs if c.family == family]
