"""LoRA adapter aggregation: weighted mean, robust variants, clipping and drift."""

from __future__ import annotations

import numpy as np
import pytest

from pubswap_flwr.algorithms.lora_averaging import (
    AggregationError,
    AggregationRule,
    aggregate,
    clip_update,
    combine,
    coordinate_median,
    count_votes,
    geometric_median,
    mean_pairwise_l2,
    median_clip,
    not_robust,
    trimmed_mean,
    update_norm,
    weighted_mean,
)


def adapter(a, b) -> dict[str, np.ndarray]:
    return {"layer.lora_A": np.asarray(a, dtype=np.float32), "layer.lora_B": np.asarray(b, dtype=np.float32)}


# --- weighted mean ----------------------------------------------------------------------------------------------


def test_weighted_mean_exact_values():
    x = adapter([[1.0, 2.0]], [[4.0], [0.0]])
    y = adapter([[5.0, -2.0]], [[0.0], [8.0]])
    out = weighted_mean([x, y], [1, 3])
    np.testing.assert_array_equal(out["layer.lora_A"], np.array([[4.0, -1.0]], dtype=np.float32))
    np.testing.assert_array_equal(out["layer.lora_B"], np.array([[1.0], [6.0]], dtype=np.float32))
    assert all(v.dtype == np.float32 for v in out.values())
    assert set(out) == {"layer.lora_A", "layer.lora_B"}


def test_weights_are_normalised():
    x = adapter([[1.0, 2.0]], [[3.0]])
    y = adapter([[3.0, 6.0]], [[5.0]])
    a = weighted_mean([x, y], [1, 1])
    b = weighted_mean([x, y], [50, 50])
    c = weighted_mean([x, y], [0.25, 0.25])
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
        np.testing.assert_array_equal(a[k], c[k])
    np.testing.assert_array_equal(a["layer.lora_A"], [[2.0, 4.0]])
    # a zero weight ignores that adapter entirely
    only_y = weighted_mean([x, y], [0, 7])
    np.testing.assert_array_equal(only_y["layer.lora_A"], y["layer.lora_A"])


def test_single_adapter_mean_is_itself():
    x = adapter([[0.1, -0.7]], [[1.5]])
    out = weighted_mean([x], [3.0])
    for k in x:
        np.testing.assert_allclose(out[k], x[k], rtol=0, atol=1e-7)


def test_fp16_transport_error_is_bounded_and_output_is_fp32():
    rng = np.random.default_rng(0)
    clients = [{"A": rng.normal(0, 0.05, (8, 64)).astype(np.float32),
                "B": rng.normal(0, 0.05, (64, 8)).astype(np.float32)}
               for _ in range(4)]
    weights = [10, 20, 30, 40]
    exact = weighted_mean(clients, weights)
    sent = [{k: v.astype(np.float16) for k, v in c.items()} for c in clients]
    received = weighted_mean(sent, weights)
    for k in exact:
        assert received[k].dtype == np.float32
        bound = max(np.abs(c[k]).max() for c in clients) * 2.0**-11 + 1e-7  # half an fp16 ulp, relative
        err = np.abs(received[k] - exact[k]).max()
        assert err <= bound
        assert err > 0  # fp16 did round something: the bound is exercised, not vacuous


def test_a_and_b_are_averaged_separately_not_their_products():
    # Client 1: B1 A1 = [[1]]*[[1]]; client 2: B2 A2 = [[3]]*[[3]] (rank 1, 1x1 for clarity).
    c1 = {"A": np.array([[1.0]], dtype=np.float32), "B": np.array([[1.0]], dtype=np.float32)}
    c2 = {"A": np.array([[3.0]], dtype=np.float32), "B": np.array([[3.0]], dtype=np.float32)}
    out = weighted_mean([c1, c2], [1, 1])
    assert out["A"][0, 0] == 2.0 and out["B"][0, 0] == 2.0
    product_of_means = (out["B"] @ out["A"])[0, 0]
    mean_of_products = ((c1["B"] @ c1["A"] + c2["B"] @ c2["A"]) / 2)[0, 0]
    assert product_of_means == 4.0
    assert mean_of_products == 5.0  # the two differ; aggregation is per tensor (the PubSwap paper's choice)


def test_key_mismatch_raises():
    with pytest.raises(AggregationError, match="adapter 1 has different tensor keys"):
        weighted_mean([{"A": np.zeros(2)}, {"B": np.zeros(2)}], [1, 1])
    with pytest.raises(AggregationError, match="adapter 2 has different tensor keys"):
        coordinate_median([{"A": np.zeros(2)}, {"A": np.zeros(2)}, {"A": np.zeros(2), "B": np.zeros(2)}])


