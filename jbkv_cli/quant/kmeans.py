"""Seeded batched k-means over tokens (Lloyd), pure PyTorch, in bounded memory.

For each batch row ``n`` (one (batch, head) pair in QVG), tokens ``x_n [L, D]`` and ``k``
centroids ``c_n [k, D]``:

    init     c⁰ = k distinct tokens drawn by a seeded CPU generator (:class:`Draws`; random order per row)
    assign   a_i = argmin_j ‖x_i − c_j‖² = argmin_j (‖c_j‖² − 2 x_i·c_j)   (first j on ties)
    update   c_j = mean{x_i : a_i = j};  an empty cluster keeps its centroid

``iters`` rounds of (assign, update). The result is
the last assignment and the means of its clusters, so every non-empty cluster's residual
``x_i − c_{a_i}`` sums to zero (up to float32 rounding). QuantVideoGen's ``batch_kmeans_Euclid``
runs the same loop (assign, update, keep empty clusters, return the assignment with the
updated means); it draws its initial tokens with ``torch.randint`` (with replacement, from the
global RNG) and stops on a change rate below ``tol = 1e-4``, a host read of the change rate
every round. jbkv runs the ``iters`` rounds without reading anything on the host (no sync on
an accelerator); on a CPU it stops once no assignment changes (:func:`converged`), a shortcut
that returns the same result bit for bit: an unchanged assignment gives the same sums, hence
the same means and the same next assignment, so every remaining round repeats the last.

Memory: distances are computed for blocks of tokens, ``[N, L_b, k]`` with ``N·L_b·k ≤
max_elements``; cluster sums are one-hot matrix products accumulated block by block (no
scatter with atomics), so results are the same on every run on a given device.
"""

from __future__ import annotations

import torch

from jbkv_cli.utils.host_reads import kept

DEFAULT_MAX_ELEMENTS = 1 << 22
CENTROID_DTYPE = torch.bfloat16  # stored centroids (QVG, QuantWM)
MAX_CENTROIDS = 256  # uint8 cluster ids
MAX_ITERS = 1000  # Lloyd rounds an option may ask for
MAX_TOKENS_PER_CENTROID = 2**20


def capped_centroids(k: int, tokens: int, tokens_per_centroid: int) -> int:
    """``K_eff = min(k, tokens // tokens_per_centroid)`` (no cap for 0), at least 1, at most
    ``tokens``: the centroids a chunk of ``tokens`` tokens stores."""
    cap = tokens if tokens_per_centroid == 0 else tokens // tokens_per_centroid
    return max(1, min(k, cap, tokens))


def update_centroids(
    sums: torch.Tensor, counts: torch.Tensor, centroids: torch.Tensor
) -> torch.Tensor:
    """Lloyd's update: each cluster's mean (``sums [N, k, D] / counts [N, k]``); an empty
    cluster keeps its centroid."""
    means = sums / counts.clamp_min(1.0).unsqueeze(-1)
    return torch.where((counts > 0).unsqueeze(-1), means, centroids)


def converged(ids: torch.Tensor, previous: torch.Tensor | None) -> bool:
    """Lloyd's loop may stop: no assignment changed since the last round. Read only on a CPU
    (elsewhere a host sync per round): the remaining rounds would repeat the last one
    (module docstring), so stopping or not gives the same result."""
    return previous is not None and ids.device.type == "cpu" and torch.equal(ids, previous)


