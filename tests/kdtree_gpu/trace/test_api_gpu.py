"""The public ray API on the GPU: fused ray checks, scalar intervals, ``out=``, streams,
device-resident trees and device inputs to ``kd.build``.

GPU tests (``-m gpu``); each compares with an oracle: the CPU path of the same
API, the brute force, or a host build of the same mesh.
"""

from __future__ import annotations

import numpy as np
import pytest

import kdtree_gpu as kd
from kdtree_gpu.device import gpu_available
from kdtree_gpu.testing import random_rays
from kdtree_gpu.trace import gpu as rg

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no usable CUDA GPU")]


def sphere():
    import trimesh

    mesh = trimesh.creation.icosphere(subdivisions=3)
    return mesh.vertices.astype(np.float32), mesh.faces.astype(np.int32)


def rays(num, seed=0):
    """Origins and directions in and around the sphere's box (kdtree_gpu.testing)."""
    return random_rays([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]], num, seed)[:2]


BAD_RAYS = [  # (what is wrong with ray 3, the words of the error)
    (lambda O, D, t0, t1: O.__setitem__((3, 1), np.nan), "ray 3 has a NaN or infinite value in its origin"),
    (lambda O, D, t0, t1: D.__setitem__((3, 2), np.inf), "ray 3 has a NaN or infinite value in its direction"),
    (lambda O, D, t0, t1: D.__setitem__(3, 0.0), "ray 3 has a zero-length direction"),
    (lambda O, D, t0, t1: t0.__setitem__(3, np.nan), "ray 3 has a NaN tmin"),
    (lambda O, D, t0, t1: t1.__setitem__(3, np.nan), "ray 3 has a NaN tmax"),
    (lambda O, D, t0, t1: t0.__setitem__(3, 5.0), r"ray 3 has tmin > tmax \(5.0 > 1.0\)"),
]


@pytest.mark.parametrize("spoil, message", BAD_RAYS)
def test_the_kernel_names_the_first_bad_ray_as_the_cpu_does(spoil, message):
    import cupy

    V, F = sphere()
    tree = kd.build(V, F, device="cuda")
    O, D = rays(64)
    t0, t1 = np.zeros(64, np.float32), np.ones(64, np.float32)
    spoil(O, D, t0, t1)
    O[40, 0] = np.nan  # a second bad ray: counted, not named
    for query in ("intersect", "occluded"):
        with pytest.raises(ValueError, match=message + r".*\(2 bad rays\)"):
            getattr(tree, query)(cupy.asarray(O), cupy.asarray(D), cupy.asarray(t0),
                                 cupy.asarray(t1))
        with pytest.raises(ValueError, match=message):
            getattr(tree, query)(O, D, t0, t1, device="cpu")
    # unchecked: bad rays are misses, the others as in a checked query of the good rays
    t, tri, u, v = tree.intersect(cupy.asarray(O), cupy.asarray(D), cupy.asarray(t0),
                                  cupy.asarray(t1), check=False)
    good = np.ones(64, bool)
    good[[3, 40]] = False
    assert np.all(tri.get()[~good] == -1) and np.all(np.isinf(t.get()[~good]))
    ref = tree.intersect(O[good], D[good], t0[good], t1[good], device="cpu")
    assert np.array_equal(tri.get()[good], ref[1])
    hit = tree.occluded(cupy.asarray(O), cupy.asarray(D), cupy.asarray(t0), cupy.asarray(t1),
                        check=False)
    assert not hit.get()[~good].any()


def test_unchecked_queries_never_wait_for_the_gpu():
    import cupy
    import cupyx

    V, F = sphere()
    O, D = (cupy.asarray(a) for a in rays(100_000))
    tree = kd.build(cupy.asarray(V), cupy.asarray(F))
    assert tree.device == f"cuda:{cupy.cuda.runtime.getDevice()}"
    with cupyx.allow_synchronize(False):
        t, tri, u, v = tree.intersect(O, D, check=False)
        hit = tree.occluded(O, D, 0.0, 10.0, check=False)
    cupy.cuda.get_current_stream().synchronize()
    ref = rg.brute_intersect_gpu(V, F, O, D, cupy.zeros(len(O), cupy.float32),
                                 cupy.full(len(O), np.inf, cupy.float32))
    assert np.array_equal(tri.get() >= 0, ref[1].get() >= 0)
    assert np.array_equal(hit.get(), (tri.get() >= 0) & (t.get() <= 10.0))


