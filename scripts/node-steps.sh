#!/usr/bin/env bash
# The evidence runs on an offline GPU node (../shared/GPU-NODE.md), step by step, from the repository
# root, with a wheelhouse in .whl/ (flashinfer-python 0.6.6, apache-tvm-ffi, nvidia-cudnn-frontend,
# cupti-python, pydantic + pydantic-core + annotated-types + typing-inspection, landlock, pyseccomp,
# nox and its dependencies: ../shared/tools/gpu-wheelhouse):
#
#   scripts/node-steps.sh unit cold warm mutants bench overhead ncu moe-bg moe-wait moe
#   scripts/node-steps.sh probe alone mps-on mps-off        (diagnostics)
#   DEFS="name,name" scripts/node-steps.sh paths   (flashinfer 0.6.6: each source's kernel path here, what it passed over)
#   DEFS=".public/definitions" FI=0.6.6 scripts/node-steps.sh public   (flashinfer-trace check vs FlashInfer)
#   scripts/node-steps.sh fi072a, then at once fi072b + FI=0.7.2.post1 public: 0.7.2.post1 moved in two calls
#   the sweep (docs/matrix-sessions.md, 2026-11-24): WH=/tmp/wh FROM=".whl .whl066 .whl053" wh, then chains of
#   C=<combination> jitc / ref / benchc in the background (bg, BGN=name, BG="..."; mark / await order them),
#   collect to wait and bring results back; a wheel over a call's 64 MiB travels as pieces: carry [.wp072a],
#   then [.wp072b], each with `piece`, then `join` (sha256 checked) puts it in $WH
#   BG="fitrace public fitrace-check" scripts/node-steps.sh bg, then W=540 scripts/node-steps.sh collect (each
#   call returns what has finished; the steps go on between calls while the machine stays warm)
#   sglang 0.5.16 (constraints/cu130-torch2.11-fi0.6.14-sglang0.5.16.toml) in 10 consecutive calls (the
#   machine stays warm 30 s between calls: /tmp survives; each call carries at most 64 MiB, tree included):
#     carry [.sk1] .. [.sk6]: sgl-piece; carry [.sk7], [.wsgl2] (together they and a 10 MB tree pass 64 MiB): sgl-piece; carry [.wsgl3]: sgl-piece;
#     carry [.wsgl]: sgl-install sgl-probe (a plain install in /tmp/sgl), or sgl-join (the nox sessions' wheelhouse
#     /tmp/wh-sgl), then C=cu130-torch2.11-fi0.6.14-sglang0.5.16 WH=/tmp/wh-sgl XW=/tmp/sgl-wheels jitc / ref, its pins
#     from the joined wheels, sglang's import closure through --extra-wheels
#   a machine handed back loses its JIT cache: jit-export brings the modules it built back (in 12 MiB pieces);
#   carried as .jso/ to the next machine, jit-carry unpacks them and JM=/tmp/jit-carried passes --jit-modules, so
#   FlashInfer loads them instead of compiling (sweep/prebuilt.py)
#   a module too big for one machine (fp8 MoE's fused_moe_90: about 41 min on 16 cores, a machine goes back after 30)
#   is built over two: jitmoe in the background, then moe-export (the objects ninja logged since the last export,
#   its .ninja_log/.ninja_deps, the generated sources; xz, 15 MiB pieces, sha256) and moe-send (4 pieces a call:
#   $OUT's 64 MiB); the next machine carries them as .jmo*/ (moe-piece), installs the combination (a jitc that
#   selects nothing), moe-place (sha256 checked, unpacked at the same paths, the freshly installed inputs dated
#   back so ninja keeps the objects: it says how many edges it would still run), then jitmoe finishes the rest;
#   seed puts the snapshot's tests of references-$C in $RES so refmoe (--resume) adds only the MoE tests
#   (.skN: sglang-kernel 0.4.5's wheel in 55 MiB pieces, .sk1/SHA256 its PyPI sha256; .wsgl: sglang,
#   flashinfer-python 0.6.14, transformers, ...; .wsgl2: torchvision 0.26.0, pillow, ...; .wsgl3: xgrammar)
#
# unit: the GPU unit tests (confined CUDA worker, cupti timer); cold / warm: nox -s references-cuda13
# (the first run of a machine is cold: prebuild included); mutants: planted bugs against FlashInfer in
# that session's environment and JIT cache (MV: a combination's venv, .nox/references-<id, dots as dashes>;
# MO: --only, e.g. moe_fp8; each verdict with how close the bug and the true reference came); bench: nox -s bench-cuda13; overhead: the confined
# worker's per-call cost; ncu: scripts/ncu-validate.py; moe-bg / moe-wait: the fp8 MoE prebuild in the
# background (setsid: it outlives the call while the machine stays warm) and waiting for it; moe: the
# MoE tests against FlashInfer added to the references session (--resume). probe: the GPU, its clocks
# and MPS; alone: one test process (K: its -k); mps-on / mps-off: a system MPS daemon by hand.
# sgl-piece: the .skN pieces and .wsgl* wheels carried in this call to /tmp/sgk-parts, /tmp/sgl-wheels;
# sgl-install: the pieces joined in order and checked against .sk1/SHA256 (no install on a mismatch),
# then everything into /tmp/sgl (--target); sgl-probe: scripts/sgl-probe.py, each module's import.
# Each step's summary goes to $OUT/log.txt and its results to $OUT/<step>.tgz (OUT: results/node).
# T: a nox step's time limit (s), TM: the mutants' (SIGINT first: finished results are kept).
set -u
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
OUT=${OUT:-results/node}
mkdir -p "$OUT"
LOG=$OUT/log.txt
step() { echo "=== $* $(date +%T)" | tee -a "$LOG"; }
nox_env() {  # nox in a venv of its own: nothing leaks into the sessions' environments
  [ -x /tmp/noxenv/bin/nox ] && return
  python3 -m venv --without-pip /tmp/noxenv && \
    python3 -m pip --python /tmp/noxenv/bin/python install -q --no-index --find-links .whl nox >/dev/null
}
unit_env() {  # the package's own dependencies for plain pytest runs (no flashinfer)
  [ -d /tmp/unit ] && return
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/unit .whl/pydantic*.whl \
    .whl/annotated_types*.whl .whl/typing_inspection*.whl .whl/landlock*.whl .whl/pyseccomp*.whl .whl/cupti*.whl \
    .whl/rich*.whl .whl/markdown_it_py*.whl .whl/mdurl*.whl .whl/pygments*.whl >/dev/null
}
fi_env() {  # flashinfer 0.6.6 for plain runs (its wheel in .whl or, carried apart, .whl066)
  [ -d /tmp/fi066 ] && return
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fi066 \
    $(ls .whl/flashinfer_python-0.6.6-*.whl .whl066/flashinfer_python-0.6.6-*.whl 2>/dev/null | head -1) \
    .whl/apache_tvm_ffi*.whl .whl/nvidia_cudnn_frontend*.whl >/dev/null
}
keep() { tar czf "$OUT/$1.tgz" -C results "${@:2}" 2>/dev/null; }
join_checked() {  # join_checked DIR WHEEL SHA256 PIECE...: the pieces, in order, become DIR/WHEEL if its sha256 matches
  local dir=$1 whl=$2 want=$3 got; shift 3
  cat "$@" > "$dir/$whl.joining" 2>/dev/null; got=$(sha256sum "$dir/$whl.joining" | cut -d' ' -f1)
  if [ "$got" = "$want" ]; then mv "$dir/$whl.joining" "$dir/$whl"; echo "$whl: sha256 $got matches" | tee -a "$LOG"; return 0; fi
  rm -f "$dir/$whl.joining"
  echo "$whl: REFUSED: $# piece(s) joined give sha256 $got, PyPI publishes $want: a piece is missing or damaged" \
    "(carry it again)" | tee -a "$LOG"; return 1
}
all_done() { for c in "$@"; do [ -f "$c/DONE" ] || return 1; done; }
RES=${RES:-/tmp/results}  # the sweep steps' results ($FLASHINFER_TRACE_RESULTS): outside the tree, kept between calls
sess() {  # sess NAME K [ARGS...]: one nox session, offline (wheelhouse $WH, extra wheels $XW), the node's torch
  local name=$1 k=$2 start=$SECONDS rc; shift 2; nox_env; mkdir -p "$RES"
  step "nox -s $name -- -k '$k' $*"
  FLASHINFER_TRACE_RESULTS=$RES timeout -s INT -k 30 ${T:-1500} /tmp/noxenv/bin/nox -s "$name" -- \
    --wheelhouse "${WH:-/tmp/wh}" ${XW:+--extra-wheels "$XW"} ${JM:+--jit-modules "$JM"} --preinstalled-torch --jobs ${J:-8} -k "$k" "$@" \
    > "$RES/nox-$name.log" 2>&1; rc=$?
  echo "$name: rc $rc, $((SECONDS - start)) s wall" | tee -a "$LOG"; tail -3 "$RES/nox-$name.log" | tee -a "$LOG"
  python3 -c "import json, sys; s = json.load(open(sys.argv[1])); j = s.get('jit') or {}
print(s['status'], s.get('reason'), s.get('counts'), s.get('wall_seconds'), j.get('counts'), j.get('wall_seconds'))" \
    "$RES/$name/session.json" 2>&1 | tail -1 | tee -a "$LOG"
}
JITC=$HOME/.cache/flashinfer-trace/jit/cu130-torch2.11-fi0.6.6  # the references session's JIT cache
NOXARGS=(--wheelhouse .whl --preinstalled-torch --jobs ${J:-8})  # J: test processes
for s in "$@"; do
  case $s in
    [A-Z]*=*) export "$s"; continue ;;  # VAR=value between steps: set for the steps after it
    unit) step unit; unit_env
      PYTHONPATH=src:/tmp/unit timeout 300 python3 -m pytest -p no:cacheprovider -q -rs \
        tests/unit/test_sandbox_confinement.py tests/unit/test_bench.py -k "cuda or gpu" 2>&1 | tail -25 | tee -a "$LOG" ;;
    cold|warm) step "references $s"; nox_env; start=$SECONDS
      timeout -s INT -k 30 ${T:-330} /tmp/noxenv/bin/nox -s references-cuda13 -- "${NOXARGS[@]}" -k "not (moe and flashinfer)" 2>&1 | tail -12 | tee -a "$LOG"
      echo "references $s: $((SECONDS - start)) s wall" | tee -a "$LOG"; keep "references-$s${J:+-j$J}" references-cuda13
      python3 -c "import json; s=json.load(open('results/references-cuda13/session.json')); print(s['status'], s.get('reason'), s['counts'], s['wall_seconds'], {k: v for k, v in (s.get('jit') or {}).items() if k not in ('slowest', 'modules_built')}, s.get('phases'), s.get('mps'))" 2>&1 | tee -a "$LOG"
      [ -f results/references-cuda13/install.log ] && grep -i -m3 "error" results/references-cuda13/install.log | tee -a "$LOG" ;;
    alone) step "alone: ${K:-rmsnorm and medium}"  # one test process: a test's own time, without the others'
      FLASHINFER_WORKSPACE_BASE=$JITC .nox/references-cuda13/bin/python -m flashinfer_trace.sweep.session references \
        --combination constraints/cu130-torch2.11-fi0.6.6.toml --session alone --results results/alone --jobs 1 \
        -- -k "${K:-rmsnorm and medium}" 2>&1 | tail -3 | tee -a "$LOG"; keep alone alone ;;
    public) DEFS=${DEFS:-.public/definitions}; step "check $DEFS vs flashinfer ${FI:-0.6.6}"; unit_env; fi_env  # DEFS: dirs/files (, or space)
      FIP=/tmp/fi066; [ "${FI:-0.6.6}" = 0.6.6 ] || FIP=/tmp/fi072; start=$SECONDS
      PYTHONPATH=src:/tmp/unit:$FIP timeout -s INT -k 20 ${T:-500} python3 -m flashinfer_trace.cli check ${DEFS//,/ } \
        --ground-truth flashinfer --size small --no-progress --results "$OUT/check-${FI:-0.6.6}.jsonl" --jit-budget ${JB:-600} \
        --save-failures "$OUT/failures-${FI:-0.6.6}" 2>&1 | grep -v "^  \|Warning" | tail -${TAILN:-80} | tee -a "$LOG"
      echo "check: $((SECONDS - start)) s wall" | tee -a "$LOG" ;;
    paths) step "the kernel path each source takes on this GPU, and the ones it passes over: ${DEFS:-}"; unit_env; fi_env
      for d in ${DEFS//,/ }; do PYTHONPATH=src:/tmp/unit:/tmp/fi066 timeout 120 python3 -m flashinfer_trace.cli show "$d" \
        --ground-truths --device cuda --json 2>/dev/null | python3 -c "import json, sys; d = json.load(sys.stdin)
print(d['name'], json.dumps(d['ground_truths']))" 2>&1 | tee -a "$LOG"; done ;;
    fi072a) step "flashinfer 0.7.2.post1: the wheel (carried alone: .w072a)"
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fi072 .w072a/flashinfer_python-0.7.2.post1-*.whl 2>&1 | tail -2 | tee -a "$LOG" ;;
    fi072b) step "flashinfer 0.7.2.post1: its dependencies (.w072b, tvm-ffi and cudnn-frontend from .whl)"
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fi072 .w072b/*.whl .whl/apache_tvm_ffi*.whl \
        .whl/nvidia_cudnn_frontend*.whl 2>&1 | tail -2 | tee -a "$LOG"
      PYTHONPATH=/tmp/fi072 python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" 2>&1 | tail -1 | tee -a "$LOG" ;;
    fitrace) step "flashinfer 0.7.2.post1's own definitions: import-fi-trace, validate, drift"
      unit_env; FT="$OUT/fi-trace-0.7.2.post1"; PP=src:/tmp/unit:/tmp/fi072; start=$SECONDS
      PYTHONPATH=$PP timeout 240 python3 -m flashinfer_trace.cli import-fi-trace --out "$FT" --device cuda 2>&1 | grep -v Warn | tail -8 | tee -a "$LOG"
      PYTHONPATH=$PP python3 -m flashinfer_trace.cli validate "$FT" 2>&1 | tail -1 | tee -a "$LOG"
      PYTHONPATH=$PP timeout 150 python3 -m flashinfer_trace.cli drift --upstream "$FT" --fi-version 0.7.2.post1 \
        --out "$OUT/drift-0.7.2.post1.json" 2>&1 | grep -v Warn | tail -6 | tee -a "$LOG"
      echo "fitrace: $((SECONDS - start)) s wall" | tee -a "$LOG" ;;
    fitrace-check) step "flashinfer 0.7.2.post1's own definitions (all but MoE) vs FlashInfer: fi_api: tags resolved"
      unit_env; FT="$OUT/fi-trace-0.7.2.post1"; start=$SECONDS
      PYTHONPATH=src:/tmp/unit:/tmp/fi072 timeout -s INT -k 20 ${T:-200} python3 -m flashinfer_trace.cli check \
        $(ls -d "$FT"/*/ | grep -v "/moe") --ground-truth flashinfer --size small --no-edge-cases --no-progress \
        --results "$OUT/check-fi-trace.jsonl" --jit-budget ${JB:-150} 2>&1 | grep -v "^│\|Warn" | tail -${TAILN:-40} | tee -a "$LOG"
      echo "fitrace-check: $((SECONDS - start)) s wall" | tee -a "$LOG" ;;
    bg) B=/tmp/${BGN:-bgout}; step "in the background as $B (setsid: it outlives this call while the machine stays warm): ${BG:-}"
      mkdir -p "$B"; rm -f "$B/DONE"
      # from a copy of the tree made once per machine: each call syncs the working tree, and an import in a
      # chain that met a half-synced package failed ("cannot import name ... (unknown location)": 96 jobs)
      [ -d /tmp/tree ] || { mkdir -p /tmp/tree && tar --exclude='./.sk*' --exclude='./.w*' --exclude='./.nox' \
        --exclude='./results' --exclude='./.public' --exclude='./.venv' --exclude='./.git' -cf - . | tar -xf - -C /tmp/tree; }
      (cd /tmp/tree && setsid nohup env OUT="$B" bash -c "bash scripts/node-steps.sh ${BG:-}; date +%T > $B/DONE" \
        > "$B/stdout.txt" 2>&1 < /dev/null &); echo "started" | tee -a "$LOG" ;;
    collect) step "collect the background steps' results (waiting up to ${W:-0} s for ${BGN:-every chain} to end)"
      end=$((SECONDS + ${W:-0})); chains=$(ls -d /tmp/${BGN:-bg*}/ 2>/dev/null)
      while [ $SECONDS -lt $end ] && ! all_done $chains; do sleep 10; done
      for c in $chains; do n=$(basename "$c")
        [ -f "$c/DONE" ] && echo "[$n] ended at $(cat "$c/DONE")" | tee -a "$LOG" || echo "[$n] still running" | tee -a "$LOG"
        tail -${TAILN:-12} "$c/log.txt" 2>/dev/null | sed "s/^/[$n] /" | tee -a "$LOG"
        [ "$n" = bgout ] && cp -r /tmp/bgout "$OUT/bg" 2>/dev/null; done
      for b in $HOME/.cache/flashinfer-trace/jit/*/.cache/flashinfer/*/*/cached_ops/fused_moe_90; do [ -f "$b/build.ninja" ] || continue
        echo "fused_moe_90 ($b): $(find "$b" -name '*.o' | wc -l) of $(grep -c '^build .*\.o:' "$b/build.ninja") objects," \
          "$(ls "$b"/*.so 2>/dev/null | wc -l) library" | tee -a "$LOG"; done
      [ -d "$RES" ] && tar czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null; uptime | tee -a "$LOG" ;;
    wh) step "wheelhouse ${WH:=/tmp/wh} <- ${FROM:-.whl}${XFROM:+; extra wheels ${XW:=/tmp/xw} <- $XFROM}"
      mkdir -p "$WH"; for d in ${FROM:-.whl}; do cp "$d"/*.whl "$WH"/; done
      if [ -n "${XFROM:-}" ]; then mkdir -p "$XW"; for d in $XFROM; do cp "$d"/*.whl "$XW"/; done; fi
      echo "$(ls "$WH" | wc -l) wheels in $WH${XW:+, $(ls "$XW" 2>/dev/null | wc -l) in $XW}" | tee -a "$LOG" ;;
    ref) sess "references-$C" "${K:-not (moe and flashinfer)}" ${JB:+--jit-budget $JB} ;;  # C: the combination's id
    refmoe) sess "references-$C" "moe and flashinfer" --resume --jit-budget ${JB:-120} ;;  # after jitmoe: from the cache
    jitmoe) sess "jit-$C" "moe and flashinfer" --jit-budget ${JB:-1700} ;;
    jitc) sess "jit-$C" "${K:-not (moe and flashinfer)}" --jit-budget ${JB:-1200} ;;  # the prebuild alone (CPU)
    benchc) sess "bench-$C" "${KB:-not moe}" --bench-sources=${BS:-flashinfer,sglang} ;;  # BS: torch is one release
    noxenv) nox_env ;;  # before chains that start nox sessions at once
    jit-export) step "the JIT cache's built modules (every combination's .so) -> \$OUT/jit-so.tgz.part*, 12 MiB each"
      (cd "$HOME/.cache/flashinfer-trace/jit" && find . -path '*cached_ops*' -name '*.so' | tar czf /tmp/jit-so.tgz -T -)
      split -b 12m /tmp/jit-so.tgz "$OUT/jit-so.tgz.part"
      echo "$(sha256sum /tmp/jit-so.tgz | cut -d' ' -f1) jit-so.tgz" > "$OUT/SHA256"
      echo "$(tar tzf /tmp/jit-so.tgz | grep -c '\.so$') modules, $(du -h /tmp/jit-so.tgz | cut -f1): carry them" \
        "back as .jso/ (the pieces and SHA256), then jit-carry" | tee -a "$LOG" ;;
    jit-carry) step "modules another machine built (.jso/: jit-export's pieces) -> ${JM:=/tmp/jit-carried} (--jit-modules)"
      read -r want name < .jso/SHA256 && mkdir -p /tmp/jso "$JM" && join_checked /tmp/jso "$name" "$want" .jso/"$name".part* \
        && tar xzf "/tmp/jso/$name" -C "$JM" && echo "$(find "$JM" -name '*.so' | wc -l) modules in $JM" | tee -a "$LOG" ;;
    moe-export) step "fused_moe_90's finished objects (logged by ninja, not exported yet), its ninja logs and generated sources -> /tmp/moe-out"
      b=$(ls -d "$HOME"/.cache/flashinfer-trace/jit/*/.cache/flashinfer/*/*/cached_ops/fused_moe_90 2>/dev/null | head -1)
      [ -f "$b/.ninja_log" ] || { echo "moe-export: no fused_moe_90 build with a .ninja_log" | tee -a "$LOG"; continue; }
      jr=$HOME/.cache/flashinfer-trace/jit; rel=${b#"$jr"/}; n=$(( $(ls /tmp/moe-out/*.SHA256 2>/dev/null | wc -l) + 1 ))
      mkdir -p /tmp/moe-out; touch /tmp/moe-exported; cp "$b/.ninja_log" "$b/.ninja_log.export"; cp "$b/.ninja_deps" "$b/.ninja_deps.export"
      # an object is finished once ninja logged it (nvcc may be writing one that is not); paths relative to the JIT root
      awk -F'\t' 'NR > 1 && $4 ~ /\.o$/ {print $4}' "$b/.ninja_log.export" | sort -u | while read -r o; do [ -f "$o" ] && echo "${o#"$jr"/}"; done \
        | grep -vxF -f /tmp/moe-exported > /tmp/moe-new.txt
      { cat /tmp/moe-new.txt; echo "$rel/build.ninja"; echo "$rel/.ninja_log.export"; echo "$rel/.ninja_deps.export"
        echo "${rel%/cached_ops/fused_moe_90}/generated/cutlass_instantiations"; } > /tmp/moe-list.txt
      z="xz -T${XT:-8} -3"; command -v xz >/dev/null || z="gzip -4"  # tar -xf reads either
      tar -cf - -C "$jr" --transform 's/\.export$//' -T /tmp/moe-list.txt | $z > /tmp/moe-$n.tar.z
      (cd /tmp/moe-out && split -b 15m -d -a 2 /tmp/moe-$n.tar.z moe-$n.tar.z.part)
      echo "$(sha256sum /tmp/moe-$n.tar.z | cut -d' ' -f1) moe-$n.tar.z" > /tmp/moe-out/moe-$n.SHA256
      cat /tmp/moe-new.txt >> /tmp/moe-exported
      echo "moe-$n: $(wc -l < /tmp/moe-new.txt) new objects ($(wc -l < /tmp/moe-exported) exported of" \
        "$(grep -c '^build .*\.o:' "$b/build.ninja")), $(du -h /tmp/moe-$n.tar.z | cut -f1) packed ($z)," \
        "objects $(cd "$jr" && du -ch $(cat /tmp/moe-new.txt) 2>/dev/null | tail -1 | cut -f1) unpacked" | tee -a "$LOG"
      NJ=$(command -v ninja || ls /tmp/tree/.nox/*/bin/ninja 2>/dev/null | head -1)
      (cd "$b" && "$NJ" -f build.ninja -t deps 2>/dev/null | grep '^    ' | sed 's/^ *//' | cut -d/ -f1-6 | sort | uniq -c | sort -rn | head -8) | tee -a "$LOG" ;;
    moe-send) step "the next exported pieces (4 at most: \$OUT's 64 MiB) -> \$OUT"; touch /tmp/moe-sent
      cp /tmp/moe-out/*.SHA256 "$OUT"/ 2>/dev/null
      for f in $(cd /tmp/moe-out && ls *.part* 2>/dev/null | grep -vxF -f /tmp/moe-sent | head -${NP:-4}); do
        cp "/tmp/moe-out/$f" "$OUT/" && echo "$f" >> /tmp/moe-sent; done
      echo "sent: $(tr '\n' ' ' < /tmp/moe-sent); left: $(cd /tmp/moe-out && ls *.part* | grep -vxcF -f /tmp/moe-sent)" | tee -a "$LOG" ;;
    moe-piece) step "fused_moe_90 pieces carried in this call (.jmo*/: moe-N.tar.z.partNN, moe-N.SHA256) -> /tmp/moe-parts"
      mkdir -p /tmp/moe-parts; for d in .jmo*/; do [ -d "$d" ] && cp "$d"* /tmp/moe-parts/; done
      echo "pieces: $(cd /tmp/moe-parts && ls | tr '\n' ' ')" | tee -a "$LOG" ;;
    moe-place) step "fused_moe_90's objects from another machine (sha256 checked) -> the JIT cache; inputs made older than them"
      jr=$HOME/.cache/flashinfer-trace/jit; mkdir -p "$jr" /tmp/moe-joined; ok=1
      for sha in $(ls /tmp/moe-parts/moe-*.SHA256 | sort -V); do read -r want name < "$sha"
        join_checked /tmp/moe-joined "$name" "$want" /tmp/moe-parts/"$name".part* && tar -xf "/tmp/moe-joined/$name" -C "$jr" || ok=0; done
      [ $ok = 1 ] || { echo "moe-place: a piece is missing or damaged: nothing marked" | tee -a "$LOG"; continue; }
      b=$(ls -d "$jr"/*/.cache/flashinfer/*/*/cached_ops/fused_moe_90 | head -1)
      NJ=$(command -v ninja || ls /tmp/tree/.nox/*/bin/ninja 2>/dev/null | head -1)
      # ninja rebuilds an object older than any input: the sources, headers and generated files this machine
      # installed afresh; the carried objects keep their build times (tar), so the inputs go back to 2001
      (cd "$b" && { "$NJ" -f build.ninja -t deps | grep '^    ' | sed 's/^ *//'; awk '$1 == "build" && $2 ~ /\.o:$/ {print $4}' build.ninja; } \
        | sort -u | xargs -r touch -c -d 2001-01-01); find "${b%/cached_ops/fused_moe_90}/generated" -exec touch -d 2001-01-01 {} +
      (cd "$b" && "$NJ" -f build.ninja -n -d explain > /tmp/moe-explain.txt 2>&1)
      echo "fused_moe_90: $(find "$b" -name '*.o' | wc -l) objects placed; ninja -n would run" \
        "$(grep -c '^\[' /tmp/moe-explain.txt) of $(( $(grep -c '^build .*\.o:' "$b/build.ninja") + 1 )) edges" | tee -a "$LOG"
      grep -m4 'explain:' /tmp/moe-explain.txt | cut -c1-240 | tee -a "$LOG" ;;
    seed) step "references-$C's earlier tests (the snapshot's, but those naming every word of '${SK:-moe flashinfer}') -> $RES/references-$C/tests.jsonl: --resume runs only the rest"
      # a seeded test is not run again: the ones refmoe is for stay out (a seed of all of them ran nothing)
      mkdir -p "$RES/references-$C"; python3 -c "import gzip, json, sys