def test_shape_mismatch_raises_naming_key_and_shapes():
    with pytest.raises(AggregationError, match=r"adapter 1: A has shape \(3,\), expected \(2,\)"):
        weighted_mean([{"A": np.zeros(2)}, {"A": np.zeros(3)}], [1, 1])


@pytest.mark.parametrize("weights,match", [
    ([1.0], "1 weights for 2 adapters"),
    ([1.0, -1.0], "weights must be finite"),
    ([0.0, 0.0], "weights must be finite"),
    ([float("nan"), 1.0], "weights must be finite"),
    ([float("inf"), 1.0], "weights must be finite"),
])
def test_bad_weights_raise(weights, match):
    with pytest.raises(AggregationError, match=match):
        weighted_mean([{"A": np.zeros(2)}, {"A": np.ones(2)}], weights)


def test_no_adapters_raises():
    with pytest.raises(AggregationError, match="no adapters"):
        weighted_mean([], [])
    with pytest.raises(AggregationError, match="no adapters"):
        trimmed_mean([], 0.2)


# --- robust aggregation -----------------------------------------------------------------------------------------


def _honest_and_outlier():
    rng = np.random.default_rng(1)
    truth = rng.normal(0, 1, (16, 16)).astype(np.float32)
    honest = [{"W": truth + rng.normal(0, 0.01, truth.shape).astype(np.float32)} for _ in range(4)]
    outlier = {"W": truth * 100}
    return truth, honest + [outlier]


def test_median_and_trimmed_mean_resist_a_x100_outlier():
    truth, clients = _honest_and_outlier()
    err = lambda out: float(np.abs(out["W"] - truth).max())  # noqa: E731
    mean_err = err(weighted_mean(clients, [1] * 5))
    median_err = err(coordinate_median(clients))
    trimmed_err = err(trimmed_mean(clients, 0.2))
    assert mean_err > 10  # the outlier drags the mean by ~99/5 of |truth|
    assert median_err < 0.05
    assert trimmed_err < 0.05
    assert median_err * 100 < mean_err and trimmed_err * 100 < mean_err


def test_median_values():
    xs = [{"W": np.array([1.0, 10.0])}, {"W": np.array([2.0, -5.0])}, {"W": np.array([100.0, 0.0])}]
    np.testing.assert_array_equal(coordinate_median(xs)["W"], [2.0, 0.0])
    even = xs + [{"W": np.array([3.0, 1.0])}]
    np.testing.assert_array_equal(coordinate_median(even)["W"], [2.5, 0.5])


def test_trimmed_mean_values():
    xs = [{"W": np.array([v], dtype=np.float32)} for v in [1, 2, 3, 4, 100]]
    np.testing.assert_allclose(trimmed_mean(xs, 0.2)["W"], [3.0])  # drops 1 and 100
    np.testing.assert_allclose(trimmed_mean(xs, 0.0)["W"], [22.0])  # plain mean
    np.testing.assert_allclose(trimmed_mean(xs, 0.19)["W"], [22.0])  # floor(0.95) = 0 cut


def test_trimmed_mean_that_leaves_nothing_raises():
    xs = [{"W": np.zeros(1)}, {"W": np.ones(1)}]
    with pytest.raises(AggregationError, match="leaves no values"):
        trimmed_mean(xs, 0.5)


# --- clipping ---------------------------------------------------------------------------------------------------


def test_clip_update_caps_the_update_norm():
    ref = {"A": np.array([1.0, 1.0], dtype=np.float32), "B": np.zeros(1, dtype=np.float32)}
    big = {"A": np.array([4.0, 5.0], dtype=np.float32), "B": np.array([0.0], dtype=np.float32)}  # update (3, 4)
    assert update_norm(big, ref) == pytest.approx(5.0)
    clipped = clip_update(big, ref, 1.0)
    assert update_norm(clipped, ref) == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_allclose(clipped["A"], [1.6, 1.8], rtol=1e-6)  # same direction, length 1
    assert all(v.dtype == np.float32 for v in clipped.values())


def test_clip_update_leaves_short_updates_and_disabled_clipping_alone():
    ref = {"A": np.zeros(2, dtype=np.float32)}
    small = {"A": np.array([0.3, 0.4], dtype=np.float32)}
    np.testing.assert_array_equal(clip_update(small, ref, 1.0)["A"], small["A"])
    big = {"A": np.array([30.0, 40.0], dtype=np.float16)}
    out = clip_update(big, ref, 0.0)
    np.testing.assert_array_equal(out["A"], [30.0, 40.0])
    assert out["A"].dtype == np.float32


