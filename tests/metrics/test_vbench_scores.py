"""VBench Total/Quality/Semantic and clip regrouping against hand-computed examples."""

import math

import pytest

from jbkv_cli.metrics.vbench_scores import (
    DIMENSIONS,
    DimensionScore,
    clip_index,
    compute_totals,
    parse_dimension,
    regroup_clips,
    standard_error,
    totals_from_dimensions,
    video_id,
)

# Raw scores chosen so each normalized fraction f_d = (s − Min)/(Max − Min) is a round number.
FULL = {
    "subject_consistency": 1.0,  # f = 1
    "background_consistency": 0.2615,  # f = 0
    "temporal_flickering": 0.81465,  # f = 0.5
    "motion_smoothness": 0.9975,  # f = 1
    "dynamic_degree": 0.4,  # f = 0.4, weight 0.5 -> 0.2
    "aesthetic_quality": 0.6,
    "imaging_quality": 0.3,
    "object_class": 0.9,
    "multiple_objects": 0.5,
    "human_action": 0.8,
    "color": 0.7,
    "spatial_relationship": 0.4,
    "scene": 0.4111,  # f = 0.5
    "appearance_style": 0.1432,  # f = 0.5
    "temporal_style": 0.182,  # f = 0.5
    "overall_consistency": 0.0728,  # f = 0.2
}


def test_full_total_by_hand():
    t = compute_totals(FULL)
    quality = (1 + 0 + 0.5 + 1 + 0.2 + 0.6 + 0.3) / 6.5
    semantic = (0.9 + 0.5 + 0.8 + 0.7 + 0.4 + 0.5 + 0.5 + 0.5 + 0.2) / 9
    assert t.quality == pytest.approx(quality, abs=1e-12)
    assert t.semantic == pytest.approx(semantic, abs=1e-12)
    assert t.total == pytest.approx((4 * quality + semantic) / 5, abs=1e-12)
    assert t.total == pytest.approx(0.5541880341880342, abs=1e-12)
    assert not t.partial and t.missing == []


def test_extremes():
    from jbkv_cli.metrics.vbench_scores import NORMALIZE

    assert compute_totals({d: hi for d, (_, hi) in NORMALIZE.items()}).total == pytest.approx(1.0)
    assert compute_totals({d: lo for d, (lo, _) in NORMALIZE.items()}).total == pytest.approx(0.0)


def test_partial_is_marked_never_zero_filled():
    t = compute_totals({"subject_consistency": 1.0, "dynamic_degree": 0.4})
    assert t.quality == pytest.approx((1 + 0.2) / 1.5)
    assert t.semantic is None and t.total is None
    assert t.partial
    assert t.missing == [
        d for d in DIMENSIONS if d not in ("subject_consistency", "dynamic_degree")
    ]

    t = compute_totals({"subject_consistency": 1.0, "object_class": 0.9, "unknown": 5.0})
    assert (t.quality, t.semantic) == (pytest.approx(1.0), pytest.approx(0.9))
    assert t.total == pytest.approx((4 * 1.0 + 0.9) / 5)
    assert t.partial and len(t.missing) == 14
    # upstream would have zero-filled: a much lower total
    assert t.to_json()["partial"] is True


def test_standard_errors_delta_method():
    assert standard_error([0.90, 0.94, 0.98]) == pytest.approx(0.04 / math.sqrt(3))
    assert standard_error([0.5]) is None
    t = compute_totals(
        {"subject_consistency": 0.9, "object_class": 0.5},
        {"subject_consistency": 0.01, "object_class": 0.02},
    )
    se_q = 0.01 / (1.0 - 0.1462)
    se_s = 0.02
    assert t.quality_se == pytest.approx(se_q)
    assert t.semantic_se == pytest.approx(se_s)
    assert t.total_se == pytest.approx(math.hypot(0.8 * se_q, 0.2 * se_s))
    assert (
        compute_totals({"subject_consistency": 0.9}, {"subject_consistency": None}).quality_se
        is None
    )


