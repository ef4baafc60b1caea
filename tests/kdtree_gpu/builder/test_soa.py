"""The builder's structs (kdtree_gpu/builder/soa.py) as kernels receive them."""

from kdtree_gpu import SAHConfig
from kdtree_gpu.builder.soa import LoopSettings


def test_loop_settings_are_made_once_per_set_of_values():
    cfg = SAHConfig()
    first = LoopSettings.for_build(cfg, 30, 0, 1 << 23)
    assert LoopSettings.for_build(SAHConfig(), 30, 0, 1 << 23) is first
    assert LoopSettings.for_build(cfg, 31, 0, 1 << 23) is not first
    assert LoopSettings.for_build(SAHConfig(k_traversal=2.0), 30, 0, 1 << 23) is not first


def test_loop_settings_hold_the_config_values():
    cfg = SAHConfig(k_traversal=1.5, k_intersect=2.5, empty_bonus=0.25, leaf_size=3,
                    axes="longest")
    got = LoopSettings.for_build(cfg, 17, 64, 1000)
    want = LoopSettings(max_level_events=1000, max_depth=17, leaf_size=3, longest_only=1,
                        k_traversal=1.5, k_intersect=2.5, empty_bonus=0.25,
                        small_refs=64, clip_segment=0).struct()
    assert got.tobytes() == want.tobytes()
    clipped = LoopSettings.for_build(SAHConfig(clip=True), 17, 0, 1000, clip_segment=512)
    default = SAHConfig()
    want = LoopSettings(max_level_events=1000, max_depth=17, leaf_size=default.leaf_size,
                        longest_only=0, k_traversal=default.k_traversal,
                        k_intersect=default.k_intersect, empty_bonus=default.empty_bonus,
                        small_refs=0, clip_segment=512).struct()
    assert clipped.tobytes() == want.tobytes()
