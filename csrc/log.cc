#include "log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <strings.h>

#include "config.h"
#include "error.h"

namespace rcoll {

static std::atomic<int> g_log_rank{-1};

// A bad value is a warning, not an error: logging must never stop a job.
static LogLevel parseLevel(const std::string& text) {
  const char* value = text.c_str();
  if (*value == '\0') return LogLevel::kWarn;
  if (strcasecmp(value, "TRACE") == 0) return LogLevel::kTrace;
  if (strcasecmp(value, "INFO") == 0) return LogLevel::kInfo;
  if (strcasecmp(value, "WARN") == 0) return LogLevel::kWarn;
  if (strcasecmp(value, "NONE") == 0 || strcasecmp(value, "OFF") == 0) return LogLevel::kNone;
  std::fprintf(stderr, "[rcoll] WARN: RCOLL_DEBUG=%s is not one of WARN, INFO, TRACE, NONE; using WARN\n", value);
  return LogLevel::kWarn;
}

LogLevel logLevel() {
  static const LogLevel level = parseLevel(environmentValue("RCOLL_DEBUG"));
  return level;
}

void setLogRank(int rank) { g_log_rank.store(rank); }

void logMessage(LogLevel level, const std::string& message) {
  const char* name = level == LogLevel::kWarn ? "WARN" : level == LogLevel::kInfo ? "INFO" : "TRACE";
  int rank = g_log_rank.load();
  std::string line = rank >= 0 ? strFormat("[rcoll %d rank %d] %s: ", static_cast<int>(getpid()), rank, name)
                               : strFormat("[rcoll %d] %s: ", static_cast<int>(getpid()), name);
  line += message;
  line += '\n';
  // One write() so that lines from several threads and processes do not interleave.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace rcoll
