"""GPU ray queries (kdtree_gpu.trace.gpu): kd-tree traversal against brute force and the CPU.

GPU tests: ``python -m pytest tests/kdtree_gpu/trace/test_gpu.py -m gpu -q``.
They compare the GPU traversal with the GPU brute force (all triangles, the
same watertight test) and with the CPU traversal, on procedural scenes built
to be hard (grids of quads whose shared edges and vertices the rays pass
through, a closed sphere shot from inside, random soups) and on the real
meshes when the mesh folder exists.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from kdtree_gpu import kernels, testing
from kdtree_gpu.trace import gpu as rg
from kdtree_gpu.device import gpu_available

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no usable CUDA GPU")


# --- scenes ----------------------------------------------------------------------
def make_quad_grid(n, z=0.0):
    """(n+1)^2 vertices on [0, 1]^2 at height z, two triangles per cell.

    Returns
    -------
    vertices : ((n+1)^2, 3) float32
    faces : (2 n^2, 3) int32
    """
    xs = np.linspace(0.0, 1.0, n + 1, dtype=np.float32)
    gx, gy = np.meshgrid(xs, xs, indexing="ij")
    vertices = np.stack([gx.ravel(), gy.ravel(), np.full(gx.size, z, np.float32)], 1)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    a = (i * (n + 1) + j).ravel()
    b, c, d = a + (n + 1), a + (n + 2), a + 1
    faces = np.concatenate([np.stack([a, b, c], 1), np.stack([a, c, d], 1)]).astype(np.int32)
    return vertices.astype(np.float32), faces


def make_icosphere(subdivisions=3):
    """A closed unit sphere (trimesh's icosphere)."""
    import trimesh

    mesh = trimesh.creation.icosphere(subdivisions=subdivisions)
    return mesh.vertices.astype(np.float32), mesh.faces.astype(np.int32)


def icosphere_tree(make_tree, subdivisions):
    """The vertices of ``make_icosphere(subdivisions)`` and ``make_tree``'s tree over it."""
    vertices, faces = make_icosphere(subdivisions)
    return vertices, make_tree(vertices, faces)


def make_soup(num_tris, rng):
    """Random triangles in the unit cube, some of them tiny, some long and thin."""
    corner = rng.random((num_tris, 1, 3))
    size = np.where(rng.random((num_tris, 1, 1)) < 0.2, 1e-3, 0.3)
    vertices = (corner + size * (rng.random((num_tris, 3, 3)) - 0.5)).reshape(-1, 3)
    return vertices.astype(np.float32), np.arange(3 * num_tris, dtype=np.int32).reshape(-1, 3)


def random_rays(vertices, num_rays, rng):
    """Rays in and around the mesh box (kdtree_gpu.testing), 3/8 axis-aligned or with (-)0 components."""
    bounds = np.stack([vertices.min(0), vertices.max(0)])
    return testing.random_rays(bounds, num_rays, rng, special=3 / 8)[:2]


def rays_through_points(points, rng, distance=1.0):
    """Rays from random directions that pass exactly through ``points`` (t = 1)."""
    offset = rng.normal(size=points.shape)
    offset /= np.linalg.norm(offset, axis=1, keepdims=True)
    origins = (points + distance * offset).astype(np.float32)
    return origins, (points - origins).astype(np.float32)


def grid_edge_points(n, num, rng):
    """Points on the inner vertices and edges of :func:`make_quad_grid` (on z = 0).

    The points stay a cell away from the border, where a ray may rightly miss.
    """
    corner = rng.integers(1, n - 1, (num, 2)).astype(np.float64)
    along = rng.random(num)
    pick = rng.integers(0, 4, num)  # vertex, edge along x, edge along y, cell diagonal
    x = corner[:, 0] + np.where((pick == 1) | (pick == 3), along, 0.0)
    y = corner[:, 1] + np.where((pick == 2) | (pick == 3), along, 0.0)
    return np.stack([x / n, y / n, np.zeros(num)], 1).astype(np.float32)


# --- comparison ------------------------------------------------------------------
def assert_same_closest(t_a, tri_a, t_b, tri_b, what, min_same=0.99):
    """Same hit/miss, same triangle or an equally close one (kdtree_gpu.testing's ties).

    ``min_same`` is the least fraction of hits naming the same triangle; rays
    aimed at shared edges and vertices tie on purpose, so their tests lower it
    and rely on the barycentric check that the named triangle is really hit.
    """
    comparison = testing.assert_same_hits((t_a, tri_a), (t_b, tri_b), labels=(what, "the other"))
    frac_same = 1.0 - comparison.num_ties / comparison.num_hits if comparison.num_hits else 1.0
    assert frac_same >= min_same, f"{what}: only {frac_same:.4f} of the hits name the same triangle"


def assert_barycentrics(vertices, faces, origins, directions, t, tri, u, v):
    """The point at t on the ray equals (1-u-v) v0 + u v1 + v v2, and u, v, 1-u-v >= 0."""
    hit = tri >= 0
    tri_h = faces[tri[hit]]
    p_ray = origins[hit].astype(np.float64) + t[hit, None].astype(np.float64) * directions[hit]
    w1, w2 = u[hit].astype(np.float64), v[hit].astype(np.float64)
    p_bary = ((1 - w1 - w2)[:, None] * vertices[tri_h[:, 0]] + w1[:, None] * vertices[tri_h[:, 1]]
              + w2[:, None] * vertices[tri_h[:, 2]])
    scale = np.abs(vertices).max() + np.abs(origins).max()
    assert np.all(np.abs(p_ray - p_bary) <= 1e-4 * scale)
    assert np.all(w1 >= -1e-6) and np.all(w2 >= -1e-6) and np.all(w1 + w2 <= 1 + 1e-6)


def gpu_rays(origins, directions, tmin=0.0, tmax=np.inf):
    import cupy

    n = origins.shape[0]
    return (cupy.asarray(origins, dtype=cupy.float32), cupy.asarray(directions, dtype=cupy.float32),
            cupy.asarray(np.broadcast_to(np.float32(tmin), (n,)), dtype=cupy.float32),
            cupy.asarray(np.broadcast_to(np.float32(tmax), (n,)), dtype=cupy.float32))


def check_against_brute(tree, origins, directions, tmin=0.0, tmax=np.inf, what="",
                        min_same=0.99):
    """Traversal vs brute force, closest and any hit; returns the closest-hit arrays (host)."""
    rays = gpu_rays(origins, directions, tmin, tmax)
    t, tri, u, v = (x.get() for x in rg.intersect_gpu(tree, *rays))
    bt, btri, bu, bv = (x.get() for x in rg.brute_intersect_gpu(tree.vertices, tree.faces, *rays))
    assert_same_closest(t, tri, bt, btri, f"{what} traversal vs brute force", min_same=min_same)
    same = tri == btri
    assert np.array_equal(t[same], bt[same]), f"{what}: same triangle, different t"
    assert np.array_equal(u[same], bu[same]) and np.array_equal(v[same], bv[same])
    hit = rg.occluded_gpu(tree, *rays).get()
    assert np.array_equal(hit, tri >= 0), f"{what}: any hit disagrees with closest hit"
    assert np.array_equal(rg.brute_occluded_gpu(tree.vertices, tree.faces, *rays).get(), hit)
    assert_barycentrics(tree.vertices, tree.faces, origins, directions, t, tri, u, v)
    return t, tri, u, v


# --- CPU-runnable ------------------------------------------------------------------
def test_pack_triangles_keeps_order_vertices_and_ids():
    vertices = np.arange(15, dtype=np.float32).reshape(5, 3)
    faces = np.array([[0, 1, 2], [2, 3, 4], [4, 0, 1]], np.int32)
    packed = rg.pack_triangles(vertices, faces, np.array([2, 0, 2], np.int32))
    assert packed.shape == (9, 4) and packed.dtype == np.float32
    assert np.array_equal(packed[:, :3], vertices[faces[[2, 0, 2]].ravel()])
    assert packed[[0, 3, 6], 3].view(np.int32).tolist() == [2, 0, 2]
    assert np.all(packed[[1, 2, 4, 5, 7, 8], 3] == 0)


def test_traversal_stack_covers_the_depth_cap():
    # the kernel's stack is KD_MAX_DEPTH_CAP entries, the cap of every config
    from kdtree_gpu import config, encoding

    assert config.MAX_DEPTH_CAP is encoding.MAX_DEPTH_CAP
    assert "#define KD_MAX_DEPTH_CAP (64)" in encoding.cuda_defines()


def test_packed_trace_parameters_are_the_kernel_signature():
    """kd_trace's parameter list, read from traverse.cu, and the bytes a launch packs."""
    from kdtree_gpu.trace.soa import HitSoA, RaySoA, TraceParams

    packed = rg._TRACE_LAUNCH
    assert packed.parameters == (("nodes", np.uint64), ("refs", np.uint64), ("tris", np.uint64),
                                 ("p", TraceParams),
                                 ("rays", RaySoA), ("hits", HitSoA), ("status", np.uint64))
    # the layout the GPU tests ran with: three pointers, the 48-byte parameters
    # (nine floats, padding, the int64 ray count), 4 + 7 pointers, a pointer
    assert packed.offsets == (0, 8, 16, 24, 72, 104, 160)
    assert packed._struct.format == "<QQQfffffffffxxxxq" + "Q" * 12


@pytest.mark.skipif(kernels.find_nvcc() is None, reason="nvcc not installed")
@pytest.mark.parametrize("source", ["traverse.cu", "brute.cu"])
def test_sources_compile_without_warnings(source, tmp_path):
    header = kernels.write_defines_header(tmp_path / "kd_defines.h")
    cmd = [kernels.find_nvcc(), "-arch=sm_90", "--std=c++17", "-include", str(header),
           f"-I{kernels.CUDA_DIR}", "-Xptxas", "-v,-warn-spills", "-c",
           str(kernels.CUDA_DIR / source), "-o", str(tmp_path / "out.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "warning" not in output.lower(), output
    # every kernel keeps its state in registers (the traversal stack aside)
    spill_lines = [line for line in output.splitlines() if "spill stores" in line]
    assert spill_lines and all("0 bytes spill stores, 0 bytes spill loads" in line
                               for line in spill_lines), output


# --- GPU ---------------------------------------------------------------------------
@gpu
@needs_gpu
def test_grid_rays_through_shared_edges_and_vertices_always_hit(make_tree, rng):
    n = 16
    tree = make_tree(*make_quad_grid(n))
    points = grid_edge_points(n, 20000, rng)
    origins, directions = rays_through_points(points, rng)
    t, tri, _, _ = check_against_brute(tree, origins, directions, what="grid edges", min_same=0.0)
    assert np.all(tri >= 0), f"{int(np.sum(tri < 0))} rays slipped through the grid"
    assert np.allclose(t, 1.0, rtol=1e-5)


@gpu
@needs_gpu
def test_rays_lying_in_the_grid_plane_and_on_split_planes(make_tree, rng):
    n = 8
    tree = make_tree(*make_quad_grid(n))
    # rays inside the plane z = 0, along the grid lines (and so along split planes)
    lines = rng.integers(0, n + 1, 500).astype(np.float32) / n
    origins = np.stack([np.full(500, -0.5), lines, np.zeros(500)], 1).astype(np.float32)
    directions = np.tile(np.array([[1.0, 0.0, 0.0]], np.float32), (500, 1))
    origins[250:] = origins[250:, [1, 0, 2]]
    directions[250:] = directions[250:, [1, 0, 2]]
    check_against_brute(tree, origins, directions, what="in-plane")


@gpu
@needs_gpu
def test_rays_from_inside_a_closed_sphere_never_escape(make_tree, rng):
    vertices, tree = icosphere_tree(make_tree, 4)
    num = 50000
    origins = (rng.random((num, 3)) * 0.8 - 0.4).astype(np.float32)
    origins[:1000] = 0.0
    directions = rng.normal(size=(num, 3)).astype(np.float32)
    directions[:3000] = vertices[rng.integers(0, len(vertices), 3000)]  # aimed at vertices
    origins[:3000] = 0.0
    t, tri, _, _ = check_against_brute(tree, origins, directions, what="inside sphere",
                                       min_same=0.0)
    assert np.all(tri >= 0), f"{int(np.sum(tri < 0))} rays escaped the closed sphere"


@gpu
@needs_gpu
@pytest.mark.parametrize("scene", ["grid", "icosphere", "soup"])
def test_random_rays_match_brute_force_and_cpu(scene, make_tree, rng):
    if scene == "grid":
        vertices, faces = make_quad_grid(24)
    elif scene == "icosphere":
        vertices, faces = make_icosphere(3)
    else:
        vertices, faces = make_soup(2000, rng)
    tree = make_tree(vertices, faces)
    origins, directions = random_rays(vertices, 20000, rng)
    t, tri, u, v = check_against_brute(tree, origins, directions, what=scene)
    assert 0.05 < np.mean(tri >= 0) < 1.0  # the rays are a real test: some hit, some miss
    ct, ctri, cu, cv = tree.intersect(origins, directions, device="cpu")
    assert_same_closest(t, tri, ct, ctri, f"{scene}: GPU vs CPU traversal")
    hit_cpu = tree.occluded(origins, directions, device="cpu")
    assert np.array_equal(np.asarray(hit_cpu), tri >= 0)


@gpu
@needs_gpu
def test_tmin_tmax_intervals(make_tree, rng):
    vertices, tree = icosphere_tree(make_tree, 3)
    num = 20000
    origins, directions = random_rays(vertices, num, rng)
    tmin = (rng.random(num) * 2.0).astype(np.float32)
    tmax = (tmin + rng.random(num) * 3.0).astype(np.float32)
    tmax[::5] = np.inf
    tmin[::7] = 0.0
    tmax[::11] = tmin[::11]  # an empty-length interval: only t == tmin counts
    tmax[::13] = tmin[::13] - 1.0  # an inverted interval: never a hit
    t, tri, _, _ = check_against_brute(tree, origins, directions, tmin, tmax, what="tmin/tmax")
    hit = tri >= 0
    assert np.all(t[hit] >= tmin[hit]) and np.all(t[hit] <= tmax[hit])
    assert not np.any(hit[::13])
    # a hit inside the interval is also the closest from tmin on: cutting the
    # interval at the found t keeps the same answer
    rays = gpu_rays(origins[hit], directions[hit])
    import cupy

    rays = (rays[0], rays[1], cupy.asarray(tmin[hit]), cupy.asarray(t[hit]))
    t2, tri2, _, _ = (x.get() for x in rg.intersect_gpu(tree, *rays))
    assert np.array_equal(t2, t[hit]) and np.array_equal(tri2, tri[hit])


@gpu
@needs_gpu
def test_rays_pointing_away_miss(make_tree, rng):
    tree = make_tree(*make_icosphere(2))
    directions = rng.normal(size=(5000, 3)).astype(np.float32)
    origins = (3.0 * directions / np.linalg.norm(directions, axis=1, keepdims=True)).astype(np.float32)
    t, tri, u, v = (x.get() for x in rg.intersect_gpu(tree, *gpu_rays(origins, directions)))
    assert np.all(tri == -1) and np.all(np.isinf(t)) and np.all(u == 0) and np.all(v == 0)
    assert not rg.occluded_gpu(tree, *gpu_rays(origins, directions)).get().any()


@gpu
@needs_gpu
def test_every_output_is_written(make_tree, rng, monkeypatch):
    """Outputs filled with a sentinel before the launch: a skipped ray would keep it."""
    import cupy

    vertices, faces = make_soup(500, rng)
    tree = make_tree(vertices, faces)
    num = 100003  # not a multiple of the block size
    origins, directions = random_rays(vertices, num, rng)
    rays = gpu_rays(origins, directions)
    real_empty = cupy.empty

    def poisoned_empty(shape, dtype=float, order="C"):
        out = real_empty(shape, dtype=dtype, order=order)
        out.view(cupy.uint8).fill(0xA5)  # NaN floats, huge ints, bools that are neither 0 nor 1
        return out

    monkeypatch.setattr(cupy, "empty", poisoned_empty)
    t, tri, u, v = (x.get() for x in rg.intersect_gpu(tree, *rays))
    hit = rg.occluded_gpu(tree, *rays)
    counted = [x.get() for x in rg.intersect_counted_gpu(tree, *rays)]
    bt, btri, _, _ = (x.get() for x in rg.brute_intersect_gpu(vertices, faces, *rays))
    bhit = rg.brute_occluded_gpu(vertices, faces, *rays)
    monkeypatch.undo()
    assert not np.isnan(t).any() and not np.isnan(u).any() and not np.isnan(v).any()
    assert np.all((tri >= -1) & (tri < len(faces))) and np.all((btri >= -1) & (btri < len(faces)))
    assert not np.isnan(bt).any()
    assert np.all(hit.view(cupy.uint8).get() <= 1) and np.all(bhit.view(cupy.uint8).get() <= 1)
    assert np.array_equal(counted[0], t) and np.array_equal(counted[1], tri)
    ray_nodes, ray_tests = counted[4], counted[5]
    assert np.all(ray_nodes >= 0) and np.all(ray_nodes <= tree.num_nodes)
    assert np.all(ray_tests >= 0) and np.all(ray_tests <= tree.num_refs)


@gpu
@needs_gpu
def test_prepared_launch_writes_what_a_query_returns(make_tree, rng):
    """The kernel-alone launch of the benchmarks: parameters packed once, same hits."""
    import cupy

    vertices, faces = make_soup(1000, rng)
    tree = make_tree(vertices, faces)
    rays = gpu_rays(*random_rays(vertices, 5000, rng))[:2]
    for tmin, tmax, any_hit in ((0.0, np.inf, False), (0.25, 1.5, False), (0.25, 1.5, True)):
        launch, hits = rg.prepared_launch(tree, *rays, tmin, tmax, any_hit=any_hit)
        fields = ("hit_any",) if any_hit else ("hit_t", "hit_tri", "hit_u", "hit_v")
        for name in fields:
            getattr(hits, name).fill(0)
        launch()
        expected = (tree.occluded(*rays, tmin, tmax),) if any_hit else \
            tree.intersect(*rays, tmin, tmax)
        for name, want in zip(fields, expected):
            assert cupy.array_equal(getattr(hits, name), want), (name, tmin, tmax)


@gpu
@needs_gpu
def test_counts_of_the_counted_kernels(make_tree, rng):
    vertices, faces = make_quad_grid(32)
    tree = make_tree(vertices, faces)
    # rays straight down through cell centres hit after few nodes and tests
    centres = (rng.integers(0, 32, (2000, 2)) + 0.5) / 32
    points = np.concatenate([centres, np.zeros((2000, 1))], 1).astype(np.float32)
    origins = points + np.float32([0, 0, 1])
    directions = np.tile(np.float32([[0, 0, -1]]), (2000, 1))
    rays = gpu_rays(origins, directions)
    t, tri, _, _, ray_nodes, ray_tests = (x.get() for x in rg.intersect_counted_gpu(tree, *rays))
    assert np.all(tri >= 0)
    assert np.all(ray_nodes >= 2) and np.all(ray_tests >= 1)
    assert ray_tests.mean() < 0.05 * len(faces)
    hit, any_nodes, any_tests = (x.get() for x in rg.occluded_counted_gpu(tree, *rays))
    assert np.all(hit) and np.all(any_tests <= ray_tests)


@gpu
@needs_gpu
def test_layout_is_packed_on_the_device_once_and_equals_the_host_packing(make_tree, rng):
    from kdtree_gpu import encoding as enc
    from kdtree_gpu.trace.scale import trace_scale

    tree = make_tree(*make_icosphere(1))  # a CPU tree: packed on its first GPU query
    first = rg.traversal_layout(tree)
    assert rg.traversal_layout(tree) is first
    assert first.nodes.shape == (tree.num_nodes, 2)
    scale = np.float32(trace_scale(tree.bounds))
    assert first.scale == scale
    # every referenced triangle once, in the order of its first reference
    _, first_ref = np.unique(tree.leaf_tris, return_index=True)
    order = tree.leaf_tris[np.sort(first_ref)]
    assert tree.num_refs > order.size  # some triangles are in several leaves
    tris = rg.pack_triangles(tree.vertices * scale, tree.faces, order)
    assert first.tris.shape[0] >= tris.shape[0]
    assert np.array_equal(first.tris.get()[:tris.shape[0]], tris)
    row = np.empty(tree.faces.shape[0], dtype=np.int64)
    row[order] = np.arange(order.size)
    refs = row[tree.leaf_tris]
    assert np.array_equal(first.refs.get(), refs)
    split = (tree.node_split * scale).astype(np.float32)
    expected = enc.pack_nodes(tree.node_axis, split, tree.node_child, tree.node_count)
    assert np.array_equal(first.nodes.get(), expected)


@gpu
@needs_gpu
def test_bad_ray_arrays_are_rejected(make_tree):
    import cupy

    tree = make_tree(*make_icosphere(1))
    o, d = cupy.zeros((4, 3), cupy.float32), cupy.ones((4, 3), cupy.float32)
    with pytest.raises(ValueError, match="origins must have shape"):
        tree.intersect(o[:, :2], d)
    with pytest.raises(ValueError, match="origins has 4 rays but directions has 3"):
        tree.intersect(o, d[:3])
    with pytest.raises(ValueError, match=r"tmax must be a scalar or have shape \(4,\)"):
        tree.occluded(o, d, tmax=cupy.ones(2, cupy.float32))
    # other dtypes are converted on the device
    t64 = tree.intersect(o.astype(cupy.float64), d)[0]
    assert np.array_equal(t64.get(), tree.intersect(o, d)[0].get())


@gpu
@needs_gpu
def test_torch_and_cupy_inputs_give_the_same_hits(make_tree, rng):
    import cupy

    vertices, tree = icosphere_tree(make_tree, 3)
    origins, directions = random_rays(vertices, 5000, rng)
    t, tri, u, v = tree.intersect(cupy.asarray(origins), cupy.asarray(directions))
    assert isinstance(t, cupy.ndarray) and isinstance(tri, cupy.ndarray)
    ref = rg.intersect_gpu(tree, *gpu_rays(origins, directions))
    for a, b in zip((t, tri, u, v), ref):
        assert np.array_equal(a.get(), b.get())
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    tt, ttri, tu, tv = tree.intersect(torch.as_tensor(origins, device="cuda"),
                                      torch.as_tensor(directions, device="cuda"))
    assert tt.is_cuda
    for a, b in zip((tt, ttri, tu, tv), ref):
        assert np.array_equal(a.cpu().numpy(), b.get())


@gpu
@needs_gpu
@pytest.mark.slow
@pytest.mark.parametrize("name", ["spot.ply", "stanford_bunny.ply", "sponza_dabrovic.ply",
                                  "happy_buddha_100k.ply"])
def test_real_meshes_match_brute_force(name, make_tree, rng, mesh_file):
    from kdtree_gpu.mesh import load_mesh

    vertices, faces = load_mesh(mesh_file(name))
    tree = make_tree(vertices, faces)
    origins, directions = random_rays(vertices, 20000, rng)
    check_against_brute(tree, origins, directions, what=name)
