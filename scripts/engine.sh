#!/usr/bin/env bash
# A real serving engine for the relay: llama.cpp's OpenAI-compatible server, from
# llama-cpp-python[server], in a venv of its own (.venv-engine) so that the project's
# .venv is never touched. PyPI has only the source of llama-cpp-python for Linux, so pip
# compiles llama.cpp (C/C++, cmake + ninja): ~15-40 min on 2 shared cores, at nice 19 so
# other work keeps its CPU. Idempotent: does nothing when the pinned version is there.
#
#   bash scripts/engine.sh            # or: make engine
#   STREAMLAB_ENGINE_VENV=/elsewhere bash scripts/engine.sh   # streamlab.lab.outside.llamacpp reads the same variable
#
# The build is for this CPU (-march=native): build the venv on the machine that uses it,
# or set CMAKE_ARGS="-DGGML_NATIVE=OFF" for a portable one. If the native build fails,
# this script retries once with GGML_NATIVE=OFF.
set -euo pipefail

VERSION=0.3.36
cd "$(dirname "$0")/.."
VENV=${STREAMLAB_ENGINE_VENV:-.venv-engine}
PYTHON=${PYTHON:-python3}
started=$(date +%s)

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$VERSION" <<'EOF' 2>/dev/null
import sys, importlib.metadata as m, importlib.util as u
assert m.version("llama_cpp_python") == sys.argv[1]
assert u.find_spec("llama_cpp.server") and u.find_spec("uvicorn") and u.find_spec("sse_starlette")
EOF
then
  echo "streamlab: $VENV already has llama-cpp-python[server]==$VERSION"
  exit 0
fi

# Build tools: a C and C++ compiler (build-essential), cmake >= 3.21 (scikit-build-core
# would otherwise fetch cmake and ninja from PyPI), and Debian's python3-venv when this
# python3 cannot make a venv (Debian's own python3 lacks ensurepip without it).
need=()
for pkg in build-essential cmake; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
[ -x "$VENV/bin/python" ] || "$PYTHON" -c "import ensurepip, venv" 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    sudo=()
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
  else
    sudo=(false)
  fi
  if command -v apt-get >/dev/null 2>&1 && [ "${sudo[0]:-}" != false ]; then
    echo "streamlab: installing ${need[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "streamlab: missing ${need[*]} and cannot apt-get them; trying the build anyway" >&2
  fi
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
echo "streamlab: building llama-cpp-python[server]==$VERSION into $VENV (compiles llama.cpp; progress in $VENV/build.log)"
install() {
  nice -n 19 "$VENV/bin/python" -m pip install -v "llama-cpp-python[server]==$VERSION" >"$VENV/build.log" 2>&1
}
if ! install; then
  case "${CMAKE_ARGS:-}" in
    *GGML_NATIVE=OFF*) tail -30 "$VENV/build.log" >&2; exit 1 ;;
  esac
  echo "streamlab: the native build failed (tail of $VENV/build.log below); retrying with GGML_NATIVE=OFF" >&2
  tail -15 "$VENV/build.log" >&2
  export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_NATIVE=OFF"
  install || { tail -30 "$VENV/build.log" >&2; exit 1; }
fi
elapsed=$(( $(date +%s) - started ))
printf 'streamlab: llama-cpp-python[server]==%s ready in %s after %dm%02ds\n' "$VERSION" "$VENV" $((elapsed / 60)) $((elapsed % 60))
