#include "data/h5util.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace easyctx::data::h5 {

void quiet_errors() {
  static std::once_flag once;
  std::call_once(once, [] {
    // No library shutdown at exit (before the library starts, so first): a file whose writes
    // failed (EFBIG under a file-size limit, ENOSPC) cannot be closed, and HDF5 1.10's shutdown
    // then crashes on it (SIGSEGV in H5F__close_cb) after the error was reported, turning a
    // clean exit 1 into 139. Every file easyctx writes is closed (and flushed) by its Handle;
    // at exit only those failed ones, already removed, are left to the process's end.
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

int64_t check(int64_t rc, const char* what, const std::string& file) {
  if (rc < 0) EASYCTX_THROW("HDF5 ", what, " failed for ", file);
  return rc;
}

Handle::Handle(hid_t id, Kind kind, const char* what, const std::string& file) : id_(id), kind_(kind) {
  check(id, what, file);
}

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    kind_ = o.kind_;
    o.id_ = -1;
  }
  return *this;
}

void Handle::reset() {
  if (id_ < 0) return;
  // Close errors cannot be reported from a destructor; the data was already checked on
  // write (H5Fflush before commit), so ignoring them here loses nothing.
  switch (kind_) {
    case Kind::File: H5Fclose(id_); break;
    case Kind::Dataset: H5Dclose(id_); break;
    case Kind::Dataspace: H5Sclose(id_); break;
    case Kind::Datatype: H5Tclose(id_); break;
    case Kind::Attribute: H5Aclose(id_); break;
    case Kind::Plist: H5Pclose(id_); break;
    case Kind::Group: H5Gclose(id_); break;
  }
  id_ = -1;
}

Handle open_file(const std::string& path, bool writable) {
  quiet_errors();
  hid_t id = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) EASYCTX_THROW_INPUT("cannot open HDF5 file ", path, " (missing, unreadable or not HDF5)");
  return Handle(id, Handle::Kind::File, "H5Fopen", path);
}

Handle create_file(const std::string& path) {
  quiet_errors();
  return Handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), Handle::Kind::File, "H5Fcreate",
                path);
}

Handle open_dataset(const Handle& file, const char* name, const std::string& path) {
  htri_t exists = H5Lexists(file, name, H5P_DEFAULT);
  check(exists, "H5Lexists", path);
  if (!exists) EASYCTX_THROW_INPUT(path, ": dataset ", name, " is missing (not an easyctx token shard?)");
  return Handle(H5Dopen2(file, name, H5P_DEFAULT), Handle::Kind::Dataset, name, path);
}

namespace {
std::string type_name(hid_t t, const std::string& path) {
  const size_t bytes = H5Tget_size(t);
  EASYCTX_CHECK(bytes > 0, "H5Tget_size failed for ", path);
  switch (H5Tget_class(t)) {
    case H5T_INTEGER: {
      const H5T_sign_t sign = H5Tget_sign(t);
      check(sign, "H5Tget_sign", path);
      return std::string(sign == H5T_SGN_NONE ? "uint" : "int") + std::to_string(8 * bytes);
    }
    case H5T_FLOAT: return "float" + std::to_string(8 * bytes);
    case H5T_STRING: return "string";
    case H5T_BITFIELD: return "bitfield" + std::to_string(8 * bytes);
    case H5T_OPAQUE: return "opaque";
    case H5T_COMPOUND: return "compound";
    case H5T_REFERENCE: return "reference";
    case H5T_ENUM: return "enum";
    case H5T_VLEN: return "variable-length";
    case H5T_ARRAY: return "array";
    default: return "unknown";
  }
}
}  // namespace

std::string dataset_type_name(const Handle& ds, const std::string& path) {
  Handle t(H5Dget_type(ds), Handle::Kind::Datatype, "H5Dget_type", path);
  return type_name(t, path);
}

void expect_unsigned(const Handle& ds, const char* name, size_t bytes, const std::string& path) {
  const std::string got = dataset_type_name(ds, path);
  const std::string want = "uint" + std::to_string(8 * bytes);
  EASYCTX_CHECK_INPUT(got == want, path, ": dataset /", name, " holds ", got, ", expected ", want,
                      " (the token shard format, docs/data.md; re-run h5tokenize or convert the dataset)");
}

uint64_t dataset_length(const Handle& ds, const char* name, const std::string& path) {
  Handle space(H5Dget_space(ds), Handle::Kind::Dataspace, "H5Dget_space", path);
  int rank = static_cast<int>(check(H5Sget_simple_extent_ndims(space), "H5Sget_simple_extent_ndims", path));
  EASYCTX_CHECK_INPUT(rank == 1, path, ": dataset ", name, " has rank ", rank, ", expected 1");
  hsize_t dims[1];
  check(H5Sget_simple_extent_dims(space, dims, nullptr), "H5Sget_simple_extent_dims", path);
  return static_cast<uint64_t>(dims[0]);
}

