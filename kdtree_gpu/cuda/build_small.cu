// Small-node subtrees of the SAH kd-tree builder
// (kdtree_gpu/builder/gpu/small.py, build_small_subtrees).
//
// The level loop (build_loop.cu) defers every node it would split that holds
// at most small_refs <= KD_SMALL_MAX_REFS references: it writes the node as a
// leaf of its references and a record (tree node, level, leaf range, box).
// Here the deferred nodes' subtrees are built level by level, one warp per
// node and one launch per level, with the rules of the level stages
// (build_stages.cuh), so the tree is the one the level loop would have built,
// node for node (only the numbering differs). A level costs one launch, not
// the loop's dozen grid barriers and event passes.
//
// With at most 64 references a node's events need no sort. The run-head
// counts of kd_split_cost_event, for a plane p of an axis, are
//   N_L = opens before p        = #{t : lo_t <  p}
//   N_P = planars at p          = #{t : lo_t == hi_t == p}
//   N_R = N - closes up to p    = N - #{t : hi_t <= p}
// (an event is END at hi, START at lo, or PLANAR at lo == hi), counted by each
// lane for its own candidates over all the node's references. The candidates
// are the run heads: each distinct event position inside the node's box. The
// best plane is the minimum of (cost, axis, position), which is the level
// stages' choice: the lowest event index of an axis' minimum cost is its
// lowest position, and the lower axis wins ties.
#include "build_stages.cuh"

#define KD_SMALL_PER_LANE (KD_SMALL_MAX_REFS / 32)

__device__ __forceinline__ bool kd_small_better(double c, int axis, float p, double best_c,
                                                int best_axis, float best_p)
{
    return c < best_c || (c == best_c && (axis < best_axis || (axis == best_axis && p < best_p)));
}

// v[k] for a run-time k without an indexed (local-memory) load.
__device__ __forceinline__ float kd_pick3(const float* v, int k)
{
    return k == 0 ? v[0] : (k == 1 ? v[1] : v[2]);
}

struct KdSmallSplit {
    double cost;
    int axis;  // 3: no candidate plane
    float pos;
    int side;
};

// The run-head counts of this lane's candidates on one axis over the node's r
// references: candidate c is lo (c even) or hi (c odd) of reference c / 2 of
// the lane's NQ (lo_a, hi_a: the references' bounds on the axis, lane l
// holding references l + 32 q). n_lo_cl[c]: opens before p in the low 16 bits,
// closes up to p in the high ones (r <= 64); n_pl[c]: planars at p, counted
// only when some reference of the node is planar on the axis (PLANAR). The
// source loop runs over valid references only, and its body is a few
// instructions: it is the kernel's hot loop.
template <int NQ, bool PLANAR>
__device__ __forceinline__ void kd_small_count(const float* lo_a, const float* hi_a, int r,
                                               int* n_lo_cl, int* n_pl)
{
    const unsigned full = 0xffffffffu;
#pragma unroll
    for (int c = 0; c < 2 * NQ; ++c) n_lo_cl[c] = n_pl[c] = 0;
#pragma unroll
    for (int q = 0; q < NQ; ++q) {
        const int count = min(32, r - 32 * q);
        for (int src = 0; src < count; ++src) {
            const float t_lo = __shfl_sync(full, lo_a[q], src);
            const float t_hi = __shfl_sync(full, hi_a[q], src);
#pragma unroll
            for (int c = 0; c < 2 * NQ; ++c) {
                const float p = c & 1 ? hi_a[c >> 1] : lo_a[c >> 1];
                n_lo_cl[c] += (t_lo < p ? 1 : 0) + (t_hi <= p ? 0x10000 : 0);
                if (PLANAR) n_pl[c] += t_lo == t_hi && t_lo == p;
            }
        }
    }
}

