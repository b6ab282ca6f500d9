"""A compact GPT (nanoGPT style) with squared-ReLU FFNs: the model the main job trains.

Pre-LayerNorm blocks, causal attention through F.scaled_dot_product_attention, FFN hidden 4*d
with relu(x)^2, token embedding tied to the output head. Byte-level vocabulary (256).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    block_size: int = 256
    vocab_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True


SIZES: dict[str, GPTConfig] = {
    "tiny": GPTConfig(block_size=128, n_layer=4, n_head=4, n_embd=128),
    "125m": GPTConfig(block_size=1024, n_layer=18, n_head=12, n_embd=768),  # 127M parameters
    # 126M parameters with FFN hidden 4096: a multiple of 2048, as keep 1/4 (M = 16) in chunks of
    # 128 needs (the 125m model's 3072 is not)
    "125m-d1024": GPTConfig(block_size=1024, n_layer=10, n_head=16, n_embd=1024),
    "350m": GPTConfig(block_size=1024, n_layer=28, n_head=16, n_embd=1024),  # 353M parameters
    "1.3b": GPTConfig(block_size=2048, n_layer=24, n_head=16, n_embd=2048),  # 1.21B parameters
    "3b": GPTConfig(block_size=2048, n_layer=24, n_head=24, n_embd=3072),  # 2.72B parameters
}


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.n_embd % cfg.n_head:
            raise ValueError(f"n_embd={cfg.n_embd} must be a multiple of n_head={cfg.n_head}")
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    """FFN: c_proj(relu(c_fc(x))^2), hidden 4*d."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(torch.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def adamw(self, lr: float, weight_decay: float, fused: bool) -> torch.optim.AdamW:
        """AdamW, betas (0.9, 0.95), weight decay on the 2-D weights only (not biases, norms)."""
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=fused)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx [B, T] int64 -> (logits [B, T, vocab], mean cross-entropy vs targets or None)."""
        t = idx.shape[1]
        if t > self.cfg.block_size:
            raise ValueError(f"sequence length {t} > block_size {self.cfg.block_size}")
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return logits, loss


def train_step(compiled, model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, autocast):
    """One step of the benchmarks' recipe: loss of ``compiled(x, y)`` under ``autocast()``, backward,
    gradient norm clipped to 1.0, ``opt`` step, gradients set to None. Returns the loss."""
    with autocast():
        _, loss = compiled(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def tiny() -> GPT:
    """The CPU-sized model (factory for ``sparse-compile explain bench.model:tiny``)."""
    return GPT(SIZES["tiny"])
