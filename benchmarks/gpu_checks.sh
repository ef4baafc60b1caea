#!/usr/bin/env bash
# Run the GPU tests and (optionally) the GPU benchmarks on a CUDA machine.
#
#   bash benchmarks/gpu_checks.sh OUT_DIR [tests|tests-all|build|build-quick|level-loop|
#       primitives|traversal|traversal-check|first-hit|query-overhead|query-profile|clip|render|build-paired|baseline-build|baseline-traversal|memory-trace]...
#
# Meshes: $KDTREE_GPU_MESH_DIR (default ./.meshes, unpacked from ./.meshes.tar.xz
# when that archive is there). Wheels of missing packages (trimesh, warp-lang,
# embreex) may be placed in ./.whl and are installed into /tmp/site first.
# The peers' script and results (peer_bench.py, h200_optix.md) are read from
# ./.peers. A copy of an earlier commit in ./.baseline is measured by the
# baseline-* steps in the same run (before/after); its commit is read from
# ./.baseline/.commit. Full logs and results go
# to OUT_DIR.
set -u
out=${1:?usage: gpu_checks.sh OUT_DIR [steps...]}
shift
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
base_path=${PYTHONPATH:-}
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export KDTREE_GPU_MESH_DIR=${KDTREE_GPU_MESH_DIR:-$PWD/.meshes}
if [ ! -d "$KDTREE_GPU_MESH_DIR" ] && [ -f .meshes.tar.xz ]; then
  mkdir -p "$KDTREE_GPU_MESH_DIR" && tar xJf .meshes.tar.xz -C "$KDTREE_GPU_MESH_DIR"
fi
export PYTHONUNBUFFERED=1
baseline_commit=$(cat .baseline/.commit 2>/dev/null || echo baseline)
# A copy of the tree on a remote GPU machine names its commit in .commit (or
# $KDTREE_GPU_COMMIT); a .git there may be stale, so it is asked last.
export KDTREE_GPU_COMMIT=${KDTREE_GPU_COMMIT:-$(cat .commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
status=0
for step in "${@:-tests}"; do
  case $step in
    tests) python3 -m pytest tests -m gpu -q -p no:cacheprovider -x --maxfail=20 2>&1 \
             | tee "$out/gpu_tests.log" | tail -40 || status=1 ;;
    tests-all) python3 -m pytest tests -m gpu -q -p no:cacheprovider 2>&1 \
             | tee "$out/gpu_tests.log" | tail -60 || status=1 ;;
    build) python3 benchmarks/bench_build.py --out "$out" 2>&1 | tee "$out/bench_build.log" | tail -40 ;;
    build-quick) python3 benchmarks/bench_build.py --out "$out" --no-cold --no-cpu --repeats 5 \
             --meshes cornell_box suzanne stanford_bunny stanford_armadillo conference \
             stanford_armadillo@sub1 2>&1 | tee "$out/bench_build.log" | grep -v '^|' | tail -12 ;;
    level-loop) python3 benchmarks/bench_level_loop.py --mesh-dir "$KDTREE_GPU_MESH_DIR" --out "$out" 2>&1 | tail -20 ;;
    primitives) python3 benchmarks/bench_primitives.py --out "$out/primitives.json" 2>&1 | tail -30 ;;
    traversal) python3 benchmarks/bench_traversal.py --peers-dir .peers --out "$out" 2>&1 | tail -40 ;;
    traversal-check) python3 benchmarks/gpu_traversal_check.py --mesh-dir "$KDTREE_GPU_MESH_DIR" --out "$out" 2>&1 | tail -40 ;;
    clip) python3 benchmarks/bench_clip.py --peers-dir .peers --out "$out" 2>&1 \
             | tee "$out/bench_clip.log" | tail -30 ;;
    render) python3 benchmarks/gpu_render_check.py --out "$out" 2>&1 | tail -40 ;;
    query-overhead) python3 benchmarks/bench_query_overhead.py --peers-dir .peers --out "$out" 2>&1 \
             | tail -12 ;;
    query-profile) python3 benchmarks/profile_query.py --peers-dir .peers --out "$out" 2>&1 \
             | tail -12 ;;
    memory-trace) for m in stanford_bunny happy_buddha_100k conference stanford_armadillo \
             stanford_armadillo@sub1; do python3 benchmarks/trace_build_memory.py "$m" \
             --out "$out/memory_trace" 2>&1 | head -3; done ;;
    first-hit) python3 benchmarks/bench_first_hit.py --peers-dir .peers --out "$out" 2>&1 \
             | tee "$out/bench_first_hit.log" | tail -20 ;;
    baseline-build) (cd .baseline && KDTREE_GPU_COMMIT=$baseline_commit PYTHONPATH=$PWD:$base_path python3 benchmarks/bench_build.py \
             --out "$out/baseline" --no-cold --no-cpu --repeats 5 --mesh-dir "$KDTREE_GPU_MESH_DIR" \
             --meshes cornell_box suzanne stanford_bunny stanford_armadillo conference \
             stanford_armadillo@sub1 2>&1 | grep -v '^|' | tail -12) ;;
    build-paired) python3 benchmarks/bench_build_paired.py --baseline-root .baseline --out "$out" 2>&1 \
             | tee "$out/bench_build_paired.log" | tail -16 ;;
    baseline-traversal) (cd .baseline && KDTREE_GPU_COMMIT=$baseline_commit PYTHONPATH=$PWD:$base_path python3 benchmarks/bench_traversal.py \
             --peers-dir ../.peers --no-peers --out "$out/baseline" \
             --mesh-dir "$KDTREE_GPU_MESH_DIR" 2>&1 | tail -20) ;;
    *) echo "unknown step $step"; status=2 ;;
  esac
done
exit $status
