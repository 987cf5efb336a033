#include "csv_scan.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

namespace videotrain {

namespace {
constexpr size_t kScanBlock = 4u << 20;  // bytes read at once

ssize_t pread_block(int fd, char *buf, size_t len, uint64_t offset) {
  for (;;) {
    ssize_t n = pread(fd, buf, len, off_t(offset));
    if (n >= 0 || errno != EINTR) return n;
  }
}
}  // namespace

CsvRecordScanner::CsvRecordScanner(std::vector<int> columns, size_t cap) : cap_(cap), values_(columns.size()) {
  int top = -1;
  for (int c : columns) top = std::max(top, c);
  slot_.assign(size_t(top + 1), -1);
  for (size_t k = 0; k < columns.size(); k++)
    if (columns[k] >= 0) slot_[size_t(columns[k])] = int(k);
}

void CsvRecordScanner::append(int field, const char *s, const char *e) {
  if (field >= int(slot_.size()) || slot_[size_t(field)] < 0) return;
  std::string &v = values_[size_t(slot_[size_t(field)])];
  v.append(s, std::min<size_t>(size_t(e - s), cap_ - std::min(cap_, v.size())));
}

// Bytes outside quotes: count fields up to the last kept column.
void CsvRecordScanner::take_unquoted(const char *s, const char *e) {
  for (const char *c = s; empty_ && c < e; c++)
    if (*c != '\r') empty_ = false;
  while (field_ < int(slot_.size()) && s < e) {
    const char *comma = static_cast<const char *>(memchr(s, ',', size_t(e - s)));
    const char *stop = comma ? comma : e;
    append(field_, s, stop);
    if (!comma) break;
    field_++;
    s = comma + 1;
  }
}

void CsvRecordScanner::take_quoted(const char *s, const char *e) { append(field_, s, e); }

void CsvRecordScanner::end_record(const OnRecord &on_record) {
  if (!empty_) on_record(start_, values_);
  empty_ = true;
  field_ = 0;
  for (auto &v : values_) v.clear();
}

bool CsvRecordScanner::scan(int fd, uint64_t from, const OnRecord &on_record) {
  std::unique_ptr<char[]> buf(new char[kScanBlock]);
  uint64_t base = from;
  start_ = from;
  bool inq = false;
  bool just_closed = false;  // the last byte was a closing quote: a quote now is a doubled one
  for (;;) {
    const ssize_t n = pread_block(fd, buf.get(), kScanBlock, base);
    if (n < 0) return false;
    if (n == 0) break;
    const char *p = buf.get(), *e = p + n, *i = p;
    const char *nl = nullptr;  // next newline at or after i; null: none left in this block
    bool nl_known = false;
    while (i < e) {
      if (inq) {
        const char *q = static_cast<const char *>(memchr(i, '"', size_t(e - i)));
        const char *stop = q ? q : e;
        take_quoted(i, stop);
        if (!q) break;
        inq = false;
        just_closed = true;
        i = q + 1;
        continue;
      }
      if (!nl_known || (nl && nl < i)) {
        nl = static_cast<const char *>(memchr(i, '\n', size_t(e - i)));
        nl_known = true;
      }
      const char *line_end = nl ? nl : e;
      const char *q = static_cast<const char *>(memchr(i, '"', size_t(line_end - i)));
      if (q == i && just_closed) {
        static const char quote = '"';
        append(field_, &quote, &quote + 1);
      }
      just_closed = false;
      take_unquoted(i, q ? q : line_end);
      if (q) {
        empty_ = false;
        inq = true;
        i = q + 1;
      } else if (nl) {
        end_record(on_record);
        i = nl + 1;
        start_ = base + uint64_t(i - p);
      } else {
        break;
      }
    }
    base += uint64_t(n);
  }
  unterminated_ = inq;
  unterminated_start_ = start_;
  end_record(on_record);
  return true;
}

}  // namespace videotrain
