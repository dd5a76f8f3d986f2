#!/usr/bin/env bash
# The reference suite on an offline GPU node, once per FlashInfer wheel in a wheelhouse, reusing
# the node's own torch: each version goes into its own --target folder on PYTHONPATH, and the
# versions run side by side (their JIT caches are keyed by version under one workspace).
#
#   scripts/gpu-references.sh WHEELHOUSE OUTDIR VERSION... [-- PYTEST-ARGS]
#
# Writes OUTDIR/fi<VERSION>.xml (JUnit), OUTDIR/fi<VERSION>.log and the wall time of each run;
# FT_TIMEOUT=SECONDS bounds each run (SIGINT first, so pytest still writes its report).
# The noxfile's offline mode does the same per combination; this is the minimal form.
set -uo pipefail
wh=$1 out=$2; shift 2
versions=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do versions+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
mkdir -p "$out"
deps=${FT_DEPS:-/tmp/ft-deps}
pip_target() { python3 -m pip install -q --no-index --no-deps --no-compile --target "$@"; }
shopt -s nullglob
extra=("$wh"/pydantic*.whl "$wh"/typing_extensions*.whl "$wh"/annotated_types*.whl "$wh"/typing_inspection*.whl "$wh"/apache_tvm_ffi*.whl
       "$wh"/nvidia_cudnn_frontend*.whl "$wh"/landlock-*.whl "$wh"/pyseccomp-*.whl)  # the last two: the reference worker
[ -d "$deps" ] || pip_target "$deps" "${extra[@]}" || exit 1
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-4}
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-jit} PYTHONUNBUFFERED=1
for v in "${versions[@]}"; do
  [ -d "/tmp/fi-$v" ] || pip_target "/tmp/fi-$v" "$wh"/flashinfer_python-"$v"-*.whl || exit 1
  (
    start=$SECONDS
    PYTHONPATH="$PWD/src:/tmp/fi-$v:$deps" timeout -s INT -k 30 "${FT_TIMEOUT:-0}" python3 -m pytest tests/references -p no:cacheprovider \
      --device=cuda --junitxml="$out/fi$v.xml" -rs -v --durations=25 "$@" > "$out/fi$v.log" 2>&1
    rc=$?
    echo "flashinfer $v: exit $rc, wall $((SECONDS - start)) s" | tee -a "$out/fi$v.log"
  ) &
done
wait
