"""The GPU builder's tree output (kdtree_gpu/builder/gpu/output.py), on NumPy.

TreeOutput allocates, slices and copies, so NumPy stands in for CuPy:
growth keeps what was written and nothing else, and the finished arrays are
views of small buffers (bounded slack) and copies of the others. Its one
kernel (kd_finish_nodes, the finished node arrays out of both pages) is
compared with its NumPy twin on a GPU.
"""

import numpy as np
import pytest

from kdtree_gpu.builder.gpu.output import VIEW_SLACK, TreeOutput, grown


def _fill(out, num_nodes, num_leaf_refs):
    for k, a in enumerate(out.nodes.args()):
        a[:num_nodes] = np.arange(num_nodes) + k
    out.leaf[:num_leaf_refs] = np.arange(num_leaf_refs) * 3


def test_growing_keeps_what_was_written():
    out = TreeOutput(np)
    assert out.node_capacity == 0 and out.leaf_capacity == 0
    out.reserve(10, 20, 0, 0)
    assert out.node_capacity >= 10 and out.leaf_capacity >= 20
    _fill(out, 7, 5)
    out.reserve(100, 300, 7, 5)
    assert out.node_capacity >= 100 and out.leaf_capacity >= 300
    for k, a in enumerate(out.nodes.args()):
        assert np.array_equal(a[:7], (np.arange(7) + k).astype(a.dtype))
    assert np.array_equal(out.leaf[:5], np.arange(5) * 3)


def test_a_reserve_within_capacity_changes_nothing():
    out = TreeOutput(np, 64, 64)
    before = [a for a in out.nodes.args()] + [out.leaf]
    out.reserve(64, 10, 3, 3)
    assert all(a is b for a, b in zip(before, [*out.nodes.args(), out.leaf]))


def test_growth_at_least_doubles():
    out = TreeOutput(np, 100, 100)
    out.reserve(101, 101)
    assert out.node_capacity == 200 and out.leaf_capacity == 200


def test_node_growth_starts_at_the_first_room_then_doubles():
    out = TreeOutput(np, first_nodes=1000)
    out.reserve(1, 1, 0, 0)
    assert out.node_capacity == 1000 and out.leaf_capacity == 1
    _fill(out, 1, 1)
    out.reserve(600, 1, 1, 1)  # (within the first room: nothing is made again)
    assert out.node_capacity == 1000
    out.reserve(1001, 1, 1, 1)
    assert out.node_capacity == 2000
    assert all(a[0] == k for k, a in enumerate(out.nodes.args()))
    assert out.reserve(5000, 1, exact=True) is None and out.node_capacity == 5000


def test_small_buffers_finish_as_views_and_large_ones_as_copies():
    out = TreeOutput(np, 1000, 1000)
    _fill(out, 990, 999)
    buffers = [*out.nodes.args(), out.leaf]
    arrays = out.finish(990, 999, keep_below=1 << 20)
    assert [a.shape for a in arrays.values()] == [(990,)] * 4 + [(999,)]
    assert all(np.shares_memory(a, b) for a, b in zip(arrays.values(), buffers))
    assert out.nodes is None and out.leaf is None  # the buffers are let go

    out = TreeOutput(np, 1000, 1000)
    _fill(out, 990, 999)
    buffers = [*out.nodes.args(), out.leaf]
    arrays = out.finish(990, 999)  # keep_below=0: every buffer may be workspace memory
    assert not any(np.shares_memory(a, b) for a, b in zip(arrays.values(), buffers))
    assert np.array_equal(arrays["leaf_tris"], np.arange(999) * 3)


def test_a_pooled_output_always_finishes_as_copies():
    # its buffers are the build's workspace, which goes back when the build ends
    out = TreeOutput(np, 100, 100)
    out.reserve(1000, 1000, 0, 0, pooled=True)
    assert out.pooled
    _fill(out, 990, 999)
    buffers = [*out.nodes.args(), out.leaf]
    arrays = out.finish(990, 999, keep_below=1 << 20)
    assert not any(np.shares_memory(a, b) for a, b in zip(arrays.values(), buffers))
    assert np.array_equal(arrays["node_child"], (np.arange(990) + 2).astype(np.int32))