class Draws:
    """The random draws of k-means inits: ``torch.rand`` of a CPU generator seeded ``seed``, in
    order, so the choice does not depend on the device the tokens live on. Off the CPU the
    ``i``-th draw (of its shape) is copied to the device once and kept
    (:func:`~jbkv_cli.utils.host_reads.kept`): a method seeds a fresh ``Draws`` per chunk, so
    every chunk reuses the copies of the first."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self.shapes: list[tuple[int, int]] = []  # of every draw so far
        self.drawn = 0  # of those, the ones the generator made (the others were kept)

    def _draw(self, n: int, length: int, k: int) -> torch.Tensor:
        for shape in self.shapes[self.drawn :]:  # catch up on draws read from a device copy
            torch.rand(*shape, generator=self.generator)
        self.drawn = len(self.shapes) + 1
        return torch.rand(n, length, generator=self.generator).argsort(dim=-1)[:, :k]

    def order(self, n: int, length: int, k: int, device: torch.device) -> torch.Tensor:
        """``[n, k]`` (int64, on ``device``): ``k`` distinct random positions of ``length`` per
        row, the next draw."""
        if device.type == "cpu":
            out = self._draw(n, length, k)
        else:
            key = ("kmeans-init", self.seed, tuple(self.shapes), n, length, k, str(device))
            out = kept(key, lambda: self._draw(n, length, k).to(device))
        self.shapes.append((n, length))
        return out


def init_centroids(x: torch.Tensor, k: int, draws: Draws) -> torch.Tensor:
    """``k`` distinct tokens of each row of ``x [N, L, D]`` chosen at random (the next of
    ``draws``): ``[N, k, D]``."""
    n, length, _ = x.shape
    if not 1 <= k <= length:
        raise ValueError(f"k-means needs 1 <= k <= tokens, got k={k} for {length} tokens")
    order = draws.order(n, length, k, x.device)
    index = order.unsqueeze(-1).expand(-1, -1, x.shape[-1])
    return x.gather(1, index)


def assign_and_sum(
    x: torch.Tensor, centroids: torch.Tensor, max_elements: int = DEFAULT_MAX_ELEMENTS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Nearest centroid of every token, and per cluster the sum and count of its tokens.

    ``x [N, L, D]``, ``centroids [N, k, D]`` (float32) -> ``ids [N, L]`` (int64),
    ``sums [N, k, D]``, ``counts [N, k]`` (float32), one pass over token blocks.
    """
    n, length, dim = x.shape
    k = centroids.shape[1]
    c_sq = centroids.square().sum(-1).unsqueeze(1)  # [N, 1, k]
    c_t = centroids.transpose(1, 2)  # [N, D, k]
    block = max(1, min(length, max_elements // max(1, n * k)))
    ids = torch.empty(n, length, dtype=torch.long, device=x.device)
    sums = torch.zeros(n, k, dim, dtype=torch.float32, device=x.device)
    counts = torch.zeros(n, k, dtype=torch.float32, device=x.device)
    for start in range(0, length, block):
        xb = x[:, start : start + block]  # [N, b, D]
        dist = torch.baddbmm(c_sq, xb, c_t, alpha=-2.0)  # ‖c‖² − 2 x·c, [N, b, k]
        best = dist.argmin(dim=-1)  # [N, b]
        ids[:, start : start + block] = best
        onehot = torch.nn.functional.one_hot(best, k).to(torch.float32)  # [N, b, k]
        sums += onehot.transpose(1, 2) @ xb
        counts += onehot.sum(1)
    return ids, sums, counts


def kmeans(
    x: torch.Tensor,
    k: int,
    iters: int,
    draws: Draws,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's k-means on each row of ``x [N, L, D]`` (see the module docstring).

    Returns ``ids [N, L]`` (int64, the last assignment) and ``centroids [N, k, D]`` (float32,
    the means of that assignment's clusters; empty clusters keep their previous centroid).
    """
    if iters < 1:
        raise ValueError(f"k-means needs at least 1 iteration, got {iters}")
    x = x.float()
    centroids = init_centroids(x, k, draws)
    previous = None
    for _ in range(iters):
        ids, sums, counts = assign_and_sum(x, centroids, max_elements)
        if converged(ids, previous):
            break  # the means below would equal the current centroids
        centroids = update_centroids(sums, counts, centroids)
        previous = ids
    return ids, centroids


def inertia(x: torch.Tensor, ids: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """``Σ_i ‖x_i − c_{a_i}‖²`` per row: ``[N]`` (the objective Lloyd's steps never increase)."""
    index = ids.unsqueeze(-1).expand(-1, -1, x.shape[-1])
    return (x.float() - centroids.gather(1, index)).square().sum((-1, -2))
