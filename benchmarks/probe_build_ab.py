"""One JSON line for one mesh: warm ``kd.build`` ms from CuPy arrays (CUDA events, median of
$REPS, default 15, after two), and from one ``kd.build(profile=True)`` the subtree stage's
ms, the level loop's, the staged cost passes' and scatters', the sum of the profile's
top-level rows and the peak bytes per triangle. The package is
whichever ``kdtree_gpu`` is first on PYTHONPATH, so that two commits can run in alternating
fresh processes::

    PYTHONPATH=OLD_ROOT python benchmarks/probe_build_ab.py stanford_armadillo@sub2
    PYTHONPATH=. python benchmarks/probe_build_ab.py stanford_armadillo@sub2

``KD_SETTINGS`` (JSON, optional) gives ``GpuSettings`` fields for every build, e.g.
``KD_SETTINGS='{"workspace_budget": 288}'``. ``AB_ROWS=1`` adds every row of the profile
(``rows``: description -> total ms), for comparing single stages.

(The digest of the tree's arrays is printed too; the subtree stage numbers its nodes with
atomics, so it differs from build to build: compare trees with the tests.)"""
import os, sys, json, hashlib
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import cupy, numpy as np
import kdtree_gpu as kd
from _common import kernels_ms
from bench_build import load
V, F = load(sys.argv[1], os.environ["KDTREE_GPU_MESH_DIR"])
V, F = cupy.asarray(V), cupy.asarray(F)
REPS = int(os.environ.get('REPS', 15))
SETTINGS = json.loads(os.environ.get("KD_SETTINGS") or "{}")
KW = {"settings": kd.GpuSettings(**SETTINGS)} if SETTINGS else {}
for _ in range(2): kd.build(V, F, **KW)
T = []
for _ in range(REPS):
    a, b = cupy.cuda.Event(), cupy.cuda.Event()
    a.record(); kd.build(V, F, **KW); b.record(); b.synchronize()
    T.append(cupy.cuda.get_elapsed_time(a, b))
tree = kd.build(V, F, profile=True, **KW)
h = hashlib.sha1()
for name in ("node_axis", "node_split", "node_child", "node_count", "leaf_tris"):
    h.update(cupy.asnumpy(tree.device_array(name)).tobytes())
prof = tree.build_info["profile"]
# (key: profile row) of the stages printed on their own
ROWS = {"small_ms": "small subtrees", "loop_ms": "build_levels_grid",
        "costs_ms": "compute_split_costs: costs",
        "prepass_ms": "compute_split_costs: scan: tile sums",
        "route_scan_ms": "route: event scan: tile sums", "scatter_ms": "split_refs_and_events"}
print(json.dumps({"pkg": os.path.dirname(kd.__file__).split("/")[-2], "mesh": sys.argv[1],
                  **({"settings": SETTINGS} if SETTINGS else {}),
                  "ms": round(float(np.median(T)), 3), "digest": h.hexdigest()[:12],
                  "peak_B_per_tri": round(tree.build_info["peak_device_bytes"] / int(F.shape[0]), 1),
                  **{key: round(prof.get(row, {}).get("total_ms", 0), 3)
                     for key, row in ROWS.items()},
                  "kernels_ms": round(kernels_ms(prof), 3),
                  **({"relaunches": tree.build_info["scatter_relaunches"],
                      "stage_levels": len(tree.build_info["stage_levels"])}
                     if "scatter_relaunches" in tree.build_info else {}),
                  **({"rows": {k: round(v["total_ms"], 3) for k, v in prof.items()}}
                     if os.environ.get("AB_ROWS") else {})}), flush=True)
