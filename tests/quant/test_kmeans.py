"""The seeded batched k-means behind QVG (``jbkv_cli/quant/kmeans.py``)."""

from itertools import pairwise

import pytest
import torch

from jbkv_cli.quant.kmeans import Draws, assign_and_sum, inertia, init_centroids, kmeans


def _blobs(n=3, per=40, clusters=5, dim=8, seed=0):
    """Well separated clusters: ``[n, clusters·per, dim]`` and the true labels ``[n, L]``."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(n, clusters, dim, generator=g) * 20
    labels = torch.stack([torch.randperm(clusters * per, generator=g) % clusters for _ in range(n)])
    points = centers.gather(1, labels.unsqueeze(-1).expand(-1, -1, dim))
    return points + 0.1 * torch.randn(n, clusters * per, dim, generator=g), labels


def test_converged_clusters_are_pure_and_every_token_sits_at_its_nearest_centroid():
    x, labels = _blobs()
    ids, cents = kmeans(x, 20, iters=50, draws=Draws(0))
    for n in range(x.shape[0]):
        for j in ids[n].unique():
            assert labels[n][ids[n] == j].unique().numel() == 1  # no cluster spans two blobs
    # a fixed point of Lloyd's iteration: each token's centroid is its nearest, up to the
    # float32 rounding of ‖c‖² − 2 x·c (k-means) against cdist's own (2e-5 of ‖x‖², |x| ~ 20)
    dist = torch.cdist(x, cents).square()
    chosen = dist.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert (chosen <= dist.min(-1).values + 2e-5 * x.square().sum(-1)).all()


def test_centroids_are_the_means_of_the_returned_assignment():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 300, 16, generator=g)
    ids, cents = kmeans(x, 12, iters=2, draws=Draws(0))
    for n in range(4):
        for j in ids[n].unique():
            assert torch.allclose(cents[n, j], x[n][ids[n] == j].mean(0), atol=1e-5)


def test_blocked_distances_change_nothing():
    """One assignment over the same centroids in blocks of one token and all at once: the two
    run matrix products of other shapes, whose last bits a BLAS may round differently per CPU,
    so the ids agree wherever the nearest centroid beats the runner-up by more than that
    rounding (1e-4, distances ~64), and the cluster sums and counts within 1e-4."""
    x = torch.randn(2, 500, 32, generator=torch.Generator().manual_seed(2))
    cents = init_centroids(x, 17, Draws(4))
    (ids_a, sums_a, counts_a), (ids_b, sums_b, counts_b) = (
        assign_and_sum(x, cents, max_elements=m) for m in (50, 1 << 22)
    )
    two = torch.cdist(x, cents).square().topk(2, dim=-1, largest=False).values
    clear = two[..., 1] - two[..., 0] > 1e-4
    assert clear.float().mean() > 0.99 and torch.equal(ids_a[clear], ids_b[clear])
    torch.testing.assert_close(sums_a, sums_b, rtol=0, atol=1e-4)
    torch.testing.assert_close(counts_a, counts_b, rtol=0, atol=1e-4)


def test_lloyd_steps_never_increase_the_objective():
    x = torch.randn(3, 400, 16, generator=torch.Generator().manual_seed(3))
    costs = [inertia(x, *kmeans(x, 20, it, Draws(0))) for it in (1, 2, 4, 8)]
    for before, after in pairwise(costs):
        assert (after <= before * (1 + 1e-6)).all()
    assert (costs[-1] < costs[0]).all()


def test_init_draws_distinct_tokens_from_the_generator():
    x = torch.arange(50.0).view(1, 50, 1).expand(2, 50, 3).contiguous()
    c = init_centroids(x, 50, Draws(0))
    assert sorted(c[0, :, 0].tolist()) == list(range(50))  # every token once: no duplicates
    again = init_centroids(x, 7, Draws(0))
    assert torch.equal(again, init_centroids(x, 7, Draws(0)))
    torch.manual_seed(123)  # the global RNG plays no part
    assert torch.equal(again, init_centroids(x, 7, Draws(0)))
    with pytest.raises(ValueError, match="1 <= k <= tokens"):
        init_centroids(x, 51, Draws())
    with pytest.raises(ValueError, match="at least 1 iteration"):
        kmeans(x, 2, 0, Draws())
