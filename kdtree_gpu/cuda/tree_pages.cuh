// The tree output's one or two pages as kernels see them
// (kdtree_gpu/builder/gpu/output.py, TreeOutput): written by the subtree
// levels (small_level.cuh), packed by the leaf packing
// (build_small_leaves.cu) and copied out by kd_finish_nodes (build.cu).
#pragma once

// The tree as the subtree levels write it: node i below node_split in `lo`,
// the others in `hi` at i - node_split (a second page, made when the first
// was full: the first is not copied into a larger one); the same for the
// leaf list. Without a second page the splits are past every index.
struct KdSmallTree {
    KdTreeNodes lo, hi;
    int* leaf_lo;
    int* leaf_hi;
    long long node_split, leaf_split;

    __device__ __forceinline__ void set_node(long long i, int axis, float split, int child,
                                             int count) const
    {
        const KdTreeNodes& t = page(i);
        const long long k = page_index(i);
        t.node_axis[k] = (signed char)axis;
        t.node_split[k] = split;
        t.node_child[k] = child;
        t.node_count[k] = count;
    }
    __device__ __forceinline__ long long page_index(long long i) const
    {
        return i < node_split ? i : i - node_split;
    }
    __device__ __forceinline__ const KdTreeNodes& page(long long i) const
    {
        return i < node_split ? lo : hi;
    }
    __device__ __forceinline__ int* leaf(long long i) const
    {
        return i < leaf_split ? leaf_lo + i : leaf_hi + (i - leaf_split);
    }
};
