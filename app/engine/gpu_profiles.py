"""GPU hardware profiles and the Megatron-LM FLOPs formula, for compute times.

Achieved throughput, not peak: what a GPU sustains in transformer training
kernels (TP inside the server), by model width, in TFLOP/s per GPU.

- `a100`: Megatron-LM (Narayanan et al., SC'21) Table 1 achieved TFLOP/s
  (data/tables/megatron_sc21_table1.csv) with each row's GPipe bubble
  ((p-1)/m) taken out, interpolated by hidden size. The simulator adds the
  bubble back, so the calibration test (each Table 1 row alone on `ideal`
  within +-10% of the table's derived iteration time) checks the timing model
  (bubble, micro-batches, DP exposure), not an independent prediction.
- `h100`: the A100 curve x 2.6, the ratio of Llama 3 405B Table 4's 400-430
  TFLOP/s per H100 (16k hidden, data/tables/llama3_405b_table4.csv) to Table
  1's 155-171 at the same width.
- `b200`: the H100 curve x 2.2 (NVIDIA's published Blackwell-over-Hopper
  training speed-up for GPT-class models; dense BF16 peak ratio 2.25). An
  estimate: no per-width measurement is public.

FLOPs of one iteration (Narayanan et al. 2021, eq. 3): with B sequences of s
tokens, l layers, hidden h and vocabulary V,
72 B s l h^2 (1 + s/(6h) + V/(16 l h)), and 96 instead of 72 with full
activation recomputation (one more forward). Forward is one third (one quarter
with recomputation) of it.

Pure data and arithmetic; no I/O.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

DEFAULT_GPU = "a100"
DEFAULT_VOCAB = 51200
DEFAULT_HIDDEN = 8192

# (hidden size, achieved TFLOP/s per A100) from Table 1, bubble removed
_A100_CURVE: tuple[tuple[int, float], ...] = (
    (2304, 137.0),
    (4096, 140.0),
    (6144, 137.0),
    (8192, 141.0),
    (10240, 148.0),
    (12288, 159.0),
    (16384, 171.0),
    (20480, 183.0),
    (25600, 183.0),
)


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """A GPU model: achieved TFLOP/s per GPU by hidden size, HBM bandwidth and size."""

    name: str
    scale: float  # times the A100 curve
    hbm_bytes_per_s: float
    peak_tflops: float
    memory_bytes: float  # HBM per GPU: what the admission check fits a job into

    def achieved_tflops(self, hidden_size: int | None) -> float:
        h = hidden_size or DEFAULT_HIDDEN
        xs = [x for x, _ in _A100_CURVE]
        i = bisect_left(xs, h)
        if i == 0:
            rate = _A100_CURVE[0][1]
        elif i >= len(xs):
            rate = _A100_CURVE[-1][1]
        else:
            (x0, y0), (x1, y1) = _A100_CURVE[i - 1], _A100_CURVE[i]
            rate = y0 + (y1 - y0) * (h - x0) / (x1 - x0)
        return rate * self.scale


PROFILES: dict[str, GpuProfile] = {
    "a100": GpuProfile("a100", 1.0, 2.0e12, 312.0, 80 * 1024**3),
    "h100": GpuProfile("h100", 2.6, 3.35e12, 989.0, 80 * 1024**3),
    # DGX B200: 1,440 GB of HBM3e over 8 GPUs
    "b200": GpuProfile("b200", 2.6 * 2.2, 8.0e12, 2250.0, 180e9),
}


def gpu_profile(name: str | None) -> GpuProfile:
    """The named profile (a100, h100, b200); ValueError listing them."""
    key = (name or DEFAULT_GPU).lower()
    if key not in PROFILES:
        raise ValueError(f"unknown GPU model {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[key]


def megatron_flops(
    sequences: float,
    seq_len: int,
    num_layers: int,
    hidden_size: int,
    vocab: int = DEFAULT_VOCAB,
    *,
    recompute: bool = True,
) -> float:
    """Training FLOPs of `sequences` sequences (forward + backward, + recompute)."""
    s, layers, h = seq_len, num_layers, hidden_size
    k = 96.0 if recompute else 72.0
    return k * sequences * s * layers * h * h * (1.0 + s / (6.0 * h) + vocab / (16.0 * layers * h))


def forward_share(recompute: bool) -> float:
    """The forward pass's share of the FLOPs (the rest is backward, with recompute)."""
    return 0.25 if recompute else 1.0 / 3.0


__all__ = [
    "DEFAULT_GPU",
    "PROFILES",
    "GpuProfile",
    "forward_share",
    "gpu_profile",
    "megatron_flops",
]
