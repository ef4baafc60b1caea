"""A deliberately naive SAH kd-tree builder: the test oracle of the fast one.

Plain Python and NumPy, O(N^2) per node. It follows the build rules R1-R10 of
:mod:`cpu_reference` without events or sweeps: for every node and candidate
axis it takes every distinct triangle-box coordinate strictly inside the node
(R5) and counts ``N_L``, ``N_R`` and ``N_P`` over the node's triangles
directly (R6). It shares only the cost model (:mod:`kdtree_gpu.config`) and
the clipping code (:mod:`cpu_reference.clip`) with the fast builder, so that
an agreement between the two checks the sweep, the event order, the
classification and the event splicing. Use it on small meshes only.
"""

from __future__ import annotations

import numpy as np

from kdtree_gpu import encoding as enc
from kdtree_gpu.config import SAHConfig, box_half_area, leaf_cost, split_cost
from kdtree_gpu.mesh import prepare_mesh
from kdtree_gpu.tree import KdTree

from .clip import clip_child_box


def build(vertices, faces, config=None) -> KdTree:
    """Build a full-SAH kd-tree the slow, obvious way.

    Parameters
    ----------
    vertices : (num_vertices, 3) array_like of float
    faces : (num_triangles, 3) array_like of int
    config : SAHConfig, optional

    Returns
    -------
    KdTree
        With ``build_info["builder"] == "cpu_reference_naive"``.

    Raises
    ------
    kdtree_gpu.MeshError
        Bad input mesh.
    TypeError
        ``config`` is not an :class:`SAHConfig`.
    """
    if config is None:
        config = SAHConfig()
    if not isinstance(config, SAHConfig):
        raise TypeError(f"config must be a kdtree_gpu.SAHConfig or None, got {type(config).__name__}")
    V, F, tri_lo, tri_hi, valid, bounds = prepare_mesh(vertices, faces)
    tri_ids = np.nonzero(valid)[0].astype(np.int32)
    builder = _NaiveBuilder(V, F, config, config.resolved_max_depth(tri_ids.shape[0]))
    builder.add_node()
    builder.build_node(0, tri_ids, tri_lo[tri_ids].copy(), tri_hi[tri_ids].copy(),
                       bounds[0].copy(), bounds[1].copy(), 0)
    return KdTree(
        node_axis=builder.node_axis, node_split=builder.node_split,
        node_child=builder.node_child, node_count=builder.node_count,
        leaf_tris=np.array(builder.leaf_tris, dtype=np.int32), bounds=bounds,
        vertices=V, faces=F, config=config,
        num_degenerate=int(F.shape[0] - tri_ids.shape[0]),
        build_info={"builder": "cpu_reference_naive"},
    )


class _NaiveBuilder:
    def __init__(self, vertices, faces, config, max_depth):
        self.vertices = vertices
        self.faces = faces
        self.config = config
        self.max_depth = max_depth
        self.node_axis = []
        self.node_split = []
        self.node_child = []
        self.node_count = []
        self.leaf_tris = []

    def add_node(self):
        self.node_axis.append(enc.AXIS_LEAF)
        self.node_split.append(0.0)
        self.node_child.append(0)
        self.node_count.append(0)
        return len(self.node_axis) - 1

    def build_node(self, node, tris, box_lo, box_hi, node_lo, node_hi, depth):
        """Recursively build ``node`` over ``tris`` with boxes ``box_lo/box_hi`` (n, 3)."""
        cfg = self.config
        n = tris.shape[0]
        best = None
        if not (n <= cfg.leaf_size or depth >= self.max_depth):
            best = self.find_best_plane(box_lo, box_hi, node_lo, node_hi)
            if best is not None and not (best[0] < leaf_cost(cfg.k_intersect, n)):
                best = None
        if best is None:
            self.node_child[node] = len(self.leaf_tris)
            self.node_count[node] = n
            self.leaf_tris.extend(sorted(int(t) for t in tris))
            return
        _, axis, p, side = best
        left = self.add_node()
        self.add_node()
        self.node_axis[node] = axis
        self.node_split[node] = p
        self.node_child[node] = left

        # R9: classify by the box on the split axis
        a = box_lo[:, axis]
        b = box_hi[:, axis]
        planar_on = (a == b) & (a == p)
        go_left = np.where(planar_on, side == enc.SIDE_LEFT, a < p)
        go_right = np.where(planar_on, side == enc.SIDE_RIGHT, b > p)
        straddle = go_left & go_right

        for child, keep, lo_axis, hi_axis in ((left, go_left, node_lo[axis], p),
                                              (left + 1, go_right, p, node_hi[axis])):
            child_lo = node_lo.copy()
            child_hi = node_hi.copy()
            child_lo[axis] = lo_axis
            child_hi[axis] = hi_axis
            c_lo = box_lo[keep].copy()
            c_hi = box_hi[keep].copy()
            if cfg.clip:
                for i in np.nonzero(straddle[keep])[0]:
                    t = tris[keep][i]
                    out_lo = np.empty(3, dtype=np.float32)
                    out_hi = np.empty(3, dtype=np.float32)
                    v = self.vertices[self.faces[t]]
                    clip_child_box(v[0], v[1], v[2], c_lo[i].copy(), c_hi[i].copy(),
                                   child_lo, child_hi, out_lo, out_hi)
                    c_lo[i] = out_lo
                    c_hi[i] = out_hi
            self.build_node(child, tris[keep], c_lo, c_hi, child_lo, child_hi, depth + 1)

    def find_best_plane(self, box_lo, box_hi, node_lo, node_hi):
        """Return ``(cost, axis, position, side)`` of the best plane, or None (R5-R8)."""
        cfg = self.config
        ext = [float(node_hi[k]) - float(node_lo[k]) for k in range(3)]
        area_node = box_half_area(ext[0], ext[1], ext[2])
        axes = [0, 1, 2]
        if cfg.axes == "longest":
            axes = [int(np.argmax(ext))]  # argmax returns the first maximum
        best = None
        for k in axes:
            a = box_lo[:, k]
            b = box_hi[:, k]
            planar = a == b
            coords = np.unique(np.concatenate([a, b]))
            candidates = coords[(coords > node_lo[k]) & (coords < node_hi[k])]
            for p in candidates:
                n_left = int(np.count_nonzero(a < p))
                n_right = int(np.count_nonzero(~planar & (b > p)) + np.count_nonzero(planar & (a > p)))
                n_planar = int(np.count_nonzero(planar & (a == p)))
                side_ext = list(ext)
                side_ext[k] = float(p) - float(node_lo[k])
                area_left = box_half_area(*side_ext)
                side_ext[k] = float(node_hi[k]) - float(p)
                area_right = box_half_area(*side_ext)
                cost_left = split_cost(cfg.k_traversal, cfg.k_intersect, cfg.empty_bonus,
                                       area_left, area_right, area_node,
                                       n_left + n_planar, n_right)
                cost_right = split_cost(cfg.k_traversal, cfg.k_intersect, cfg.empty_bonus,
                                        area_left, area_right, area_node,
                                        n_left, n_right + n_planar)
                if cost_left <= cost_right:
                    cost, side = cost_left, enc.SIDE_LEFT
                else:
                    cost, side = cost_right, enc.SIDE_RIGHT
                if best is None or cost < best[0]:
                    best = (cost, k, np.float32(p), side)
        return best