def test_a_packed_leaf_list_is_handed_over_as_it_is():
    out = TreeOutput(np, 100, 100)
    out.reserve(1000, 1000, 0, 0, pooled=True)
    _fill(out, 990, 999)
    packed = np.arange(500, dtype=np.int32)
    out.set_final_leaf(packed)
    arrays = out.finish(990, 500)
    assert arrays["leaf_tris"] is packed
    assert arrays["node_count"].shape == (990,)


def test_a_view_never_holds_more_than_the_slack():
    rows = VIEW_SLACK // 13 + 1000  # 13 bytes per node: more than VIEW_SLACK unused bytes
    out = TreeOutput(np, rows, 16)
    block = out.leaf.base
    arrays = out.finish(999, 16, keep_below=1 << 30)
    # copies: the node arrays cut from one new block, the leaf list its own array
    assert not any(np.shares_memory(a, block) for a in arrays.values())
    assert len({a.base.ctypes.data for k, a in arrays.items() if k != "leaf_tris"}) == 1
    # within the slack: views of the one block
    out = TreeOutput(np, 2000, 16)
    block = out.leaf.base
    arrays = out.finish(1999, 16, keep_below=1 << 30)
    assert all(a.base is block for a in arrays.values())


def test_the_five_buffers_share_one_block_and_regrow_into_one():
    out = TreeOutput(np, 100, 50)
    assert len({a.base.ctypes.data for a in [*out.nodes.args(), out.leaf]}) == 1
    _fill(out, 90, 40)
    out.reserve(150, 40, 90, 40)  # only the nodes must grow: all five move
    assert out.node_capacity == 200 and out.leaf_capacity == 50
    assert len({a.base.ctypes.data for a in [*out.nodes.args(), out.leaf]}) == 1
    assert np.array_equal(out.leaf[:40], np.arange(40) * 3)
    assert out.block_bytes == 200 * 13 + 50 * 4
    out.reserve(201, 40, 90, 40, exact=True)
    assert out.node_capacity == 201


def test_a_grown_buffer_keeps_its_first_rows():
    records = np.arange(30, dtype=np.int32).reshape(10, 3)
    bigger = grown(np, records, 25, 4)
    assert bigger.shape == (25, 3) and bigger.dtype == np.int32
    assert np.array_equal(bigger[:4], records[:4])
    assert grown(np, records, 25, 0).shape == (25, 3)
    assert np.array_equal(grown(np, records, 25, 99)[:10], records)  # at most what there is


def test_a_second_page_adds_room_without_copying_the_first_block():
    # (NumPy stands in for CuPy: outside a build, pooled() changes nothing)
    from kdtree_gpu.builder.gpu.output import NO_PAGE

    out = TreeOutput(np, 10, 20)
    first = out.nodes.node_child
    out.nodes.node_child[:6] = np.arange(6)
    assert out.page_args()[4] == NO_PAGE and out.node_capacity == 10
    out.add_page(True, 6, 5)  # nodes 6.. in a page of 5 rows
    assert out.nodes.node_child is first and out.node_split == 6 and out.node_capacity == 11
    out.more_nodes.node_child[:3] = [100, 101, 102]
    out.add_page(True, 9, 2)  # full again at 9: the page made again, its 3 rows and 2 more
    assert out.more_nodes.size == 5 and out.node_capacity == 11
    assert out.more_nodes.node_child[:3].tolist() == [100, 101, 102]
    out.more_nodes.node_child[3:5] = [103, 104]
    out.add_page(False, 15, 7)
    assert out.leaf_capacity == 22 and out.leaf_split == 15
    assert [int(v) for v in out.page_args()[4:]] == [6, 15, 11, 22]
    out.set_final_leaf(np.arange(3, dtype=np.int32))
    assert out.leaf_split == NO_PAGE and out.leaf_capacity == 3
    arrays = out.finish(11, 3)
    assert arrays["node_child"].tolist() == [0, 1, 2, 3, 4, 5, 100, 101, 102, 103, 104]
    assert arrays["leaf_tris"].tolist() == [0, 1, 2]