def test_aggregate_dispatch_and_clipping():
    ref = {"W": np.zeros(2, dtype=np.float32)}
    xs = [{"W": np.array([3.0, 4.0], dtype=np.float32)}, {"W": np.array([0.0, 0.0], dtype=np.float32)}]
    np.testing.assert_allclose(aggregate(xs, [1, 1])["W"], [1.5, 2.0])
    clipped = aggregate(xs, [1, 1], reference=ref, clip_norm=1.0)
    np.testing.assert_allclose(clipped["W"], [0.3, 0.4], rtol=1e-6)
    np.testing.assert_allclose(aggregate(xs, [1, 1], method="median")["W"], [1.5, 2.0])
    three = xs + [{"W": np.array([1.0, 1.0], dtype=np.float32)}]
    np.testing.assert_allclose(aggregate(three, [1, 1, 1], method="trimmed-mean", trim_fraction=0.34)["W"], [1.0, 1.0])
    with pytest.raises(AggregationError, match="needs the reference"):
        aggregate(xs, [1, 1], clip_norm=1.0)
    with pytest.raises(AggregationError, match="unknown aggregation 'krum'"):
        aggregate(xs, [1, 1], method="krum")


def test_median_clip_bounds_each_update_by_c_times_the_median_norm():
    ref = {"W": np.zeros(2, dtype=np.float32)}
    honest = [{"W": np.array([0.3, 0.4], dtype=np.float32)}, {"W": np.array([0.6, 0.8], dtype=np.float32)}]
    huge = {"W": np.array([6e4, 0.0], dtype=np.float32)}
    out, bound, norms = median_clip(honest + [huge], ref, 3.0)
    assert norms == pytest.approx([0.5, 1.0, 6e4]) and bound == pytest.approx(3.0)  # 3 x the median 1.0
    assert out[0] is honest[0] and out[1] is honest[1]  # within the bound: the very same arrays
    np.testing.assert_allclose(out[2]["W"], [3.0, 0.0], rtol=1e-6)
    assert out[2]["W"].dtype == np.float32


def test_median_clip_of_two_is_their_mean_and_a_zero_median_clips_nothing():
    ref = {"W": np.ones(2, dtype=np.float32)}
    a, b = {"W": np.array([1.0, 1.5], dtype=np.float32)}, {"W": np.array([1.0, 5.0], dtype=np.float32)}
    out, bound, _ = median_clip([a, b], ref, 2.0)
    assert bound == pytest.approx(2.0 * (0.5 + 4.0) / 2) and out == [a, b]  # two clients: no protection
    still = [{"W": np.ones(2, dtype=np.float32)}] * 2 + [b]
    out, bound, _ = median_clip(still, ref, 3.0)  # most sent no change: scaling b to 0 would hand them the round
    assert bound == 0.0 and out[2] is b


def test_geometric_median_outvotes_a_far_point_in_any_direction_and_takes_the_mean_of_two():
    points = [{"W": np.array(p, dtype=np.float32)} for p in ([0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 2.0])]
    np.testing.assert_allclose(geometric_median(points)["W"], [1.0, 1.0], atol=1e-6)  # symmetric: the centre
    for far in ([1e6, 0.0], [-1e6, -1e6], [0.0, -3e4]):
        moved = geometric_median(points[:3] + [{"W": np.array(far, dtype=np.float32)}])["W"]
        assert np.linalg.norm(moved - np.array([2 / 3, 2 / 3])) < 2.0, (far, moved)  # within the honest spread
    two = [points[1], points[2]]
    np.testing.assert_allclose(aggregate(two, [3.0, 1.0], method="geometric-median")["W"], [1.5, 0.5])  # the mean
    assert geometric_median(points)["W"].dtype == np.float32


def test_a_round_is_robust_only_by_a_robust_rule_of_3_or_more_replies_with_a_nonzero_median():
    assert not_robust("geometric-median", 3, 0.1) is None and not_robust("median", 4, 1.0) is None
    assert "bounds no direction" in not_robust("mean", 10, 1.0)
    assert not_robust("geometric-median", 2, 1.0).startswith("2 replies")
    assert "median update norm is 0" in not_robust("trimmed-mean", 5, 0.0)


def vec(*values) -> dict[str, np.ndarray]:
    return {"W": np.array(values, dtype=np.float32)}


DEFAULT = AggregationRule("geometric-median", median_clip=3.0, idle_floor=0.1)  # the config's defaults


