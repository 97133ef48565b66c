// Helpers for tests that damage checkpoints on purpose (tests/ckpt, tests/eval).
#pragma once
#include <fcntl.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/strings.h"

namespace easyctx::test {

// The arrays rank file `file` (0, 1, ...) of step folder `step_dir` holds, in dataset order
// (slice_0, slice_1, ...), as index.json lists them.
inline std::vector<std::string> arrays_of(const std::string& step_dir, int file) {
  const Json index = parse_json(read_file(step_dir + "/index.json"), step_dir + "/index.json");
  std::vector<std::string> names;
  for (const Json& s : index.at("files")[static_cast<size_t>(file)].at("slices").as_array())
    names.push_back(s[0].as_string());
  return names;
}

// Which dataset (slice_<i>) of rank file `file` of step folder `step_dir` holds array `name`;
// -1 when that file holds none of it.
inline int slice_of(const std::string& step_dir, int file, const std::string& name) {
  const std::vector<std::string> names = arrays_of(step_dir, file);
  const auto it = std::find(names.begin(), names.end(), name);
  return it == names.end() ? -1 : static_cast<int>(it - names.begin());
}

// The array that dataset slice_<slice> of rank file `file` of step folder `step_dir` holds.
inline std::string array_of(const std::string& step_dir, int file, int slice) {
  return arrays_of(step_dir, file).at(static_cast<size_t>(slice));
}

// Flips one bit in the middle of dataset slice_<i> of an HDF5 checkpoint file (contiguous
// layout: H5Dget_offset is where its bytes are).
inline void flip_bit(const std::string& file, int slice = 0) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0) << file;
  const std::string name = "slice_" + std::to_string(slice);
  hid_t ds = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  ASSERT_GE(ds, 0) << file << " " << name;
  const haddr_t off = H5Dget_offset(ds);
  const hsize_t bytes = H5Dget_storage_size(ds);
  H5Dclose(ds);
  H5Fclose(f);
  ASSERT_NE(off, HADDR_UNDEF);
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const off_t at = static_cast<off_t>(off + bytes / 2);
  unsigned char b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, at), 1);
  b ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &b, 1, at), 1);
  ::close(fd);
}

}  // namespace easyctx::test
