#!/usr/bin/env bash
# Run the GPU tests and (optionally) the GPU benchmarks on a CUDA machine.
#
#   bash benchmarks/gpu_checks.sh OUT_DIR [tests] [build] [level-loop] [primitives] [traversal] [render]
#
# Meshes: $KDTREE_GPU_MESH_DIR (default ./.meshes). Wheels of missing packages
# (trimesh, warp-lang, embreex) may be placed in ./.whl and are installed into
# /tmp/site first. Full logs and results go to OUT_DIR.
set -u
out=${1:?usage: gpu_checks.sh OUT_DIR [steps...]}
shift
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export KDTREE_GPU_MESH_DIR=${KDTREE_GPU_MESH_DIR:-$PWD/.meshes}
export PYTHONUNBUFFERED=1
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
    build-quick) python3 benchmarks/bench_build.py --out "$out" --no-cold --repeats 5 \
             --meshes cornell_box suzanne stanford_bunny stanford_armadillo stanford_armadillo@sub1 \
             2>&1 | tee "$out/bench_build.log" | grep -v '^|' | tail -30 ;;
    level-loop) python3 benchmarks/bench_level_loop.py --mesh-dir "$KDTREE_GPU_MESH_DIR" --out "$out" 2>&1 | tail -20 ;;
    primitives) python3 benchmarks/bench_primitives.py --out "$out/primitives.json" 2>&1 | tail -30 ;;
    traversal) python3 benchmarks/bench_traversal.py --peers-dir .peers --out "$out" 2>&1 | tail -40 ;;
    traversal-check) python3 benchmarks/gpu_traversal_check.py --mesh-dir "$KDTREE_GPU_MESH_DIR" --out "$out" 2>&1 | tail -40 ;;
    render) python3 benchmarks/gpu_render_check.py --out "$out" 2>&1 | tail -40 ;;
    *) echo "unknown step $step"; status=2 ;;
  esac
done
exit $status
