"""Sample definitions shared by the unit tests."""

VALID = {
    "name": "rmsnorm_h8",
    "op_type": "rmsnorm",
    "description": "A tiny RMSNorm used by the unit tests.",
    "tags": ["status:reference", "model:toy"],
    "axes": {
        "batch_size": {"type": "var"},
        "hidden_size": {"type": "const", "value": 8},
    },
    "constraints": ["hidden_size == weight.shape[0]"],
    "inputs": {
        "hidden_states": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"},
        "weight": {"shape": ["hidden_size"], "dtype": "bfloat16"},
    },
    "outputs": {"output": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"}},
    "reference": (
        "import torch\n\nEPS = 1e-5\n\n\n@torch.no_grad()\ndef run(hidden_states, weight):\n"
        "    x = hidden_states.to(torch.float32)\n"
        "    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)\n"
        "    return (y * weight.to(torch.float32)).to(hidden_states.dtype)\n"
    ),
}