def test_the_common_query_writes_every_output_and_agrees_with_the_general_path():
    """CuPy float32 C-contiguous rays take the short path (output memory taken
    before the launch, arrays made after it); memory poisoned as it is handed
    out shows every output is written, and rays the kernel cannot read as they
    are (Fortran order, float64) take the general path to the same hits."""
    import cupy

    from kdtree_gpu.trace import api

    V, F = sphere()
    tree = kd.build(cupy.asarray(V), cupy.asarray(F))
    O, D = (cupy.asarray(a, cupy.float32) for a in rays(100_003, seed=3))
    assert api._kernel_rays(cupy, O, D)
    for other in (cupy.asfortranarray(O), O.astype(cupy.float64), O[::2],
                  cupy.ones((5, 4), cupy.float32)):
        assert not api._kernel_rays(cupy, other, D[:len(other)])
    pool = cupy.get_default_memory_pool()

    def poisoned(size):
        memory = pool.malloc(size)
        cupy.cuda.runtime.memsetAsync(memory.ptr, 0xA5, size,
                                      cupy.cuda.get_current_stream().ptr)
        return memory

    with cupy.cuda.using_allocator(poisoned):
        common = tree.intersect(O, D)
        hit = tree.occluded(O, D, 0.0, 1.5)
    assert len({a.data.ptr for a in common}) == 4 and all(a.base is None for a in common)
    assert [a.dtype for a in common] == [np.float32, np.int32, np.float32, np.float32]
    general = tree.intersect(cupy.asfortranarray(O), D.astype(cupy.float64))
    for a, b in zip(common, general):
        assert a.shape == (len(O),) and np.array_equal(a.get(), b.get())
    assert not np.isnan(common[0].get()).any()
    assert hit.dtype == bool and np.all(hit.view(cupy.uint8).get() <= 1)
    assert np.array_equal(hit.get(), (general[1].get() >= 0) & (general[0].get() <= 1.5))
    empty = tree.intersect(O[:0], D[:0])
    assert [a.shape for a in empty] == [(0,)] * 4


def test_scalar_and_array_intervals_and_out_arrays_agree():
    import cupy

    V, F = sphere()
    tree = kd.build(V, F, device="cuda")
    O, D = (cupy.asarray(a) for a in rays(10_000, seed=2))
    n = len(O)
    scalar = tree.intersect(O, D, 0.25, 2.0)
    array = tree.intersect(O, D, cupy.full(n, 0.25, cupy.float32), cupy.full(n, 2.0, cupy.float32))
    out = (cupy.empty(n, cupy.float32), cupy.empty(n, cupy.int32), cupy.empty(n, cupy.float32),
           cupy.empty(n, cupy.float32))
    returned = tree.intersect(O, D, 0.25, 2.0, out=out)
    assert all(r is o for r, o in zip(returned, out))
    for a, b, c in zip(scalar, array, out):
        assert np.array_equal(a.get(), b.get()) and np.array_equal(a.get(), c.get())
    hit_out = cupy.empty(n, bool)
    assert tree.occluded(O, D, 0.25, 2.0, out=hit_out) is hit_out
    assert np.array_equal(hit_out.get(), scalar[1].get() >= 0)
    with pytest.raises(ValueError, match="out array t has shape"):
        tree.intersect(O, D, out=(out[0][:10],) + out[1:])


def test_torch_tensors_on_their_own_stream():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    V, F = sphere()
    tree = kd.build(torch.as_tensor(V, device="cuda"), torch.as_tensor(F, device="cuda"))
    O, D = rays(50_000, seed=3)
    ref = tree.intersect(O, D, device="cpu")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        Ot = torch.as_tensor(O, device="cuda")
        Dt = torch.as_tensor(D, device="cuda")
        t, tri, u, v = tree.intersect(Ot, Dt)
        tri_sum = (tri >= 0).sum()  # queued behind the traversal on the same stream
    stream.synchronize()
    assert isinstance(t, torch.Tensor) and t.is_cuda and t.device == Ot.device
    assert np.array_equal(tri.cpu().numpy() >= 0, ref[1] >= 0)
    assert int(tri_sum) == int((ref[1] >= 0).sum())