void read_1d(const Handle& ds, hid_t mem_type, uint64_t offset, uint64_t count, void* out, const char* name,
             const std::string& path) {
  if (count == 0) return;
  Handle fspace(H5Dget_space(ds), Handle::Kind::Dataspace, "H5Dget_space", path);
  hsize_t start[1] = {offset}, cnt[1] = {count};
  check(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, cnt, nullptr), "H5Sselect_hyperslab", path);
  Handle mspace(H5Screate_simple(1, cnt, nullptr), Handle::Kind::Dataspace, "H5Screate_simple", path);
  if (H5Dread(ds, mem_type, mspace, fspace, H5P_DEFAULT, out) < 0)
    EASYCTX_THROW("HDF5 read of ", name, "[", offset, ":", offset + count, "] failed for ", path);
}

Handle create_extendible(const Handle& file, const char* name, hid_t type, uint64_t chunk, int deflate_level,
                         const std::string& path) {
  hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunk_dims[1] = {chunk};
  Handle space(H5Screate_simple(1, dims, maxdims), Handle::Kind::Dataspace, "H5Screate_simple", path);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), Handle::Kind::Plist, "H5Pcreate", path);
  check(H5Pset_chunk(dcpl, 1, chunk_dims), "H5Pset_chunk", path);
  if (deflate_level > 0) {
    check(H5Pset_shuffle(dcpl), "H5Pset_shuffle", path);
    check(H5Pset_deflate(dcpl, static_cast<unsigned>(deflate_level)), "H5Pset_deflate", path);
  }
  return Handle(H5Dcreate2(file, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), Handle::Kind::Dataset, name, path);
}

void append_1d(const Handle& ds, hid_t mem_type, uint64_t len, uint64_t count, const void* data, const char* name,
               const std::string& path) {
  if (count == 0) return;
  hsize_t new_dims[1] = {len + count};
  check(H5Dset_extent(ds, new_dims), "H5Dset_extent", path);
  Handle fspace(H5Dget_space(ds), Handle::Kind::Dataspace, "H5Dget_space", path);
  hsize_t start[1] = {len}, cnt[1] = {count};
  check(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, cnt, nullptr), "H5Sselect_hyperslab", path);
  Handle mspace(H5Screate_simple(1, cnt, nullptr), Handle::Kind::Dataspace, "H5Screate_simple", path);
  if (H5Dwrite(ds, mem_type, mspace, fspace, H5P_DEFAULT, data) < 0)
    EASYCTX_THROW("HDF5 write of ", name, " failed for ", path, " (disk full?)");
}

namespace {
Handle string_type(size_t size, const std::string& path) {
  Handle t(H5Tcopy(H5T_C_S1), Handle::Kind::Datatype, "H5Tcopy", path);
  check(H5Tset_size(t, size), "H5Tset_size", path);
  check(H5Tset_cset(t, H5T_CSET_UTF8), "H5Tset_cset", path);
  return t;
}
Handle scalar_space(const std::string& path) {
  return Handle(H5Screate(H5S_SCALAR), Handle::Kind::Dataspace, "H5Screate", path);
}
}  // namespace

void write_attr_string(const Handle& obj, const char* name, const std::string& value, const std::string& path) {
  Handle t = string_type(std::max<size_t>(1, value.size()), path);
  check(H5Tset_strpad(t, H5T_STR_NULLPAD), "H5Tset_strpad", path);
  Handle space = scalar_space(path);
  Handle a(H5Acreate2(obj, name, t, space, H5P_DEFAULT, H5P_DEFAULT), Handle::Kind::Attribute, name, path);
  std::string buf = value;
  buf.resize(std::max<size_t>(1, value.size()), '\0');
  check(H5Awrite(a, t, buf.data()), "H5Awrite", path);
}

void write_attr_int(const Handle& obj, const char* name, int64_t value, const std::string& path) {
  Handle space = scalar_space(path);
  Handle a(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), Handle::Kind::Attribute, name, path);
  check(H5Awrite(a, H5T_NATIVE_INT64, &value), "H5Awrite", path);
}

bool has_attr(const Handle& obj, const char* name, const std::string& path) {
  return check(H5Aexists(obj, name), "H5Aexists", path) > 0;
}

