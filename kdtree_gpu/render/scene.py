"""The scene on the render backend: per-triangle records, materials, light tables, camera.

Next-event estimation picks a light triangle with probability proportional
to its power (``luminance(Le) * area``) from an alias table (Vose's method)
and a point uniformly on it; :func:`light_tables` makes the tables and
:func:`upload_scene` puts everything the kernels read on the backend, as
16-byte records.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..scenes import Scene

# Rec. 709 luminance weights: the light-selection power of an RGB emitter.
LUMINANCE_WEIGHTS = np.array([0.2126, 0.7152, 0.0722], dtype=np.float64)

# Ray origins are pushed off the surface by this fraction of the hit point's
# largest coordinate (about 130 float32 ulps), see stages.offset_origin.
DEFAULT_RAY_EPSILON = 2e-5


@dataclasses.dataclass
class DeviceScene:
    """Scene arrays on the render backend (16-byte records for the kernels).

    Attributes
    ----------
    tri_vertex : (num_triangles, 3, 4) float32
    tri_normal : (num_triangles, 4) float32
        Unit geometric normal and area.
    tri_material : (num_triangles,) int32
    material_albedo, material_emission : (num_materials, 4) float32
        RGB padded to 4.
    light_tri : (num_lights,) int32
    light_alias_prob : (num_lights,) float32
    light_alias_index : (num_lights,) int32
    tri_light_pmf : (num_triangles,) float32
    camera_frame : (4, 3) float32
        See :meth:`kdtree_gpu.scenes.Camera.frame`.
    background : tuple of 3 float
    ray_epsilon : float
        Secondary ray origins move off the surface along the normal by
        ``ray_epsilon * max(max |coordinate of the point|, min_scale)``.
    min_scale : float
        One hundredth of the scene diagonal: the floor of that scale near the
        coordinate origin.
    two_sided : int
        1 when both faces of an emitter emit, 0 for the front face only.
    """

    tri_vertex: object
    tri_normal: object
    tri_material: object
    material_albedo: object
    material_emission: object
    light_tri: object
    light_alias_prob: object
    light_alias_index: object
    tri_light_pmf: object
    camera_frame: object
    background: tuple
    ray_epsilon: float
    min_scale: float
    two_sided: int

    @property
    def num_lights(self) -> int:
        return int(self.light_tri.shape[0])


def upload_scene(xp, scene: Scene, width: int, height: int,
                 ray_epsilon: float = DEFAULT_RAY_EPSILON) -> DeviceScene:
    """Per-triangle records, materials, light tables and camera on the backend of ``xp``.

    Parameters
    ----------
    scene : Scene
        With materials and a camera (:func:`kdtree_gpu.scenes.as_scene`).
    """
    tri_vertex, tri_normal = triangle_records(scene.vertices, scene.faces)
    light_tri, alias_prob, alias_index, tri_light_pmf = light_tables(scene)

    def pad4(table):
        out = np.zeros((table.shape[0], 4), dtype=np.float32)
        out[:, :3] = table
        return out

    bounds = scene.bounds.astype(np.float64)
    diagonal = float(np.linalg.norm(bounds[1] - bounds[0]))
    return DeviceScene(
        tri_vertex=xp.asarray(tri_vertex),
        tri_normal=xp.asarray(tri_normal),
        tri_material=xp.asarray(scene.tri_material),
        material_albedo=xp.asarray(pad4(scene.material_albedo)),
        material_emission=xp.asarray(pad4(scene.material_emission)),
        light_tri=xp.asarray(light_tri),
        light_alias_prob=xp.asarray(alias_prob),
        light_alias_index=xp.asarray(alias_index),
        tri_light_pmf=xp.asarray(tri_light_pmf),
        camera_frame=xp.asarray(scene.camera.frame(width, height)),
        background=tuple(float(x) for x in scene.background),
        ray_epsilon=float(ray_epsilon),
        min_scale=max(1e-2 * diagonal, 1e-30),
        two_sided=int(scene.two_sided_emission),
    )


def triangle_records(vertices, faces):
    """16-byte aligned per-triangle records for the shading kernels.

    Returns
    -------
    tri_vertex : (num_triangles, 3, 4) float32
        The three corners, each padded to a float4 (one 16-byte load each).
    tri_normal : (num_triangles, 4) float32
        xyz: unit geometric normal ``normalize((v1 - v0) x (v2 - v0))``
        (zero for degenerate triangles); w: triangle area.
    """
    P = vertices[faces].astype(np.float64)
    cross = np.cross(P[:, 1] - P[:, 0], P[:, 2] - P[:, 0])
    length = np.linalg.norm(cross, axis=1)
    tri_normal = np.zeros((faces.shape[0], 4), dtype=np.float32)
    nonzero = length > 0
    tri_normal[nonzero, :3] = cross[nonzero] / length[nonzero, None]
    tri_normal[:, 3] = 0.5 * length
    tri_vertex = np.zeros((faces.shape[0], 3, 4), dtype=np.float32)
    tri_vertex[:, :, :3] = P
    return tri_vertex, tri_normal


def build_alias_table(weights):
    """Vose's alias table for sampling indices in proportion to ``weights``.

    Parameters
    ----------
    weights : (num_items,) float, >= 0, with a positive sum

    Returns
    -------
    alias_prob : (num_items,) float32
        Probability of keeping bucket ``i`` (else take ``alias_index[i]``).
    alias_index : (num_items,) int32
    pmf : (num_items,) float64
        ``weights / weights.sum()``: the probability of each item.

    Notes
    -----
    Sampling with one uniform ``u``: ``i = min(floor(u * n), n - 1)``,
    ``f = u * n - i``; the item is ``i`` if ``f < alias_prob[i]`` else
    ``alias_index[i]``.
    """
    weights = np.asarray(weights, dtype=np.float64).reshape(-1)
    n = weights.shape[0]
    total = weights.sum()
    if n == 0 or not total > 0:
        raise ValueError("build_alias_table needs at least one positive weight")
    pmf = weights / total
    scaled = pmf * n
    alias_prob = np.ones(n, dtype=np.float64)
    alias_index = np.arange(n, dtype=np.int32)
    small = [i for i in range(n) if scaled[i] < 1.0]
    large = [i for i in range(n) if scaled[i] >= 1.0]
    while small and large:
        s = small.pop()
        g = large.pop()
        alias_prob[s] = scaled[s]
        alias_index[s] = g
        scaled[g] = (scaled[g] + scaled[s]) - 1.0
        (small if scaled[g] < 1.0 else large).append(g)
    # leftovers are 1 up to rounding
    for i in small + large:
        alias_prob[i] = 1.0
        alias_index[i] = i
    return alias_prob.astype(np.float32), alias_index, pmf


def light_tables(scene: Scene):
    """Light triangles and their selection probabilities.

    Returns
    -------
    light_tri : (num_lights,) int32
        Emissive, non-degenerate triangles.
    light_alias_prob : (num_lights,) float32
    light_alias_index : (num_lights,) int32
        Alias table over ``light_tri`` with weights ``luminance(Le) * area``.
    tri_light_pmf : (num_triangles,) float32
        Probability that light sampling picks each triangle (0 for
        non-emissive ones); the MIS weight of an emitter hit by BSDF sampling
        needs it.
    """
    _, tri_normal = triangle_records(scene.vertices, scene.faces)
    area = tri_normal[:, 3].astype(np.float64)
    emission = scene.material_emission[scene.tri_material].astype(np.float64)
    power = (emission @ LUMINANCE_WEIGHTS) * area
    # a light whose luminance is 0 but which emits (pure blue of tiny weight)
    # still needs a chance to be sampled: floor the weight at 1e-6 of the mean
    emits = (emission.max(axis=1) > 0) & (area > 0)
    light_tri = np.flatnonzero(emits).astype(np.int32)
    tri_light_pmf = np.zeros(scene.num_triangles, dtype=np.float32)
    if light_tri.size == 0:
        return (light_tri, np.zeros(0, np.float32), np.zeros(0, np.int32), tri_light_pmf)
    weight = power[light_tri]
    weight = np.maximum(weight, 1e-6 * max(weight.mean(), 1e-30))
    alias_prob, alias_index, pmf = build_alias_table(weight)
    tri_light_pmf[light_tri] = pmf.astype(np.float32)
    return light_tri, alias_prob, alias_index, tri_light_pmf
