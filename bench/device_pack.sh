# Sourced by the one-call device scripts (run_document_mask.sh, run_families.sh): what their
# `prepare` packs and their `run` unpacks.
#   pack_device_dir DIR BUILD BIN...  DIR afresh: the BUILD/bin programs stripped in
#                                     DIR/bins.tar.xz, and DIR/gpulibs: the host libraries the
#                                     GPU image lacks or has in another version (as
#                                     bench/prebuilt.sh's list)
#   unpack_device_dir DIR             there: DIR/bin/<programs>, LD_LIBRARY_PATH with DIR/gpulibs
#                                     and torch's cuDNN (>= 9.19; the image's is 9.14), the
#                                     environment of the tests (EASYCTX_SOURCE_DIR, NCCL_NVLS_ENABLE=0)
pack_device_dir() {
  local dir=$1 build=$2 l
  shift 2
  rm -rf "$dir" && mkdir -p "$dir/stage" "$dir/gpulibs"
  for b in "$@"; do cp "$build/bin/$b" "$dir/stage/"; done
  strip "$dir"/stage/*
  tar -C "$dir/stage" -cf - . | xz -T2 -6 > "$dir/bins.tar.xz" && rm -rf "$dir/stage"
  for l in libboost_program_options.so.1.74.0 libyaml-cpp.so.0.7 libhdf5_serial.so.103 libsz.so.2 libaec.so.0; do
    cp -L "$(ls /lib/x86_64-linux-gnu/$l /usr/lib/x86_64-linux-gnu/$l 2>/dev/null | head -n 1)" "$dir/gpulibs/"
  done
}

unpack_device_dir() {
  local dir=$1 cudnn
  mkdir -p "$dir/bin" && tar -C "$dir/bin" -xJf "$dir/bins.tar.xz"
  cudnn=$(python3 -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cudnn", "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH=$PWD/$dir/gpulibs${cudnn:+:$cudnn}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export NCCL_NVLS_ENABLE=0 EASYCTX_SOURCE_DIR=$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=16
}
