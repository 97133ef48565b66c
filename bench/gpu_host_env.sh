# Sourced on the lent GPU host (Ubuntu 24.04 image) before configuring easyctx there. That
# image has Boost headers but no compiled Boost.Program_options, and PCRE2's runtime but
# not its header. The development checkout carries both in .deps/ (ignored by git; made by
# bench/make_gpu_deps.sh): Boost.Program_options' sources (built into the project by
# EASYCTX_BOOST_PO_SOURCE_DIR) and pcre2.h (linked against the system libpcre2-8.so.0).
# Exports EASYCTX_GPU_CMAKE_FLAGS for `cmake -S . -B build-gpu $EASYCTX_GPU_CMAKE_FLAGS`.
deps=$(pwd)/.deps
mkdir -p "$deps/pcre2/lib/pkgconfig"
ln -sf "$(ls /usr/lib/x86_64-linux-gnu/libpcre2-8.so.0 2>/dev/null || echo /usr/lib/x86_64-linux-gnu/libpcre2-8.so)" \
  "$deps/pcre2/lib/libpcre2-8.so"
cat > "$deps/pcre2/lib/pkgconfig/libpcre2-8.pc" <<PC
Name: libpcre2-8
Description: PCRE2 (header carried in .deps, library from the system)
Version: 10.42
Libs: -L$deps/pcre2/lib -lpcre2-8
Cflags: -I$deps/pcre2/include
PC
export PKG_CONFIG_PATH=$deps/pcre2/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
cudnn_root=$(python3 -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cudnn"))' 2>/dev/null || true)
export LD_LIBRARY_PATH=$deps/pcre2/lib${cudnn_root:+:$cudnn_root/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
EASYCTX_GPU_CMAKE_FLAGS="-G Ninja -DEASYCTX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DEASYCTX_BOOST_PO_SOURCE_DIR=$deps/boost_po_src"
[ -n "$cudnn_root" ] && EASYCTX_GPU_CMAKE_FLAGS="$EASYCTX_GPU_CMAKE_FLAGS -DEASYCTX_CUDNN_ROOT=$cudnn_root"
export EASYCTX_GPU_CMAKE_FLAGS