def test_video_id_from_clip_paths():
    assert video_id("/w/videos/split_clip/a cat-0/a cat-0_003.mp4") == "a cat-0"
    # the odd per-clip key VBench-Long's reorganize step produces
    assert video_id("/w/videos/split_clip/a cat-1/a cat-1_000.mp4/a cat-1.mp4") == "a cat-1"
    assert video_id("/w/x/filtered_videos/filtered_clips/a dog-2_001.mp4") == "a dog-2"
    assert video_id("/w/videos/a dog-2.mp4") == "a dog-2"
    assert video_id("/w/videos/split_clip/short-0/short-0_full.mp4") == "short-0"


def test_parse_long_result_regroups_clips_per_video():
    clip = "/w/videos/split_clip/{v}/{v}_{i:03d}.mp4"
    detailed = [
        {"video_path": clip.format(v="a-0", i=0), "video_results": 0.9},
        {"video_path": clip.format(v="a-0", i=1), "video_results": 0.8},
        {"video_path": clip.format(v="b-0", i=0), "video_results": 0.6},
        {"video_path": clip.format(v="b-0", i=1), "video_results": 0.7},
    ]
    raw = [0.75, detailed, [{"video_path": "x", "video_results": 0.9}, {"long_video_cnt": 4}]]
    s = parse_dimension("temporal_flickering", raw)
    assert s.score == 0.75 and s.n_clips == 4
    assert s.per_video == {"a-0": pytest.approx(0.85), "b-0": pytest.approx(0.65)}
    assert s.se == pytest.approx(standard_error([0.85, 0.65]))


def test_clip_index_and_clips_in_time_order():
    assert clip_index("/w/videos/split_clip/a cat-0/a cat-0_003.mp4") == 3
    assert clip_index("/w/videos/split_clip/a cat-1/a cat-1_012.mp4/a cat-1.mp4") == 12
    assert clip_index("/w/x/filtered_videos/filtered_clips/a dog-2_001.mp4") == 1
    assert clip_index("/w/videos/split_clip/short-0/short-0_full.mp4") == 0
    assert clip_index("/w/videos/a dog-2.mp4") == 0  # short mode: the video is its one clip
    clip = "/w/videos/split_clip/{v}/{v}_{i:03d}.mp4"
    detailed = [  # listed out of order, a clip twice, a hole at b-0's clip 1
        {"video_path": clip.format(v="a-0", i=2), "video_results": 0.7},
        {"video_path": clip.format(v="a-0", i=0), "video_results": 0.9},
        {"video_path": clip.format(v="a-0", i=1), "video_results": 0.8},
        {"video_path": clip.format(v="a-0", i=1), "video_results": 0.6},
        {"video_path": clip.format(v="b-0", i=2), "video_results": 50.0},
        {"video_path": clip.format(v="b-0", i=0), "video_results": 40.0},
    ]
    assert regroup_clips(detailed) == {
        "a-0": [0.9, pytest.approx(0.7), 0.7],
        "b-0": [40.0, None, 50.0],
    }
    s = parse_dimension("imaging_quality", [0.5, detailed[4:]])
    assert s.per_clip == {"b-0": [pytest.approx(0.4), None, pytest.approx(0.5)]}
    assert s.to_json()["per_clip"] == s.per_clip


def test_imaging_quality_detail_rescaled_and_booleans():
    s = parse_dimension(
        "imaging_quality",
        [0.55, [{"video_path": "/v/split_clip/a-0/a-0_000.mp4", "video_results": 55.0}]],
    )
    assert s.per_video == {"a-0": pytest.approx(0.55)}
    s = parse_dimension(
        "dynamic_degree",
        [
            0.5,
            [
                {"video_path": "/v/split_clip/a-0/a-0_000.mp4", "video_results": True},
                {"video_path": "/v/split_clip/a-0/a-0_001.mp4", "video_results": False},
            ],
        ],
    )
    assert s.per_video == {"a-0": 0.5}
    with pytest.raises(ValueError):
        parse_dimension("color", {"not": "a list"})


def test_totals_from_dimensions():
    dims = {
        "subject_consistency": DimensionScore("subject_consistency", 0.9, {"a": 0.9, "b": 0.92}),
    }
    t = totals_from_dimensions(dims)
    assert t.quality == pytest.approx((0.9 - 0.1462) / (1 - 0.1462))
    assert t.quality_se == pytest.approx(standard_error([0.9, 0.92]) / (1 - 0.1462))
