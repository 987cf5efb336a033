/* One pass over a CSV file's records that keeps where each starts and, for a few chosen
 * columns, their text: the manifest's index is built from it without parsing every field.
 *
 * Quotes toggle the quoted state (a doubled quote toggles twice, and counts as one quote in a
 * kept value); a newline outside quotes ends a record; records of only '\r' are blank and
 * skipped. memchr finds newlines, quotes and commas, so an unquoted line costs a few
 * vectorised searches. */
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace videotrain {

class CsvRecordScanner {
 public:
  // `columns`: 0-based field numbers whose text is kept (each capped at `cap` bytes, so that a
  // runaway field, say a quote that never closes, cannot pull the file into memory).
  CsvRecordScanner(std::vector<int> columns, size_t cap);

  // Calls on_record(start, values) for every non-blank record from byte `from` on, values[k]
  // being the raw text of columns[k] ("" when the record is shorter). False on a read error
  // (errno set).
  using OnRecord = std::function<void(uint64_t start, const std::vector<std::string> &values)>;
  bool scan(int fd, uint64_t from, const OnRecord &on_record);

  // After scan(): whether the last record's quote never closed, and where that record starts.
  bool unterminated() const { return unterminated_; }
  uint64_t unterminated_start() const { return unterminated_start_; }

 private:
  void take_unquoted(const char *s, const char *e);
  void take_quoted(const char *s, const char *e);
  void append(int field, const char *s, const char *e);
  void end_record(const OnRecord &on_record);

  std::vector<int> slot_;  // field number -> index in values_, or -1
  size_t cap_;
  std::vector<std::string> values_;
  int field_ = 0;
  bool empty_ = true;
  uint64_t start_ = 0;
  bool unterminated_ = false;
  uint64_t unterminated_start_ = 0;
};

}  // namespace videotrain
