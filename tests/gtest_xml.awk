# Reads GoogleTest XML reports (--gtest_output=xml) and sums them up. A case reported by
# several files of one folder (the ranks of one mpirun job, or one ctest entry) is one
# case: failed if it failed on any rank, else skipped if it skipped on any, else passed.
# Cases filtered out (status="notrun") are not counted. POSIX awk (mawk on Debian).
#   default:      the failures and skip reasons, for people;
#   -v list=1:    "STATUS<TAB>ENTRY:Suite.Case<TAB>reason" for every case, ENTRY being the
#                 report's folder name (tests/gtest_run.sh writes one folder per ctest entry);
# then always a last line "total RUN PASSED SKIPPED FAILED".
function attr(line, key,    i, rest) {
  i = index(line, " " key "=\"")
  if (i == 0) return ""
  rest = substr(line, i + length(key) + 3)
  return substr(rest, 1, index(rest, "\"") - 1)
}
function unescape(s) {
  gsub(/&#x0A;/, "\n", s); gsub(/&#x0D;/, "", s); gsub(/&#x09;/, "\t", s)
  gsub(/&quot;/, "\"", s); gsub(/&apos;/, "'", s); gsub(/&lt;/, "<", s); gsub(/&gt;/, ">", s)
  gsub(/&amp;/, "\\&", s)
  return s
}
function severity(s) { return s == "failed" ? 3 : s == "skipped" ? 2 : 1 }
function note(key, s, msg) {
  if (!(key in status)) { order[++n] = key; status[key] = s; message[key] = msg; return }
  if (severity(s) > severity(status[key])) { status[key] = s; message[key] = msg }
  else if (s == status[key] && message[key] == "") message[key] = msg
  else if (s == "failed" && index(message[key], msg) == 0) message[key] = message[key] "\n" msg
}
function entry(path,    d) {
  d = path
  sub(/\/[^\/]*$/, "", d)
  sub(/^.*\//, "", d)
  return d
}
FNR == 1 {
  prefix = list ? entry(FILENAME) ":" : ""; cur = ""
  rank = FILENAME ~ /\.rank[0-9]+\.xml$/ ? FILENAME : ""
  if (rank != "") { sub(/^.*\.rank/, "", rank); sub(/\.xml$/, "", rank); rank = "rank " rank ": " }
}
/<testcase / {
  cur = ""
  if (attr($0, "status") == "notrun") next
  cur = prefix attr($0, "classname") "." attr($0, "name")
  note(cur, attr($0, "result") == "skipped" ? "skipped" : "passed", "")
  if ($0 ~ /\/>[ \t\r]*$/) cur = ""
  next
}
/<failure / && cur != "" { note(cur, "failed", rank unescape(attr($0, "message"))); next }
/<skipped / && cur != "" { note(cur, "skipped", unescape(attr($0, "message"))); next }
/<\/testcase>/ { cur = "" }
END {
  for (i = 1; i <= n; ++i) {
    k = order[i]; s = status[k]; m = message[k]; ++count[s]
    if (list) {
      sub(/^[^\n]*:[0-9]+\n/, "", m)  # the file:line GoogleTest puts first
      gsub(/[\t\n]+/, " ", m)
      print s "\t" k "\t" m
    } else if (s != "passed") {
      gsub(/\n/, "\n    ", m)
      print (s == "failed" ? "FAILED  " : "SKIPPED ") k (m != "" ? ":\n    " m : "")
    }
  }
  print "total " n + 0, count["passed"] + 0, count["skipped"] + 0, count["failed"] + 0
}
