"""The subtree stage level by level: CUDA events around each level's launch (third warm build,
a launch per level), with the level's records and references (``build_info["small_level_sizes"]``)::

    PYTHONPATH=. python benchmarks/probe_subtree_levels.py stanford_bunny stanford_armadillo@sub2"""
import os, sys
sys.path.insert(0, "benchmarks")
import cupy
import kdtree_gpu as kd
import kdtree_gpu.builder.gpu.small as S
from bench_build import load
orig = S.launch
EV = []
def rec(desc, kernel, n, args, **kw):
    if desc == "small subtrees: level":
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record(); orig(desc, kernel, n, args, **kw); b.record(); EV.append((a, b))
    else:
        orig(desc, kernel, n, args, **kw)
S.launch = rec
# a launch per level (GpuSettings.small_grid=False): one cooperative launch has no level times
PER_LEVEL = kd.GpuSettings(small_grid=False)
for spec in sys.argv[1:]:
    V, F = load(spec, os.environ["KDTREE_GPU_MESH_DIR"]); V, F = cupy.asarray(V), cupy.asarray(F)
    for _ in range(2): kd.build(V, F, settings=PER_LEVEL)
    EV.clear()
    t = kd.build(V, F, settings=PER_LEVEL); cupy.cuda.Device().synchronize()
    sizes = t.build_info["small_level_sizes"]
    ms = [cupy.cuda.get_elapsed_time(a, b) for a, b in EV]
    print(f"== {spec}: {F.shape[0]} tris, deferred {t.build_info['small_subtrees']}, launches {len(ms)}, total {sum(ms):.2f} ms, runs full {t.build_info['small_runs_full']}")
    for i, m in enumerate(ms):
        s = sizes[i] if i < len(sizes) else (0, 0)
        print(f"  level {i:2d}: {m:7.3f} ms  records {s[0]:>9,} refs {s[1]:>10,}  refs/rec {s[1]/max(s[0],1):5.1f}  ns/rec {1e6*m/max(s[0],1):7.1f}")
