"""What a warm ``kd.build`` spends host time on: the workspace's trims (split into the wait
for queued GPU work, by a synchronize put before each, and the device frees; those before
a device allocation, without a synchronize, apart), its
allocations (those that made the pool grow, i.e. a device allocation, and the rest) and the
tree output's growth. Profiling off. The synchronizes add waits the build does not make
elsewhere, so totals are for attribution, not for timing::

    python benchmarks/probe_build_host.py stanford_armadillo@sub2 [MESH ...]
"""
import collections
import os
import sys
import time

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import cupy

import kdtree_gpu as kd
from kdtree_gpu.builder.gpu import output as output_mod
from kdtree_gpu.builder.gpu import workspace as ws_mod
from bench_build import load

stats = collections.defaultdict(lambda: [0, 0.0, 0])  # name -> [calls, ms, bytes]
big = []  # (ms, bytes, what) of device allocations


def note(name, ms, nbytes=0):
    s = stats[name]
    s[0] += 1
    s[1] += ms
    s[2] += nbytes


_trim = ws_mod.Workspace.trim


def trim(self):
    t0 = time.perf_counter()
    cupy.cuda.Device().synchronize()
    t1 = time.perf_counter()
    held = self._own_bytes()
    _trim(self)
    t2 = time.perf_counter()
    note("trim: wait for the GPU", 1000 * (t1 - t0))
    note("trim: free blocks", 1000 * (t2 - t1), held - self._own_bytes())


ws_mod.Workspace.trim = trim
_before = ws_mod.Workspace.before_device_allocation


def before_device_allocation(self):
    t0 = time.perf_counter()
    held = self._own_bytes()
    _before(self)
    freed = held - self._own_bytes()
    if freed:
        note("trim before a device allocation", 1000 * (time.perf_counter() - t0), freed)


ws_mod.Workspace.before_device_allocation = before_device_allocation
_release_tree = ws_mod.Workspace.release_tree_blocks


def release_tree(self):
    t0 = time.perf_counter()
    held = self.tree_pool.total_bytes()
    _release_tree(self)
    note("release_tree_blocks", 1000 * (time.perf_counter() - t0),
         held - self.tree_pool.total_bytes())


ws_mod.Workspace.release_tree_blocks = release_tree
_malloc = ws_mod.Workspace._malloc


def malloc(self, size):
    t0 = time.perf_counter()
    held = self._held() if self.user_pool is not None else self._own_bytes()
    mem = _malloc(self, size)
    ms = 1000 * (time.perf_counter() - t0)
    grew = (self._held() if self.user_pool is not None else self._own_bytes()) - held
    if grew > 0:
        note("malloc: device allocation", ms, grew)
        big.append((ms, grew, "aside" if self._aside else "tree" if self._tree else "pool"))
    else:
        note("malloc: from the pool's cache", ms, size)
    return mem


ws_mod.Workspace._malloc = malloc
_reserve = output_mod.TreeOutput.reserve


def reserve(self, *args, **kwargs):
    t0 = time.perf_counter()
    _reserve(self, *args, **kwargs)
    note("TreeOutput.reserve (all of it)", 1000 * (time.perf_counter() - t0))


output_mod.TreeOutput.reserve = reserve

for name in sys.argv[1:]:
    V, F = load(name, os.environ["KDTREE_GPU_MESH_DIR"])
    V, F = cupy.asarray(V), cupy.asarray(F)
    for _ in range(2):
        kd.build(V, F)
    for rep in range(2):
        stats.clear()
        big.clear()
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        kd.build(V, F)
        cupy.cuda.Device().synchronize()
        wall = 1000 * (time.perf_counter() - t0)
        print(f"== {name} ({F.shape[0]} triangles) build {wall:.2f} ms with the probe's synchronizes")
        for key, (calls, ms, nbytes) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
            print(f"  {ms:8.2f} ms {calls:6d} calls {nbytes / 2**20:10.1f} MiB  {key}")
        big.sort(reverse=True)
        print("  slowest device allocations (ms, MiB, pool):",
              ", ".join(f"{ms:.2f}/{b / 2**20:.0f}/{w}" for ms, b, w in big[:12]))
