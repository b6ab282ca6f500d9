"""FFN modules written the ways users write them, for the matcher's coverage tests."""

import operator

import torch
import torch.nn as nn
import torch.nn.functional as F

D, H = 32, 128


class _Two(nn.Module):
    def __init__(self, bias: bool = True, d: int = D, h: int = H, d_out: int = D) -> None:
        super().__init__()
        self.fc = nn.Linear(d, h, bias=bias)
        self.proj = nn.Linear(h, d_out, bias=bias)


class TorchReluSquare(_Two):
    def forward(self, x):
        return self.proj(torch.square(torch.relu(self.fc(x))))


class FunctionalLinearKwBias(_Two):
    def forward(self, x):
        z = F.linear(x, self.fc.weight, bias=self.fc.bias)
        return F.linear(F.relu(z).square(), self.proj.weight, bias=self.proj.bias)


class InplaceReluPowOp(_Two):
    def forward(self, x):
        return self.proj(F.relu(self.fc(x), inplace=True) ** 2)


class ReluModuleInplaceTorchPow(_Two):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.proj(torch.pow(self.act(self.fc(x)), 2))


class MethodReluMethodPow(_Two):
    def forward(self, x):
        return self.proj(self.fc(x).relu().pow(2.0))


class MethodReluInplaceMulOp(_Two):
    def forward(self, x):
        r = self.fc(x).relu_()
        return self.proj(r * r)


class TorchReluTorchMul(_Two):
    def forward(self, x):
        r = torch.relu(self.fc(x))
        return self.proj(torch.mul(r, r))


class InplaceReluAliasedName(_Two):
    """relu in place, then the square reads the linear's (mutated) output by its old name."""

    def forward(self, x):
        z = self.fc(x)
        F.relu(z, inplace=True)
        return self.proj(operator.mul(z, z))


class SquaredReLU(nn.Module):
    def forward(self, x):
        return torch.square(torch.relu(x))


class HFStyleMLP(nn.Module):
    """Hugging Face style: up_proj / act_fn module / down_proj, no bias."""

    def __init__(self) -> None:
        super().__init__()
        self.up_proj = nn.Linear(D, H, bias=False)
        self.act_fn = SquaredReLU()
        self.down_proj = nn.Linear(H, D, bias=False)

    def forward(self, x):
        return self.down_proj(self.act_fn(self.up_proj(x)))


class NoBias(_Two):
    def __init__(self) -> None:
        super().__init__(bias=False)

    def forward(self, x):
        return self.proj(torch.relu(self.fc(x)) ** 2)


MATCHING = [
    TorchReluSquare,
    FunctionalLinearKwBias,
    InplaceReluPowOp,
    ReluModuleInplaceTorchPow,
    MethodReluMethodPow,
    MethodReluInplaceMulOp,
    TorchReluTorchMul,
    InplaceReluAliasedName,
    HFStyleMLP,
    NoBias,
]


class GeluFFN(_Two):
    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class SiluFFN(_Two):
    def forward(self, x):
        return self.proj(F.silu(self.fc(x)))


class ReluOnly(_Two):
    def forward(self, x):
        return self.proj(torch.relu(self.fc(x)))


class SquareOnly(_Two):
    def forward(self, x):
        return self.proj(torch.square(self.fc(x)))


class ReluSquaredUsedTwice(_Two):
    def forward(self, x):
        h = torch.relu(self.fc(x)).square()
        return self.proj(h), h.sum()


class LinearOutputUsedElsewhere(_Two):
    def forward(self, x):
        z = self.fc(x)
        return self.proj(torch.relu(z).square()) + z[..., :D]


class GatedGLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(D, H, bias=False)
        self.up_proj = nn.Linear(D, H, bias=False)
        self.down_proj = nn.Linear(H, D, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# (module, reason the report must give: a fragment)
NOT_MATCHING = [
    (GeluFFN, "activation gelu is not relu²"),
    (SiluFFN, "activation silu is not relu²"),
    (ReluOnly, "activation relu is not relu²"),
    (SquareOnly, "activation square is not relu²"),
    (ReluSquaredUsedTwice, "relu² output feeds"),
    (LinearOutputUsedElsewhere, "first linear's output is also used"),
    (GatedGLU, "gated FFN (GLU)"),
]


class MultiFFN(nn.Module):
    """Two relu² FFNs and a GELU one in one graph."""

    def __init__(self) -> None:
        super().__init__()
        self.a = TorchReluSquare()
        self.b = HFStyleMLP()
        self.c = GeluFFN()

    def forward(self, x):
        return self.c(self.b(self.a(x)) + x)