namespace {
// A scalar (or one-element) string attribute's text; `ft` is its file type (a string).
// The memory type takes the file's character set: HDF5 does not convert between ASCII and UTF-8.
std::string read_string_value(const Handle& a, const Handle& ft, const std::string& path) {
  const H5T_cset_t cset = H5Tget_cset(ft);
  check(cset, "H5Tget_cset", path);
  if (check(H5Tis_variable_str(ft), "H5Tis_variable_str", path) > 0) {  // h5py writes these
    Handle mt = string_type(H5T_VARIABLE, path);
    check(H5Tset_cset(mt, cset), "H5Tset_cset", path);
    char* p = nullptr;
    check(H5Aread(a, mt, &p), "H5Aread", path);
    std::string out = p ? p : "";
    H5free_memory(p);
    return out;
  }
  const size_t size = H5Tget_size(ft);
  EASYCTX_CHECK(size > 0, "H5Tget_size failed for ", path);
  // One more byte than stored: HDF5 converts to a null-terminated string, which would
  // otherwise drop the last character of a null-padded one.
  Handle mt = string_type(size + 1, path);
  check(H5Tset_cset(mt, cset), "H5Tset_cset", path);
  check(H5Tset_strpad(mt, H5T_STR_NULLTERM), "H5Tset_strpad", path);
  std::string buf(size + 1, '\0');
  check(H5Aread(a, mt, buf.data()), "H5Aread", path);
  buf.resize(std::strlen(buf.c_str()));
  return buf;
}
}  // namespace

// Fixed-length strings (what easyctx writes) and variable-length ones (what h5py writes when it
// rewrites an attribute) read alike; another type or more than one value is refused, naming both.
std::string read_attr_string(const Handle& obj, const char* name, const std::string& path) {
  EASYCTX_CHECK_INPUT(has_attr(obj, name, path), path, ": attribute ", name, " is missing");
  Handle a(H5Aopen(obj, name, H5P_DEFAULT), Handle::Kind::Attribute, name, path);
  Handle ft(H5Aget_type(a), Handle::Kind::Datatype, "H5Aget_type", path);
  EASYCTX_CHECK_INPUT(H5Tget_class(ft) == H5T_STRING, path, ": attribute ", name, " holds ", type_name(ft, path),
                      ", expected a string");
  Handle space(H5Aget_space(a), Handle::Kind::Dataspace, "H5Aget_space", path);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  check(n, "H5Sget_simple_extent_npoints", path);
  EASYCTX_CHECK_INPUT(n == 1, path, ": attribute ", name, " holds ", n, " strings, expected one string");
  return read_string_value(a, ft, path);
}

int64_t read_attr_int(const Handle& obj, const char* name, const std::string& path) {
  EASYCTX_CHECK_INPUT(has_attr(obj, name, path), path, ": attribute ", name, " is missing");
  Handle a(H5Aopen(obj, name, H5P_DEFAULT), Handle::Kind::Attribute, name, path);
  {
    Handle t(H5Aget_type(a), Handle::Kind::Datatype, "H5Aget_type", path);
    EASYCTX_CHECK_INPUT(H5Tget_class(t) == H5T_INTEGER, path, ": attribute ", name, " holds ", type_name(t, path),
                        ", expected an integer");
  }
  int64_t v = 0;
  check(H5Aread(a, H5T_NATIVE_INT64, &v), "H5Aread", path);
  return v;
}

void write_strings(const Handle& file, const char* name, const std::vector<std::string>& v, const std::string& path) {
  Handle t = string_type(H5T_VARIABLE, path);
  hsize_t dims[1] = {v.size()};
  Handle space(H5Screate_simple(1, dims, nullptr), Handle::Kind::Dataspace, "H5Screate_simple", path);
  Handle ds(H5Dcreate2(file, name, t, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), Handle::Kind::Dataset, name, path);
  std::vector<const char*> ptrs;
  for (const auto& s : v) ptrs.push_back(s.c_str());
  if (!v.empty()) check(H5Dwrite(ds, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()), "H5Dwrite", path);
}

std::vector<std::string> read_strings(const Handle& file, const char* name, const std::string& path) {
  Handle ds = open_dataset(file, name, path);
  uint64_t n = dataset_length(ds, name, path);
  std::vector<std::string> out;
  if (n == 0) return out;
  Handle t = string_type(H5T_VARIABLE, path);
  std::vector<char*> ptrs(n, nullptr);
  check(H5Dread(ds, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()), "H5Dread", path);
  for (char* p : ptrs) out.emplace_back(p ? p : "");
  Handle space(H5Dget_space(ds), Handle::Kind::Dataspace, "H5Dget_space", path);
  check(H5Dvlen_reclaim(t, space, H5P_DEFAULT, ptrs.data()), "H5Dvlen_reclaim", path);
  return out;
}

}  // namespace easyctx::data::h5