// compute_split_costs and select_best_splits (R4-R8) for one node of r <= 64
// references, lane l holding references l and l + 32 (tri < 0: none). Every
// lane of the warp calls it and gets the node's best plane. The axis loop is
// not unrolled (the kernel's code must fit the instruction cache: with three
// copies of the counting loops its warps mostly waited for instructions);
// values of the axis are picked with selects, not indexed loads.
__device__ __forceinline__ KdSmallSplit kd_small_best_split(
    const int* tri, const float (*blo)[3], const float (*bhi)[3], int r, const float* nlo,
    const float* nhi, const KdLoopSettings& cfg)
{
    const unsigned full = 0xffffffffu;
    KdSmallSplit best = {__longlong_as_double((long long)KD_INF_BITS), 3, 0.0f, KD_SIDE_LEFT};
    double ext[3];
    for (int k = 0; k < 3; ++k) ext[k] = __dsub_rn((double)nhi[k], (double)nlo[k]);
    const double area = kd_half_area(ext[0], ext[1], ext[2]);
    const int longest = kd_longest_axis(nlo, nhi, 0);
    const bool two = r > 32;  // the same in every lane
#pragma unroll 1
    for (int axis = 0; axis < 3; ++axis) {
        if (cfg.longest_only && axis != longest) continue;
        float lo_a[KD_SMALL_PER_LANE], hi_a[KD_SMALL_PER_LANE];
        bool planar = false;
#pragma unroll
        for (int q = 0; q < KD_SMALL_PER_LANE; ++q) {
            lo_a[q] = kd_pick3(blo[q], axis);
            hi_a[q] = kd_pick3(bhi[q], axis);
            planar |= tri[q] >= 0 && lo_a[q] == hi_a[q];
        }
        planar = __any_sync(full, planar);
        int n_lo_cl[2 * KD_SMALL_PER_LANE], n_pl[2 * KD_SMALL_PER_LANE];
        if (two) {
            if (planar) kd_small_count<2, true>(lo_a, hi_a, r, n_lo_cl, n_pl);
            else kd_small_count<2, false>(lo_a, hi_a, r, n_lo_cl, n_pl);
        } else {
            if (planar) kd_small_count<1, true>(lo_a, hi_a, r, n_lo_cl, n_pl);
            else kd_small_count<1, false>(lo_a, hi_a, r, n_lo_cl, n_pl);
            n_lo_cl[2] = n_lo_cl[3] = n_pl[2] = n_pl[3] = 0;
        }
        const float lo_k = kd_pick3(nlo, axis), hi_k = kd_pick3(nhi, axis);
#pragma unroll
        for (int c = 0; c < 2 * KD_SMALL_PER_LANE; ++c) {
            const int q = c >> 1;
            if (tri[q] < 0) continue;
            const float p = c & 1 ? hi_a[q] : lo_a[q];
            if ((c & 1) && p == lo_a[q]) continue;  // planar: one event
            if (!(p > lo_k && p < hi_k)) continue;
            const long long n_left = n_lo_cl[c] & 0xffff, n_planar = n_pl[c];
            const long long n_right = (long long)r - (n_lo_cl[c] >> 16);
            int side;
            const double cost = kd_plane_cost(ext, area, axis, lo_k, hi_k, p, n_left, n_planar,
                                              n_right, cfg.k_traversal, cfg.k_intersect,
                                              cfg.empty_bonus, &side);
            if ((unsigned long long)__double_as_longlong(cost) == KD_INF_BITS) continue;
            if (kd_small_better(cost, axis, p, best.cost, best.axis, best.pos))
                best = {cost, axis, p, side};
        }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        KdSmallSplit other = {__shfl_xor_sync(full, best.cost, offset),
                              __shfl_xor_sync(full, best.axis, offset),
                              __shfl_xor_sync(full, best.pos, offset),
                              __shfl_xor_sync(full, best.side, offset)};
        if (kd_small_better(other.cost, other.axis, other.pos, best.cost, best.axis, best.pos))
            best = other;
    }
    return best;
}

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