def test_idle_clients_count_as_one_vote_at_their_weighted_mean():
    ref = vec(0.0, 0.0)
    replies = [vec(1.0, 0.0), vec(0.0, 1.0), vec(-1.0, 0.0), vec(0.0, 0.0), vec(0.01, 0.0)]
    votes = count_votes(replies, [1, 1, 1, 2, 6], ref, 0.1)
    assert votes.moving == [0, 1, 2] and votes.idle == [3, 4] and votes.bound == pytest.approx(0.1)  # 0.1 x median 1
    assert len(votes.adapters) == 4 and votes.adapters[:3] == replies[:3] and votes.weights == [1, 1, 1, 8]
    np.testing.assert_allclose(votes.adapters[3]["W"], [0.0075, 0.0], rtol=1e-6)  # (2 x 0 + 6 x 0.01) / 8
    every = count_votes(replies, [1, 1, 1, 2, 6], ref, 0.0)  # idle-floor 0: every reply its own vote
    assert every.idle == [] and every.adapters == replies and every.moving == [0, 1, 2, 3, 4]
    most_still = count_votes([vec(0.0, 0.0)] * 3 + [vec(3.0, 4.0)], [1] * 4, ref, 0.1)  # a median of 0
    assert most_still.idle == [0, 1, 2] and most_still.moving == [3] and most_still.bound == 0.0


def test_idle_clients_no_longer_freeze_the_geometric_median():
    ref = vec(0.0, 0.0)
    replies = [vec(0.0, 0.0), vec(0.0, 0.0), vec(1.0, 0.0), vec(0.0, 1.0)]
    old = combine(replies, [1] * 4, ref, AggregationRule("geometric-median", median_clip=3.0))
    np.testing.assert_allclose(old.adapter["W"], [0.0, 0.0], atol=1e-6)  # half the weight at 0: frozen
    new = combine(replies, [1] * 4, ref, DEFAULT)
    s = (6 - np.sqrt(12)) / 12  # the Fermat point of 0, e1, e2: 120 degrees between the pulls of e1 and e2
    np.testing.assert_allclose(new.adapter["W"], [s, s], atol=1e-5)
    assert new.votes.idle == [0, 1] and new.robust_reason is None and new.kept_reason is None


def test_idle_clients_below_the_robust_minimum_keep_the_global_unless_asked():
    ref = vec(0.0, 0.0)
    replies = [vec(0.0, 0.0), vec(0.0, 0.0), vec(0.0, 0.0), vec(300.0, 400.0)]
    kept = combine(replies, [1] * 4, ref, DEFAULT)
    assert kept.adapter is None and kept.robust_reason.startswith("2 votes (3 idle replies counted as one)")
    assert kept.kept_reason.startswith(kept.robust_reason) and "global adapter kept" in kept.kept_reason
    two = combine([vec(1.0, 0.0), vec(300.0, 400.0)], [1, 3], ref, DEFAULT)
    assert two.adapter is None and two.kept_reason.startswith("2 replies")
    applied = combine([vec(1.0, 0.0), vec(300.0, 400.0)], [1, 3], ref,
                      AggregationRule("geometric-median", median_clip=3.0, idle_floor=0.1, apply_below_minimum=True))
    np.testing.assert_allclose(applied.adapter["W"], [225.25, 300.0])  # their example-weighted mean
    assert applied.kept_reason is None and applied.robust_reason.startswith("2 replies")
    mean = combine([vec(1.0, 0.0), vec(300.0, 400.0)], [1, 3], ref, AggregationRule("mean"))
    assert mean.adapter is not None and "bounds no direction" in mean.robust_reason  # the mean claims nothing


def test_idle_clients_the_median_clip_is_taken_over_the_votes():
    ref = vec(0.0, 0.0)
    replies = [vec(0.0, 0.0), vec(0.0, 0.0), vec(1.0, 0.0), vec(0.0, -100.0)]
    out = combine(replies, [1] * 4, ref, DEFAULT)  # over the replies the median would be 0.5: 2 of 4 sent 0
    assert out.clip_median == pytest.approx(1.0) and out.clip_bound == pytest.approx(3.0)  # the median of 1, 100, 0
    assert out.clipped == {3: pytest.approx(100.0)}  # by reply index
    assert np.linalg.norm(out.adapter["W"]) < 1.0  # the 100 carries no further than the honest update


# --- drift ------------------------------------------------------------------------------------------------------


def test_mean_pairwise_l2_values():
    xs = [{"W": np.array([0.0, 0.0])}, {"W": np.array([3.0, 4.0])}, {"W": np.array([6.0, 8.0])}]
    assert mean_pairwise_l2(xs) == pytest.approx((5 + 10 + 5) / 3)
    assert mean_pairwise_l2(xs[:2]) == pytest.approx(5.0)
    assert mean_pairwise_l2(xs[:1]) == 0.0
    assert mean_pairwise_l2([]) == 0.0
    same = [{"W": np.ones(3)}, {"W": np.ones(3)}]
    assert mean_pairwise_l2(same) == 0.0