def test_a_gpu_tree_stays_on_the_gpu_until_host_code_asks():
    import cupy

    V, F = sphere()
    tree = kd.build(V, F, device="cuda")
    assert tree.device.startswith("cuda:") and tree.build_info["device"] == tree.device
    # nothing downloaded by the build: the host bounds came with its one read
    # (the mesh summary that sizes the build)
    assert set(tree._host) == {"bounds"}
    key = ("layout", cupy.cuda.runtime.getDevice())
    layout = tree._device_cache[key]  # written by the builder
    tree.intersect(cupy.zeros((1, 3), cupy.float32), cupy.ones((1, 3), cupy.float32))
    assert tree._device_cache[key] is layout and set(tree._host) == {"bounds"}
    reference = kd.build(V, F, device="cpu")
    assert tree.compare(reference) is None  # host copies made here, on first host use
    assert set(tree._host) >= {"node_axis", "leaf_tris"}
    assert not tree.node_axis.flags.writeable  # they cannot drift from the device arrays
    on_cpu = tree.to("cpu")
    assert on_cpu.device == "cpu" and on_cpu.compare(reference) is None
    back = reference.to("cuda")
    assert back.device == tree.device and back.compare(reference) is None
    O, D = rays(20_000, seed=4)
    for other in (back, on_cpu):  # packed on the device on their first GPU query
        got = other.intersect(cupy.asarray(O), cupy.asarray(D))
        want = tree.intersect(cupy.asarray(O), cupy.asarray(D))
        for a, b in zip(got, want):
            assert np.array_equal(a.get(), b.get())


def test_a_loaded_tree_is_packed_on_the_device(tmp_path):
    import cupy

    V, F = sphere()
    tree = kd.build(V, F, device="cuda")
    tree.save(tmp_path / "sphere.kdt")
    loaded = kd.load_tree(tmp_path / "sphere.kdt")
    O, D = (cupy.asarray(a) for a in rays(5000, seed=5))
    for a, b in zip(loaded.intersect(O, D), tree.intersect(O, D)):
        assert np.array_equal(a.get(), b.get())


def test_device_inputs_build_the_same_tree_and_bad_ones_are_named():
    import cupy

    V, F = sphere()
    host = kd.build(V, F, device="cuda")
    for faces in (F, F.astype(np.int64), F.astype(np.uint32)):
        tree = kd.build(cupy.asarray(V), cupy.asarray(faces))
        assert tree.compare(host) is None
    bad_v = V.copy()
    bad_v[17, 1] = np.nan
    with pytest.raises(kd.MeshError, match="vertex 17 has a NaN coordinate"):
        kd.build(cupy.asarray(bad_v), cupy.asarray(F))
    bad_f = F.astype(np.int64)
    bad_f[5, 2] = 1 << 40
    with pytest.raises(kd.MeshError, match="face 5 has vertex index"):
        kd.build(cupy.asarray(V), cupy.asarray(bad_f))
    # the GPU stays usable
    assert kd.build(cupy.asarray(V), cupy.asarray(F)).compare(host) is None


def test_device_names_select_a_gpu():
    import cupy

    V, F = sphere()
    count = cupy.cuda.runtime.getDeviceCount()
    for index in range(min(count, 2)):
        tree = kd.build(V, F, device=f"cuda:{index}")
        assert tree.device == f"cuda:{index}"
        O, D = rays(1000, seed=6)
        t, tri, _, _ = tree.intersect(O, D, device=f"cuda:{index}")
        assert isinstance(t, np.ndarray)
        assert np.array_equal(tri, tree.intersect(O, D, device="gpu")[1])
    with pytest.raises(ValueError, match=f"there is no CUDA device {count}"):
        kd.build(V, F, device=f"cuda:{count}")
