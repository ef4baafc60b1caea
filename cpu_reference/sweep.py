"""The SAH sweep over a node's sorted events (rules R5-R8, Wald & Havran §4.1).

One pass per candidate axis over the node's events counts, at each distinct
position ``p``, the triangles ending at ``p`` (``p-``), lying on it (``p|``)
and starting at it (``p+``), which gives ``N_L``, ``N_R`` and ``N_P`` of
every candidate plane without looking at a triangle twice.
"""

from __future__ import annotations

import numba
import numpy as np

from kdtree_gpu import config as cfg
from kdtree_gpu import encoding as enc

# The cost model is written once (kdtree_gpu.config); compile it, do not retype it.
split_cost = numba.njit(cache=True)(cfg.split_cost)
leaf_cost = numba.njit(cache=True)(cfg.leaf_cost)
box_half_area = numba.njit(cache=True)(cfg.box_half_area)


@numba.njit(cache=True)
def find_best_plane(pool_pos, pool_kind, seg_start, seg_count, num_tris, node_lo, node_hi,
                    k_traversal, k_intersect, empty_bonus, longest_only):
    """Sweep the node's events and return the best plane (rules R5-R8).

    Parameters
    ----------
    pool_pos : (3, capacity) float32
    pool_kind : (3, capacity) int8
        Event pools; the node's events on axis k are
        ``[seg_start[k], seg_start[k] + seg_count[k])``.
    seg_start, seg_count : (3,) int64
    num_tris : int
        Triangles in the node, N.
    node_lo, node_hi : (3,) float32
        The node's box.

    Returns
    -------
    best_cost : float
        ``inf`` when there is no candidate plane.
    best_axis : int
    best_pos : float32
    best_side : int
        ``SIDE_LEFT`` or ``SIDE_RIGHT``: where planar triangles on the plane go.
    """
    # scalars, not small arrays: this runs once per node and must not allocate
    ext0 = np.float64(node_hi[0]) - np.float64(node_lo[0])
    ext1 = np.float64(node_hi[1]) - np.float64(node_lo[1])
    ext2 = np.float64(node_hi[2]) - np.float64(node_lo[2])
    area_node = box_half_area(ext0, ext1, ext2)
    axis_first = 0
    axis_last = 2
    if longest_only:
        longest = 0
        if ext1 > ext0:
            longest = 1
        if ext2 > (ext1 if longest == 1 else ext0):
            longest = 2
        axis_first = longest
        axis_last = longest
    best_cost = np.inf
    best_axis = -1
    best_pos = np.float32(0.0)
    best_side = enc.SIDE_LEFT
    for k in range(axis_first, axis_last + 1):
        lo_k = node_lo[k]
        hi_k = node_hi[k]
        if not lo_k < hi_k:
            continue
        n_left = 0
        n_right = num_tris
        i = seg_start[k]
        end = i + seg_count[k]
        pos = pool_pos[k]
        kind = pool_kind[k]
        while i < end:
            p = pos[i]
            n_end = 0
            n_planar = 0
            n_start = 0
            while i < end and pos[i] == p and kind[i] == enc.EVENT_END:
                n_end += 1
                i += 1
            while i < end and pos[i] == p and kind[i] == enc.EVENT_PLANAR:
                n_planar += 1
                i += 1
            while i < end and pos[i] == p and kind[i] == enc.EVENT_START:
                n_start += 1
                i += 1
            # move the plane onto p: triangles ending at p or lying on it leave the right side
            n_right -= n_end + n_planar
            if lo_k < p and p < hi_k:
                d_left = np.float64(p) - np.float64(lo_k)
                d_right = np.float64(hi_k) - np.float64(p)
                if k == 0:
                    area_left = box_half_area(d_left, ext1, ext2)
                    area_right = box_half_area(d_right, ext1, ext2)
                elif k == 1:
                    area_left = box_half_area(ext0, d_left, ext2)
                    area_right = box_half_area(ext0, d_right, ext2)
                else:
                    area_left = box_half_area(ext0, ext1, d_left)
                    area_right = box_half_area(ext0, ext1, d_right)
                # planar triangles on the plane: try them on each side (Wald & Havran §4.1)
                cost_left = split_cost(k_traversal, k_intersect, empty_bonus, area_left,
                                       area_right, area_node, n_left + n_planar, n_right)
                cost_right = split_cost(k_traversal, k_intersect, empty_bonus, area_left,
                                        area_right, area_node, n_left, n_right + n_planar)
                if cost_left <= cost_right:
                    cost = cost_left
                    side = enc.SIDE_LEFT
                else:
                    cost = cost_right
                    side = enc.SIDE_RIGHT
                # strict '<': ties keep the lower axis, then the lower position
                if cost < best_cost:
                    best_cost = cost
                    best_axis = k
                    best_pos = p
                    best_side = side
            n_left += n_start + n_planar
    return best_cost, best_axis, best_pos, best_side
