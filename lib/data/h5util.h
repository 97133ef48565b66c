// Thin RAII and error-checking layer over the HDF5 C API, shared by the shard writer and
// reader. Every call that returns a status or an id goes through h5check(), which turns a
// negative value into easyctx::Error naming the operation and the file; HDF5's own error
// stack printing is switched off so the message is ours.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace easyctx::data::h5 {

// Silences HDF5's automatic error printing and keeps HDF5 from shutting down at exit (once per
// process, before the first other HDF5 call: every open and create calls it first).
void quiet_errors();

// Throws easyctx::Error("HDF5 <what> failed for <file>") when rc < 0; returns rc.
int64_t check(int64_t rc, const char* what, const std::string& file);

// Owns one hid_t; closes it with the matching H5?close on destruction.
class Handle {
 public:
  enum class Kind { File, Dataset, Dataspace, Datatype, Attribute, Plist, Group };
  Handle() = default;
  Handle(hid_t id, Kind kind, const char* what, const std::string& file);
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(o.id_), kind_(o.kind_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();

 private:
  hid_t id_ = -1;
  Kind kind_ = Kind::File;
};

Handle open_file(const std::string& path, bool writable);
Handle create_file(const std::string& path);  // truncates
Handle open_dataset(const Handle& file, const char* name, const std::string& path);

// The element type of a dataset as text: "uint32", "int64", "float32", "string", "compound"...
std::string dataset_type_name(const Handle& ds, const std::string& path);
// Throws InputError naming the file, the dataset and its element type unless the dataset
// holds unsigned integers of `bytes` bytes (either byte order): a float, signed or narrower
// dataset is never converted silently (HDF5 would clip negative ids to 0).
void expect_unsigned(const Handle& ds, const char* name, size_t bytes, const std::string& path);

// Number of elements of a 1-D dataset (throws when it is not 1-D).
uint64_t dataset_length(const Handle& ds, const char* name, const std::string& path);
// Reads [offset, offset+count) of a 1-D dataset into out with the given memory type.
void read_1d(const Handle& ds, hid_t mem_type, uint64_t offset, uint64_t count, void* out, const char* name,
             const std::string& path);
// Creates a chunked, extendible 1-D dataset of `type`, initially empty.
Handle create_extendible(const Handle& file, const char* name, hid_t type, uint64_t chunk, int deflate_level,
                         const std::string& path);
// Appends count elements to an extendible 1-D dataset whose current length is `len`.
void append_1d(const Handle& ds, hid_t mem_type, uint64_t len, uint64_t count, const void* data, const char* name,
               const std::string& path);

// Attributes on the file root (scalar).
void write_attr_string(const Handle& obj, const char* name, const std::string& value, const std::string& path);
void write_attr_int(const Handle& obj, const char* name, int64_t value, const std::string& path);
bool has_attr(const Handle& obj, const char* name, const std::string& path);
std::string read_attr_string(const Handle& obj, const char* name, const std::string& path);
int64_t read_attr_int(const Handle& obj, const char* name, const std::string& path);

// A 1-D dataset of variable-length UTF-8 strings.
void write_strings(const Handle& file, const char* name, const std::vector<std::string>& v, const std::string& path);
std::vector<std::string> read_strings(const Handle& file, const char* name, const std::string& path);

}  // namespace easyctx::data::h5