def test_mean_pairwise_l2_sums_over_all_tensors():
    xs = [{"A": np.array([0.0]), "B": np.array([0.0])}, {"A": np.array([3.0]), "B": np.array([4.0])}]
    assert mean_pairwise_l2(xs) == pytest.approx(5.0)


def test_dp_fedavg_clips_averages_equally_and_adds_calibrated_noise():
    import numpy as np

    from pubswap_flwr.algorithms.lora_averaging import AggregationError, aggregate

    reference = {"w": np.zeros(20000, dtype=np.float32)}
    big = {"w": np.full(20000, 10.0, dtype=np.float32)}  # update norm 1414, clipped to 1
    small = {"w": np.zeros(20000, dtype=np.float32)}
    out = aggregate([big, small], [100.0, 1.0], reference=reference, clip_norm=1.0, noise_multiplier=2.0,
                    rng=np.random.default_rng(0))
    clipped_mean = 0.5 * (10.0 / np.sqrt(20000 * 100.0))  # equal weights despite num-examples 100 vs 1
    noise = out["w"] - clipped_mean
    assert abs(float(noise.mean())) < 0.02
    assert float(noise.std()) == pytest.approx(2.0 * 1.0 / 2, rel=0.02)  # Flower's compute_stdv: z*C/n
    again = aggregate([big, small], [1.0, 1.0], reference=reference, clip_norm=1.0, noise_multiplier=2.0,
                      rng=np.random.default_rng(0))
    assert np.array_equal(out["w"], again["w"])  # seeded: a resumed run repeats it
    with pytest.raises(AggregationError, match="needs clip_norm > 0"):
        aggregate([big, small], [1.0, 1.0], reference=reference, noise_multiplier=1.0, rng=np.random.default_rng(0))


def _weiszfeld_over_coordinates(points: np.ndarray, w: np.ndarray, iterations: int = 200) -> np.ndarray:
    """Weiszfeld's iteration written out over every coordinate (what geometric_median computes in Gram form)."""
    z = w @ points
    for _ in range(iterations):
        beta = w / np.maximum(np.sqrt(((points - z) ** 2).sum(axis=1)), 1e-12)
        nxt = beta @ points / beta.sum()
        if np.sqrt(((nxt - z) ** 2).sum()) <= 1e-10 * max(1.0, np.sqrt((nxt ** 2).sum())):
            return nxt
        z = nxt
    return z


@pytest.mark.parametrize("n,spread,weighted", [(3, 1e-3, False), (5, 1e-2, True), (8, 1.0, False), (4, 1e-6, True)])
def test_geometric_median_equals_weiszfeld_over_the_coordinates(n, spread, weighted):
    rng = np.random.default_rng(n)
    base = rng.normal(size=(6, 50))
    adapters = [{"A": (base + spread * rng.normal(size=base.shape)).astype(np.float32),
                 "B": (2 * spread * rng.normal(size=7)).astype(np.float32)} for _ in range(n)]
    weights = rng.uniform(0.5, 3.0, size=n) if weighted else np.ones(n)
    got = geometric_median(adapters, list(weights) if weighted else None)
    points = np.stack([np.concatenate([a["A"].ravel(), a["B"].ravel()]).astype(np.float64) for a in adapters])
    scale = np.abs(points).max()
    want = _weiszfeld_over_coordinates(points / scale, weights / weights.sum()) * scale
    np.testing.assert_allclose(np.concatenate([got["A"].ravel(), got["B"].ravel()]), want, rtol=1e-6,
                               atol=1e-7 * spread)


def test_geometric_median_of_points_on_a_line_is_the_middle_one():
    points = [{"W": np.array([x, 2 * x], dtype=np.float32)} for x in (0.0, 1.0, 5.0)]
    np.testing.assert_allclose(geometric_median(points)["W"], [1.0, 2.0], atol=1e-6)  # the iterate reaches a point


def test_the_dp_noise_is_what_flowers_compute_stdv_gives():
    from flwr.supercore.differential_privacy import compute_stdv

    from pubswap_flwr.algorithms.lora_averaging import dp_noise_std

    for z, clip, n in ((2.0, 1.0, 2), (0.7, 0.05, 7), (1.0, 3.0, 100)):
        assert dp_noise_std(z, clip, n) == compute_stdv(z, clip, n)
