// TensorBoard event files written by easyctx itself (no TensorFlow, no protobuf library), so
// that `tensorboard --logdir DIR` shows a run live and `wandb sync --sync-tensorboard DIR`
// uploads it (docs/training.md, "Live tracking").
//
// A file is a sequence of TFRecords: uint64 length (little-endian), uint32 masked CRC-32C of
// the 8 length bytes, the data, uint32 masked CRC-32C of the data; mask(c) = ((c >> 15) |
// (c << 17)) + 0xa282ead8. Each record's data is a tensorflow.Event protobuf
// (tensorflow/core/util/event.proto, summary.proto), of which these fields are written:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//             Summary summary = 5; SessionLog session_log = 7; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
//   SessionLog { SessionStatus status = 1; }   (START = 1)
// The first record of a file is the file_version "brain.Event:2" event.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace easyctx::tb {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), as TFRecord uses it:
// crc32c("123456789") = 0xe3069283. `crc` continues an earlier call's result.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
uint32_t masked_crc32c(const void* data, size_t n);

// Protobuf wire encoding (appends to out).
void put_varint(std::string& out, uint64_t v);
void put_key(std::string& out, uint32_t field, uint32_t wire_type);

using Scalar = std::pair<std::string, float>;  // tag, value

// One Event's bytes (the protobuf, not yet framed).
std::string encode_file_version_event(double wall_time);
std::string encode_scalars_event(double wall_time, int64_t step, const std::vector<Scalar>& values);
// SessionLog START at `step`: TensorBoard drops the events of earlier files at steps >= step
// (its purge of orphaned data), which a run killed after logging a step but before that
// step's checkpoint leaves behind when it resumes.
std::string encode_session_start_event(double wall_time, int64_t step);
// The TFRecord framing of `data`.
std::string frame_record(const std::string& data);

// Appends events to a new file events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n> in
// `dir` (created with its parents). Each record is written with one write(2) call and, when it
// cannot be written whole (a full disk), cut off again and reported as an error naming the
// file: the file only ever holds whole records, and a killed process leaves every record
// written so far readable (writes reach the page cache, where a viewer reads them at once).
class EventWriter {
 public:
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One Event holding every value, at `step`, stamped with the current time.
  void add_scalars(int64_t step, const std::vector<Scalar>& values);
  void add_scalar(const std::string& tag, int64_t step, float value) { add_scalars(step, {{tag, value}}); }
  void session_start(int64_t step);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event, const char* what);
  std::string path_;
  int fd_ = -1;
};

// Reading event files back (the tests, and any tool that wants a run's scalars).
struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;  // set only in the file_version event
  int session_status = -1;   // SessionLog.status when the event is one, else -1
  std::vector<Scalar> values;
};

struct EventFile {
  std::vector<Event> events;
  // Bytes at the end that do not form a whole record (a writer killed mid-write), which
  // TensorBoard skips too.
  uint64_t partial_tail_bytes = 0;
};

// Parses every record, checking both CRCs of each: a mismatch or an undecodable Event is an
// error naming the file and the record's offset.
EventFile read_event_file(const std::string& path);
// The event files in dir (names starting "events.out.tfevents."), in name order (the order
// TensorBoard reads them in).
std::vector<std::string> list_event_files(const std::string& dir);
// Decodes one Event's protobuf bytes (unknown fields skipped); `where` names it in errors.
Event decode_event(const std::string& data, const std::string& where);

}  // namespace easyctx::tb
