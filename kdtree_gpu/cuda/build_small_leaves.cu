// The subtree stage's last step (kdtree_gpu/builder/gpu/small.py,
// pack_leaves): every leaf's triangles, in the tree's one or two pages, packed
// into one list in node order. A module of its own: builds that run the
// subtree levels in one cooperative launch (build_small_grid.cu) need these
// two kernels and nothing else of build_small.cu, which takes a machine's
// first build about 2 s to compile (H200, NVRTC).
#include "small_level.cuh"

// Leaf sizes for the scan that packs leaf_tris: counts[i + 1] = node i's
// triangles if it is a leaf, else 0, after a leading 0 (nodes in the pages
// of KdSmallTree).
extern "C" __global__ void kd_leaf_counts(KdTreeNodes lo, KdTreeNodes hi, long long node_split,
                                          long long num_nodes, long long* __restrict__ counts)
{
    const KdSmallTree tree = {lo, hi, nullptr, nullptr, node_split, 0};
    long long i = kd_tid();
    if (i == 0) counts[0] = 0;
    if (i < num_nodes) {
        const KdTreeNodes& t = tree.page(i);
        const long long k = tree.page_index(i);
        counts[i + 1] = t.node_axis[k] == KD_AXIS_LEAF ? t.node_count[k] : 0;
    }
}

// Copy every leaf's triangles to its packed offset (the scan of kd_leaf_counts)
// and point the leaf there: the deferred nodes' level-loop leaves, replaced by
// their subtrees, leave no unused entries behind.
extern "C" __global__ void kd_pack_leaves(KdTreeNodes lo, KdTreeNodes hi, long long node_split,
                                          long long num_nodes,
                                          const long long* __restrict__ offsets, int* leaf_lo,
                                          int* leaf_hi, long long leaf_split,
                                          int* __restrict__ leaf_out)
{
    const KdSmallTree tree = {lo, hi, leaf_lo, leaf_hi, node_split, leaf_split};
    long long i = kd_tid();
    if (i >= num_nodes) return;
    const KdTreeNodes& t = tree.page(i);
    const long long k = tree.page_index(i);
    if (t.node_axis[k] != KD_AXIS_LEAF) return;
    long long src = t.node_child[k], dst = offsets[i];
    for (int j = 0; j < t.node_count[k]; ++j) leaf_out[dst + j] = *tree.leaf(src + j);
    t.node_child[k] = (int)dst;
}