d = json.loads(gzip.decompress(open(sys.argv[1], 'rb').read()))
keep = [t for t in d['tests'] if not all(w in t['nodeid'] for w in sys.argv[3].split())]
with open(sys.argv[2], 'w') as f: f.writelines(json.dumps(t) + '\n' for t in keep)
print(len(keep), 'tests seeded,', len(d['tests']) - len(keep), 'left to run')" \
        "docs/matrix-snapshot/results/references-$C/tests.json.gz" "$RES/references-$C/tests.jsonl" "${SK:-moe flashinfer}" 2>&1 | tee -a "$LOG" ;;
    piece) step "wheel pieces carried in this call (.wp*/: NAME.partN, SHA256 of NAME) -> /tmp/pieces"
      mkdir -p /tmp/pieces; for d in .wp*/; do [ -d "$d" ] || continue; cp "$d"*.part* /tmp/pieces/ 2>/dev/null
        [ -f "$d"SHA256 ] && cp "$d"SHA256 "/tmp/pieces/SHA256.$(basename "$d")"; done
      echo "pieces: $(cd /tmp/pieces && ls | tr '\n' ' ')" | tee -a "$LOG" ;;
    join) step "wheels joined from their pieces, each checked against its sha256 -> ${WH:=/tmp/wh}"; mkdir -p "$WH"
      while read -r want whl; do join_checked "$WH" "$whl" "$want" /tmp/pieces/"$whl".part*; done \
        < <(cat /tmp/pieces/SHA256.* 2>/dev/null) ;;
    sgl-join) step "sglang-kernel 0.4.5 joined from its pieces, sha256 checked; wheelhouse /tmp/wh-sgl = /tmp/wh + sglang's"
      if ! read -r want whl < /tmp/sgk-parts/SHA256 2>/dev/null; then
        echo "sgl-join: no /tmp/sgk-parts/SHA256: carry .sk1 (with sgl-piece) on this warm machine first" | tee -a "$LOG"; continue; fi
      join_checked /tmp/sgk-parts "$whl" "$want" /tmp/sgk-parts/sglang_kernel.part* || continue
      mkdir -p /tmp/wh-sgl; (shopt -s nullglob; ln -sf /tmp/wh/*.whl /tmp/sgl-wheels/*.whl "/tmp/sgk-parts/$whl" /tmp/wh-sgl/)
      echo "$(ls /tmp/wh-sgl | wc -l) wheels in /tmp/wh-sgl" | tee -a "$LOG" ;;
    mark) touch "/tmp/mark-$MK" ;;  # MK: a marker another chain awaits
    await) step "waiting for $MK"; until [ -e "/tmp/mark-$MK" ] || [ -e "$MK" ]; do sleep 5; done ;;
    sgl-piece) step "sglang: the pieces and wheels carried in this call -> /tmp/sgk-parts, /tmp/sgl-wheels"
      mkdir -p /tmp/sgk-parts /tmp/sgl-wheels
      for d in .sk*/; do [ -d "$d" ] || continue; cp "$d"sglang_kernel.part* /tmp/sgk-parts/
        [ -f "$d"SHA256 ] && cp "$d"SHA256 /tmp/sgk-parts/; done
      for d in .wsgl*/; do [ -d "$d" ] && cp "$d"*.whl /tmp/sgl-wheels/; done
      for d in .sk*/ .wsgl*/; do [ -f "$d"SHA256SUMS ] && { (cd "$d" && sha256sum --quiet -c SHA256SUMS) 2>&1 \
        || echo "sgl-piece: $d damaged in transit: carry it again"; } | tee -a "$LOG"; done
      echo "pieces: $(cd /tmp/sgk-parts && ls sglang_kernel.part* 2>/dev/null | tr '\n' ' ')$([ -f /tmp/sgk-parts/SHA256 ] && echo '+ SHA256');" \
        "wheels: $(ls /tmp/sgl-wheels | wc -l)" | tee -a "$LOG" ;;
    sgl-install) step "sglang 0.5.16 into /tmp/sgl: sglang-kernel 0.4.5 from its pieces (sha256 checked), the .wsgl* wheels"
      for d in .wsgl*/; do [ -d "$d" ] && mkdir -p /tmp/sgl-wheels && cp "$d"*.whl /tmp/sgl-wheels/; done
      if ! read -r want whl < /tmp/sgk-parts/SHA256 2>/dev/null; then
        echo "sgl-install: no /tmp/sgk-parts/SHA256: carry .sk1 (with sgl-piece) on this warm machine first" | tee -a "$LOG"; continue; fi
      join_checked /tmp/sgk-parts "$whl" "$want" /tmp/sgk-parts/sglang_kernel.part* || continue  # part01, ...: in order
      rm -rf /tmp/sgl
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sgl "/tmp/sgk-parts/$whl" /tmp/sgl-wheels/*.whl \
        2>&1 | grep -v "root user" | tail -3 | tee -a "$LOG"
      PYTHONPATH=/tmp/sgl timeout 120 python3 scripts/sgl-probe.py --versions sgl_kernel:rmsnorm,fused_add_rmsnorm,silu_and_mul \
        2>&1 | grep -v Warn | tail -4 | tee -a "$LOG" ;;
    sgl-check) step "definitions vs SGLang 0.5.16 (sgl_kernel, Triton attention and MoE): ${DEFS:-definitions}"; unit_env
      start=$SECONDS
      PYTHONPATH=src:/tmp/unit:/tmp/sgl timeout -s INT -k 20 ${T:-400} python3 -m flashinfer_trace.cli check ${DEFS//,/ } \
        --ground-truth sglang --size small --no-edge-cases --no-progress --results "$OUT/check-sglang.jsonl" \
        --jit-budget ${JB:-300} --save-failures "$OUT/failures-sglang" 2>&1 | grep -v "^│\|Warn" | tail -${TAILN:-40} | tee -a "$LOG"
      echo "sgl-check: $((SECONDS - start)) s wall" | tee -a "$LOG" ;;
    sgl-probe) step "sglang modules on PYTHONPATH=src:/tmp/unit:/tmp/sgl: ok or the exception, per module"
      PYTHONPATH=src:/tmp/unit:/tmp/sgl timeout ${T:-400} python3 scripts/sgl-probe.py --versions --json "$OUT/sgl-probe.json" \
        2>&1 | grep -v Warn | tail -${TAILN:-40} | tee -a "$LOG" ;;
    mps-on) step "MPS on"; nvidia-cuda-mps-control -d 2>&1 | tee -a "$LOG" ;;
    mps-off) step "MPS off"; echo quit | nvidia-cuda-mps-control 2>&1 | tee -a "$LOG" ;;
    probe) step probe; nvidia-smi --query-gpu=name,compute_mode,clocks.sm,clocks.max.sm --format=csv | tee -a "$LOG"
      command -v nvidia-cuda-mps-control | tee -a "$LOG"; nproc | tee -a "$LOG"
      echo "autogroup: $(cat /proc/sys/kernel/sched_autogroup_enabled 2>&1)" | tee -a "$LOG" ;;
    moe-bg) step "moe prebuild in the background"; nox_env
      setsid nohup /tmp/noxenv/bin/nox -s jit-cuda13 -- "${NOXARGS[@]}" -k moe --jit-budget 1500 > /tmp/moe-jit.log 2>&1 < /dev/null & ;;
    moe-wait) step "waiting for the moe prebuild"; while pgrep -f "jit-cuda13" >/dev/null; do sleep 5; done
      tail -5 /tmp/moe-jit.log | tee -a "$LOG"; keep jit jit-cuda13 ;;
    moe) step "references: the fp8 MoE against FlashInfer, added to the session's results (--resume)"; nox_env
      start=$SECONDS
      timeout -s INT -k 30 ${T:-300} /tmp/noxenv/bin/nox -s references-cuda13 -- "${NOXARGS[@]}" --resume \
        -k "moe and flashinfer" 2>&1 | tail -6 | tee -a "$LOG"
      echo "references moe: $((SECONDS - start)) s wall" | tee -a "$LOG"; keep references-all references-cuda13 ;;
    bench) step bench; nox_env; start=$SECONDS
      timeout -s INT -k 30 ${T:-300} /tmp/noxenv/bin/nox -s bench-cuda13 -- "${NOXARGS[@]}" -k "not moe" 2>&1 | tail -12 | tee -a "$LOG"
      echo "bench: $((SECONDS - start)) s wall" | tee -a "$LOG"; keep bench bench-cuda13 ;;
    ncu) step ncu; unit_env; fi_env
      PYTHONPATH=src:/tmp/unit:/tmp/fi066 timeout 400 python3 scripts/ncu-validate.py all --workdir /tmp/ncu \
        --out "$OUT/ncu-validate.json" 2>&1 | tail -40 | tee -a "$LOG" ;;
    overhead) step overhead; unit_env
      PYTHONPATH=src:/tmp/unit timeout 300 python3 -m pytest -p no:cacheprovider -q tests/bench/test_sandbox_overhead.py \
        -k cuda --benchmark-columns=median,iqr,rounds 2>&1 | tail -40 | tee -a "$LOG" ;;
    mutants) step "mutants ${MO:-}"  # through a references session's environment (MV) and JIT cache: nothing rebuilds
      FLASHINFER_WORKSPACE_BASE=$JITC timeout ${TM:-150} ${MV:-.nox/references-cuda13}/bin/python -m flashinfer_trace.cli \
        mutants --ground-truth flashinfer --device cuda ${MO:+--only "$MO"} \
        --stream "$OUT/mutants-flashinfer.jsonl" > "$OUT/mutants-flashinfer.txt" 2> /tmp/mutants.err
      echo "mutants rc $?" | tee -a "$LOG"; tail -45 "$OUT/mutants-flashinfer.txt" | tee -a "$LOG"
      tail -5 /tmp/mutants.err | tee -a "$LOG" ;;
    *) echo "unknown step $s" | tee -a "$LOG" ;;
  esac
done