def test_an_output_never_reserved_finishes_empty():
    # the buffers are made by the first reserve; without one, finish and the
    # kernel arguments see empty ones
    out = TreeOutput(np)
    assert out.node_capacity == 0 and out.leaf_capacity == 0
    assert out.nodes is None
    arrays = TreeOutput(np).finish(0, 0)
    assert set(arrays) == {"node_axis", "node_split", "node_child", "node_count", "leaf_tris"}
    assert all(a.shape == (0,) for a in arrays.values())


def test_extending_adds_pages_without_copying_the_first_block():
    # the subtree stage's first room: the levels' part of the tree stays where it is
    out = TreeOutput(np, 10, 20)
    first = [*out.nodes.args(), out.leaf]
    out.nodes.node_child[:6] = np.arange(6)
    out.leaf[:20] = np.arange(20)
    out.extend(8, 12)  # within the block: nothing is made
    assert out.more_nodes is None and out.more_leaf is None and not out.pooled
    out.extend(25, 30)
    assert all(a is b for a, b in zip(first, [*out.nodes.args(), out.leaf]))
    assert (out.node_split, out.leaf_split) == (10, 20)
    assert (out.node_capacity, out.leaf_capacity) == (25, 30) and out.pooled
    # the two pages share one block
    assert out.more_leaf.base is out.more_nodes.node_child.base
    out.nodes.node_child[6:10] = np.arange(6, 10)
    out.more_nodes.node_child[:3] = [10, 11, 12]
    out.more_leaf[:2] = [20, 21]
    arrays = out.finish(13, 22)
    assert arrays["node_child"].tolist() == list(range(13))
    assert arrays["leaf_tris"].tolist() == list(range(22))


def test_an_extended_output_that_stays_within_its_first_block_finishes_from_it():
    out = TreeOutput(np, 10, 20)
    out.nodes.node_child[:7] = np.arange(7)
    out.leaf[:5] = np.arange(5)
    out.extend(40, 40)
    arrays = out.finish(7, 5)
    assert arrays["node_child"].tolist() == list(range(7))
    assert arrays["leaf_tris"].tolist() == list(range(5))
    assert out.more_nodes is None and out.more_leaf is None


def test_a_page_made_again_keeps_nothing_for_a_level_that_began_in_the_first_block():
    out = TreeOutput(np, 10, 20)
    out.extend(15, 20)
    out.more_nodes.node_child[:5] = 7
    out.add_page(True, 8, 6)  # the level that found room full began at node 8
    assert out.node_split == 10 and out.more_nodes.size == 6 and out.node_capacity == 16


@pytest.mark.gpu
def test_the_finish_kernel_joins_the_pages_as_numpy_does():
    # kd_finish_nodes (CuPy) against the NumPy join of the same two pages
    import cupy as cp

    rng = np.random.default_rng(5)
    contents = None
    finished = []
    for xp in (np, cp):
        out = TreeOutput(xp, 300, 40)
        out.extend(700, 40)  # nodes 300.. in a second page
        pages = [*out.nodes.args(), *out.more_nodes.args()]
        if contents is None:
            contents = [rng.integers(-100, 100, a.shape).astype(a.dtype) for a in pages]
        for a, c in zip(pages, contents):
            a[...] = xp.asarray(c)
        out.leaf[:40] = xp.arange(40, dtype=out.leaf.dtype)
        arrays = out.finish(650, 40)
        finished.append({k: cp.asnumpy(a) if xp is cp else a for k, a in arrays.items()})
    host, device = finished
    for name in host:
        assert host[name].dtype == device[name].dtype
        assert np.array_equal(host[name], device[name]), name
    # node i >= 300 is row i - 300 of the second page (node_child: the 7th of the pages)
    assert np.array_equal(host["node_child"][300:], contents[6][:350])
    assert np.array_equal(host["node_child"][:300], contents[2])