// One level of the small nodes' subtrees, one warp per node: the nodes of
// every deferred subtree at the same distance below its root (their depths
// differ). A node is a record of KD_SMALL_RECORD int32 (small_record.cuh:
// tree node, depth, start and count of its references in `in_refs`, box): the
// deferred nodes' records with their level-loop leaves in leaf_tris first
// (level 0), then the children this kernel writes to `out_rec`/`out_refs`
// (ping-pong buffers). counters (encoding.SMALL_*) holds the run's counters and a row
// per level: level L reads its number of records from row L, takes rows for
// its children's records and references from row L + 1, and counts the tree
// nodes and leaf entries it takes in row L, placed after those of the levels
// before it. The host launches it once per possible level with no read in
// between: a level without nodes returns at once. When a buffer would
// overflow, its bit (KD_SMALL_FULL_*) is set in counters[KD_SMALL_OVERFLOW]
// and the level in counters[KD_SMALL_FULL_LEVEL], every later launch
// returns, and the host makes room and runs the levels again from that one
// (the levels before it are done, and its input is only read).
extern "C" __global__ void __launch_bounds__(KD_SMALL_BLOCK)
kd_build_small_level(const float* __restrict__ tri_lo, const float* __restrict__ tri_hi,
                     const int* __restrict__ in_rec, const int* __restrict__ in_refs, int level,
                     unsigned long long* counters, int* __restrict__ out_rec,
                     int* __restrict__ out_refs, long long rec_capacity, long long ref_capacity,
                     KdTreeNodes out, int* leaf_tris, KdTreeNodes out_more, int* leaf_more,
                     long long node_split, long long leaf_split, long long node_capacity,
                     long long leaf_capacity, KdLoopSettings cfg)
{
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const unsigned lanes_below = (1u << lane) - 1u;
    const long long num_warps = (long long)gridDim.x * (blockDim.x >> 5);
    const bool roots = level == 0;
    const KdSmallTree tree = {out, out_more, leaf_tris, leaf_more, node_split, leaf_split};
    unsigned long long* row = counters + KD_SMALL_COUNTERS + (long long)KD_SMALL_LEVEL_ROW * level;
    unsigned long long* next = row + KD_SMALL_LEVEL_ROW;
    // the tree nodes and leaf entries taken before this level
    __shared__ unsigned long long before[2];
    __shared__ int stop;
    if (threadIdx.x == 0) {
        stop = *(volatile unsigned long long*)(counters + KD_SMALL_OVERFLOW) != 0;
        before[0] = counters[KD_SMALL_NODES];
        before[1] = counters[KD_SMALL_LEAVES];
    }
    __syncthreads();
    for (int j = threadIdx.x; j < level && !stop; j += blockDim.x) {
        const unsigned long long* r = counters + KD_SMALL_COUNTERS + KD_SMALL_LEVEL_ROW * j;
        atomicAdd(&before[0], r[KD_SMALL_LEVEL_NODES]);
        atomicAdd(&before[1], r[KD_SMALL_LEVEL_LEAVES]);
    }
    __syncthreads();
    if (stop) return;
    const unsigned long long nodes_before = before[0], leaves_before = before[1];
    const long long num_nodes = (long long)row[KD_SMALL_LEVEL_RECORDS];
    for (long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < num_nodes;
         w += num_warps) {
        const KdSmallRecord rec = kd_small_read_record(in_rec + w * KD_SMALL_RECORD);
        const int node = rec.node, depth = rec.depth, start = rec.start, r = rec.count;
        const float* nlo = rec.lo;
        const float* nhi = rec.hi;
        int tri[KD_SMALL_PER_LANE];
        float blo[KD_SMALL_PER_LANE][3], bhi[KD_SMALL_PER_LANE][3];
        for (int q = 0; q < KD_SMALL_PER_LANE; ++q) {
            int j = lane + 32 * q;
            tri[q] = j < r ? in_refs[start + j] : -1;
            for (int k = 0; k < 3; ++k) {
                blo[q][k] = tri[q] >= 0 ? tri_lo[3 * tri[q] + k] : 0.0f;
                bhi[q][k] = tri[q] >= 0 ? tri_hi[3 * tri[q] + k] : 0.0f;
            }
        }
        KdSmallSplit best = {0.0, 3, 0.0f, KD_SIDE_LEFT};
        if (depth < cfg.max_depth && r > cfg.leaf_size)
            best = kd_small_best_split(tri, blo, bhi, r, nlo, nhi, cfg);
        const bool split = best.axis < 3 && best.cost < __dmul_rn(cfg.k_intersect, (double)r);
        // a root's level-loop leaf is replaced: its entries become unused
        if (lane == 0 && roots) atomicAdd(counters + KD_SMALL_HOLES, (unsigned long long)r);
        if (!split) {
            unsigned long long first = 0;
            if (lane == 0)
                first = leaves_before + atomicAdd(row + KD_SMALL_LEVEL_LEAVES,
                                                  (unsigned long long)r);
            first = __shfl_sync(full, first, 0);
            if (first + r > (unsigned long long)leaf_capacity) {
                if (lane == 0) {
                    atomicOr(counters + KD_SMALL_OVERFLOW, KD_SMALL_FULL_LEAVES);
                    atomicMin(counters + KD_SMALL_FULL_LEVEL, (unsigned long long)level);
                }
                continue;  // (warp-uniform: the level's other nodes still count their needs)
            }
            for (int q = 0; q < KD_SMALL_PER_LANE; ++q)
                if (tri[q] >= 0) *tree.leaf(first + lane + 32 * q) = tri[q];
            if (lane == 0) {
                tree.set_node(node, KD_AXIS_LEAF, 0.0f, (int)first, r);
                atomicMax(counters + KD_SMALL_DEPTH, (unsigned long long)depth);
            }
            continue;
        }
        // classify_triangles (R9)
        unsigned cls[KD_SMALL_PER_LANE];
        int num_left = 0, num_right = 0;
        for (int q = 0; q < KD_SMALL_PER_LANE; ++q) {
            cls[q] = 0;
            if (tri[q] >= 0) {
                float a = kd_pick3(blo[q], best.axis), b = kd_pick3(bhi[q], best.axis);
                if (a == b && a == best.pos)
                    cls[q] = best.side == KD_SIDE_LEFT ? KD_CLASS_LEFT : KD_CLASS_RIGHT;
                else if (a >= best.pos) cls[q] = KD_CLASS_RIGHT;
                else if (b <= best.pos) cls[q] = KD_CLASS_LEFT;
                else cls[q] = KD_CLASS_BOTH;
            }
            num_left += __popc(__ballot_sync(full, cls[q] & KD_CLASS_LEFT));
            num_right += __popc(__ballot_sync(full, cls[q] & KD_CLASS_RIGHT));
        }
        // make_child_nodes: left hi[axis] = p, right lo[axis] = p; children
        // without references are leaves now, the others the next level's nodes
        const int live = (num_left > 0) + (num_right > 0);
        unsigned long long child = 0, slot = 0, first = 0;
        if (lane == 0) {
            child = nodes_before + atomicAdd(row + KD_SMALL_LEVEL_NODES, 2ull);
            if (live) {
                slot = atomicAdd(next + KD_SMALL_LEVEL_RECORDS, (unsigned long long)live);
                first = atomicAdd(next + KD_SMALL_LEVEL_REFS,
                                  (unsigned long long)(num_left + num_right));
            }
        }
        child = __shfl_sync(full, child, 0);
        slot = __shfl_sync(full, slot, 0);
        first = __shfl_sync(full, first, 0);
        const unsigned long long full_bits =
            (child + 2 > (unsigned long long)node_capacity ? KD_SMALL_FULL_NODES : 0ull)
            | (slot + live > (unsigned long long)rec_capacity ? KD_SMALL_FULL_RECORDS : 0ull)
            | (first + num_left + num_right > (unsigned long long)ref_capacity
                   ? KD_SMALL_FULL_REFS : 0ull);
        if (full_bits) {
            if (lane == 0) {
                atomicOr(counters + KD_SMALL_OVERFLOW, full_bits);
                atomicMin(counters + KD_SMALL_FULL_LEVEL, (unsigned long long)level);
            }
            continue;
        }
        int l = 0, rr = 0;
        for (int q = 0; q < KD_SMALL_PER_LANE; ++q) {
            unsigned to_left = __ballot_sync(full, cls[q] & KD_CLASS_LEFT);
            unsigned to_right = __ballot_sync(full, cls[q] & KD_CLASS_RIGHT);
            if (cls[q] & KD_CLASS_LEFT) out_refs[first + l + __popc(to_left & lanes_below)] = tri[q];
            if (cls[q] & KD_CLASS_RIGHT)
                out_refs[first + num_left + rr + __popc(to_right & lanes_below)] = tri[q];
            l += __popc(to_left);
            rr += __popc(to_right);
        }
        if (lane == 0) {
            tree.set_node(node, best.axis, best.pos, (int)child, 0);
            float hi_l[3] = {nhi[0], nhi[1], nhi[2]};
            float lo_r[3] = {nlo[0], nlo[1], nlo[2]};
            hi_l[best.axis] = best.pos;
            lo_r[best.axis] = best.pos;
            int counts[2] = {num_left, num_right};
            for (int side = 0; side < 2; ++side) {
                int c = (int)child + side;
                if (counts[side] == 0) {
                    tree.set_node(c, KD_AXIS_LEAF, 0.0f, 0, 0);  // (child: set when packed)
                    atomicMax(counters + KD_SMALL_DEPTH, (unsigned long long)(depth + 1));
                } else {
                    kd_small_write_record(out_rec + (slot++) * KD_SMALL_RECORD, c, depth + 1,
                                          first + (side ? num_left : 0), counts[side],
                                          side ? lo_r : nlo, side ? nhi : hi_l);
                }
            }
        }
    }
}

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
