// Small string helpers shared by config parsing, CLI tools and reports.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace easyctx {

std::vector<std::string> split(std::string_view s, char sep);
// The parts with `sep` between them ("" for none): split's inverse.
std::string join(const std::vector<std::string>& parts, std::string_view sep);
std::string trim(std::string_view s);
bool starts_with(std::string_view s, std::string_view prefix);
bool ends_with(std::string_view s, std::string_view suffix);
size_t edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `word` by edit distance, or "" when nothing is close enough
// (distance > max(2, |word|/3)).
std::string nearest(std::string_view word, const std::vector<std::string>& candidates);
std::string format_bytes(double bytes);       // "1.50 GiB"
std::string format_count(double n);           // "12.3K", "4.10M"
std::string format_duration(double seconds);  // "1h02m", "3m05s", "12.3s"
// Appends code point cp (<= 0x10FFFF) encoded as UTF-8.
void append_utf8(std::string& out, uint32_t cp);
std::string read_file(const std::string& path);  // throws InputError naming the path (also for a folder)
// Writes via `path.tmp` + rename so readers never see a partial file.
void write_file_atomic(const std::string& path, std::string_view content);
// Appends `bytes` whole to the end of the file open as `fd`, retrying short writes and EINTR.
// On failure the file is cut back to its size before, so a reader never meets a partial record,
// and the errno is returned (ENOSPC for a write of nothing); 0 when all was written.
int append_whole(int fd, std::string_view bytes);

}  // namespace easyctx
